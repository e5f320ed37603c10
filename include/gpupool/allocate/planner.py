"""Which platform should hold each pool node for the coming hours: a mixed-integer program.

Inputs
------
* the pool inventory — one :class:`NodeRecord` per node (owner, GPUs, busy GPUs, whether it is in
  a handover, when it last moved, its MIG capability and layout);
* each platform's demand for the next hours — :class:`PlatformDemand`: per-hour ``mean`` and
  ``upper`` (the policy's ``headroom_quantile``) in the platform's unit (whole GPUs, or MIG slices
  such as ``1g.10gb``);
* the :class:`~gpupool.allocate.policy.Policy`.

Model
-----
Demand of platform ``p`` in hour ``h`` is taken as Normal with the given mean and the spread
implied by the upper quantile; for ``reactive`` and ``predictive`` that upper is at least
``1 + Policy.min_headroom`` times the mean where the pool could give every platform that much at
once, since a spread read from a week in which demand sat still says it cannot rise, and such a
platform then gives away every idle node. The expected unmet demand ``E[(D - c)+]`` is convex in the capacity
``c``; the program represents it exactly at a set of tangent points (a convex piecewise-linear
lower envelope), so "expected unmet" stays linear. The planner minimises

    sum_{p,h} w_p * g_p * U[p,h]                          (weighted expected unmet, GPU-hours)
  + idle_weight * sum_{p,h} g_p * (held[p] - mean[p,h] + U[p,h])   (expected idle held capacity)
  + move_cost * moves + layout_change_cost * re-layouts
  + source_risk * sum_p w_p * g_p * (F_p(held_after[p]) - F_p(held_now[p]))+   (what a source gives up later)
  + peak_weight * sum_p g_p * (peak[p] - held_after[p])+   (reactive, predictive: spare nodes park where demand has been)

where ``F_p(c) = E[(D_p - c)+]`` one horizon further out: demand as in the last horizon hour with
its spread grown as a random walk's (``sqrt 2`` for twice the lead time). Within the horizon two
sources that both keep enough look equally safe; the last term breaks that tie toward the source
with the most headroom left after giving (the platform with the largest surplus in its own spread
units), and, being small, it does not outweigh a real difference in expected unmet within the
horizon.

and ``peak[p]`` is the platform's highest hourly demand over the last week
(:attr:`PlatformDemand.peak`). The last term is small, and on only where the pool could hold
every platform's peak at once: it parks the nodes the pool can spare with platforms that held
more demand lately than they hold nodes now.

``g_p`` converts the platform's unit to GPUs. A node that moves serves nobody for
``move_minutes``; a node leaves its source at once. Each hour is cut into slots where some node
starts serving (a move's arrival, a re-layout's end, a handover in flight), ``U[p,h]`` is the
slot-length-weighted sum of each slot's expected unmet, and a node counts fully in the slots
after it arrives and not at all before — so an arriving node is credited with the part of the
hour it really serves, not with a fraction of itself over the whole hour (which overstated a
move's gain whenever the shortfall was smaller than the node). Identical nodes are grouped into
classes with integer counts, so the program is small and its solution is unique up to the
deterministic choice of which member of a class moves — the plan is idempotent.

Constraints: each node has one target; at most ``max_moves_per_decision`` moves; only idle nodes
(``busy_gpus == 0``, unless the policy may evict), not in a handover and out of their cool-down
may move, and the GPUs leaving a platform never exceed its idle GPUs; per-platform min/max node
counts are soft (large penalty) but never made worse than they are now. If the MILP solver
fails, a greedy search over single actions on the same exact objective is used and the plan
says so.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.special import ndtr, ndtri

from gpupool.values import utc
from gpupool.errors import UserError
from gpupool import mig
from gpupool.allocate.policy import Policy

#: the MIG table lives in gpupool.mig; re-exported here for the planner's callers
SLICES_PER_GPU = mig.SLICES_PER_GPU
WHOLE_LAYOUTS = mig.WHOLE_LAYOUTS
GPU_UNIT = "gpu"

_BOUND_PENALTY = 1e4  # per node outside a platform's min/max: above any realistic demand gain
_TANGENT_Z = np.linspace(-3.0, 3.0, 13)
_FAR_TANGENT_Z = np.linspace(-3.0, 4.5, 16)  # further into the tail: the source term is about small risks
_FAR_SPREAD = math.sqrt(2.0)  # one horizon further out: twice the lead time, a random walk's spread
_SQRT_2PI = math.sqrt(2.0 * math.pi)


def _infeasible_bounds(policy: Policy, platforms: Sequence[str], nodes: int) -> str | None:
    """Why the platforms' node bounds cannot all hold with ``nodes`` nodes in all, or None.

    The bounds count every node a platform holds (movable or not), so only the whole inventory
    can tell: a pool listed in the configuration does not (its non-members count too)."""
    low = sum(policy.min_nodes.get(p, 0) for p in platforms)
    if low > nodes:
        return f"infeasible bounds: platforms' min_nodes add up to {low} but the platforms hold {nodes} nodes in all"
    if all(p in policy.max_nodes for p in platforms):
        high = sum(policy.max_nodes[p] for p in platforms)
        if high < nodes:
            return f"infeasible bounds: platforms' max_nodes add up to {high} but the platforms hold {nodes} nodes in all"
    return None


class PlanningError(UserError, ValueError):
    """Inputs the planner cannot plan from (duplicate nodes, demand of unequal horizons, ...)."""


@dataclass(frozen=True)
class NodeRecord:
    """One pool node as the planner sees it.

    ``owner`` is the platform that holds the node — for a node in a handover, the platform it is
    moving to; ``available_in_minutes`` says when such a node can serve (``None``: a whole move).
    """

    name: str
    owner: str
    gpus: int
    busy_gpus: float = 0.0
    in_handover: bool = False
    last_moved_at: pd.Timestamp | None = None
    mig_capable: bool = False
    mig_layout: str | None = None
    available_in_minutes: float | None = None

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> "NodeRecord":
        """Build from a dict such as a simulator or platform inventory entry."""
        owner = raw.get("owner", raw.get("platform"))
        if owner is None:
            raise PlanningError(f"node {raw.get('name')!r}: no 'owner' (or 'platform')")
        last = raw.get("last_moved_at")
        return cls(
            name=str(raw["name"]),
            owner=str(owner),
            gpus=int(raw["gpus"]),
            busy_gpus=float(raw.get("busy_gpus", 0.0) or 0.0),
            in_handover=bool(raw.get("in_handover", raw.get("in_transit", False))),
            last_moved_at=None if last is None or pd.isna(last) else utc(last),
            mig_capable=bool(raw.get("mig_capable", False)),
            mig_layout=raw.get("mig_layout"),
            available_in_minutes=raw.get("available_in_minutes"),
        )


@dataclass(frozen=True)
class PlatformDemand:
    """A platform's demand for the next hours, one number per hour, in its ``unit``."""

    mean: tuple[float, ...]
    upper: tuple[float, ...]
    unit: str = GPU_UNIT
    #: the highest hourly demand of the platform's last week (None: not known); where the pool has
    #: nodes to spare, the plan parks them up to it (``Policy.peak_weight``)
    peak: float | None = None

    @classmethod
    def coerce(cls, platform: str, value: Any) -> "PlatformDemand":
        """Accept a PlatformDemand, a mapping ``{mean, upper?, unit?}`` or a plain sequence (certain)."""
        if isinstance(value, PlatformDemand):
            out = value
        elif isinstance(value, Mapping):
            if "mean" not in value:
                raise PlanningError(f"demand of {platform!r}: needs 'mean'")
            mean = _floats(platform, "mean", value["mean"])
            upper = _floats(platform, "upper", value["upper"]) if value.get("upper") is not None else mean
            peak = value.get("peak")
            if peak is not None:
                peak = _floats(platform, "peak", [peak])[0]
            out = cls(mean=mean, upper=upper, unit=str(value.get("unit", GPU_UNIT)), peak=peak)
        else:
            mean = _floats(platform, "mean", value)
            out = cls(mean=mean, upper=mean)
        if len(out.mean) != len(out.upper):
            raise PlanningError(f"demand of {platform!r}: mean has {len(out.mean)} hours, upper {len(out.upper)}")
        if out.unit != GPU_UNIT and out.unit not in SLICES_PER_GPU:
            raise PlanningError(f"demand of {platform!r}: unknown unit {out.unit!r} (use 'gpu' or a MIG profile)")
        return out


