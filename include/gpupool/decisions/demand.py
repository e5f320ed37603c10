"""What the planner plans on: each platform's demand for the next hours, from the same inputs in
production and in the what-if.

:func:`plan_demand` is the one decision of the plan stage's input. ``jobs.allocation``
(the pipeline's plan task, ``gpupool plan``) calls it on what ``staging.reads`` returns, and
``gpupool.sim.study`` (``gpupool simulate``) on the same functions run over the world's telemetry:

* hourly demand (``canonical.demand_of_steps``) and, beside it, the spread of demand inside the
  hour and demand as it stands (its ``within_hour_sd`` and ``level``): the one source of both;
* for ``predictive``, the forecast issued now (its frame and interval level), the one-hour-ahead
  forecasts issued before (its track record, :func:`forecast_skill`) and demand as it stood at
  each hour's start (``canonical.hourly_levels``, for the record and :func:`daily_record`).

Also here: the spread rules of the last hour's demand (:func:`demand_from_last_hour`,
:func:`spread_record`) and the forecast's track record. The constants below were chosen on the
tuning groupings of ``bench/allocate_helios.py`` with ``bench/allocate_tune.py`` (the bench
named beside each says how; its figures are the bench's, not this module's).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy.special import ndtri

from gpupool.config import FORECAST_LEVEL
from gpupool.decisions.layouts import GPU_UNIT, SLICES_PER_GPU, PlanningError
from gpupool.decisions.policy import PlanTuning, Policy
from gpupool.values import utc


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

    def in_unit(self, unit: str = GPU_UNIT, factor: int = 1) -> "PlatformDemand":
        """This demand in ``unit``, each of its units ``factor`` of that one (the plan stage's
        ``platform_demand`` and the what-if convert staged demand with it)."""
        return PlatformDemand(mean=tuple(v * factor for v in self.mean), upper=tuple(v * factor for v in self.upper),
                              unit=unit, peak=None if self.peak is None else self.peak * factor)


def _floats(platform: str, key: str, values: Any) -> tuple[float, ...]:
    try:
        out = tuple(float(v) for v in values)
    except (TypeError, ValueError) as exc:
        raise PlanningError(f"demand of {platform!r}: {key} must be numbers ({exc})") from exc
    if any(not math.isfinite(v) or v < 0 for v in out):
        raise PlanningError(f"demand of {platform!r}: {key} must be finite and >= 0, got {out}")
    return out


#: hours of a forecast's own track record the plan weighs it on
SKILL_HOURS = 48
#: scored hours a forecast's record must cover before the plan may use it: until then the plan
#: is reactive's, the simple baseline (as the spread rules keep ``SPREAD_BASE`` until their record
#: is long enough). Trusting the model without a record decided the first hours of a cold start
#: by chance (the six-day regimes of ``bench/allocate_helios.py``)
MIN_SKILL_HOURS = 6
#: how much lower the forecast's RMSE over its record must be than the naive forecast's for the
#: plan to use it (as ``SPREAD_MARGIN`` for the spread rules): a record that is only level with
#: reacting is no reason to plan on the model: hours where it edged ahead by less were coin flips
#: on the Helios traces (``bench/allocate_helios.py``, its month-long runs)
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
#: the rule a caller that names none gets (``PlanTuning.demand_spread``'s default, defined there)
DEFAULT_SPREAD = PlanTuning().demand_spread
#: the rules a series' record chooses between
SPREAD_RULES = ("random_walk", "empirical", "wider")
#: the rule a series keeps unless its own record clearly favours another. Chosen on the tuning
#: groupings of ``bench/allocate_helios.py`` (``bench/allocate_tune.py --spreads``, reactive,
#: six and ten days): the random walk, the simpler rule, loses there as a base, its one-hour
#: record level with the empirical rule's while the plans made on it leave more unmet
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
        # the forecast's change from the last hour, from where demand stands now: a burst inside
        # the last hour is not forgotten (chosen on the tuning groupings, bench/allocate_tune.py)
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
    first hour twice over (measured on the tuning groupings, ``bench/allocate_tune.py``). This naive
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
# the plan stage's input, in production and in the what-if


@dataclass(frozen=True)
class DemandChoice:
    """One platform's demand for the plan (:attr:`demand`) and what it was planned on.

    ``basis``: ``"forecast"`` (the model, its record clearly better than reacting), ``"daily"``
    (demand as it stands moved by the daily shape, :func:`with_daily_change`) or ``"last_hour"``
    (demand as it stands, :func:`demand_from_last_hour`). ``skill`` and ``daily`` are the
    forecast's records where a forecast was weighed (None otherwise).
    """

    demand: PlatformDemand
    basis: str
    within_hour_sd: float
    skill: ForecastSkill | None = None
    daily: DailyRecord | None = None

    def why(self, at: pd.Timestamp, level: float | None = None) -> str:
        """One line saying where the demand came from (the plan's ``demand_from``); ``level``: the
        forecast's interval level (default :data:`gpupool.config.FORECAST_LEVEL`, the forecast stage's)."""
        level = _forecast_level(level)
        skill, daily = self.skill, self.daily
        if skill is None:
            return "last hour" + ("" if self.demand.peak is not None else " (no demand data: zero)")
        if self.basis == "daily":
            return (f"last hour moved by the daily change at this hour "
                    f"({', '.join(f'{c:+.1f}' for c in daily.change)} GPUs): over {daily.scored} hours ahead "
                    f"it forecast {SKILL_MARGIN:.0%} better than demand as it stood (RMSE "
                    f"{daily.rmse_daily:.1f} vs {daily.rmse_naive:.1f})")
        if self.basis == "forecast":
            return (f"forecast issued {pd.Timestamp(at).isoformat()} (level {level:g}, spread within the hour "
                    f"{self.within_hour_sd:.1f})")
        if skill.hours < MIN_SKILL_HOURS:
            return (f"last hour: the model's record covers {skill.hours} h, fewer than the "
                    f"{MIN_SKILL_HOURS} it must beat demand as it stood over before it is planned on")
        return (f"last hour: over {skill.hours} h the model issued {pd.Timestamp(at).isoformat()} did not forecast "
                f"{SKILL_MARGIN:.0%} better than demand as it stood (RMSE {skill.rmse_forecast:.1f} "
                f"vs {skill.rmse_naive:.1f})")


def plan_demand(
    hourly: pd.Series,
    info: Mapping[str, Any],
    policy: Policy,
    at: Any,
    forecast: pd.DataFrame | None = None,
    level: float | None = None,
    issued: pd.Series | None = None,
    levels: pd.Series | None = None,
) -> DemandChoice:
    """A platform's demand for the plan at ``at``: the plan stage's one decision of its input.

    Parameters
    ----------
    hourly:
        The platform's hourly demand (``canonical.demand_of_steps``), indexed by the hour's start;
        hours from ``at`` on are ignored. :data:`SPREAD_HISTORY_HOURS` of it (and
        :data:`DAILY_HISTORY_HOURS` for ``predictive``) are all that is read.
    info:
        ``demand_of_steps``'s ``info`` over the same steps: ``within_hour_sd`` (the spread of
        demand inside the hour, over the last day) and ``level`` (demand as it stands). It is the
        only source of either.
    policy:
        ``kind``, ``plan_horizon_hours``, ``headroom_quantile`` and ``demand_spread`` are read.
    forecast:
        ``predictive``: the forecast issued at ``at`` (``ts, yhat, yhat_upper`` by step; None or
        empty: there is none, and the plan is reactive's), at interval ``level`` (default
        :data:`gpupool.config.FORECAST_LEVEL`, the forecast stage's).
    issued, levels:
        ``predictive``: the one-hour-ahead forecasts issued before ``at``, indexed by the hour they
        forecast, and demand as it stood at each hour's start (``canonical.hourly_levels``): the
        forecast's track record (:func:`forecast_skill`, :func:`daily_record`).

    ``static`` plans on demand as it stands as ``reactive`` does (its plan never moves anything);
    ``oracle`` has no input here: it plans on the true future, which only the what-if knows.
    """
    if policy.kind == "oracle":
        raise PlanningError("the oracle policy plans on the true future: only `gpupool simulate` has it")
    at = utc(at)
    if isinstance(hourly.index, pd.DatetimeIndex):
        hourly = hourly[hourly.index < at]
    within = float(info.get("within_hour_sd") or 0.0)
    latest = info.get("level")
    horizon, quantile, spread = policy.plan_horizon_hours, policy.headroom_quantile, policy.demand_spread
    if policy.kind != "predictive" or forecast is None or forecast.empty:
        return DemandChoice(demand_from_last_hour(hourly, within, horizon, quantile, spread=spread, latest=latest),
                            "last_hour", within)
    ahead = forecast.head(horizon)
    level = _forecast_level(level)
    levels = pd.Series(dtype=float) if levels is None else levels
    skill = forecast_skill(pd.Series(dtype=float) if issued is None else issued, hourly, levels=levels)
    daily = daily_record(hourly, levels, at, len(ahead))
    demand = demand_from_forecast(ahead["yhat"].to_numpy(float), ahead["yhat_upper"].to_numpy(float), level, within,
                                  quantile, skill=skill, hourly=hourly, latest=latest, spread=spread, daily=daily)
    basis = "daily" if daily.wins else "forecast" if skill.forecast_wins else "last_hour"
    return DemandChoice(demand, basis, within, skill, daily)


def _forecast_level(level: float | None) -> float:
    """``level``, or the forecast stage's (:data:`gpupool.config.FORECAST_LEVEL`)."""
    return FORECAST_LEVEL if level is None else float(level)
