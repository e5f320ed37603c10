"""The outage rule: on a series whose history hardly idles, a fall to zero as long as a counter
reset is an outage of the exporter, not idle demand."""

from __future__ import annotations

import numpy as np

from gpupool.detect.rules.stuck import MIN_REPEAT_STEPS
from gpupool.detect.settings import CleaningRules


def idle_share(values: np.ndarray, drop_share: float, max_run: int) -> float:
    """Share of the history's points in idle spells: runs of more than `max_run` points at or below
    `drop_share` x the history's median (an exporter's drops are shorter); NaN when the history is too
    short to tell.
    """
    v = np.asarray(values, dtype="float64")
    v = v[np.isfinite(v)]
    if v.size <= MIN_REPEAT_STEPS:
        return float("nan")
    low = v <= drop_share * float(np.median(v))
    edges = np.diff(np.concatenate([[0], low.astype(np.int8), [0]]))
    lengths = np.flatnonzero(edges == -1) - np.flatnonzero(edges == 1)
    return float(lengths[lengths > max_run].sum() / v.size)


def longest_drop(idle: float, rules: CleaningRules) -> int:
    """The longest flat fall to zero (points) that `collapses` cleans, as its `max_drop_run`.

    As short as a spike (`rules.max_anomaly_run`): demand that went away for a while is idle. On a
    series whose history hardly idles (`idle`, its `idle_share`, at most `rules.outage_max_idle_share`)
    a fall as long as a counter reset's (`rules.max_fault_run`, returned as 0) is an outage of the
    exporter: the demand does not vanish for an hour to come back where it was.
    """
    if rules.outage_max_idle_share is not None and np.isfinite(idle) and idle <= rules.outage_max_idle_share:
        return 0
    return rules.max_anomaly_run
