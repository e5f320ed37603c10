"""The stuck rule: an exporter repeating one exact value for longer than the series' history
makes plausible."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from gpupool.detect.model import FittedSeriesModel


#: fewest history steps a repeat statistic is read from
MIN_REPEAT_STEPS = 48
#: a stuck run is longer than this x the 0.99 quantile of the history's run lengths
#: (bench/detect_cleaning.py)
STUCK_RUN_FACTOR = 2.0
#: a series can be stuck only if at most this share of its history's steps repeat the value
#: before: a flat or step-like series holds values for hours, and a count that repeats more often
#: stands still in clustered plateaus, which a stuck exporter cannot be told from
#: (bench/detect_cleaning.py)
STUCK_MAX_REPEAT_SHARE = 0.1


def repeats(values: np.ndarray) -> tuple[float, float]:
    """The history's share of steps that repeat the value before, and the 0.99 quantile of its
    run lengths (points holding one exact value); NaN when the history is too short to tell.

    A quantile, not the longest run: a stuck exporter in the history itself must not raise the
    bar for the next one.
    """
    v = np.asarray(values, dtype="float64")
    v = v[np.isfinite(v)]
    if v.size <= MIN_REPEAT_STEPS:
        return float("nan"), float("nan")
    change = np.flatnonzero(np.diff(v) != 0)
    lengths = np.diff(np.concatenate([[-1], change, [v.size - 1]]))
    return float(np.mean(np.diff(v) == 0)), float(np.quantile(lengths, 0.99))


def stuck_runs(
    raw: np.ndarray, expected: np.ndarray, model: FittedSeriesModel, known: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Points of an exporter stuck on one value: the repeats in a run of one exact value that
    is longer than the series' history makes plausible.

    Only a series whose history varies (at most `STUCK_MAX_REPEAT_SHARE` of its steps repeat
    the value before) can be stuck: a flat or step-like series holds values for hours. A run
    of `n` points is stuck when `n` > both `cleaning.min_stuck_run` and `STUCK_RUN_FACTOR` x the 0.99
    quantile of the history's run lengths, and, with `cleaning.max_stuck_run` > 0, `n` <= it (a
    longer run is the demand itself standing still). A run at zero of a non-negative series
    is idle, not stuck (a collapse is the drop rule's); so is a run entered by a step of more
    than τ: a jump to a new level (the burst rule judges it), not an exporter repeating an
    ordinary reading. Both read raw values only, so a window judges a run that began before it
    as one go does. The run's first point is the last
    value the exporter really read and is kept; missing points end a run. The repeats are
    replaced by a straight line from that value to the first value after the run (as `known`
    gives it: that value cleaned, when it is itself a fault; default the raw one); a run still
    open at the end of the data is judged on its length so far and replaced by x̂ (so is a run
    with a missing point after it). Returns the mask of replaced points and their values.
    """
    cfg = model.config
    out = np.zeros(raw.size, dtype=bool)
    values = np.full(raw.size, np.nan)
    share, typical = model.repeat_share_, model.repeat_run_
    if cfg.cleaning.min_stuck_run <= 0 or not (np.isfinite(share) and np.isfinite(typical)):
        return out, values
    if share > STUCK_MAX_REPEAT_SHARE or raw.size < 2:
        return out, values
    least = max(cfg.cleaning.min_stuck_run, STUCK_RUN_FACTOR * typical)
    with np.errstate(invalid="ignore"):
        same = np.isfinite(raw[1:]) & (raw[1:] == raw[:-1])
    edges = np.diff(np.concatenate([[0], same.astype(np.int8), [0]]))
    for a, b in zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)):
        # same[a:b] true: raw[a] .. raw[b] hold one value, b - a + 1 points
        n_points = b - a + 1
        if n_points <= least:
            continue
        if cfg.cleaning.max_stuck_run > 0 and n_points > cfg.cleaning.max_stuck_run:
            continue
        if model.nonnegative_ and raw[a] == 0.0:
            continue
        if a > 0 and np.isfinite(raw[a - 1]) and abs(raw[a] - raw[a - 1]) > model.tau_:
            continue
        out[a + 1 : b + 1] = True
        after = (raw if known is None else known)[b + 1] if b + 1 < raw.size else np.nan
        if np.isfinite(after):
            k = b - a  # repeats
            values[a + 1 : b + 1] = raw[a] + (after - raw[a]) * np.arange(1, k + 1) / (k + 1)
        else:
            values[a + 1 : b + 1] = expected[a + 1 : b + 1]
    return out, values
