"""The stuck rule: an exporter repeating one exact value for longer than the series' history
makes plausible at that level."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from gpupool.detect.model import FittedSeriesModel


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
# With a co-moving series given (docs/decisions/0020-stuck-co-moving.md, chosen on Helios traces
# with their GPU-job counts as the co-moving series):
#: the run bar's factor in place of `STUCK_RUN_FACTOR` (0: only `cleaning.min_stuck_run`; the
#: co-moving series, not the run's length against the history's, tells a stuck exporter)
MOVING_RUN_FACTOR = 0.0
#: the co-moving series counts as moved at a point of the run when it stands at least this far (its
#: own units: a whole job) from its value at the run's start, so a blip that comes back is no
#: move; 0: at each step where it changes at all
MOVING_MIN_SHIFT = 1.0
#: a run is stuck only when the co-moving series moved at this many of its points or more
MOVING_MIN_MOVES = 3
#: ... and at no less than this share of them
MIN_MOVING_SHARE = 0.0
#: with a co-moving series given, a run entered by a step of more than τ is judged too (the
#: co-moving series, not the entry, tells a stuck exporter from a new level)
MOVING_JUDGES_ENTRY = False
#: with a co-moving series given, only the repeats from the co-moving series' first move in the
#: run on are replaced: until then it stood still too, and so, most likely, did the demand
MOVING_FROM_FIRST_MOVE = True
#: with a co-moving series given, the line across the repeats is shaped by that series: it moves
#: as the co-moving series does, scaled by this series' value per unit of it at the run's start
#: (GPUs per job), the line closing what is left to the value after the run
MOVING_SHAPED = True


def _runs(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Lengths (points) and values of the runs of one exact value in finite `values`."""
    change = np.flatnonzero(np.diff(values) != 0)
    lengths = np.diff(np.concatenate([[-1], change, [values.size - 1]]))
    return lengths, values[np.concatenate([[0], change + 1])]


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


def typical_run(model: FittedSeriesModel, level: float) -> float:
    """The history's `STUCK_RUN_QUANTILE` of run lengths at `level` (a model stored before the
    bands existed: the whole history's)."""
    table = model.extra.get("repeat_levels") or {}
    if not table.get("runs"):
        return model.repeat_run_
    return float(table["runs"][int(np.searchsorted(np.asarray(table["edges"], dtype="float64"), level, side="right"))])