@dataclass(frozen=True)
class Move:
    """One node to hand over from ``source`` to ``target``."""

    node: str
    source: str
    target: str
    gpus: int
    expected_gain: float  # GPU-hours of objective the move saves, other moves held fixed
    mig_layout: str | None  # the layout the node should have on arrival
    reason: str


@dataclass(frozen=True)
class LayoutChange:
    """A MIG re-layout of a node that stays on its platform."""

    node: str
    platform: str
    from_layout: str | None
    to_layout: str
    expected_gain: float
    reason: str


@dataclass(frozen=True)
class Plan:
    """The planner's answer: target owner of every node, the moves, and why."""

    at: pd.Timestamp | None
    policy: str
    solver: str  # "milp", "greedy" (fallback or forced) or "none" (nothing to decide)
    status: str
    moves: tuple[Move, ...]
    layout_changes: tuple[LayoutChange, ...]
    targets: dict[str, str]
    expected_unmet_before: dict[str, float]  # per platform, over the horizon, platform units x hours
    expected_unmet_after: dict[str, float]
    objective_before: float
    objective_after: float
    reasons: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict:
        """A JSON-ready dict."""
        out = asdict(self)
        out["at"] = None if self.at is None else self.at.isoformat()
        out["moves"] = [asdict(m) for m in self.moves]
        out["layout_changes"] = [asdict(c) for c in self.layout_changes]
        out["reasons"] = list(self.reasons)
        return out


# --------------------------------------------------------------------------------------------
# what the planner plans on: one function per demand source, shared by the pipeline's plan
# stage and `gpupool simulate`


#: hours of a forecast's own track record the plan weighs it on
SKILL_HOURS = 48
#: scored hours a forecast's record must cover before the plan may use it: until then the plan
#: is reactive's, the simple baseline (as the spread rules keep ``SPREAD_BASE`` until their record
#: is long enough). Trusting the model without a record decided the first hours of a cold start
#: by chance: on the six-day Helios regimes it won one (G3 115 %: 8.2 vs 11.9 GPU-h) and lost one
#: (G3 100 %: 94.6 vs 93.3); on the tuning groupings G1-G2 it changed nothing
MIN_SKILL_HOURS = 6
#: how much lower the forecast's RMSE over its record must be than the naive forecast's for the
#: plan to use it (as ``SPREAD_MARGIN`` for the spread rules): a record that is only level with
#: reacting is no reason to plan on the model. On the shared Helios traces the forecast's RMSE is
#: about twice the naive's in the first days and level with it once a week of history is behind
#: it (its ``naive`` model ties exactly); the hours where it edged ahead by under 10 % were coin
#: flips, and over a month they left predictive 2.6 % above reactive (see the README)
SKILL_MARGIN = 0.1
#: hours of the series' own hour-ahead changes the last-hour demand's spread is measured on
#: (a week: every hour of the day and most days of the week seen at least once)
CHANGE_HOURS = 168
#: the share of those hours, nearest the current level, the spread is taken from
LEVEL_SHARE = 0.5
#: fewest changes a quantile is taken of
MIN_CHANGES = 12
#: how the last hour's error grows ahead (see :func:`demand_from_last_hour`); ``chosen`` lets
#: each series' own record pick one of :data:`SPREAD_RULES` (:func:`spread_record`)
SPREADS = ("chosen", "empirical", "random_walk", "wider")
#: the rule a caller that names none gets (``Policy.demand_spread``'s default)
DEFAULT_SPREAD = "chosen"
#: the rules a series' record chooses between
SPREAD_RULES = ("random_walk", "empirical", "wider")
#: the rule a series keeps unless its own record clearly favours another. Chosen on the tuning
#: groupings G1, G2 (reactive, 100 % and 115 % pools, no cleaning; mean unmet GPU-h per run):
#: 6 days — empirical alone 35.6, chosen from the empirical 33.3, from the random walk 35.8
#: (random walk alone 35.8); 10 days — 223.0, 220.7, 227.1 (227.2). The random walk, the simpler
#: rule, loses there as a base: on those series its one-hour record is level with the
#: empirical rule's while the plans made on it leave more unmet
SPREAD_BASE = "empirical"
#: hours of the series' own one-hour-ahead changes each rule is scored on, out of sample
SPREAD_SCORE_HOURS = CHANGE_HOURS
#: scored hours before the record may overrule the base rule
MIN_SPREAD_HOURS = 24
#: how much lower another rule's mean quantile loss must be than the base rule's to replace it
SPREAD_MARGIN = 0.1
#: hourly demand a caller reads so that every scored hour has a full lookback before it
SPREAD_HISTORY_HOURS = CHANGE_HOURS + SPREAD_SCORE_HOURS


@dataclass(frozen=True)
class SpreadRecord:
    """How each spread rule's one-hour-ahead upper bound did on the series' own recent hours.

    ``loss`` is the mean quantile (pinball) loss at the policy's quantile of each rule in
    :data:`SPREAD_RULES`, each hour judged by the bound the rule computed from the hours before it.
    """

    hours: int
    loss: dict[str, float]

    @property
    def choice(self) -> str:
        """The rule the plan uses: ``SPREAD_BASE`` until the record covers ``MIN_SPREAD_HOURS``;
        after that the rule of lowest loss, where it beats the base rule's by ``SPREAD_MARGIN``."""
        base = SPREAD_BASE
        if self.hours < MIN_SPREAD_HOURS:
            return base
        best = min(SPREAD_RULES, key=lambda r: (self.loss[r], SPREAD_RULES.index(r)))
        return best if self.loss[best] < (1.0 - SPREAD_MARGIN) * self.loss[base] else base


@dataclass(frozen=True)
class ForecastSkill:
    """How the forecast did against the reactive plan's naive forecast on the platform's own recent hours."""

    hours: int
    rmse_forecast: float
    rmse_naive: float

    @property
    def forecast_wins(self) -> bool:
        """Whether the plan uses the forecast: only once its record covers ``MIN_SKILL_HOURS``
        and while its RMSE there is ``SKILL_MARGIN`` below the naive forecast's (a perfect record
        on a flat series, both 0, keeps it). Without such a record the plan is reactive's."""
        return self.hours >= MIN_SKILL_HOURS and self.rmse_forecast <= (1.0 - SKILL_MARGIN) * self.rmse_naive


