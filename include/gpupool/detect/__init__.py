"""Detect and clean: profile each series, route it to a detector, flag and clean anomalies.

- `features.profile_series(y)`: stability and periodicity features (stored in series_profile)
- `router.RouterConfig`, `router.route(profile, config)`: which detector, and why
- `sr`, `svr`, `prophet`, `zscore`: detectors with one interface, `fit(history)` then `score(y)`
  (expected value and raw score per point, judged on the past only), each beside its config
- `model.fit_series_model(history)`, `model.FittedSeriesModel`: the routed, calibrated model,
  stored as data
- `alarms`: events and the false-alarm budget; `rules/`: one module per cleaning rule
  (spikes, faults, stuck values, outages, gap bridging)
- `clean.stream_detect(y)`, `clean.detect_and_clean(y)`, `clean.score_window(model, y, start,
  end)`: the stream (refit anchors, flags, clean values, gap filling)
- `stage`: what the detect task and the what-if call; `io.detect_csv(input, out)`: the
  `gpupool detect` CLI contract

Submodules are imported explicitly: Prophet and scikit-learn are heavy, and a DAG file
must stay cheap to parse.
"""
