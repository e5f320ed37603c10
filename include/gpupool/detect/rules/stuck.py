"""The stuck rule: an exporter repeating one exact value for longer than the series' history
makes plausible at that level."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpupool.detect.settings import CleaningRules

#: fewest history steps a repeat statistic is read from
MIN_REPEAT_STEPS = 48
#: the quantile of the history's run lengths a stuck run is measured against
#: (docs/decisions/0018-stuck-from-values.md)
STUCK_RUN_QUANTILE = 0.99
#: a stuck run is longer than this x the `STUCK_RUN_QUANTILE` of the history's run lengths at its
#: level (docs/decisions/0018-stuck-from-values.md)
STUCK_RUN_FACTOR = 2.0
#: the history's runs are split into this many bands of level (quantiles of the runs' values)
REPEAT_LEVEL_BANDS = 4
#: fewest runs a band's own quantile is read from; a band with fewer uses the whole history's
MIN_BAND_RUNS = 20


def _runs(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Lengths (points) and values of the runs of one exact value in finite `values`."""
    change = np.flatnonzero(np.diff(values) != 0)
    lengths = np.diff(np.concatenate([[-1], change, [values.size - 1]]))
    return lengths, values[np.concatenate([[0], change + 1])]


@dataclass(frozen=True)
class RepeatStats:
    """What the stuck rule reads of a series' history (`repeat_stats`); NaN and empty: the history
    was too short to tell, or the model was stored before the statistic existed (the rule is off,
    or judges every level against the whole history's runs)."""

    #: share of the history's steps that repeat the value before exactly
    share: float = float("nan")
    #: the `STUCK_RUN_QUANTILE` of the lengths of the history's runs of one exact value (points)
    run: float = float("nan")
    #: the inner bounds of `REPEAT_LEVEL_BANDS` bands of level (quantiles of the runs' values)
    edges: tuple[float, ...] = ()
    #: each band's `STUCK_RUN_QUANTILE` of run lengths (a band of under `MIN_BAND_RUNS` runs: the whole history's)
    runs: tuple[float, ...] = ()


def repeat_stats(values: np.ndarray) -> RepeatStats:
    """The history's `RepeatStats`: `repeats` and `repeat_levels` of `values`."""
    share, run = repeats(values)
    levels = repeat_levels(values)
    return RepeatStats(share, run, tuple(levels.get("edges", ())), tuple(levels.get("runs", ())))


def repeats(values: np.ndarray) -> tuple[float, float]:
    """The history's share of steps that repeat the value before, and the `STUCK_RUN_QUANTILE`
    of its run lengths (points holding one exact value); NaN when the history is too short to tell.

    A quantile, not the longest run: a stuck exporter in the history itself must not raise the
    bar for the next one.
    """
    v = np.asarray(values, dtype="float64")
    v = v[np.isfinite(v)]
    if v.size <= MIN_REPEAT_STEPS:
        return float("nan"), float("nan")
    lengths, _ = _runs(v)
    return float(np.mean(np.diff(v) == 0)), float(np.quantile(lengths, STUCK_RUN_QUANTILE))


def repeat_levels(values: np.ndarray) -> dict:
    """The history's run lengths by level, JSON-able: ``edges`` (the inner bounds of
    `REPEAT_LEVEL_BANDS` bands, quantiles of the runs' values) and ``runs`` (each band's
    `STUCK_RUN_QUANTILE` of run lengths; a band of under `MIN_BAND_RUNS` runs gets the whole
    history's). Empty when the history is too short to tell.

    By level because a series sits still longer at some levels than at others: an idle or a full
    platform holds its count for hours, a busy one changes it every few minutes.
    """
    v = np.asarray(values, dtype="float64")
    v = v[np.isfinite(v)]
    if v.size <= MIN_REPEAT_STEPS:
        return {}
    lengths, levels = _runs(v)
    whole = float(np.quantile(lengths, STUCK_RUN_QUANTILE))
    edges = np.unique(np.quantile(levels, np.arange(1, REPEAT_LEVEL_BANDS) / REPEAT_LEVEL_BANDS))
    band = np.searchsorted(edges, levels, side="right")
    runs = []
    for b in range(edges.size + 1):
        at = lengths[band == b]
        runs.append(float(np.quantile(at, STUCK_RUN_QUANTILE)) if at.size >= MIN_BAND_RUNS else whole)
    return {"edges": [float(e) for e in edges], "runs": runs}


