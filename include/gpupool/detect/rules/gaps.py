"""Bridging: what replaces a cleaned run or a short gap (a line between the readings on both sides)."""

from __future__ import annotations

import numpy as np

#: longest run of missing points that is filled (longer gaps stay missing)
MAX_FILL_GAP_POINTS = 3


def bridge(values: np.ndarray, mask: np.ndarray, fallback: np.ndarray) -> np.ndarray:
    """Replacement values for the runs of `mask`: a straight line from the value before each run
    to the value after it (`values`: the series as cleaning keeps it, so a fault beside a run
    does not shape the line), or `fallback` where either is missing or the run touches the start
    or the end of the data.

    The points on both sides are the series' own readings around the run: the hourly mean
    the replaced points feed follows the demand better than x̂, which lags a move and carries
    the detector's error.
    """
    out = np.asarray(fallback, dtype="float64").copy()
    n = values.size
    edges = np.diff(np.concatenate([[0], mask.astype(np.int8), [0]]))
    for a, b in zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)):
        if a == 0 or b >= n or not (np.isfinite(values[a - 1]) and np.isfinite(values[b])):
            continue
        out[a:b] = values[a - 1] + (values[b] - values[a - 1]) * np.arange(1, b - a + 1) / (b - a + 1)
    return out


def short_gaps(raw: np.ndarray, max_len: int) -> np.ndarray:
    """Mask of missing points in runs of at most `max_len` (runs touching the end included)."""
    miss = ~np.isfinite(raw)
    if max_len <= 0 or not miss.any():
        return np.zeros(raw.size, dtype=bool)
    edges = np.diff(np.concatenate([[0], miss.astype(np.int8), [0]]))
    starts = np.flatnonzero(edges == 1)
    stops = np.flatnonzero(edges == -1)
    mask = np.zeros(raw.size, dtype=bool)
    for a, b in zip(starts, stops):
        if b - a <= max_len:
            mask[a:b] = True
    return mask
