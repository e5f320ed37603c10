"""Alarms: from deviating points to events, and the false-alarm budget a history sets.

An alarm is the first deviating point of an event (`alarms`); its threshold is read from the
history the model was fitted on (`budget_threshold`, `excursions`), and a run of smaller
deviations on one side raises one too (`run_scores`, `calibrate_runs`). Alarms only: what is
cleaned does not depend on them. Their settings are `gpupool.detect.settings.AlarmRules`
(`RouterConfig.alarms`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from gpupool.detect.settings import AlarmRules

#: run lengths and shares of the alarm τ whose history excursions are kept with each model (for the bench)
RUN_KEPT = ((3, 0.35), (3, 0.5), (5, 0.35), (5, 0.5), (5, 0.75), (10, 0.35), (10, 0.5))


def run_scores(signed: np.ndarray, points: int) -> np.ndarray:
    """Per point: the smallest |deviation| of the `points` points ending there when all lie on one
    side (0 when they do not, or any is missing; 0 for the first `points` - 1 points)."""
    e = np.asarray(signed, dtype="float64")
    out = np.zeros(e.size)
    if points < 1 or e.size < points:
        return out
    w = np.lib.stride_tricks.sliding_window_view(e, points)
    with np.errstate(invalid="ignore"):
        lo, hi = w.min(axis=1), w.max(axis=1)
        run = np.where(lo > 0, lo, np.where(hi < 0, -hi, 0.0))
    out[points - 1 :] = np.where(np.isfinite(run), run, 0.0)
    return out


def run_threshold(
    run: np.ndarray, level: float, merge_points: int, skip: int, budget: float | None
) -> tuple[float, np.ndarray]:
    """The run alarm's threshold from the history's run scores: `level` at least, and beyond the
    history's runs (`budget`) less its `skip` largest excursions; and the excursions' peaks, largest first."""
    events, peaks = excursions(run, level, merge_points)
    order = np.argsort(-peaks, kind="stable")
    kept = np.where(np.isin(events, order[:skip]), np.nan, run) if skip and peaks.size else run
    return max(level, budget_threshold(kept, budget)), peaks[order]


def calibrate_runs(signed: np.ndarray, least: float, skip: int, rules: AlarmRules) -> tuple[float, dict]:
    """The run alarm's threshold from a history's signed deviations (in residual spreads): for
    runs of `rules.run_points` beyond `rules.run_share` x `least` (the alarm τ), under the
    false-alarm budget less the `skip` largest excursions (NaN: no run alarms); and, for the
    bench, the largest run excursions of each run length and share of `RUN_KEPT`."""
    threshold = float("nan")
    m = rules.run_points
    if m > 0:
        threshold, _ = run_threshold(run_scores(signed, m), rules.run_share * least, rules.merge_points, skip,
                                     rules.history_share)
    # what the bench needs to read the run threshold for other run lengths and shares
    kept = {}
    for points, share in RUN_KEPT:
        _, peaks = run_threshold(run_scores(signed, points), share * least, rules.merge_points, 0, None)
        kept[f"{points}:{share}"] = [float(p) for p in peaks[:MAX_KEPT_PEAKS]]
    return threshold, kept


@dataclass(frozen=True)
class BudgetHistory:
    """What a bench needs to read a model's alarm thresholds again under other alarm settings
    without refitting (bench/detect_nab_collect.py keeps it): the upper tail of the history's
    normalised scores (`TAIL_LEVELS`), its largest excursions (``peaks``, largest first), the
    largest score outside any (``rest``), its span (``days``, ``points``), and its run
    excursions (`calibrate_runs`; None for Spectral Residual). Kept in memory only, never stored."""

    quantiles: list
    excursions: dict
    run_excursions: dict | None = None


#: fewest history scores a false-alarm budget is read from
MIN_BUDGET_POINTS = 50
#: upper tail levels of a history's normalised scores kept with each model (for the bench)
TAIL_LEVELS = (0.99, 0.995, 0.998, 0.999, 0.9995, 1.0)


def tail_quantiles(norm: np.ndarray) -> list[float | None]:
    v = np.asarray(norm, dtype="float64")
    v = v[np.isfinite(v)]
    if v.size < MIN_BUDGET_POINTS:
        return [None] * len(TAIL_LEVELS)
    return [float(q) for q in np.quantile(v, TAIL_LEVELS)]


#: largest excursion peaks kept with each model (for the bench)
MAX_KEPT_PEAKS = 32


def span_days(history: pd.Series) -> float:
    idx = history.index
    if len(idx) < 2 or not isinstance(idx, pd.DatetimeIndex):
        return 0.0
    return float((idx[-1] - idx[0]) / pd.Timedelta(days=1))


def excursions(norm: np.ndarray, level: float, merge_points: int) -> tuple[np.ndarray, np.ndarray]:
    """The history's excursions: runs of scores beyond `level`, joined as `alarms` joins an event's points.

    Returns each point's excursion (-1: none) and each excursion's largest score.
    """
    v = np.asarray(norm, dtype="float64")
    events = np.full(v.size, -1, dtype=np.int64)
    with np.errstate(invalid="ignore"):
        where = np.flatnonzero(np.isfinite(v) & (v > level))
    if where.size == 0:
        return events, np.empty(0)
    new = np.concatenate([[True], np.diff(where) > max(merge_points, 0)])
    ids = np.cumsum(new) - 1
    starts, ends = where[new], where[np.concatenate([new[1:], [True]])]
    for k, (a, b) in enumerate(zip(starts, ends)):
        events[a : b + 1] = k
    peaks = np.full(int(ids[-1]) + 1, -np.inf)
    np.maximum.at(peaks, ids, v[where])
    return events, peaks


def budget_threshold(norm: np.ndarray, budget: float | None) -> float:
    """The threshold that the history's normalised scores exceed at most a `budget` share of the time.

    A false-alarm budget per series: a series whose history is heavy-tailed (bursty
    counts, volumes) alarms only beyond what its own history does. 0: beyond the history's
    largest score; None: no budget.
    """
    if budget is None:
        return 0.0
    v = np.asarray(norm, dtype="float64")
    v = v[np.isfinite(v)]
    if v.size < MIN_BUDGET_POINTS:
        return 0.0
    return float(np.quantile(v, 1.0 - budget))


def alarms(frame: pd.DataFrame, merge_points: int) -> np.ndarray:
    """Alarms from deviating rows: the first deviating point of each event.

    A deviating point within `merge_points` points (in time order, one per timestamp) of
    the previous deviating point belongs to the same event and raises no new alarm; a
    burst or level shift therefore raises one alarm, at its first point. Returns a
    boolean array aligned with the rows of `frame` (a duplicate timestamp shares its
    first row's alarm).
    """
    return alarm_flags(frame["is_anomaly"].to_numpy(dtype=bool), pd.DatetimeIndex(frame.index), merge_points)


def alarm_flags(dev: np.ndarray, idx: pd.DatetimeIndex, merge_points: int) -> np.ndarray:
    """`alarms` of deviating flags `dev` on the rows of `idx`."""
    if merge_points <= 0 or not dev.any():
        return dev.copy()
    order = np.argsort(idx.asi8, kind="stable")
    sorted_idx = idx[order]
    first_of_ts = np.ones(len(order), dtype=bool)
    first_of_ts[1:] = sorted_idx[1:] != sorted_idx[:-1]
    ts_pos = np.cumsum(first_of_ts) - 1  # position in time of each sorted row
    dev_ts = np.zeros(int(ts_pos[-1]) + 1 if len(ts_pos) else 0, dtype=bool)
    np.logical_or.at(dev_ts, ts_pos, dev[order])
    where = np.flatnonzero(dev_ts)
    alarm_ts = np.zeros_like(dev_ts)
    gaps = np.diff(np.concatenate([[-(merge_points + 1)], where]))
    alarm_ts[where[gaps > merge_points]] = True
    out = np.zeros(len(order), dtype=bool)
    out[order] = alarm_ts[ts_pos] & dev[order]
    # a duplicate timestamp: only its first deviating row carries the alarm
    return out
