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


class TSBForecaster(_Baseline):
    """Teunter-Syntetos-Babai (TSB) forecast of intermittent demand: the probability that a step
    has any demand and the size of the demand when there is some, each smoothed exponentially.

    The probability is updated on every step (towards 1 when there was demand, towards 0 when
    there was none), the size only on steps with demand; the forecast is their product. With
    ``season`` (steps per cycle, e.g. 24 on hourly data) each phase of the cycle keeps its own
    probability and size, updated once per cycle: an on/off pattern with the time of day is
    forecast as the share of days each hour was on times that hour's usual size.

    Parameters
    ----------
    alpha_d, alpha_p:
        Smoothing weights of the demand size and of the demand probability, in (0, 1].
    season:
        Steps per cycle, or None (one probability and size for all steps).
    level, lower_bound, upper_bound:
        As the other baselines.

    Fitted attributes: ``prob_`` and ``size_`` (one value, or one per phase, the phase of the
    first future step first), ``sigma_`` (root mean square of the one-step errors, per phase
    with ``season``) and ``summary_``.
    """

    name = "tsb"

    def __init__(self, alpha_d: float = 0.1, alpha_p: float = 0.1, season: int | None = None, level: float = 90,
                 lower_bound: float | None = 0.0, upper_bound: float | None = None):
        super().__init__(level, lower_bound, upper_bound)
        for what, a in (("alpha_d", alpha_d), ("alpha_p", alpha_p)):
            if not 0 < float(a) <= 1:
                raise ValueError(f"TSBForecaster: {what} must be in (0, 1], got {a!r}")
        if season is not None and int(season) < 1:
            raise ValueError(f"TSBForecaster: season must be a positive number of steps, got {season!r}")
        self.alpha_d = float(alpha_d)
        self.alpha_p = float(alpha_p)
        self.season = None if season is None else int(season)

    def _refresh(self) -> None:
        y = self.series_.values
        m = self.season if self.season and len(y) >= 2 * self.season else 1
        prob, size, sigma = tsb_filter(y, self.alpha_d, self.alpha_p, m)
        self.season_ = m
        self.prob_, self.size_, self.sigma_ = prob, size, sigma
        self.summary_ = {"model": self.name, "season": m, "n_obs": int(len(y)), "alpha_d": self.alpha_d,
                         "alpha_p": self.alpha_p, "sigma": float(np.sqrt(np.mean(sigma**2)))}

    def _forecast(self, h: int) -> tuple[np.ndarray, np.ndarray]:
        phase = np.arange(h) % len(self.prob_)
        return self.prob_[phase] * self.size_[phase], self.sigma_[phase]


def tsb_filter(y: np.ndarray, alpha_d: float, alpha_p: float, m: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """TSB's recursions over ``y`` with ``m`` phases (1: none): the probability, size and one-step
    error RMS of each phase after the last point, rolled so that index 0 is the next step's phase.

    The phases are updated together, one cycle at a time (a vectorised pass over ``len(y) / m``
    cycles). Initial values: each phase's share of non-zero points and mean non-zero size over
    the first cycles (at most four); the errors are counted after them."""
    y = np.asarray(y, dtype=float)
    m = max(int(m), 1)
    n = len(y)
    if n == 0:
        return np.zeros(m), np.zeros(m), np.zeros(m)
    cycles = -(-n // m)
    grid = np.full(cycles * m, np.nan)
    grid[:n] = y
    grid = grid.reshape(cycles, m)
    init = grid[: min(4, cycles)]
    seen = np.isfinite(init)
    nonzero = seen & (np.nan_to_num(init) != 0)
    prob = nonzero.sum(0) / np.maximum(seen.sum(0), 1)
    size = np.where(nonzero.any(0), np.nansum(np.where(nonzero, init, 0.0), 0) / np.maximum(nonzero.sum(0), 1), 0.0)
    sq, count = np.zeros(m), np.zeros(m)
    burn = min(4, cycles) if cycles > 4 else 1
    for c in range(cycles):
        row = grid[c]
        seen = np.isfinite(row)
        if c >= burn:
            err = np.where(seen, row - prob * size, 0.0)
            sq += err**2
            count += seen
        demand = seen & (row != 0)
        prob = np.where(seen, prob + alpha_p * (demand - prob), prob)
        size = np.where(demand, size + alpha_d * (np.nan_to_num(row) - size), size)
    sigma = np.sqrt(sq / np.maximum(count, 1))
    if not np.any(count):
        sigma = np.full(m, float(np.std(y)))
    shift = n % m
    return np.roll(prob, -shift), np.roll(size, -shift), np.roll(sigma, -shift)


__all__ = ["SeasonalNaiveForecaster", "MeanForecaster", "NaiveForecaster", "TSBForecaster", "tsb_filter"]