def forecast_skill(issued: pd.Series, hourly: pd.Series, hours: int = SKILL_HOURS,
                   levels: pd.Series | None = None) -> ForecastSkill:
    """Score the one-hour-ahead forecasts ``issued`` (indexed by the hour they forecast) against
    the hourly demand seen since, beside the naive forecast, over the last ``hours`` scored.

    With ``levels`` (demand as it stood at the start of each hour, ``canonical.hourly_levels``)
    both sides are scored as the plan uses them: the naive forecast is the level — what the
    reactive plan plans on — and the forecast is anchored on it like
    :func:`demand_from_forecast` anchors it (its change from the hour before, added to the
    level). So a forecast that lost to reacting is dropped for exactly the reactive plan.
    Without ``levels`` the naive forecast is the hour before and the forecast is taken as issued.
    """
    if issued.dropna().empty:
        return ForecastSkill(0, math.inf, math.inf)
    seen = hourly.dropna()
    # the last hour seen before each hour (the plan's last hour, across hours without data)
    before = seen.asfreq("1h").ffill().shift(1, freq="1h") if len(seen) else seen
    if levels is None:
        naive, fc = before, issued
    else:
        # where no level stood, the plan took the last hour seen and did not anchor
        naive = levels.dropna().combine_first(before)
        fc = issued + (naive - before)
    both = pd.DataFrame({"fc": fc, "actual": seen, "naive": naive}).dropna()
    both = both.iloc[-hours:]
    if both.empty:
        return ForecastSkill(0, math.inf, math.inf)
    err_fc = both["actual"].to_numpy() - both["fc"].to_numpy()
    err_naive = both["actual"].to_numpy() - both["naive"].to_numpy()
    return ForecastSkill(len(both), float(np.sqrt(np.mean(err_fc**2))), float(np.sqrt(np.mean(err_naive**2))))


#: days of the same hour's changes the daily shape is averaged over (a week: each weekday once)
DAILY_DAYS = 7
#: fewest of those days with data before a daily change is computed
MIN_DAILY_DAYS = 3
#: scored (origin, hour ahead) pairs before the daily shape's record may be believed: a day of
#: origins at a two-hour horizon
MIN_DAILY_SCORED = 48
#: hourly demand and levels a caller reads for :func:`daily_record` (its record's origins, each
#: with ``DAILY_DAYS`` days behind it, and the hours they forecast)
DAILY_HISTORY_HOURS = SKILL_HOURS + 24 * DAILY_DAYS + 2


@dataclass(frozen=True)
class DailyRecord:
    """The daily shape of a platform's demand, as a change from demand as it stands.

    ``change[h - 1]`` is the median, over the last :data:`DAILY_DAYS` days, of how far the mean
    of the hour ``h - 1`` hours after this time of day lay from the level at this time of day. A
    platform whose demand rises every morning and falls every evening has a positive change
    before its peak and a negative one after it; one without a daily shape has changes near zero.
    The median, not the mean: one day's burst at this hour is not planned on for a week.
    ``rmse_daily`` / ``rmse_naive``: how the level plus the change (each origin's own change,
    from the days before it) and the level alone forecast the hours ahead of each of the last
    :data:`SKILL_HOURS` origins, over ``scored`` (origin, hour ahead) pairs.
    """

    change: tuple[float, ...] | None
    scored: int
    rmse_daily: float
    rmse_naive: float

    @property
    def wins(self) -> bool:
        """Whether the plan adds the change: only on a record of ``MIN_DAILY_SCORED`` pairs where
        it forecast ``SKILL_MARGIN`` better than the level alone (as a forecast must)."""
        return (self.change is not None and self.scored >= MIN_DAILY_SCORED
                and self.rmse_daily <= (1.0 - SKILL_MARGIN) * self.rmse_naive)


def daily_record(hourly: pd.Series, levels: pd.Series, at: pd.Timestamp, horizon: int,
                 hours: int = SKILL_HOURS, days: int = DAILY_DAYS) -> DailyRecord:
    """The daily change ahead of ``at`` (:class:`DailyRecord`) from ``hourly`` (each hour's mean
    demand, indexed by the hour's start) and ``levels`` (demand as it stood at each hour's start,
    :func:`gpupool.canonical.hourly_levels`), with its record over the last ``hours`` origins."""
    at = pd.Timestamp(at)
    hour = pd.Timedelta("1h")
    none = DailyRecord(None, 0, math.inf, math.inf)
    if horizon < 1 or hourly.dropna().empty or levels.dropna().empty:
        return none
    first = at - (hours + 24 * days) * hour
    grid = pd.date_range(first, at, freq=hour)  # the origins: every whole hour up to `at`
    hourly = hourly[~hourly.index.duplicated(keep="last")]
    levels = levels[~levels.index.duplicated(keep="last")]
    lev = levels.reindex(grid).to_numpy(float)
    change, sq_daily, sq_naive, scored = [], 0.0, 0.0, 0
    scored_from = len(grid) - 1 - hours  # the origins of the record: the last `hours` before `at`
    for h in range(1, horizon + 1):
        # how far the mean of the hour h - 1 hours after each origin lay from the origin's level
        ahead = np.array(hourly.reindex(grid + (h - 1) * hour), dtype=float)
        ahead[grid + (h - 1) * hour >= at] = np.nan  # not seen yet at `at`
        dev = ahead - lev
        # each origin's change: the median of the same deviation on the `days` days before it
        past = np.full((days, len(grid)), np.nan)
        for d in range(1, days + 1):
            past[d - 1, 24 * d:] = dev[: len(grid) - 24 * d]
        count = np.sum(np.isfinite(past), axis=0)
        mu = np.full(len(grid), np.nan)
        enough = count >= MIN_DAILY_DAYS
        mu[enough] = np.nanmedian(past[:, enough], axis=0)
        if not math.isfinite(mu[-1]):
            return none
        change.append(float(mu[-1]))
        ok = np.isfinite(dev) & np.isfinite(mu)
        ok[: max(scored_from, 0)] = False
        sq_daily += float(np.sum((dev[ok] - mu[ok]) ** 2))
        sq_naive += float(np.sum(dev[ok] ** 2))
        scored += int(ok.sum())
    n = max(scored, 1)  # no pair scored: both 0, and `wins` asks for MIN_DAILY_SCORED pairs anyway
    return DailyRecord(tuple(change), scored, math.sqrt(sq_daily / n), math.sqrt(sq_naive / n))


def with_daily_change(demand: PlatformDemand, daily: DailyRecord | None) -> PlatformDemand:
    """``demand`` (planned on the level, :func:`demand_from_last_hour`) moved by the daily change
    when its record wins (:attr:`DailyRecord.wins`); else ``demand`` as it is."""
    if daily is None or not daily.wins:
        return demand
    change = np.asarray(daily.change, dtype=float)  # one per hour ahead, as the demand's
    mean = np.clip(np.asarray(demand.mean) + change, 0.0, None)
    upper = np.clip(np.asarray(demand.upper) + change, 0.0, None)
    return PlatformDemand(mean=tuple(round(float(v), 6) for v in mean),
                          upper=tuple(round(float(v), 6) for v in upper), unit=demand.unit, peak=demand.peak)


