"""Baseline forecasters with the same interface as :class:`~gpupool.forecast.arima.ArimaForecaster`.

They are the yardsticks of the benchmarks and the fallbacks of the ARIMA procedure, so they take
any series the ARIMA forecaster takes (gaps, duplicates, a single point) and never return NaN.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpupool.forecast._series import candidate_periods, forecast_frame, regularize


class _Baseline:
    """Fit/predict/update plumbing shared by the baselines."""

    name = "baseline"

    def __init__(self, level: float = 90, lower_bound: float | None = 0.0, upper_bound: float | None = None):
        self.level = level
        self.lower_bound = lower_bound
        self.upper_bound = upper_bound

    def fit(self, y: pd.Series) -> "_Baseline":
        """Fit on a series with a DatetimeIndex (not modified)."""
        self.series_ = regularize(y)
        self._refresh()
        return self

    def update(self, y_new: pd.Series) -> "_Baseline":
        """Append newly arrived points (no re-estimation beyond what the baseline is)."""
        self._check_fitted()
        combined = pd.concat([self.series_.to_series(), y_new])
        combined = combined[~combined.index.duplicated(keep="last")]
        self.series_ = regularize(combined, step=self.series_.step)
        self._refresh()
        return self

    def predict(self, h: int, level: float | None = None) -> pd.DataFrame:
        """Forecast ``h`` steps: columns ``ts, yhat, yhat_lower, yhat_upper``."""
        self._check_fitted()
        if h < 1:
            raise ValueError("h must be at least 1")
        mean, se = self._forecast(int(h))
        frame, clipped = forecast_frame(
            self.series_.future_index(int(h)), mean, se, self.level if level is None else level,
            self.lower_bound, self.upper_bound,
        )
        self.summary_["clipped"] = clipped
        return frame

    def _check_fitted(self) -> None:
        if not hasattr(self, "series_"):
            raise RuntimeError(f"{type(self).__name__} is not fitted")

    def _refresh(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def _forecast(self, h: int) -> tuple[np.ndarray, np.ndarray]:  # pragma: no cover - overridden
        raise NotImplementedError


class SeasonalNaiveForecaster(_Baseline):
    """Repeat the last full season; intervals from the in-sample seasonal-difference errors.

    ``season`` is the period in steps; without it the daily period of the sampling step is used.
    A series shorter than one season is forecast by its last value (naive).
    """

    name = "seasonal_naive"

    def __init__(self, season: int | None = None, level: float = 90, lower_bound: float | None = 0.0,
                 upper_bound: float | None = None):
        super().__init__(level, lower_bound, upper_bound)
        self.season = season

    def _refresh(self) -> None:
        y = self.series_.values
        periods = candidate_periods(self.series_.step, self.season)
        m = periods[0] if periods else 1
        if len(y) <= m:
            m = 1
        self.season_ = m
        diffs = y[m:] - y[:-m] if len(y) > m else np.zeros(1)
        self.sigma_ = float(np.sqrt(np.mean(diffs**2))) if len(diffs) else 0.0
        self.summary_ = {"model": self.name, "season": m, "n_obs": int(len(y)), "sigma": self.sigma_}

    def _forecast(self, h: int) -> tuple[np.ndarray, np.ndarray]:
        y, m = self.series_.values, self.season_
        steps = np.arange(h)
        mean = y[len(y) - m + steps % m]
        se = self.sigma_ * np.sqrt(steps // m + 1)
        return mean, se


class MeanForecaster(_Baseline):
    """Forecast the mean of the last ``window`` points (all points when None), with intervals
    from their standard deviation."""

    name = "mean"

    def __init__(self, window: int | None = None, level: float = 90, lower_bound: float | None = 0.0,
                 upper_bound: float | None = None):
        super().__init__(level, lower_bound, upper_bound)
        self.window = window

    def _refresh(self) -> None:
        y = self.series_.values
        if self.window:
            y = y[-int(self.window) :]
        self.mean_ = float(np.mean(y))
        self.sigma_ = float(np.std(y, ddof=1)) if len(y) > 1 else 0.0
        self.summary_ = {"model": self.name, "n_obs": int(len(y)), "mean": self.mean_, "sigma": self.sigma_}

    def _forecast(self, h: int) -> tuple[np.ndarray, np.ndarray]:
        n = len(self.series_.values) if not self.window else min(len(self.series_.values), int(self.window))
        se = self.sigma_ * np.sqrt(1 + 1 / max(n, 1))
        return np.full(h, self.mean_), np.full(h, se)


class NaiveForecaster(_Baseline):
    """Forecast the last value (random-walk intervals)."""

    name = "naive"

    def _refresh(self) -> None:
        y = self.series_.values
        diffs = np.diff(y)
        self.sigma_ = float(np.sqrt(np.mean(diffs**2))) if len(diffs) else 0.0
        self.summary_ = {"model": self.name, "n_obs": int(len(y)), "sigma": self.sigma_}

    def _forecast(self, h: int) -> tuple[np.ndarray, np.ndarray]:
        steps = np.arange(1, h + 1)
        return np.full(h, self.series_.values[-1]), self.sigma_ * np.sqrt(steps)


__all__ = ["SeasonalNaiveForecaster", "MeanForecaster", "NaiveForecaster"]
