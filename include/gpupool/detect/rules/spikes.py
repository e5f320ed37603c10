"""The spike rule: a short excursion that towers over the series' own and jumps back."""

from __future__ import annotations

import numpy as np

from gpupool.detect.rules.stuck import MIN_REPEAT_STEPS

#: quantile of the history's local-peak heights (how far a point stands above or below both
#: neighbours) and one-step changes that measures a series' ordinary excursions
#: (bench/detect_cleaning.py)
SPIKE_HEIGHT_QUANTILE = 0.99


def transients(
    flag: np.ndarray,
    raw: np.ndarray,
    expected: np.ndarray,
    tau: float,
    max_run: int,
    min_height: float,
    max_shoulder: float = 1.0,
    min_open: float = 0.0,
) -> np.ndarray:
    """Points inside a short excursion (a spike or a dip of the exporter) that a flag starts.

    A flagged point t0 with level x̂_t0 starts an excursion: the run of points from t0 that
    stay more than τ from x̂_t0 and nearer to x_t0 than to the value before t0. A point within
    τ of x̂_t0, or back nearer to where the series left (x̂ may lag a real rise the spike sat
    on), or missing (no evidence of a new level) ends it. The excursion is short, and its
    points are cleaned, when

    - the run lasts at most `max_run` points (a longer one is a burst or a level shift of real
      demand: kept; a run still open at the end of the data, shorter than that, cannot be told
      yet and counts as short);
    - it stands more than τ, and more than `min_height`, above (or below) the values on both
      sides of it (the point before t0 and the first back; x̂_t0 for a missing one). A run
      that begins inside another excursion does not: it is that excursion's tail (the end of
      a burst a slow x̂ has not followed, or the points after a spike whose x̂ the spike
      shaped). `min_height` is the history's ordinary local-peak height times
      `cleaning.spike_height_factor`, so a series whose own noise and short surges reach τ keeps
      them, and only what towers over them is cleaned (0: no such test);
    - it rises from the level and falls back to it at once: the values on both sides of it
      carry at most `max_shoulder` of its deviation from x̂_t0 (a surge of real demand
      climbs and ebbs over a few points; an exporter's glitch jumps).

    A run still open at the end of the data may as well be the start of a new level: it is
    cleaned only when it also moved more than `min_open` from the point before it (the
    history's ordinary one-step change times `cleaning.open_move_factor`: the demand does not move
    like that, an exporter's spike does; 0: no such test).

    The decision waits for at most `max_run` later points; judging each point stays causal.
    `max_run` 0: every flagged point is cleaned. Returns the mask of the excursions' points
    (the caller cleans the flagged ones).
    """
    n = flag.size
    out = np.zeros(n, dtype=bool)
    if not flag.any():
        return out
    if max_run <= 0:
        return flag.copy()
    for t0 in np.flatnonzero(flag):
        level = expected[t0]
        before = raw[t0 - 1] if t0 > 0 and np.isfinite(raw[t0 - 1]) else level
        j = t0
        with np.errstate(invalid="ignore"):
            while (
                j < n
                and j - t0 <= max_run
                and np.isfinite(raw[j])
                and abs(raw[j] - level) > tau
                and abs(raw[j] - raw[t0]) <= abs(raw[j] - before)
            ):
                j += 1
        if j == t0 or j - t0 > max_run:
            continue
        after = raw[j] if j < n and np.isfinite(raw[j]) else level
        run = raw[t0:j]
        if raw[t0] > level:
            height = float(run.min()) - max(before, after)
            deviation = float(run.min()) - level
        else:
            height = min(before, after) - float(run.max())
            deviation = level - float(run.max())
        if not height > max(tau, min_height, (1.0 - max_shoulder) * deviation):
            continue
        if j >= n and min_open > 0:
            moved = float(run.min()) - before if raw[t0] > level else before - float(run.max())
            if not moved > min_open:
                continue
        out[t0:j] = True
    return out


#: history points beyond a tail quantile for it to be read (0.99: at least 500 points)
MIN_TAIL_POINTS = 5


def peak_height(values: np.ndarray, q: float) -> float:
    """The `q` quantile of how far each point stands above (or below) both its neighbours, 0 for
    a point between them: the size of a series' ordinary one-point excursions. NaN when the
    history is too short to tell (fewer than `MIN_TAIL_POINTS` / (1 - q) points).

    A quantile, not the largest: a spike of the exporter in the history itself must not raise
    the bar for the next one.
    """
    v = np.asarray(values, dtype="float64")
    if v.size < 3:
        return float("nan")
    left, mid, right = v[:-2], v[1:-1], v[2:]
    with np.errstate(invalid="ignore"):
        up = np.minimum(mid - left, mid - right)
        down = np.minimum(left - mid, right - mid)
        height = np.where(up > 0, up, np.where(down > 0, down, 0.0))
    height = height[np.isfinite(up) & np.isfinite(down)]
    # a tail quantile needs a few points beyond it, or it is the history's own largest spike
    if height.size < max(MIN_REPEAT_STEPS, MIN_TAIL_POINTS / max(1.0 - q, 0.01)):
        return float("nan")
    return float(np.quantile(height, q))


def step_height(values: np.ndarray, q: float) -> float:
    """The `q` quantile of the one-step changes |x_t - x_t-1| of `values` (a history, faults' shapes
    NaN: a change into or out of them is none of the demand's); NaN when the history is too short to
    tell (as `peak_height`)."""
    v = np.asarray(values, dtype="float64")
    if v.size < 2:
        return float("nan")
    diffs = np.abs(np.diff(v))
    diffs = diffs[np.isfinite(diffs)]
    if diffs.size < max(MIN_REPEAT_STEPS, MIN_TAIL_POINTS / max(1.0 - q, 0.01)):
        return float("nan")
    return float(np.quantile(diffs, q))