def demand_from_forecast(
    yhat: Sequence[float],
    yhat_upper: Sequence[float],
    level: float,
    within_hour_sd: float,
    headroom_quantile: float,
    skill: ForecastSkill | None = None,
    hourly: pd.Series | None = None,
    latest: float | None = None,
    spread: str | None = None,
    daily: DailyRecord | None = None,
) -> PlatformDemand:
    """The planner's demand from an hourly forecast: its mean, and an upper bound at the policy's quantile.

    The forecast is of each hour's *mean*; the world serves every step of the hour. The spread
    the planner plans on is therefore the forecast's error (its interval at ``level``, Normal)
    and the spread of demand inside an hour (``within_hour_sd``, seen in the telemetry) together:
    ``sigma = sqrt(sigma_forecast^2 + within_hour_sd^2)``. Planning on the mean alone leaves a
    platform short at every step above it.

    With ``latest`` (demand as it stands, see :func:`demand_from_last_hour`) and ``hourly``, the
    forecast's change from the last hour is planned from ``latest``: a burst inside the last
    hour that the hourly model has not yet seen is not forgotten.

    With ``skill`` (the forecast's own track record, :func:`forecast_skill`) and the ``hourly``
    demand seen: unless the model has forecast this platform clearly better than the last hour
    over its recent hours (``ForecastSkill.forecast_wins``, by ``SKILL_MARGIN``), the plan uses
    the last hour (:func:`demand_from_last_hour`, with ``latest`` and ``spread``) — the method
    notices on the series' own history that the simple baseline is as good, and falls back to it.

    ``daily`` (:func:`daily_record`): where the platform's daily shape has clearly beaten the
    level alone on its own record (:attr:`DailyRecord.wins`), the plan is the last hour moved by
    that shape (:func:`with_daily_change`), whatever the model's record: it is the simpler of the
    two forecasts, and on demand with a daily rhythm and persistent noise it is the better one —
    the hourly model seldom beats demand as it stands one hour ahead there (the level already
    holds the noise), while the level moved along the usual change at this time of day does.
    """
    if hourly is not None and daily is not None and daily.wins:
        return with_daily_change(demand_from_last_hour(hourly, within_hour_sd, len(tuple(yhat)), headroom_quantile,
                                                       spread=spread, latest=latest), daily)
    if skill is not None and hourly is not None and not skill.forecast_wins:
        return demand_from_last_hour(hourly, within_hour_sd, len(tuple(yhat)), headroom_quantile,
                                     spread=spread, latest=latest)
    mean = np.asarray(yhat, dtype=float)
    seen = hourly.dropna() if hourly is not None else pd.Series(dtype=float)
    if latest is not None and math.isfinite(latest) and len(seen):
        # the forecast's change from the last hour, from where demand stands now (tuning
        # groupings: 729 against 736 GPU-h unmet unanchored)
        mean = mean + (float(latest) - float(seen.iloc[-1]))
    mean = np.clip(mean, 0.0, None)
    z_fc = float(ndtri(0.5 + float(level) / 200.0))
    sigma_fc = np.clip(np.asarray(yhat_upper, dtype=float) - mean, 0.0, None) / z_fc
    if skill is not None and skill.hours >= MIN_SKILL_HOURS:
        # the model's interval, but never narrower than the errors it really made
        sigma_fc = np.maximum(sigma_fc, skill.rmse_forecast * np.sqrt(np.arange(1, len(mean) + 1)))
    sigma = np.sqrt(sigma_fc**2 + float(within_hour_sd) ** 2)
    return _normal_demand(mean, sigma, headroom_quantile, _week_peak(hourly))


def demand_from_last_hour(
    hourly: pd.Series,
    within_hour_sd: float,
    horizon: int,
    headroom_quantile: float,
    lookback: int | None = None,
    spread: str | None = None,
    latest: float | None = None,
) -> PlatformDemand:
    """The reactive planner's demand: demand as it stands now for every hour ahead, with its spread.

    Where ``latest`` is given (the mean of the last steps seen, ``canonical.demand_of_steps``'s
    ``level``) it is the level planned on, else the last hour's mean: a burst that began inside
    the hour is half hidden in the hour's mean, and reacting to it an hour late costs the burst's
    first hour twice over (measured on the tuning groupings: 6-8 % less unmet). This naive
    forecast's error ``h`` hours ahead (``spread``):

    * ``"empirical"`` — the series' own ``h``-hour-ahead changes over the last ``lookback`` hours,
      from the hours whose level was nearest the last hour's (:func:`hour_ahead_changes`): the
      planner's ``upper`` is the last hour plus their ``headroom_quantile`` quantile, so a series
      that bursts up more than it falls is planned on its own upward tail;
    * ``"random_walk"`` — ``sqrt(h)`` times the root mean square of the hour-to-hour changes;
    * ``"wider"`` — the larger of the two;
    * ``"chosen"`` (the default) — whichever of the three the series' own recent hours favour
      (:func:`spread_record`: each rule's one-hour-ahead bound scored out of sample by its quantile
      loss), ``SPREAD_BASE`` unless another is clearly better: the empirical rule carries over
      from some platforms to others and not to all, so each series decides on its own record.

    The spread inside an hour is added as for :func:`demand_from_forecast`.
    """
    spread = spread or DEFAULT_SPREAD
    if spread not in SPREADS:
        raise PlanningError(f"spread must be one of {', '.join(SPREADS)}, got {spread!r}")
    lookback = lookback or CHANGE_HOURS
    seen = hourly.dropna()
    last = float(seen.iloc[-1]) if len(seen) else 0.0
    if latest is not None and math.isfinite(latest):
        last = float(latest)
    last = max(last, 0.0) if math.isfinite(last) else 0.0
    y = _hour_grid(hourly)
    if spread == "chosen":
        spread = spread_record(hourly, headroom_quantile, lookback).choice
    up = _change_bound(y, horizon, last, headroom_quantile, lookback, spread)
    sigma_change = up / float(ndtri(headroom_quantile))
    sigma = np.sqrt(sigma_change**2 + float(within_hour_sd) ** 2)
    return _normal_demand(np.full(horizon, last), sigma, headroom_quantile, _week_peak(hourly))


def _week_peak(hourly: pd.Series | None) -> float | None:
    """The highest hourly demand of the last ``CHANGE_HOURS`` hours seen, or None."""
    if hourly is None:
        return None
    y = _hour_grid(hourly)[-CHANGE_HOURS:]
    y = y[np.isfinite(y)]
    return float(y.max()) if len(y) else None


def _hour_grid(hourly: pd.Series) -> np.ndarray:
    """The series on its hourly grid (NaN where an hour has no value), oldest first."""
    seen = hourly.dropna()
    if isinstance(seen.index, pd.DatetimeIndex) and len(seen):
        seen = seen.asfreq("1h")
    return seen.to_numpy(float)


def _change_bound(y: np.ndarray, horizon: int, level: float, quantile: float, lookback: int,
                  rule: str) -> np.ndarray:
    """How far above ``level`` demand may be ``h = 1..horizon`` hours on, at ``quantile``, by ``rule``,
    from the hourly grid ``y`` (the hours before the plan)."""
    z = float(ndtri(quantile))
    if rule == "empirical":
        return np.clip(_changes_quantile(y, horizon, level, quantile, lookback), 0.0, None)
    if rule == "random_walk":
        seen = y[np.isfinite(y)]
        changes = np.diff(seen)[-lookback:]
        step_sd = float(np.sqrt(np.mean(changes**2))) if len(changes) >= 2 else 0.0
        return z * np.sqrt(np.arange(1, horizon + 1, dtype=float)) * step_sd
    if rule == "wider":
        return np.maximum(_change_bound(y, horizon, level, quantile, lookback, "empirical"),
                          _change_bound(y, horizon, level, quantile, lookback, "random_walk"))
    raise PlanningError(f"spread rule must be one of {', '.join(SPREAD_RULES)}, got {rule!r}")


def spread_record(hourly: pd.Series, quantile: float, lookback: int | None = None,
                  hours: int = SPREAD_SCORE_HOURS) -> SpreadRecord:
    """Score each of :data:`SPREAD_RULES` on the series' own last ``hours`` one-hour-ahead changes.

    Each scored hour ``t`` is judged by the upper bound the rule gives from the hours before ``t``
    (from the level of hour ``t - 1``, on at most ``lookback`` hours), so the record is out of
    sample; the loss is the quantile (pinball) loss at ``quantile`` of the hour's change against
    that bound. Only hours with ``MIN_CHANGES`` one-hour changes before them count (before that
    no rule has data to speak of); hours without a value are not bridged.
    """
    lookback = lookback or CHANGE_HOURS
    y = _hour_grid(hourly)
    total = {r: 0.0 for r in SPREAD_RULES}
    scored = 0
    ok = np.isfinite(y[1:]) & np.isfinite(y[:-1])  # ok[t - 1]: the change into hour t is seen
    seen_before = np.concatenate([[0], np.cumsum(ok)])  # changes seen into hours 1..t-1
    for t in range(max(1, len(y) - hours), len(y)):
        if not ok[t - 1]:
            continue
        lo = max(0, t - (lookback + 1))
        if seen_before[t - 1] - seen_before[lo] < MIN_CHANGES:
            continue
        past = y[lo:t]
        change = y[t] - y[t - 1]
        emp = _change_bound(past, 1, y[t - 1], quantile, lookback, "empirical")[0]
        rw = _change_bound(past, 1, y[t - 1], quantile, lookback, "random_walk")[0]
        bounds = {"random_walk": rw, "empirical": emp, "wider": max(rw, emp)}
        for rule in total:
            miss = change - bounds[rule]
            total[rule] += quantile * miss if miss >= 0 else (quantile - 1.0) * miss
        scored += 1
    return SpreadRecord(scored, {r: (float(v) / scored if scored else math.inf) for r, v in total.items()})


