"""The detect stage's settings: what an operator sets and what benchmarks chose, one home each.

A leaf: it imports pydantic only, so loading platforms.yaml (`gpupool.config` checks its
`detect.router` section against `RouterConfig`) loads no detector, and every module of
`gpupool.detect` may read it without an import circle.

Settings by audience. An operator sets the fields of `RouterConfig` itself (platforms.yaml's
`detect.router`): `detector`, `tau_multiplier` (residual detectors flag |x_t - x̂_t| > τ, τ =
`tau_multiplier` x the robust spread of the history's residuals; that τ decides cleaning),
`fallback`, `spiky_detector`, `refit_every_hours`, `history_days`, `nonnegative` and
per-metric `overrides`. What benchmarks chose sits in one small settings model per concern,
which tests and benches pass in (never by changing a module's globals): `routing`
(`RoutingRules`: `gpupool.detect.router`), `alarms` (`AlarmRules`: the alarm τ scale, the
false-alarm budget, the run alarm, merging an event's points; `gpupool.detect.alarms`),
`cleaning` (`CleaningRules`: `gpupool.detect.rules`) and one per detector (`sr`: `SRConfig`,
`svr`, `prophet`, `zscore` likewise). What nothing varies is a named constant beside its code.

A fitted model (`gpupool.detect.model.FittedSeriesModel`) does not carry these settings: it is
stored as the numbers its fit read from the history, and every judgement reads the alarm and
cleaning settings of the config it is given, so renaming a setting never changes what a stored
model holds.

Per-metric overrides: `RouterConfig(overrides={"gpu_capacity": {"detector": "svr",
"tau_multiplier": 8}})`; `config.for_metric("gpu_capacity")` gives the merged config (a small
config given in an override is merged into the base's field by field).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

DetectorName = Literal["sr", "svr", "prophet", "zscore"]
DETECTORS: tuple[str, ...] = ("sr", "svr", "prophet", "zscore")


class RoutingRules(BaseModel):
    """The routing thresholds tests vary (`RouterConfig.routing`); chosen with bench/detect_nab.py."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prophet_enabled: bool = Field(True, description="allow routing to Prophet (the slowest detector to fit)")
    prophet_min_acf: float = Field(0.6, description="autocorrelation at the profiled period needed for Prophet")
    sr_min_noise_ratio: float = Field(
        0.5, description="noise/spread ratio from which the spiky detector is chosen over SVR"
    )


