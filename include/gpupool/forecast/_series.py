"""Shared plumbing of the forecasters: regularising an input series, seasonal periods from the
sampling step, future timestamps, interval bounds and clipping."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.stats import norm

FORECAST_COLUMNS = ["ts", "yhat", "yhat_lower", "yhat_upper"]


@dataclass(frozen=True)
class RegularSeries:
    """A series on a regular grid: values (gaps filled), the grid and what was done to get there."""

    values: np.ndarray
    start: pd.Timestamp
    step: pd.Timedelta
    n_missing: int
    missing_fraction: float

    @property
    def index(self) -> pd.DatetimeIndex:
        return pd.date_range(self.start, periods=len(self.values), freq=self.step)

    def future_index(self, h: int) -> pd.DatetimeIndex:
        first = self.start + self.step * len(self.values)
        return pd.date_range(first, periods=h, freq=self.step)

    def to_series(self) -> pd.Series:
        return pd.Series(self.values, index=self.index)


def infer_step(index: pd.DatetimeIndex) -> pd.Timedelta:
    """The sampling step: the most common gap between consecutive distinct timestamps."""
    uniq = index.unique().sort_values()
    if len(uniq) < 2:
        return pd.Timedelta(hours=1)
    gaps = pd.Series(uniq[1:] - uniq[:-1])  # Timedeltas, whatever the index's resolution
    step = pd.Timedelta(gaps.mode().iloc[0])
    return step if step > pd.Timedelta(0) else pd.Timedelta(hours=1)


def regularize(y: pd.Series, step: pd.Timedelta | None = None) -> RegularSeries:
    """Put ``y`` on a regular grid (mean of duplicates and of points inside one step), fill gaps
    by linear interpolation and count them. Leading gaps are dropped; ``y`` is not modified."""
    if not isinstance(y, pd.Series):
        raise TypeError("y must be a pandas Series with a DatetimeIndex")
    if not isinstance(y.index, pd.DatetimeIndex):
        raise TypeError("y must have a DatetimeIndex")
    values = pd.to_numeric(y, errors="coerce").astype("float64")
    values = values.where(np.isfinite(values))
    values = values[values.index.notna()].sort_index()
    if step is None:
        step = infer_step(values.index)
    observed = values.dropna()
    if observed.empty:
        raise ValueError("series has no finite values")
    first = observed.index[0]
    grid = values[values.index >= first].resample(step, origin=first).mean()
    n_missing = int(grid.isna().sum())
    filled = grid.interpolate(method="linear", limit_direction="both")
    return RegularSeries(
        values=filled.to_numpy(dtype=float),
        start=pd.Timestamp(grid.index[0]),
        step=step,
        n_missing=n_missing,
        missing_fraction=n_missing / max(len(grid), 1),
    )


def candidate_periods(step: pd.Timedelta, season: int | None) -> list[int]:
    """Daily and weekly periods (in steps) that the sampling step allows; a hint replaces the daily one."""
    seconds = step.total_seconds()
    day = 86400 / seconds if seconds > 0 else 0
    daily = int(round(day)) if day >= 2 and abs(day - round(day)) < 1e-9 else None
    if season is not None:
        season = int(season)
        if season < 2:
            return []
        if daily is not None and season == daily:
            return [season, 7 * season]
        return [season]
    out = []
    if daily is not None:
        out.append(daily)
        out.append(7 * daily)
    elif seconds >= 86400 and abs(seconds / 86400 - round(seconds / 86400)) < 1e-9:
        days = int(round(seconds / 86400))
        if days == 1:
            out.append(7)
    return out


def seasonal_strength(values: np.ndarray, period: int) -> float:
    """Strength of a seasonal cycle in [0, 1] from a classical additive decomposition
    (moving-average trend, phase means, remainder): ``1 - var(remainder) / var(detrended)``."""
    n = len(values)
    if period < 2 or n < 2 * period:
        return 0.0
    kernel = np.ones(period) / period
    if period % 2 == 0:
        kernel = np.convolve(kernel, [0.5, 0.5])
    trend = np.convolve(values, kernel, mode="valid")
    offset = (len(kernel) - 1) // 2
    detr = values[offset : offset + len(trend)] - trend
    phases = (np.arange(len(detr)) + offset) % period
    means = np.bincount(phases, weights=detr, minlength=period) / np.maximum(np.bincount(phases, minlength=period), 1)
    remainder = detr - means[phases]
    var_d = float(np.var(detr))
    if var_d <= 0:
        return 0.0
    return float(max(0.0, 1.0 - np.var(remainder) / var_d))


def z_value(level: float) -> float:
    """Two-sided normal quantile for a central interval of ``level`` percent."""
    if not 0 < level < 100:
        raise ValueError("level must be a percentage in (0, 100)")
    return float(norm.ppf(0.5 + level / 200.0))


def forecast_frame(
    index: pd.DatetimeIndex,
    mean: np.ndarray,
    se: np.ndarray,
    level: float,
    lower_bound: float | None,
    upper_bound: float | None,
) -> tuple[pd.DataFrame, bool]:
    """Build the ``ts, yhat, yhat_lower, yhat_upper`` frame, clip to the bounds, never NaN.

    Returns the frame and whether any value was clipped.
    """
    mean = np.asarray(mean, dtype=float)
    se = np.asarray(se, dtype=float)
    if not np.all(np.isfinite(mean)):
        raise FloatingPointError("non-finite point forecast")
    se = np.where(np.isfinite(se) & (se >= 0), se, 0.0)
    z = z_value(level)
    lower, upper = mean - z * se, mean + z * se
    clipped = False
    lo = -math.inf if lower_bound is None else float(lower_bound)
    hi = math.inf if upper_bound is None else float(upper_bound)
    cols = []
    for arr in (mean, lower, upper):
        c = np.clip(arr, lo, hi)
        clipped = clipped or bool(np.any(c != arr))
        cols.append(c)
    frame = pd.DataFrame({"ts": index, "yhat": cols[0], "yhat_lower": cols[1], "yhat_upper": cols[2]})
    frame.attrs["clipped"] = clipped
    return frame, clipped
