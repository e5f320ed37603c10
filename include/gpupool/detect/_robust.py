"""Small robust-statistics helpers shared by the detectors (no project state)."""

from __future__ import annotations

import numpy as np
import pandas as pd

#: 1.4826 * MAD estimates the standard deviation of a normal sample
MAD_TO_SIGMA = 1.4826


def robust_sigma(values: np.ndarray, floor: float = 0.0) -> float:
    """Scale of `values` from the median absolute deviation, ignoring NaN.

    Falls back to the mean absolute deviation when more than half of the values are
    equal (MAD is 0 then, which would make every change an anomaly), and returns
    `floor` when nothing finite is left.
    """
    v = np.asarray(values, dtype="float64")
    v = v[np.isfinite(v)]
    if v.size == 0:
        return float(floor)
    med = np.median(v)
    dev = np.abs(v - med)
    sigma = MAD_TO_SIGMA * float(np.median(dev))
    if sigma <= 0.0:
        sigma = 1.2533 * float(np.mean(dev))  # mean abs deviation -> sigma for a normal sample
    return float(max(sigma, floor))


def step_seconds(index: pd.DatetimeIndex) -> float | None:
    """Typical sampling step: the median positive difference between timestamps."""
    if len(index) < 2:
        return None
    ts = np.sort(index.asi8)
    diffs = np.diff(ts)
    diffs = diffs[diffs > 0]
    if diffs.size == 0:
        return None
    unit = np.timedelta64(1, index.unit if hasattr(index, "unit") else "ns") / np.timedelta64(1, "s")
    return float(np.median(diffs) * unit)


def as_sorted_unique(y: pd.Series) -> pd.Series:
    """A float copy of `y` in time order with one value per timestamp (the last one).

    Profiles and fits look at the series as time passes; the caller's frame keeps its own
    order and duplicates.
    """
    s = pd.Series(pd.to_numeric(y, errors="coerce").to_numpy(dtype="float64"), index=pd.DatetimeIndex(y.index))
    s = s[~s.index.isna()]
    if not s.index.is_monotonic_increasing:
        s = s.sort_index(kind="stable")
    if s.index.has_duplicates:
        s = s[~s.index.duplicated(keep="last")]
    return s


def ffill_array(x: np.ndarray) -> np.ndarray:
    """Forward-fill NaN in a 1-D array (leading NaN become the first finite value)."""
    x = np.asarray(x, dtype="float64").copy()
    ok = np.isfinite(x)
    if not ok.any():
        return x
    idx = np.where(ok, np.arange(x.size), 0)
    np.maximum.accumulate(idx, out=idx)
    out = x[idx]
    first = int(np.argmax(ok))
    out[:first] = x[first]
    return out