def hour_ahead_changes(hourly: pd.Series, horizon: int, level: float, quantile: float,
                       lookback: int | None = None) -> np.ndarray:
    """The ``quantile`` of the series' own ``h``-hour-ahead changes, ``h = 1..horizon``.

    Only the last ``lookback`` hours count, and of their hours the ``LEVEL_SHARE`` whose demand was
    nearest ``level`` (at least ``MIN_CHANGES``): how far demand rose from where it stands now
    is what the plan must cover, and a busy platform does not move like an idle one. Hours the
    series has no value for are not bridged. Zeros when fewer than ``MIN_CHANGES`` changes exist.
    """
    return _changes_quantile(_hour_grid(hourly), horizon, level, quantile, lookback or CHANGE_HOURS)


def _changes_quantile(y: np.ndarray, horizon: int, level: float, quantile: float, lookback: int) -> np.ndarray:
    """:func:`hour_ahead_changes` on the hourly grid ``y``."""
    out = np.zeros(horizon)
    if np.isfinite(y).sum() < 2:
        return out
    y = y[-(lookback + 1):]
    for k in range(1, horizon + 1):
        if len(y) <= k:
            break
        origin, ahead = y[:-k], y[k:]
        ok = np.isfinite(origin) & np.isfinite(ahead)
        origin, change = origin[ok], (ahead - origin)[ok]
        if len(change) < MIN_CHANGES:
            continue
        keep = max(MIN_CHANGES, int(math.ceil(LEVEL_SHARE * len(change))))
        nearest = np.argsort(np.abs(origin - level), kind="stable")[:keep]
        out[k - 1] = float(np.quantile(change[nearest], quantile))
    return np.maximum.accumulate(out)


def _normal_demand(mean: np.ndarray, sigma: np.ndarray, headroom_quantile: float,
                   peak: float | None = None) -> PlatformDemand:
    z = float(ndtri(headroom_quantile))
    upper = mean + z * sigma
    return PlatformDemand(mean=tuple(round(float(v), 6) for v in mean),
                          upper=tuple(round(float(v), 6) for v in upper), peak=peak)


# --------------------------------------------------------------------------------------------
# capacity in a platform's unit


def units_per_gpu(unit: str) -> int:
    """Slices of ``unit`` one GPU holds when laid out for it (1 for whole GPUs)."""
    return 1 if unit == GPU_UNIT else SLICES_PER_GPU[unit]


def ideal_layout(node: NodeRecord, unit: str) -> str | None:
    """The MIG layout that serves ``unit`` best on ``node`` (unchanged for a non-MIG node)."""
    if not node.mig_capable:
        return node.mig_layout
    return mig.uniform_layout(None if unit == GPU_UNIT else unit)


def node_capacity(node: NodeRecord, unit: str, layout: str | None) -> float:
    """How many requests of ``unit`` ``node`` serves in ``layout``.

    A whole GPU serves one whole-GPU request or one slice request; a GPU laid out as ``all-X``
    serves ``slices(X)`` requests of a profile no bigger than X, and no whole-GPU request.
    """
    if layout in WHOLE_LAYOUTS or not node.mig_capable:
        return float(node.gpus)
    profile = mig.layout_profile(layout)
    if profile not in SLICES_PER_GPU:
        return 0.0
    if unit == GPU_UNIT:
        return 0.0
    if _compute_size(profile) >= _compute_size(unit):
        return float(node.gpus * SLICES_PER_GPU[profile])
    return 0.0


def _compute_size(profile: str) -> int:
    return int(profile.split("g.", 1)[0])


# --------------------------------------------------------------------------------------------
# expected unmet demand


def expected_unmet(capacity: np.ndarray | float, mean: np.ndarray | float, sigma: np.ndarray | float) -> np.ndarray:
    """``E[(D - c)+]`` for ``D ~ Normal(mean, sigma)``, element-wise; ``(mean - c)+`` when sigma = 0."""
    c, m, s = np.broadcast_arrays(np.asarray(capacity, float), np.asarray(mean, float), np.asarray(sigma, float))
    shape = c.shape
    c, m, s = c.ravel(), m.ravel(), s.ravel()
    out = np.maximum(m - c, 0.0)
    pos = s > 1e-9
    if pos.any():
        z = (c[pos] - m[pos]) / s[pos]
        out[pos] = s[pos] * np.exp(-0.5 * z * z) / _SQRT_2PI + (m[pos] - c[pos]) * ndtr(-z)
    return out.reshape(shape)


def _tangents(mean: float, sigma: float, zs: np.ndarray = _TANGENT_Z) -> list[tuple[float, float]]:
    """Lines ``U >= a - b c`` whose maximum (with U >= 0) is the convex envelope of expected unmet."""
    lines = [(mean, 1.0)]  # U >= mean - c (the asymptote)
    if sigma > 1e-9:
        for z in zs:
            c0 = mean + z * sigma
            f0 = float(expected_unmet(c0, mean, sigma))
            slope = float(ndtr(-z))  # -f'(c0)
            lines.append((f0 + slope * c0, slope))
    return lines


# --------------------------------------------------------------------------------------------
# the planner


@dataclass(frozen=True)
class _Option:
    kind: str  # "keep" | "relayout" | "move"
    target: str
    capacity: float  # in the target's unit
    avail: tuple[float, ...]  # fraction of each horizon hour the node serves
    cost: float
    layout: str | None


@dataclass
class _Class:
    owner: str
    gpus: int
    options: tuple[_Option, ...]
    members: list[NodeRecord]
    movable: bool


