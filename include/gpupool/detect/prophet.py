"""Prophet detector: a seasonal model fitted once on the history, then only predicted.

Prophet is fitted with the seasonalities the profile found (daily, weekly, or a custom
period) and a flat trend, then x̂_t = Prophet's prediction + the median of the last
`bias_window` residuals before t. The residual median carries the level: a fitted
trend extrapolated over the hours (or, in the benchmark, weeks) between refits drifts,
while the past residuals know where the series is now without looking ahead.
The interval is x̂_t ± `interval_halfwidth_`, the history's residual quantile at
`interval_width`.

Prophet and its Stan backend are imported on first use only: they are slow to import
and most series never need them.
"""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd

from gpupool.detect.base import StreamingContext, judged_from, past_median, prepare, to_frame

_DAY = 86400.0


#: what Prophet and its Stan backend may still log: their per-fit INFO lines, and the ERROR
#: prophet.plot logs at import when plotly (a plotting extra gpupool never uses) is missing,
#: are not the user's business
_QUIET_LEVELS = {"prophet": logging.ERROR, "prophet.plot": logging.CRITICAL, "cmdstanpy": logging.ERROR}


def quiet_prophet() -> None:
    """Quiet Prophet's and cmdstanpy's loggers, before they are imported and again after (prophet
    sets its logger to INFO on import). cmdstanpy installs a stderr handler of its own on first
    use unless its logger has one: a NullHandler keeps that from happening, and what it logs at
    ERROR still reaches the handlers the application configured (its logger propagates)."""
    for name, level in _QUIET_LEVELS.items():
        logging.getLogger(name).setLevel(level)
    cmdstanpy = logging.getLogger("cmdstanpy")
    if not any(isinstance(h, logging.NullHandler) for h in cmdstanpy.handlers):
        cmdstanpy.addHandler(logging.NullHandler())



class ProphetDetector:
    """Prophet's seasonal prediction plus a past-residual level correction; score = |x_t - x̂_t|."""

    name = "prophet"

    def __init__(
        self,
        daily: bool = True,
        weekly: bool = False,
        extra_period_days: float | None = None,
        max_train: int = 1000,
        bias_window: int = 12,
        interval_width: float = 0.95,
    ) -> None:
        self.daily = daily
        self.weekly = weekly
        self.extra_period_days = extra_period_days
        self.max_train = max_train
        self.bias_window = bias_window
        self.interval_width = interval_width

    @classmethod
    def from_profile(cls, profile: dict, **kwargs) -> "ProphetDetector":
        """Seasonalities from a profile: daily/weekly if their lag autocorrelates, else its period."""
        step = profile.get("step_seconds") or 0.0
        duration = profile.get("duration_days") or 0.0
        acf_d = profile.get("acf_daily")
        acf_w = profile.get("acf_weekly")
        daily = bool(acf_d is not None and acf_d >= 0.3 and 0 < step < _DAY)
        weekly = bool(acf_w is not None and acf_w >= 0.3 and duration >= 14)
        extra = None
        if profile.get("period_source") == "spectral" and profile.get("period") and step:
            extra = float(profile["period"]) * step / _DAY
        if not (daily or weekly or extra):
            daily = 0 < step < _DAY
        return cls(daily=daily, weekly=weekly, extra_period_days=extra, **kwargs)

    def fit(self, y_history: pd.Series) -> "ProphetDetector":
        """Fit Prophet on the history, averaged into at most `max_train` points.

        Averaging consecutive points (rather than keeping only the newest ones) keeps the
        whole span, so a weekly season stays visible, while the fit's cost stays flat: the
        daily refit of many series is dominated by Prophet otherwise.
        """
        quiet_prophet()
        from prophet import Prophet

        quiet_prophet()  # cmdstanpy resets its logger level when first imported

        h = prepare(y_history)
        finite = h[np.isfinite(h.to_numpy())]
        self.model_ = None
        train = _block_means(finite, self.max_train)
        if len(train) >= 10 and float(np.ptp(train.to_numpy())) > 0.0:
            model = Prophet(
                growth="flat",
                daily_seasonality=self.daily,
                weekly_seasonality=self.weekly,
                yearly_seasonality=False,
                uncertainty_samples=0,
            )
            if self.extra_period_days:
                model.add_seasonality(name="profiled", period=self.extra_period_days, fourier_order=5)
            df = pd.DataFrame({"ds": _naive(train.index), "y": train.to_numpy()})
            model.fit(df)
            self.model_ = model
        self.fallback_level_ = float(np.median(finite.to_numpy())) if len(finite) else np.nan
        self.context_ = StreamingContext()
        self.context_.remember(h, self.bias_window + 1)
        expected = self._expected(h, 0)
        self.history_residuals_ = h.to_numpy() - expected
        self.history_scores_ = np.abs(self.history_residuals_)
        res = self.history_residuals_[np.isfinite(self.history_residuals_)]
        self.interval_halfwidth_ = float(np.quantile(np.abs(res), self.interval_width)) if res.size else np.nan
        self.n_history_ = int(len(h))
        return self

    def score(self, y: pd.Series, start: pd.Timestamp | None = None) -> pd.DataFrame:
        """x̂_t and |x_t - x̂_t| for each point of `y` (NaN before `start`)."""
        work = prepare(y)
        joined, offset = self.context_.with_context(work)
        first = judged_from(joined.index, offset, start)
        expected = self._expected(joined, first)
        score = np.abs(joined.to_numpy() - expected)
        return to_frame(y, work.index, expected[offset:], score[offset:])

    def _expected(self, s: pd.Series, first: int) -> np.ndarray:
        n = len(s)
        out = np.full(n, np.nan)
        if first >= n:
            return out
        # the level correction needs the residuals of the points just before `first`
        lo = max(0, first - self.bias_window)
        part = s.iloc[lo:]
        if self.model_ is not None:
            yhat = self.model_.predict(pd.DataFrame({"ds": _naive(part.index)}))["yhat"].to_numpy()
        else:
            yhat = np.full(len(part), self.fallback_level_)
        resid = part.to_numpy() - yhat
        bias = past_median(resid, self.bias_window)
        bias = np.where(np.isfinite(bias), bias, 0.0)
        out[lo:] = yhat + bias
        out[:first] = np.nan
        return out


def _naive(index: pd.DatetimeIndex) -> pd.DatetimeIndex:
    """Prophet wants tz-naive timestamps; UTC wall time keeps the order and the spacing."""
    idx = pd.DatetimeIndex(index)
    if idx.tz is not None:
        idx = idx.tz_convert("UTC").tz_localize(None)
    return idx


def _block_means(s: pd.Series, max_points: int) -> pd.Series:
    """`s` averaged over blocks of consecutive points so that at most `max_points` remain.

    Each block is stamped with its mean timestamp; the newest points form the last block.
    """
    if max_points <= 0 or len(s) <= max_points:
        return s
    k = int(np.ceil(len(s) / max_points))
    nb = len(s) // k
    tail = s.iloc[len(s) - nb * k :]
    values = tail.to_numpy().reshape(nb, k).mean(axis=1)
    stamps = tail.index.asi8.reshape(nb, k).mean(axis=1).astype("int64")
    index = pd.DatetimeIndex(stamps.astype(f"datetime64[{tail.index.unit}]"))
    if tail.index.tz is not None:
        index = index.tz_localize("UTC").tz_convert(tail.index.tz)
    return pd.Series(values, index=index)
