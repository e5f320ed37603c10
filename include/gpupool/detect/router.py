"""Choosing a detector per series from its profile.

The rules, in order (the first that applies wins, and its reason is recorded):

1. a forced detector (`RouterConfig.detector`, or a per-metric override of it);
2. too little history to train a model (`MIN_MODEL_POINTS`) -> `spiky_detector` (the rolling
   z-score by default, or Spectral Residual), which needs only a window of context;
3. a constant history -> SVR, whose local-level prediction makes any change stand out;
4. a strong, regular season with enough cycles of history (autocorrelation at the period
   >= `routing.prophet_min_acf`, STL seasonal strength >= `PROPHET_MIN_SEASONAL_STRENGTH`, at
   least `PROPHET_MIN_CYCLES` periods, at most `PROPHET_MAX_MISSING_SHARE` missing) -> Prophet;
5. point-to-point noise as large as the series' whole spread (`noise_ratio` >=
   `routing.sr_min_noise_ratio`): nothing for a regression to predict, spikes are what matter ->
   `spiky_detector` (chosen leave-one-NAB-group-out with bench/detect_nab.py --cv);
6. otherwise (structure that the recent past predicts: trends, level shifts, smooth
   cycles) -> SVR.

The settings (`RouterConfig` and its small configs) live in `gpupool.detect.settings`.

After routing, `fallback` compares the routed SVR or Prophet with the rolling z-score on the
series' own history: the one that alarms at the smaller deviation (in the series' units,
under the same budget) is kept.
"""

from __future__ import annotations

from gpupool.detect.settings import RouterConfig

#: history points below which only the spiky detector is used (a model needs this many to train);
#: also the history the stream's regular refit needs (bench/detect_nab.py)
MIN_MODEL_POINTS = 96
#: STL seasonal strength Prophet needs (bench/detect_nab.py)
PROPHET_MIN_SEASONAL_STRENGTH = 0.6
#: periods of history Prophet needs (bench/detect_nab.py)
PROPHET_MIN_CYCLES = 3.0
#: most missing share Prophet accepts (bench/detect_nab.py)
PROPHET_MAX_MISSING_SHARE = 0.2


def route(profile: dict, config: RouterConfig | None = None, metric: str | None = None) -> tuple[str, str]:
    """The detector for a profiled series and the reason, as (name, reason).

    `metric` selects per-metric overrides from the config.
    """
    cfg = (config or RouterConfig()).for_metric(metric)
    if cfg.detector != "auto":
        return cfg.detector, f"forced by configuration ({cfg.detector})"
    n_valid = int(profile.get("n_valid") or 0)
    if n_valid < MIN_MODEL_POINTS:
        return cfg.spiky_detector, f"history too short for a model ({n_valid} < {MIN_MODEL_POINTS} points)"
    if profile.get("constant"):
        return "svr", "constant history: local-level prediction makes any change stand out"

    period = profile.get("period")
    acf_p = profile.get("acf_period")
    seas = profile.get("stl_seasonal_strength")
    missing = profile.get("missing_share") or 0.0
    cycles = (n_valid / period) if period else 0.0
    if (
        cfg.routing.prophet_enabled
        and period
        and acf_p is not None
        and acf_p >= cfg.routing.prophet_min_acf
        and seas is not None
        and seas >= PROPHET_MIN_SEASONAL_STRENGTH
        and cycles >= PROPHET_MIN_CYCLES
        and missing <= PROPHET_MAX_MISSING_SHARE
    ):
        return "prophet", (
            f"regular season: period {period} points ({profile.get('period_source')}), "
            f"acf {acf_p:.2f} >= {cfg.routing.prophet_min_acf}, STL strength {seas:.2f} >= "
            f"{PROPHET_MIN_SEASONAL_STRENGTH}, {cycles:.1f} cycles"
        )
    noise = profile.get("noise_ratio")
    if noise is not None and noise >= cfg.routing.sr_min_noise_ratio:
        return cfg.spiky_detector, (
            f"noise dominates (noise ratio {noise:.2f} >= {cfg.routing.sr_min_noise_ratio}): spikes, not shape"
        )
    return "svr", (
        f"structured, not regularly seasonal (noise ratio {_fmt(noise)}, acf at period {_fmt(acf_p)}, "
        f"{profile.get('level_shifts')} level shifts): predicted from lags and calendar"
    )


def _fmt(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}"