def plan(
    nodes: Iterable[NodeRecord | Mapping[str, Any]],
    demand: Mapping[str, PlatformDemand | Mapping[str, Any] | Sequence[float]],
    policy: Policy | None = None,
    at: str | pd.Timestamp | dt.datetime | None = None,
    solver: str = "auto",
) -> Plan:
    """Choose the target platform (and MIG layout) of every pool node.

    Parameters
    ----------
    nodes:
        The pool: :class:`NodeRecord` or mappings with the same keys (``platform`` is read as
        ``owner``). Order does not matter; names must be unique.
    demand:
        Platform -> demand over the next hours (:class:`PlatformDemand`, ``{mean, upper, unit}``
        or a sequence of certain numbers). A platform that owns nodes but has no demand entry is
        planned with zero demand.
    policy:
        The knobs; ``Policy()`` when omitted. ``kind="static"`` never moves anything.
    at:
        The decision time (for cool-downs); nodes' ``last_moved_at`` are compared with it.
    solver:
        ``"auto"`` (MILP, greedy if it fails), ``"milp"`` (MILP only; a failure raises) or
        ``"greedy"``.

    Returns
    -------
    Plan
        Same inputs, same plan.
    """
    policy = policy or Policy()
    at_ts = None if at is None else utc(at)
    records = _records(nodes)
    platforms = sorted(set(demand) | {r.owner for r in records})
    demands = {p: PlatformDemand.coerce(p, demand[p]) if p in demand else None for p in platforms}
    horizons = {len(d.mean) for d in demands.values() if d is not None}
    if not horizons or 0 in horizons:
        raise PlanningError("demand: at least one platform with at least one hour of demand")
    hours = min(min(horizons), policy.horizon_hours)
    reasons: list[str] = []
    for p in platforms:
        if demands[p] is None:
            demands[p] = PlatformDemand(mean=(0.0,) * hours, upper=(0.0,) * hours)
            reasons.append(f"{p}: no demand given, planned as zero")
    if policy.min_headroom > 0 and policy.kind in ("reactive", "predictive"):
        # only where the pool could give every platform that much above its mean at once: in a
        # short pool a floor on one platform's spread only reorders who goes short
        need = sum((1.0 + policy.min_headroom) * max(d.mean) / units_per_gpu(d.unit) for d in demands.values())
        if need <= sum(r.gpus for r in records):
            demands = {p: _with_min_headroom(d, policy.min_headroom) for p, d in demands.items()}
    infeasible = _infeasible_bounds(policy, platforms, len(records))
    if infeasible:
        reasons.append(infeasible)
    model = _Model(records, platforms, demands, policy, hours, at_ts)
    before = model.counts_keep()
    obj_before, unmet_before = model.evaluate(before)

    if policy.kind == "static":
        counts, used, status = before, "none", "static policy never moves"
    elif not any(c.movable for c in model.classes):
        counts, used, status = before, "none", "no node may change (busy, in handover or cooling down)"
    elif solver == "greedy":
        counts, used, status = model.greedy(), "greedy", "greedy (requested)"
    else:
        try:
            counts, status = model.solve_milp()
            used = "milp"
        except _SolverFailed as exc:
            if solver == "milp":
                raise PlanningError(f"MILP failed: {exc}") from exc
            counts, used, status = model.greedy(), "greedy", f"greedy fallback: MILP failed ({exc})"
            reasons.append(status)
    obj_after, unmet_after = model.evaluate(counts)
    if obj_after > obj_before + 1e-9:  # never worse than doing nothing (approximation safety)
        reasons.append(f"solution ({obj_after:.3f}) not better than no change ({obj_before:.3f}); keeping all nodes")
        counts, obj_after, unmet_after = before, obj_before, unmet_before
    moves, changes, targets = model.realise(counts, reasons)
    if infeasible:  # the bounds are soft (penalised), so the solver still says "optimal": say why not
        status = f"{status}; {infeasible}"
    return Plan(
        at=at_ts,
        policy=policy.kind,
        solver=used,
        status=status,
        moves=tuple(moves),
        layout_changes=tuple(changes),
        targets=targets,
        expected_unmet_before={p: round(float(v), 6) for p, v in unmet_before.items()},
        expected_unmet_after={p: round(float(v), 6) for p, v in unmet_after.items()},
        objective_before=round(float(obj_before), 6),
        objective_after=round(float(obj_after), 6),
        reasons=tuple(reasons),
    )


def _with_min_headroom(demand: PlatformDemand, share: float) -> PlatformDemand:
    """``demand`` with every hour's ``upper`` at least ``(1 + share)`` times its mean."""
    mean = np.asarray(demand.mean, dtype=float)
    upper = np.maximum(np.asarray(demand.upper, dtype=float), mean * (1.0 + share))
    return PlatformDemand(mean=demand.mean, upper=tuple(round(float(v), 6) for v in upper), unit=demand.unit,
                          peak=demand.peak)


class _SolverFailed(RuntimeError):
    pass


