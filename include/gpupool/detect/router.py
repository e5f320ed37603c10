"""Choosing a detector per series from its profile; the router's config and the small configs
it carries.

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

Settings by audience. An operator sets the fields of `RouterConfig` itself (platforms.yaml's
`detect.router`): `detector`, `tau_multiplier` (residual detectors flag |x_t - x̂_t| > τ, τ =
`tau_multiplier` x the robust spread of the history's residuals; that τ decides cleaning),
`fallback`, `spiky_detector`, `refit_every_hours`, `history_days`, `nonnegative` and
per-metric `overrides`. What benchmarks chose travels beside the code it tunes, as a small
config that tests and benches may vary: `routing` (`RoutingRules`, here), `alarms`
(`gpupool.detect.alarms.AlarmRules`: the alarm τ scale, the false-alarm budget, the run alarm,
merging an event's points), `cleaning` (`gpupool.detect.rules.CleaningRules`) and one per
detector (`sr`: `SRConfig` in sr.py, `svr`, `prophet`, `zscore` likewise). What nothing varies
is a named constant beside its code.

After routing, `fallback` compares the routed SVR or Prophet with the rolling z-score on the
series' own history: the one that alarms at the smaller deviation (in the series' units,
under the same budget) is kept.

Per-metric overrides: `RouterConfig(overrides={"gpu_capacity": {"detector": "svr",
"tau_multiplier": 8}})`; `config.for_metric("gpu_capacity")` gives the merged config (a small
config given in an override is merged into the base's field by field).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gpupool.detect.alarms import AlarmRules
from gpupool.detect.prophet import ProphetConfig
from gpupool.detect.rules import CleaningRules
from gpupool.detect.sr import SRConfig
from gpupool.detect.svr import SVRConfig
from gpupool.detect.zscore import ZScoreConfig

DetectorName = Literal["sr", "svr", "prophet", "zscore"]
DETECTORS: tuple[str, ...] = ("sr", "svr", "prophet", "zscore")

#: history points below which only the spiky detector is used (a model needs this many to train);
#: also the history the stream's regular refit needs (bench/detect_nab.py)
MIN_MODEL_POINTS = 96
#: STL seasonal strength Prophet needs (bench/detect_nab.py)
PROPHET_MIN_SEASONAL_STRENGTH = 0.6
#: periods of history Prophet needs (bench/detect_nab.py)
PROPHET_MIN_CYCLES = 3.0
#: most missing share Prophet accepts (bench/detect_nab.py)
PROPHET_MAX_MISSING_SHARE = 0.2


class RoutingRules(BaseModel):
    """The routing thresholds tests vary (`RouterConfig.routing`); chosen with bench/detect_nab.py."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prophet_enabled: bool = Field(True, description="allow routing to Prophet (the slowest detector to fit)")
    prophet_min_acf: float = Field(0.6, description="autocorrelation at the profiled period needed for Prophet")
    sr_min_noise_ratio: float = Field(
        0.5, description="noise/spread ratio from which the spiky detector is chosen over SVR"
    )


class RouterConfig(BaseModel):
    """What an operator sets for detection (platforms.yaml's `detect.router`), and the small configs
    of the routing, alarm and cleaning rules and of each detector, chosen on benchmarks."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    detector: Literal["auto", "sr", "svr", "prophet", "zscore"] = Field(
        "auto", description="force one detector for every series"
    )
    tau_multiplier: float = Field(4.0, gt=0, description="τ = multiplier x robust residual spread (SVR, Prophet)")
    fallback: bool = Field(
        True,
        description="at each refit, use the rolling z-score instead of the routed SVR or Prophet when the "
        "z-score alarms at a smaller deviation under the same budget on the series' own history",
    )
    spiky_detector: Literal["zscore", "sr"] = Field(
        "zscore", description="the detector for short or noise-dominated histories (rules 2 and 5)"
    )
    refit_every_hours: float = Field(24.0, gt=0, description="streaming: the model is refitted this often (hours)")
    history_days: float = Field(7.0, gt=0, description="streaming: a refit sees at most this much history (days)")
    nonnegative: bool | None = Field(
        None,
        description="the metric is never negative (expected and clean values are clipped at 0); None: inferred "
        "from the history (no negative value in it)",
    )
    overrides: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="metric name -> fields to override for that metric"
    )

    routing: RoutingRules = Field(default_factory=RoutingRules, description="routing thresholds")
    alarms: AlarmRules = Field(default_factory=AlarmRules, description="when a deviation is an alarm")
    cleaning: CleaningRules = Field(default_factory=CleaningRules, description="what is cleaned")
    sr: SRConfig = Field(default_factory=SRConfig, description="Spectral Residual")
    svr: SVRConfig = Field(default_factory=SVRConfig, description="SVR")
    prophet: ProphetConfig = Field(default_factory=ProphetConfig, description="Prophet")
    zscore: ZScoreConfig = Field(default_factory=ZScoreConfig, description="the rolling z-score")

    def to_params(self) -> dict:
        """This config as a JSON-able dict (stored with every fitted model)."""
        return self.model_dump(mode="json")

    @classmethod
    def from_params(cls, params: dict) -> "RouterConfig":
        """The config `to_params` gave, validated; raises ModelParamsError when malformed."""
        from gpupool.detect.base import ModelParamsError

        if not isinstance(params, dict):
            raise ModelParamsError(f"router config: expected an object, got {type(params).__name__}")
        try:
            return cls.model_validate(params)
        except ValueError as exc:  # pydantic's ValidationError is a ValueError
            raise ModelParamsError(f"router config: {' '.join(str(exc).split())[:300]}") from None

    def for_metric(self, metric: str | None) -> "RouterConfig":
        """This config with the overrides for `metric` applied (validated like the rest)."""
        if not metric or metric not in self.overrides:
            return self
        return self.merged({**self.overrides[metric], "overrides": {}})

    def merged(self, changes: dict[str, Any]) -> "RouterConfig":
        """This config with `changes` applied, validated; a small config (`routing`, `alarms`,
        `cleaning`, a detector's) given as a dict is merged field by field, so
        `merged({"alarms": {"run_points": 0}})` keeps the other alarm settings."""
        data = self.model_dump()
        for key, value in changes.items():
            if isinstance(value, dict) and isinstance(data.get(key), dict) and key != "overrides":
                data[key] = {**data[key], **value}
            else:
                data[key] = value
        return RouterConfig.model_validate(data)

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
