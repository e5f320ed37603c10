"""Choosing a detector per series from its profile, by rules whose thresholds are configuration.

The rules, in order (the first that applies wins, and its reason is recorded):

1. a forced detector (`RouterConfig.detector`, or a per-metric override of it);
2. too little history to train a model (`min_model_points`) -> `spiky_detector` (the rolling
   z-score by default, or Spectral Residual), which needs only a window of context;
3. a constant history -> SVR, whose local-level prediction makes any change stand out;
4. a strong, regular season with enough cycles of history (autocorrelation at the period
   >= `prophet_min_acf`, STL seasonal strength >= `prophet_min_seasonal_strength`, at least
   `prophet_min_cycles` periods, at most `prophet_max_missing_share` missing) -> Prophet;
5. point-to-point noise as large as the series' whole spread (`noise_ratio` >=
   `sr_min_noise_ratio`): nothing for a regression to predict, spikes are what matter ->
   `spiky_detector` (chosen leave-one-NAB-group-out: the rolling z-score scored higher than
   Spectral Residual on every held-out group);
6. otherwise (structure that the recent past predicts: trends, level shifts, smooth
   cycles) -> SVR.

Thresholds for flagging live here too, because they travel with the routing decision:
residual detectors flag |x_t - x̂_t| > τ with τ = `tau_multiplier` x the robust spread of
the history's residuals; SR flags its per-series normalised score above `sr_threshold`.
That τ decides cleaning. An alarm needs more: `alarm_tau_scale` x τ, and a deviation that at
most `alarm_history_share` of the history reached (by default: none, a deviation larger
than any of the last `history_days`): a false-alarm budget per series. The budget is read
from the history less its largest excursions (`alarm_history_skip_per_day` of them per day
of history plus `alarm_history_skip_per_1000_points` per 1,000 history points), so an earlier
anomaly does not raise the bar for the days it stays in the history. Anomalies come at a rate
per point: a week of 1-minute history holds five times as many as a week of 5-minute history,
so by default three excursions are left out of a week of 1-minute points and none out of a
week of 5-minute points. A level shift or burst can stay under the one-point alarm τ at every
point: `alarm_run_points` consecutive points (5 by default; 0 turns it off) beyond
`alarm_run_share` of it, all on one side, raise an alarm too when no such run of the history
(under the same budget) went as far. Alarms only: what is cleaned does not depend on it.

After routing, `fallback` compares the routed SVR or Prophet with the rolling z-score on the
series' own history: the one that alarms at the smaller deviation (in the series' units,
under the same budget) is kept.

Per-metric overrides: `RouterConfig(overrides={"gpu_capacity": {"detector": "svr",
"tau_multiplier": 8}})`; `config.for_metric("gpu_capacity")` gives the merged config.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

DetectorName = Literal["sr", "svr", "prophet", "zscore"]
DETECTORS: tuple[str, ...] = ("sr", "svr", "prophet", "zscore")


class RouterConfig(BaseModel):
    """Routing rules, flagging thresholds, gap filling and warm-up; every number is configurable."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    detector: Literal["auto", "sr", "svr", "prophet", "zscore"] = Field(
        "auto", description="force one detector for every series"
    )
    min_model_points: int = Field(96, ge=0, description="history points below which only SR is used")
    prophet_enabled: bool = Field(True, description="allow routing to Prophet (the slowest detector to fit)")
    prophet_min_acf: float = Field(0.6, description="autocorrelation at the profiled period needed for Prophet")
    prophet_min_seasonal_strength: float = Field(0.6, description="STL seasonal strength needed for Prophet")
    prophet_min_cycles: float = Field(3.0, ge=1.0, description="periods of history Prophet needs")
    prophet_max_missing_share: float = Field(0.2, ge=0.0, le=1.0, description="most missing share Prophet accepts")
    sr_min_noise_ratio: float = Field(0.5, description="noise/spread ratio from which SR is chosen over SVR")

    tau_multiplier: float = Field(4.0, gt=0, description="τ = multiplier x robust residual spread (SVR, Prophet)")
    sr_threshold: float = Field(4.0, gt=0, description="flag when the normalised SR score exceeds this")
    sr_min_residual: float = Field(
        2.0, ge=0, description="SR also needs |x - x̂| above this many robust residual spreads"
    )

    alarm_tau_scale: float = Field(
        1.5, ge=1.0, description="an alarm needs a deviation this many times the cleaning threshold (τ) at least"
    )
    alarm_history_share: float | None = Field(
        0.0,
        ge=0.0,
        lt=0.5,
        description="false-alarm budget: an alarm also needs a deviation that at most this share of the "
        "history's points reached (0: larger than any in the history the model was fitted on; None: no budget)",
    )
    alarm_history_skip_per_day: float = Field(
        0.0,
        ge=0.0,
        description="the false-alarm budget is read from the history less its largest excursions (runs of points "
        "beyond τ, joined as `alarm_merge_points` joins alarms), this many per day of history (rounded down): an "
        "earlier anomaly does not make the series blind to a smaller one while it stays in the history; a series "
        "whose history has more large excursions than that keeps a bar at its next largest (0: none skipped)",
    )
    alarm_history_skip_per_1000_points: float = Field(
        0.3,
        ge=0.0,
        description="also leave this many of the history's largest excursions per 1,000 history points out of the "
        "false-alarm budget (added to `alarm_history_skip_per_day`, the sum rounded down): anomalies come at a rate "
        "per point, so a series sampled every minute has five times as many in a week's history as one sampled "
        "every five minutes; at 0.3 a week of 1-minute points (10,080) skips 3, a week of 5-minute points (2,016) "
        "none (0: none skipped)",
    )
    alarm_run_points: int = Field(
        5,
        ge=0,
        description="a level shift or burst too small for a one-point alarm: an alarm also where the last this many "
        "points all deviate on the same side by more than `alarm_run_share` x the alarm τ, and the run's smallest "
        "deviation is beyond every such run of the history (the same false-alarm budget, the same excursions left "
        "out); SVR, Prophet and the rolling z-score only; alarms only, nothing cleaned changes (0: off; 5 with "
        "`alarm_run_share` 0.5 lifts the router on NAB and on the KPI proxy, see the README's benchmarks)",
    )
    alarm_run_share: float = Field(
        0.5, gt=0.0, le=1.0, description="each point of such a run deviates by more than this x the alarm τ"
    )
    fallback: bool = Field(
        True,
        description="at each refit, use the rolling z-score instead of the routed SVR or Prophet when the "
        "z-score alarms at a smaller deviation under the same budget on the series' own history",
    )
    spiky_detector: Literal["zscore", "sr"] = Field(
        "zscore", description="the detector for short or noise-dominated histories (rules 2 and 5)"
    )
    zscore_window: int = Field(288, ge=12, description="points in the rolling z-score's past mean")

    resolution_floor: float = Field(
        0.5, ge=0, description="residual spread is at least this x the typical nonzero step of the history"
    )
    min_relative_deviation: float = Field(
        1e-3, ge=0, description="residual spread is at least this x the history's magnitude (median |x| or range)"
    )
    max_fill_gap_points: int = Field(3, ge=0, description="longest run of missing points that is filled")
    max_anomaly_run: int = Field(
        3,
        ge=0,
        description=(
            "a flagged excursion (a spike, or a fall to zero) is cleaned only if the series comes back in at most "
            "this many points; otherwise it is a level shift, a burst of real demand or an idle spell: kept, marked "
            "`sustained` (0: no limit, every flagged point is cleaned)"
        ),
    )
    spike_height_factor: float = Field(
        3.0,
        ge=0.0,
        description="a flagged excursion that comes back within `max_anomaly_run` points is cleaned only when it "
        "stands more than this x the history's ordinary local-peak height (`spike_height_quantile`) above (or "
        "below) the values on both sides of it; a smaller one is the series' own noise or a short surge of real "
        "demand and is kept (0: no such test)",
    )
    spike_height_quantile: float = Field(
        0.99,
        gt=0.0,
        le=1.0,
        description="quantile of the history's local-peak heights (how far a point stands above or below both "
        "neighbours) that measures a series' ordinary excursions",
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
    fault_drop_share: float = Field(
        0.1, ge=0.0, le=1.0, description="a collapse starts at a value at most this share of x̂"
    )
    min_stuck_run: int = Field(
        6,
        ge=0,
        description="a run of one exact value longer than this many points (and than `stuck_run_factor` x the "
        "history's typical run) on a series whose history varies is a stuck exporter: its repeats are replaced "
        "by x̂ (0: no such rule)",
    )
    stuck_run_factor: float = Field(
        2.0, ge=1.0, description="a stuck run is longer than this x the 0.99 quantile of the history's run lengths"
    )
    stuck_max_repeat_share: float = Field(
        0.1,
        ge=0.0,
        le=1.0,
        description="a series can be stuck only if at most this share of its history's steps repeat the value "
        "before (a flat or step-like series holds values for hours; a count that repeats more often than this "
        "stands still in clustered plateaus, which a stuck exporter cannot be told from)",
    )
    max_stuck_run: int = Field(
        72, ge=0, description="a run of one value longer than this many points is kept as real (0: no limit)"
    )
    outage_max_idle_share: float | None = Field(
        0.01,
        ge=0.0,
        le=1.0,
        description="a fall to zero that comes back within `max_fault_run` points is an exporter outage, however "
        "long, on a series whose history hardly idles: at most this share of its points lie in runs of more than "
        "`max_anomaly_run` points at or below `fault_drop_share` x its median (a series that never idles does not "
        "idle for an hour and come back to where it was; one that does keeps its idle spells). None switches "
        "it off. The price: real demand does fall idle for the first time in a week now and then (100 min on "
        "Helios vcLJZ), and such an hour is replaced (the README's cleaning bench weighs it)",
    )
    scales_without_fault_shapes: bool = Field(
        False,
        description="read a history's typical step (the floor of its residual spread, so τ) and its peak height "
        "(the spike bar) without the points shaped like an exporter's faults: falls of at most `max_anomaly_run` "
        "points to `fault_drop_share` x the positive readings on both sides, and single points more than "
        "`spike_height_factor` x both neighbours. At faults on more than 1 % of the steps of a flat count the "
        "0.99 quantile of its peak heights is otherwise a fault's own size (Helios G2 slurm with the bench's "
        "faults: 72 GPUs against 0.6 without), and the next faults pass. Off by default: it cleans more of the "
        "faults (the tuning groupings' faulty telemetry: spike and drop error 428 -> 283 GPU-h) but the "
        "allocation study's unmet did not follow (see README, the fault regime)",
    )
    open_move_factor: float = Field(
        0.0,
        ge=0.0,
        description="a flagged move still open at the end of the data (the newest points: it cannot be told "
        "from a step of the demand yet) is cleaned only when it moved more than this x the history's "
        "`spike_height_quantile` one-step change from the point before it; a smaller one is kept as the demand "
        "stepping (a fall to zero is the collapse rule's). 0: off, every such move is cleaned as a point anomaly "
        "(the demand as it stands, the plan's level, then lags a real rise at the end of an hour)",
    )
    nonnegative: bool | None = Field(
        None,
        description="the metric is never negative (expected and clean values are clipped at 0); None: inferred "
        "from the history (no negative value in it)",
    )
    zero_inflated_share: float = Field(
        0.3,
        ge=0.0,
        le=1.0,
        description="share of exact zeros from which a non-negative history is zero-inflated: its residual spread "
        "is floored at its resolution even when it steps rarely, so a zero next to a small x̂ is not an anomaly",
    )
    alarm_merge_points: int = Field(
        12,
        ge=0,
        description="a deviating point within this many points of the previous deviating point belongs to the same "
        "event: it raises no new alarm (0: every deviating point is an alarm)",
    )
    refit_every_hours: float = Field(24.0, gt=0, description="streaming: the model is refitted this often (hours)")
    history_days: float = Field(7.0, gt=0, description="streaming: a refit sees at most this much history (days)")
    warmup_refit_hours: float = Field(
        1.0,
        gt=0,
        description="streaming: while the history before the regular refit is under `min_model_points`, refit this "
        "often (hours), so a new or short series is judged as soon as it has `min_history_points`",
    )
    min_history_points: int = Field(24, ge=3, description="streaming: fewest history points a model is fitted on")
    warmup_share: float = Field(0.15, ge=0.0, lt=1.0, description="share of a series used as history only")
    min_warmup_points: int = Field(48, ge=0, description="fewest history-only points when none is given")

    sr_window: int = Field(123, ge=23, description="SR sliding window (points)")
    svr_lags: int = Field(12, ge=1, description="lagged values the SVR sees")
    svr_max_train: int = Field(1500, ge=20, description="newest history points the SVR trains on")
    prophet_max_train: int = Field(1000, ge=20, description="most points Prophet trains on (history averaged down to it)")

    overrides: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="metric name -> fields to override for that metric"
    )

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
        data = self.model_dump()
        data.update(self.overrides[metric])
        data["overrides"] = {}
        return RouterConfig.model_validate(data)