class _Model:
    """The planning problem over node classes, shared by the MILP and the greedy search."""

    def __init__(self, records, platforms, demands, policy: Policy, hours: int, at):
        self.platforms = platforms
        self.pidx = {p: i for i, p in enumerate(platforms)}
        self.policy = policy
        self.hours = hours
        self.mean = np.array([demands[p].mean[:hours] for p in platforms], dtype=float)
        upper = np.array([demands[p].upper[:hours] for p in platforms], dtype=float)
        z = float(ndtri(policy.headroom_quantile))
        self.sigma = np.clip(upper - self.mean, 0.0, None) / z
        self.units = {p: demands[p].unit for p in platforms}
        self.gpu_per_unit = np.array([1.0 / units_per_gpu(self.units[p]) for p in platforms])
        self.weight = np.array([policy.weight(p) for p in platforms])
        self.records = records
        self.fixed: list[tuple[int, float, tuple[float, ...]]] = []  # (platform, capacity, avail) nobody decides on
        self.fixed_held = np.zeros(len(platforms))
        self.fixed_count = np.zeros(len(platforms))
        self.current_count = np.zeros(len(platforms))
        self.idle_gpus = np.zeros(len(platforms))
        self.classes: list[_Class] = []
        self._build(at)
        # the source-risk term: demand one horizon further out, and each platform's risk there now
        self.far_mean = self.mean[:, -1].copy()
        self.far_sigma = self.sigma[:, -1] * _FAR_SPREAD
        self.held_now = self.capacity(self.counts_keep())[1]  # what each platform holds if nothing changes
        self.far_now = expected_unmet(self.held_now, self.far_mean, self.far_sigma)
        # the park term: what each platform holds below its last week's peak demand (0 where unknown)
        self.peak = np.array([demands[p].peak if demands[p].peak is not None else 0.0 for p in platforms], dtype=float)
        # only where the pool could hold every platform's peak at once: where it cannot, parking one
        # platform up to its peak is a guess at which peak returns first
        held_gpus = float((self.held_now * self.gpu_per_unit).sum())
        fits = float((self.peak * self.gpu_per_unit).sum()) <= held_gpus
        if not fits and policy.park_when_short:
            # (Policy.park_when_short) the same term with each target at most what the platform
            # holds now: a platform below its peak pays for what it gives, nobody gains by pulling
            self.peak = np.minimum(self.peak, self.held_now)
            fits = True
        self.park = (policy.peak_weight > 0 and policy.kind in ("reactive", "predictive") and bool((self.peak > 0).any())
                     and fits)

    # ---- construction
    def _avail(self, minutes: float) -> tuple[float, ...]:
        return tuple(float(np.clip(h + 1 - minutes / 60.0, 0.0, 1.0)) for h in range(self.hours))

    def _build(self, at) -> None:
        pol = self.policy
        groups: dict[tuple, _Class] = {}
        for r in self.records:
            i = self.pidx[r.owner]
            self.current_count[i] += 1
            unit = self.units[r.owner]
            if r.in_handover:
                minutes = pol.move_minutes if r.available_in_minutes is None else float(r.available_in_minutes)
                layout = ideal_layout(r, unit)
                self.fixed.append((i, node_capacity(r, unit, layout), self._avail(minutes)))
                self.fixed_held[i] += node_capacity(r, unit, layout)
                self.fixed_count[i] += 1
                continue
            self.idle_gpus[i] += max(0.0, r.gpus - r.busy_gpus)
            idle = r.busy_gpus <= 1e-9
            cooling = (
                at is not None and r.last_moved_at is not None and at - r.last_moved_at < pd.Timedelta(pol.cooldown)
            )
            can_move = (idle or pol.allow_evict) and not cooling
            keep = _Option("keep", r.owner, node_capacity(r, unit, r.mig_layout), (1.0,) * self.hours, 0.0,
                           r.mig_layout)
            options = [keep]
            best = ideal_layout(r, unit)
            if idle and best != r.mig_layout and node_capacity(r, unit, best) > keep.capacity:
                options.append(_Option("relayout", r.owner, node_capacity(r, unit, best),
                                       self._avail(pol.layout_change_minutes), pol.layout_change_cost, best))
            if can_move:
                for p in self.platforms:
                    if p == r.owner:
                        continue
                    layout = ideal_layout(r, self.units[p])
                    cost = pol.move_cost + (pol.layout_change_cost if layout != r.mig_layout else 0.0)
                    options.append(_Option("move", p, node_capacity(r, self.units[p], layout),
                                           self._avail(pol.move_minutes), cost, layout))
            key = (r.owner, r.gpus, tuple(options))
            if key not in groups:
                groups[key] = _Class(r.owner, r.gpus, tuple(options), [], len(options) > 1)
            groups[key].members.append(r)
        for key in sorted(groups, key=lambda k: min(m.name for m in groups[k].members)):
            cls = groups[key]
            # the members that move first: longest since their last move, then by name
            cls.members.sort(key=lambda m: (m.last_moved_at is not None,
                                            m.last_moved_at or pd.Timestamp(0, tz="UTC"), m.name))
            self.classes.append(cls)
        self._build_slots()

    def _build_slots(self) -> None:
        """Cut each horizon hour where some node starts serving: capacity is constant in each slot.

        A node that serves the last ``a`` of an hour counts fully from ``1 - a`` on and not at all
        before, instead of as ``a`` of a node for the whole hour: with the hour's demand the same
        all hour, ``E[(D - c)+]`` over the slots is exact where the fractional node overstated
        what an arriving node saves (it covers the hour's second half, not half of every step).
        """
        avails = [o.avail for c in self.classes for o in c.options] + [a for _, _, a in self.fixed]
        slots: list[tuple[int, float, float]] = []
        for h in range(self.hours):
            cuts = sorted({0.0, 1.0} | {round(1.0 - a[h], 9) for a in avails if 0.0 < a[h] < 1.0})
            slots += [(h, s0, s1 - s0) for s0, s1 in zip(cuts[:-1], cuts[1:])]
        self.slot_hour = np.array([h for h, _, _ in slots], dtype=int)
        self.slot_start = np.array([s0 for _, s0, _ in slots])
        self.slot_len = np.array([ln for _, _, ln in slots])
        self.slot_mean = self.mean[:, self.slot_hour]
        self.slot_sigma = self.sigma[:, self.slot_hour]
        self.fixed_cap = np.zeros((len(self.platforms), len(slots)))  # per slot
        for i, capacity, avail in self.fixed:
            self.fixed_cap[i] += capacity * self._present(avail)

    def _present(self, avail: tuple[float, ...]) -> np.ndarray:
        """True in the slots where a node serving the last ``avail`` of each hour is there."""
        a = np.asarray(avail, dtype=float)[self.slot_hour]
        return (a > 0.0) & (1.0 - a <= self.slot_start + 1e-9)

    # ---- evaluation (exact)
    def counts_keep(self) -> list[list[int]]:
        """The 'change nothing' solution: every member keeps."""
        return [[len(c.members)] + [0] * (len(c.options) - 1) for c in self.classes]

    def capacity(self, counts) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        cap = self.fixed_cap.copy()
        held = self.fixed_held.copy()
        nodes = self.fixed_count.copy()
        for cls, row in zip(self.classes, counts):
            for opt, n in zip(cls.options, row):
                if n:
                    i = self.pidx[opt.target]
                    cap[i] += n * opt.capacity * self._present(opt.avail)
                    held[i] += n * opt.capacity
                    nodes[i] += n
        return cap, held, nodes

    def evaluate(self, counts) -> tuple[float, dict[str, float]]:
        """Exact objective of a solution and expected unmet per platform (units x hours)."""
        cap, held, nodes = self.capacity(counts)
        per_slot = expected_unmet(cap, self.slot_mean, self.slot_sigma) * self.slot_len
        unmet = np.zeros((len(self.platforms), self.hours))
        for h in range(self.hours):
            unmet[:, h] = per_slot[:, self.slot_hour == h].sum(axis=1)
        g = self.gpu_per_unit[:, None]
        obj = float((self.weight[:, None] * g * unmet).sum())
        obj += self.policy.idle_weight * float((g * (held[:, None] - self.mean + unmet)).sum())
        obj += sum(n * o.cost for cls, row in zip(self.classes, counts) for o, n in zip(cls.options, row))
        obj += _BOUND_PENALTY * float(self._violation(nodes).sum())
        if self.policy.source_risk > 0:
            given_up = np.clip(expected_unmet(held, self.far_mean, self.far_sigma) - self.far_now, 0.0, None)
            obj += self.policy.source_risk * float((self.weight * self.gpu_per_unit * given_up).sum())
        if self.park:
            obj += self.policy.peak_weight * float((self.gpu_per_unit * np.clip(self.peak - held, 0.0, None)).sum())
        return obj, {p: float(unmet[i].sum()) for p, i in self.pidx.items()}

    def _bounds(self) -> tuple[np.ndarray, np.ndarray]:
        lo = np.array([self.policy.min_nodes.get(p, 0) for p in self.platforms], dtype=float)
        hi = np.array([self.policy.max_nodes.get(p, np.inf) for p in self.platforms], dtype=float)
        return lo, hi

    def _violation(self, nodes: np.ndarray) -> np.ndarray:
        lo, hi = self._bounds()
        return np.clip(lo - nodes, 0, None) + np.clip(nodes - hi, 0, None)

    def feasible(self, counts) -> bool:
        """Hard constraints: move budget, idle GPUs at each source, bounds never made worse."""
        moves = 0
        leaving = np.zeros(len(self.platforms))
        for cls, row in zip(self.classes, counts):
            for opt, n in zip(cls.options, row):
                if opt.kind == "move" and n:
                    moves += n
                    leaving[self.pidx[cls.owner]] += n * cls.gpus
        if moves > self.policy.max_moves_per_decision:
            return False
        if not self.policy.allow_evict and (leaving > self.idle_gpus + 1e-9).any():
            return False
        _, _, nodes = self.capacity(counts)
        return bool((self._violation(nodes) <= self._violation(self.current_count) + 1e-9).all())

    # ---- MILP
    def solve_milp(self) -> tuple[list[list[int]], str]:
        P, H = len(self.platforms), len(self.slot_len)  # H: slots of the horizon
        var_index: list[tuple[int, int]] = []  # (class, option) per y variable
        for k, cls in enumerate(self.classes):
            for o in range(len(cls.options)):
                var_index.append((k, o))
        ny = len(var_index)
        nu = P * H
        far = self.policy.source_risk > 0
        n_far = P if far else 0
        # y, U[p,h], under[p], over[p], (source risk V[p]), (park Z[p])
        n = ny + nu + 2 * P + n_far + (P if self.park else 0)
        u0, s0, v0, z0 = ny, ny + nu, ny + nu + 2 * P, ny + nu + 2 * P + n_far
        c = np.zeros(n)
        g = self.gpu_per_unit
        idle_w = self.policy.idle_weight
        for j, (k, o) in enumerate(var_index):
            opt = self.classes[k].options[o]
            i = self.pidx[opt.target]
            c[j] = opt.cost + idle_w * g[i] * opt.capacity * self.hours
        for i in range(P):
            for h in range(H):
                c[u0 + i * H + h] = (self.weight[i] + idle_w) * g[i] * self.slot_len[h]
        c[s0:v0] = _BOUND_PENALTY
        if far:
            c[v0:z0] = self.policy.source_risk * self.weight * g
        if self.park:
            c[z0:] = self.policy.peak_weight * g
        rows, lbs, ubs = [], [], []

        def add(coefs: dict[int, float], lb: float, ub: float) -> None:
            row = np.zeros(n)
            for j, v in coefs.items():
                row[j] += v
            rows.append(row)
            lbs.append(lb)
            ubs.append(ub)

        for k, cls in enumerate(self.classes):  # every member gets exactly one option
            add({j: 1.0 for j, (kk, _) in enumerate(var_index) if kk == k}, len(cls.members), len(cls.members))
        present = {j: self._present(self.classes[k].options[o].avail) for j, (k, o) in enumerate(var_index)}
        for i, p in enumerate(self.platforms):  # expected unmet envelope, per slot
            for h in range(H):
                for a, b in _tangents(float(self.slot_mean[i, h]), float(self.slot_sigma[i, h])):
                    coefs = {u0 + i * H + h: 1.0}
                    for j, (k, o) in enumerate(var_index):
                        opt = self.classes[k].options[o]
                        if opt.target == p and present[j][h]:
                            coefs[j] = coefs.get(j, 0.0) + b * opt.capacity
                    add(coefs, a - b * float(self.fixed_cap[i, h]), np.inf)
        for i, p in enumerate(self.platforms) if far else ():  # V[p] >= F_p(held) - F_p(held now), >= 0
            fixed_held = float(self.fixed_held[i])
            lines = _tangents(float(self.far_mean[i]), float(self.far_sigma[i]), _FAR_TANGENT_Z)
            # the envelope's own value now, so that keeping everything costs exactly 0
            now = max(0.0, max(a - b * float(self.held_now[i]) for a, b in lines))
            for a, b in lines:
                coefs = {v0 + i: 1.0}
                for j, (k, o) in enumerate(var_index):
                    opt = self.classes[k].options[o]
                    if opt.target == p:
                        coefs[j] = coefs.get(j, 0.0) + b * opt.capacity
                add(coefs, a - b * fixed_held - now, np.inf)
        for i, p in enumerate(self.platforms) if self.park else ():  # Z[p] >= peak - held, >= 0
            coefs = {z0 + i: 1.0}
            for j, (k, o) in enumerate(var_index):
                opt = self.classes[k].options[o]
                if opt.target == p:
                    coefs[j] = coefs.get(j, 0.0) + opt.capacity
            add(coefs, float(self.peak[i] - self.fixed_held[i]), np.inf)
        move_vars = {j: 1.0 for j, (k, o) in enumerate(var_index) if self.classes[k].options[o].kind == "move"}
        if move_vars:
            add(move_vars, -np.inf, self.policy.max_moves_per_decision)
        if not self.policy.allow_evict:
            for i, p in enumerate(self.platforms):
                coefs = {j: float(self.classes[k].gpus) for j, (k, o) in enumerate(var_index)
                         if self.classes[k].owner == p and self.classes[k].options[o].kind == "move"}
                if coefs:
                    add(coefs, -np.inf, float(self.idle_gpus[i]))
        lo, hi = self._bounds()
        now_viol = self._violation(self.current_count)
        for i, p in enumerate(self.platforms):
            coefs = {j: 1.0 for j, (k, o) in enumerate(var_index) if self.classes[k].options[o].target == p}
            fixed = float(self.fixed_count[i])
            # soft bounds: nodes + under >= lo ; nodes - over <= hi
            add({**coefs, s0 + i: 1.0}, lo[i] - fixed, np.inf)
            if np.isfinite(hi[i]):
                add({**coefs, s0 + P + i: -1.0}, -np.inf, hi[i] - fixed)
            else:
                c[s0 + P + i] = 0.0
            # hard: never further outside than now
            add({s0 + i: 1.0, s0 + P + i: 1.0}, -np.inf, float(now_viol[i]))
        integrality = np.zeros(n)
        integrality[:ny] = 1
        ub = np.full(n, np.inf)
        for j, (k, _) in enumerate(var_index):
            ub[j] = len(self.classes[k].members)
        try:
            res = milp(
                c,
                integrality=integrality,
                bounds=Bounds(np.zeros(n), ub),
                constraints=LinearConstraint(np.array(rows), np.array(lbs), np.array(ubs)),
                options={"time_limit": self.policy.solver_time_limit_s, "disp": False},
            )
        except (ValueError, RuntimeError) as exc:
            raise _SolverFailed(str(exc)) from exc
        if res.x is None or res.status not in (0, 1):
            raise _SolverFailed(f"status {res.status}: {res.message}")
        x = np.round(res.x[:ny]).astype(int)
        counts = [[0] * len(cls.options) for cls in self.classes]
        for j, (k, o) in enumerate(var_index):
            counts[k][o] = int(x[j])
        if not self.feasible(counts) or any(sum(r) != len(c.members) for r, c in zip(counts, self.classes)):
            raise _SolverFailed("rounded solution violates a constraint")
        status = "optimal" if res.status == 0 else "time limit, best found"
        return counts, status

    # ---- greedy
    def greedy(self) -> list[list[int]]:
        """Apply the single best action while it lowers the exact objective."""
        counts = self.counts_keep()
        best_obj, _ = self.evaluate(counts)
        while True:
            best = None
            for k, cls in enumerate(self.classes):
                if counts[k][0] == 0:
                    continue
                for o in range(1, len(cls.options)):
                    trial = [row[:] for row in counts]
                    trial[k][0] -= 1
                    trial[k][o] += 1
                    if not self.feasible(trial):
                        continue
                    obj, _ = self.evaluate(trial)
                    if obj < best_obj - 1e-9 and (best is None or obj < best[0] - 1e-12):
                        best = (obj, trial)
            if best is None:
                return counts
            best_obj, counts = best

    # ---- from counts to named nodes
    def realise(self, counts, reasons: list[str]):
        total_obj, _ = self.evaluate(counts)
        moves: list[Move] = []
        changes: list[LayoutChange] = []
        targets: dict[str, str] = {r.name: r.owner for r in self.records}
        for k, (cls, row) in enumerate(zip(self.classes, counts)):
            # the members sorted first are the ones that act
            acting = sum(row[1:])
            movers = cls.members[:acting]
            it = iter(movers)
            for o, n in enumerate(row):
                if o == 0 or n == 0:
                    continue
                opt = cls.options[o]
                without = [r[:] for r in counts]
                without[k][o] -= 1
                without[k][0] += 1
                gain = round(self.evaluate(without)[0] - total_obj, 6)
                for _ in range(n):
                    node = next(it)
                    targets[node.name] = opt.target
                    i = self.pidx[opt.target]
                    if opt.kind == "move":
                        why = (f"{opt.target}: expected unmet over {self.hours}h falls by {gain:.2f} GPU-h "
                               f"net of costs; {cls.owner} has {self.idle_gpus[self.pidx[cls.owner]]:.0f} idle GPUs")
                        if self.park and self.held_now[i] < self.peak[i]:
                            why += (f"; {opt.target} held {self.held_now[i]:.0f} against its last week's peak of "
                                    f"{self.peak[i]:.0f}")
                        moves.append(Move(node.name, cls.owner, opt.target, node.gpus, gain, opt.layout, why))
                    else:
                        why = (f"{opt.target} asks for {self.units[opt.target]}; re-layout adds "
                               f"{opt.capacity - cls.options[0].capacity:.0f} units, mean demand "
                               f"{self.mean[i].mean():.1f}")
                        changes.append(LayoutChange(node.name, opt.target, node.mig_layout, opt.layout or "", gain, why))
        moves.sort(key=lambda m: (-m.expected_gain, m.node))
        changes.sort(key=lambda c: (-c.expected_gain, c.node))
        if not moves and not changes:
            reasons.append("no change lowers the expected cost")
        return moves, changes, targets


def _records(nodes) -> list[NodeRecord]:
    out = [n if isinstance(n, NodeRecord) else NodeRecord.from_mapping(n) for n in nodes]
    names = [r.name for r in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise PlanningError(f"nodes: duplicate names {dup[:5]}")
    for r in out:
        if r.gpus <= 0:
            raise PlanningError(f"node {r.name!r}: gpus must be > 0, got {r.gpus}")
        if r.busy_gpus < 0 or r.busy_gpus > r.gpus + 1e-9:
            raise PlanningError(f"node {r.name!r}: busy_gpus {r.busy_gpus} outside 0..{r.gpus}")
    return sorted(out, key=lambda r: r.name)


def _floats(platform: str, key: str, values: Any) -> tuple[float, ...]:
    try:
        out = tuple(float(v) for v in values)
    except (TypeError, ValueError) as exc:
        raise PlanningError(f"demand of {platform!r}: {key} must be numbers ({exc})") from exc
    if any(not math.isfinite(v) or v < 0 for v in out):
        raise PlanningError(f"demand of {platform!r}: {key} must be finite and >= 0, got {out}")
    return out