class AlarmRules(BaseModel):
    """When a deviation is an alarm (`RouterConfig.alarms`): the τ scale, the false-alarm budget,
    the run alarm and the merging of an event's points.

    Chosen leave-one-NAB-group-out with bench/detect_nab.py --cv, and on the tuning half of the
    KPI proxy with bench/detect_kpi.py --tune, which vary them; alarms only: what is cleaned
    does not depend on them.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    tau_scale: float = Field(
        1.5, ge=1.0, description="an alarm needs a deviation this many times the cleaning threshold (τ) at least"
    )
    history_share: float | None = Field(
        0.0,
        ge=0.0,
        lt=0.5,
        description="false-alarm budget: an alarm also needs a deviation that at most this share of the "
        "history's points reached (0: larger than any in the history the model was fitted on; None: no budget)",
    )
    history_skip_per_day: float = Field(
        0.0,
        ge=0.0,
        description="the false-alarm budget is read from the history less its largest excursions (runs of points "
        "beyond τ, joined as `merge_points` joins alarms), this many per day of history (rounded down): an "
        "earlier anomaly does not make the series blind to a smaller one while it stays in the history; a series "
        "whose history has more large excursions than that keeps a bar at its next largest (0: none skipped)",
    )
    history_skip_per_1000_points: float = Field(
        0.3,
        ge=0.0,
        description="also leave this many of the history's largest excursions per 1,000 history points out of the "
        "false-alarm budget (added to `history_skip_per_day`, the sum rounded down): anomalies come at a rate "
        "per point, so a series sampled every minute has five times as many in a week's history as one sampled "
        "every five minutes (0: none skipped)",
    )
    run_points: int = Field(
        5,
        ge=0,
        description="a level shift or burst too small for a one-point alarm: an alarm also where the last this many "
        "points all deviate on the same side by more than `run_share` x the alarm τ, and the run's smallest "
        "deviation is beyond every such run of the history (the same false-alarm budget, the same excursions left "
        "out); SVR, Prophet and the rolling z-score only; alarms only, nothing cleaned changes (0: off)",
    )
    run_share: float = Field(
        0.5, gt=0.0, le=1.0, description="each point of such a run deviates by more than this x the alarm τ"
    )
    merge_points: int = Field(
        12,
        ge=0,
        description="a deviating point within this many points of the previous deviating point belongs to the same "
        "event: it raises no new alarm (0: every deviating point is an alarm)",
    )


class CleaningRules(BaseModel):
    """The cleaning rules' settings that tests and benches vary (`RouterConfig.cleaning`); the
    rest are constants beside each rule.

    Chosen with bench/detect_cleaning.py (injected exporter faults on synthetic and Helios demand,
    scored by the day-ahead forecast they spoil); the allocation study (bench/allocate_helios.py)
    weighs the two that are off by default.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_anomaly_run: int = Field(
        3,
        ge=0,
        description="a flagged excursion (a spike, or a fall to zero) is cleaned only if the series comes back in at "
        "most this many points; otherwise it is a level shift, a burst of real demand or an idle spell: kept, "
        "marked `sustained` (0: no limit, every flagged point is cleaned)",
    )
    spike_height_factor: float = Field(
        3.0,
        ge=0.0,
        description="a flagged excursion that comes back within `max_anomaly_run` points is cleaned only when it "
        "stands more than this x the history's ordinary local-peak height (`spikes.SPIKE_HEIGHT_QUANTILE`) above "
        "(or below) the values on both sides of it; a smaller one is the series' own noise or a short surge of "
        "real demand and is kept (0: no such test)",
    )
    spike_max_shoulder: float = Field(
        0.25,
        ge=0.0,
        le=1.0,
        description="a cleaned excursion rises from the level and falls back at once: the values just before "
        "and after it carry at most this share of its deviation from x̂ (a surge of real demand climbs and "
        "ebbs over a few points; 1: no such test)",
    )
    max_fault_run: int = Field(
        36,
        ge=0,
        description="a counter reset of the exporter (a fall to zero, then a climb at every step back to the "
        "demand) within this many points is cleaned as one fault (0: no fall to zero is cleaned)",
    )
    min_stuck_run: int = Field(
        6,
        ge=0,
        description="a run of one exact value longer than this many points (and than `stuck.STUCK_RUN_FACTOR` x "
        "the history's typical run) on a series whose history varies is a stuck exporter: its repeats are "
        "replaced (0: no such rule)",
    )
    max_stuck_run: int = Field(
        72, ge=0, description="a run of one value longer than this many points is kept as real (0: no limit)"
    )
    stuck_max_repeat_share: float = Field(
        0.1,
        ge=0.0,
        le=1.0,
        description="a series can be stuck only if at most this share of its history's steps repeat the value "
        "before: a count that repeats more often stands still in plateaus at every level, which a stuck exporter "
        "cannot be told from by values alone (docs/decisions/0018-stuck-from-values.md; 1: every series is "
        "judged on its runs at the run's level)",
    )
    outage_max_idle_share: float | None = Field(
        0.01,
        ge=0.0,
        le=1.0,
        description="a fall to zero that comes back within `max_fault_run` points is an exporter outage, however "
        "long, on a series whose history hardly idles: at most this share of its points lie in runs of more than "
        "`max_anomaly_run` points at or below `faults.FAULT_DROP_SHARE` x its median (a series that never idles "
        "does not idle for an hour and come back to where it was; one that does keeps its idle spells). None "
        "switches it off. The price: real demand does fall idle for the first time in a week now and then, and "
        "such an hour is replaced (bench/detect_cleaning.py weighs it)",
    )
    scales_without_fault_shapes: bool = Field(
        False,
        description="read a history's typical step (the floor of its residual spread, so τ) and its peak height "
        "(the spike bar) without the points shaped like an exporter's faults (`faults.fault_shaped`): at faults "
        "on a few % of the steps of a flat count, the quantile of its peak heights is otherwise a fault's own "
        "size and the next faults pass. Off by default: it cleans more of the faults, but the allocation study "
        "(bench/allocate_helios.py) did not follow",
    )
    open_move_factor: float = Field(
        0.0,
        ge=0.0,
        description="a flagged move still open at the end of the data (the newest points: it cannot be told "
        "from a step of the demand yet) is cleaned only when it moved more than this x the history's "
        "`spikes.SPIKE_HEIGHT_QUANTILE` one-step change from the point before it; a smaller one is kept as the "
        "demand stepping (a fall to zero is the collapse rule's). 0: off, every such move is cleaned as a point "
        "anomaly",
    )


class SRConfig(BaseModel):
    """Spectral Residual's settings: its window and the flagging thresholds of its score.

    Chosen with bench/detect_nab.py (NAB's scoring); the router keeps one per config
    (`RouterConfig.sr`).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    window: int = Field(123, ge=23, description="sliding window (points)")
    threshold: float = Field(4.0, gt=0, description="flag when the normalised SR score exceeds this")
    min_residual: float = Field(
        2.0, ge=0, description="a flag also needs |x - x̂| above this many robust residual spreads"
    )


class SVRConfig(BaseModel):
    """SVR's settings as the router builds it (`RouterConfig.svr`); chosen with bench/detect_nab.py,
    the training cap with bench/detect_scale.py (the daily refit of many series)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    lags: int = Field(12, ge=1, description="lagged values the SVR sees")
    max_train: int = Field(1500, ge=20, description="newest history points the SVR trains on")


class ProphetConfig(BaseModel):
    """Prophet's settings as the router builds it (`RouterConfig.prophet`); the training cap
    chosen with bench/detect_scale.py (Prophet is the slowest detector to fit)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_train: int = Field(1000, ge=20, description="most points Prophet trains on (history averaged down to it)")


class ZScoreConfig(BaseModel):
    """The rolling z-score's settings (`RouterConfig.zscore`); its window chosen with
    bench/detect_nab.py."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    window: int = Field(288, ge=12, description="points in the rolling z-score's past median")


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
