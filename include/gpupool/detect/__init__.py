"""Detect and clean: profile each series, route it to a detector, flag and clean anomalies.

- `features.profile_series(y)`: stability and periodicity features (stored in series_profile)
- `router.RouterConfig`, `router.route(profile, config)`: which detector, and why
- `sr`, `svr`, `prophet`: detectors with one interface, `fit(history)` then `score(y)`
  (expected value and raw score per point, judged on the past only)
- `clean.detect_and_clean(y)`, `clean.fit_series_model(history)`,
  `clean.score_window(model, y, start, end)`: thresholds, flags, clean values, gap filling
- `io.detect_csv(input, out)`: the `gpupool detect` CLI contract

Submodules are imported explicitly: Prophet and scikit-learn are heavy, and a DAG file
must stay cheap to parse.
"""