def stuck_runs(
    raw: np.ndarray,
    expected: np.ndarray,
    model: FittedSeriesModel,
    known: np.ndarray | None = None,
    moving: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Points of an exporter stuck on one value: the repeats in a run of one exact value that
    is longer than the series' history makes plausible at that level.

    A run of `n` points at level `x` is stuck when `n` > both `cleaning.min_stuck_run` and
    `STUCK_RUN_FACTOR` x the history's `STUCK_RUN_QUANTILE` of run lengths at `x`
    (`repeat_levels`: an idle or full platform whose history holds long runs at that level
    keeps them), and, with `cleaning.max_stuck_run` > 0, `n` <= it (a longer run is the demand
    itself standing still). A series whose history repeats the value before at more than
    `cleaning.stuck_max_repeat_share` of its steps is never stuck from its values alone. A run
    at zero of a non-negative series is idle, not stuck (a collapse is the drop rule's); so is a
    run entered by a step of more than τ: a jump to a new level (the burst rule judges it), not
    an exporter repeating an ordinary reading. All of this reads raw values only, so a window
    judges a run that began before it as one go does. The run's first point is the last value
    the exporter really read and is kept; missing points end a run. The repeats are replaced by
    a straight line from that value to the first value after the run (as `known` gives it: that
    value cleaned, when it is itself a fault; default the raw one); a run still open at the end
    of the data is judged on its length so far and replaced by x̂ (so is a run with a missing
    point after it).

    `moving` (optional: a series of another exporter on the same timestamps that moves when
    this one really does, a platform's job count beside its GPU count) is stronger evidence
    than the repeat share, so with it the gate is open and the factor is `MOVING_RUN_FACTOR`;
    a run is then stuck only when `moving` moved (stood `MOVING_MIN_SHIFT` or more from its
    value at the run's start) at `MOVING_MIN_MOVES` of the run's points or more (and at
    `MIN_MOVING_SHARE` of them): when it stands still too, so does the demand. Only the
    repeats from its first move on are replaced (`MOVING_FROM_FIRST_MOVE`), and the line
    across them follows `moving` (`MOVING_SHAPED`). Returns the mask of replaced points and
    their values.
    """
    cfg = model.config
    out = np.zeros(raw.size, dtype=bool)
    values = np.full(raw.size, np.nan)
    share = model.repeat_share_
    if cfg.cleaning.min_stuck_run <= 0 or not (np.isfinite(share) and np.isfinite(model.repeat_run_)):
        return out, values
    # a co-moving series that moves is stronger evidence than the history's repeat share
    if (moving is None and share > cfg.cleaning.stuck_max_repeat_share) or raw.size < 2:
        return out, values
    factor = STUCK_RUN_FACTOR if moving is None else MOVING_RUN_FACTOR
    if moving is not None and np.shape(moving) != raw.shape:
        raise ValueError(f"stuck_runs: the co-moving series has {np.size(moving)} points, the series {raw.size}")
    co_all = None if moving is None else np.asarray(moving, dtype="float64")
    with np.errstate(invalid="ignore"):
        same = np.isfinite(raw[1:]) & (raw[1:] == raw[:-1])
    edges = np.diff(np.concatenate([[0], same.astype(np.int8), [0]]))
    for a, b in zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)):
        # same[a:b] true: raw[a] .. raw[b] hold one value, b - a + 1 points
        n_points = b - a + 1
        if n_points <= max(cfg.cleaning.min_stuck_run, factor * typical_run(model, raw[a])):
            continue
        if cfg.cleaning.max_stuck_run > 0 and n_points > cfg.cleaning.max_stuck_run:
            continue
        if model.nonnegative_ and raw[a] == 0.0:
            continue
        entered = a > 0 and np.isfinite(raw[a - 1]) and abs(raw[a] - raw[a - 1]) > model.tau_
        if entered and not (moving is not None and MOVING_JUDGES_ENTRY):
            continue
        read = a  # the last reading: its value and the co-series' then agree
        if moving is not None:
            co = co_all[a : b + 1]
            with np.errstate(invalid="ignore"):
                if MOVING_MIN_SHIFT > 0:
                    moved = np.isfinite(co[1:]) & (np.abs(co[1:] - co[0]) >= MOVING_MIN_SHIFT)
                else:
                    moved = np.isfinite(co[1:]) & np.isfinite(co[:-1]) & (co[1:] != co[:-1])
            m = int(moved.sum())
            if moved.mean() < MIN_MOVING_SHARE or m < MOVING_MIN_MOVES:
                continue
            if MOVING_FROM_FIRST_MOVE:
                a += int(np.argmax(moved))  # raw[a + 1] is the first repeat the co-series moved at
        out[a + 1 : b + 1] = True
        after = (raw if known is None else known)[b + 1] if b + 1 < raw.size else np.nan
        shape = np.zeros(b - a + 2)  # at raw[a] .. raw[b + 1]
        if moving is not None and MOVING_SHAPED and b + 1 < raw.size and np.isfinite(co_all[read]) and co_all[read] != 0:
            co = co_all[a : b + 2]
            if np.isfinite(co).all():
                shape = (co - co_all[read]) * (raw[read] / co_all[read])
        if np.isfinite(after):
            k = b - a  # repeats
            # the run's value moved as the co-series did since the last reading, and what that
            # leaves short of `after` closed along a line
            line = (after - raw[a] - shape[-1]) * np.arange(1, k + 1) / (k + 1)
            values[a + 1 : b + 1] = raw[a] + shape[1:-1] + line
        else:
            values[a + 1 : b + 1] = expected[a + 1 : b + 1]
    return out, values