def typical_run(stats: RepeatStats, level: float) -> float:
    """The history's `STUCK_RUN_QUANTILE` of run lengths at `level` (without bands: the whole
    history's)."""
    if not stats.runs:
        return stats.run
    return float(stats.runs[int(np.searchsorted(np.asarray(stats.edges, dtype="float64"), level, side="right"))])


def stuck_runs(
    raw: np.ndarray,
    expected: np.ndarray,
    stats: RepeatStats,
    rules: CleaningRules,
    tau: float,
    nonnegative: bool,
    known: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Points of an exporter stuck on one value: the repeats in a run of one exact value that
    is longer than the series' history (`stats`) makes plausible at that level.

    A run of `n` points at level `x` is stuck when `n` > both `rules.min_stuck_run` and
    `STUCK_RUN_FACTOR` x the history's `STUCK_RUN_QUANTILE` of run lengths at `x`
    (`repeat_levels`: an idle or full platform whose history holds long runs at that level
    keeps them), and, with `rules.max_stuck_run` > 0, `n` <= it (a longer run is the demand
    itself standing still). A series whose history repeats the value before at more than
    `rules.stuck_max_repeat_share` of its steps is never stuck from its values alone. A run
    at zero of a `nonnegative` series is idle, not stuck (a collapse is the drop rule's); so is
    a run entered by a step of more than `tau`: a jump to a new level (the burst rule judges
    it), not an exporter repeating an ordinary reading. All of this reads raw values only, so a
    window judges a run that began before it as one go does. The run's first point is the last
    value the exporter really read and is kept; missing points end a run. The repeats are
    replaced by a straight line from that value to the first value after the run (as `known`
    gives it: that value cleaned, when it is itself a fault; default the raw one); a run still
    open at the end of the data is judged on its length so far and replaced by x̂ (so is a run
    with a missing point after it). Returns the mask of replaced points and their values.
    """
    out = np.zeros(raw.size, dtype=bool)
    values = np.full(raw.size, np.nan)
    share = stats.share
    if rules.min_stuck_run <= 0 or not (np.isfinite(share) and np.isfinite(stats.run)):
        return out, values
    if share > rules.stuck_max_repeat_share or raw.size < 2:
        return out, values
    with np.errstate(invalid="ignore"):
        same = np.isfinite(raw[1:]) & (raw[1:] == raw[:-1])
    edges = np.diff(np.concatenate([[0], same.astype(np.int8), [0]]))
    for a, b in zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)):
        # same[a:b] true: raw[a] .. raw[b] hold one value, b - a + 1 points
        n_points = b - a + 1
        if n_points <= max(rules.min_stuck_run, STUCK_RUN_FACTOR * typical_run(stats, raw[a])):
            continue
        if rules.max_stuck_run > 0 and n_points > rules.max_stuck_run:
            continue
        if nonnegative and raw[a] == 0.0:
            continue
        if a > 0 and np.isfinite(raw[a - 1]) and abs(raw[a] - raw[a - 1]) > tau:
            continue
        out[a + 1 : b + 1] = True
        after = (raw if known is None else known)[b + 1] if b + 1 < raw.size else np.nan
        if np.isfinite(after):
            k = b - a  # repeats
            values[a + 1 : b + 1] = raw[a] + (after - raw[a]) * np.arange(1, k + 1) / (k + 1)
        else:
            values[a + 1 : b + 1] = expected[a + 1 : b + 1]
    return out, values
