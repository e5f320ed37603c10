"""Detect and clean: profile each series, route it to a detector, flag and clean anomalies.

- `settings`: every setting of the stage, a leaf (`RouterConfig`, what an operator sets, and
  the small settings models benchmarks chose: `RoutingRules`, `AlarmRules`, `CleaningRules`,
  one per detector)
- `features.profile_series(y)`: stability and periodicity features (stored in series_profile)
- `router.route(profile, config)`: which detector, and why
- `sr`, `svr`, `prophet`, `zscore`: detectors with one interface, `fit(history)` then `score(y)`
  (expected value and raw score per point, judged on the past only)
- `params.encode(detector)`, `params.decode(params, name)`: one codec for every detector's
  stored parameters (pydantic models, JSON; never a pickle)
- `model.fit_series_model(history, config)`, `model.FittedSeriesModel`: the routed, calibrated
  model as data: the numbers its history gave, no settings
- `alarms`: events and the false-alarm budget; `rules/`: one module per cleaning rule
  (spikes, faults, stuck values, outages, gap bridging); each takes the numbers it reads and
  its settings, and returns values
- `clean.stream_detect(y)`, `clean.detect_and_clean(y)`, `clean.score_window(model, y, start,
  end, config)`: the stream (refit anchors, flags, clean values, gap filling)
- `stage`: what the detect task and the what-if call; `io.detect_csv(input, out)`: the
  `gpupool detect` CLI contract

Submodules are imported explicitly: Prophet and scikit-learn are heavy, and a DAG file
must stay cheap to parse. The imports run one way, with no circle: settings, the detectors and
rules, the codec, the model, the stream, the stage.
"""