def route(profile: dict, config: RouterConfig | None = None, metric: str | None = None) -> tuple[str, str]:
    """The detector for a profiled series and the reason, as (name, reason).

    `metric` selects per-metric overrides from the config.
    """
    cfg = (config or RouterConfig()).for_metric(metric)
    if cfg.detector != "auto":
        return cfg.detector, f"forced by configuration ({cfg.detector})"
    n_valid = int(profile.get("n_valid") or 0)
    if n_valid < cfg.min_model_points:
        return cfg.spiky_detector, f"history too short for a model ({n_valid} < {cfg.min_model_points} points)"
    if profile.get("constant"):
        return "svr", "constant history: local-level prediction makes any change stand out"

    period = profile.get("period")
    acf_p = profile.get("acf_period")
    seas = profile.get("stl_seasonal_strength")
    missing = profile.get("missing_share") or 0.0
    cycles = (n_valid / period) if period else 0.0
    if (
        cfg.prophet_enabled
        and period
        and acf_p is not None
        and acf_p >= cfg.prophet_min_acf
        and seas is not None
        and seas >= cfg.prophet_min_seasonal_strength
        and cycles >= cfg.prophet_min_cycles
        and missing <= cfg.prophet_max_missing_share
    ):
        return "prophet", (
            f"regular season: period {period} points ({profile.get('period_source')}), "
            f"acf {acf_p:.2f} >= {cfg.prophet_min_acf}, STL strength {seas:.2f} >= "
            f"{cfg.prophet_min_seasonal_strength}, {cycles:.1f} cycles"
        )
    noise = profile.get("noise_ratio")
    if noise is not None and noise >= cfg.sr_min_noise_ratio:
        return cfg.spiky_detector, (
            f"noise dominates (noise ratio {noise:.2f} >= {cfg.sr_min_noise_ratio}): spikes, not shape"
        )
    return "svr", (
        f"structured, not regularly seasonal (noise ratio {_fmt(noise)}, acf at period {_fmt(acf_p)}, "
        f"{profile.get('level_shifts')} level shifts): predicted from lags and calendar"
    )


def _fmt(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}"
