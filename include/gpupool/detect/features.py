"""Per-series features the router chooses a detector from.

`profile_series` summarises a series' stability (ADF and KPSS p-values, coefficient of
variation, level shifts, share of missing points) and periodicity (autocorrelation at the
daily and weekly lag, spectral peak strength, STL seasonal strength), plus its length and
sampling step. The result is a flat, JSON-serialisable dict: staging stores it as is in
`series_profile`, next to the time it was computed.

Every feature is computed on a regular grid at the series' typical step (irregular
timestamps are snapped to it, short holes interpolated for analysis only), so lags are
lags in time and not in rows. The function never raises on short, constant or gappy
input: a feature that cannot be computed is None.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
from threadpoolctl import threadpool_limits

from gpupool.detect._robust import as_sorted_unique, robust_sigma, step_seconds

#: the most grid points a profile looks at (the newest ones); keeps the daily refit cheap
#: while leaving room for two weekly cycles at 5-minute steps
MAX_PROFILE_POINTS = 6048
#: the stationarity tests look at this many points at most (the newest ones)
MAX_TEST_POINTS = 1000
#: autocorrelation above which a lag counts as a period
MIN_PERIOD_ACF = 0.3
#: spectral peak share above which the strongest frequency counts as a period
MIN_SPECTRAL_PEAK = 0.05

#: STL runs on block means with at most this many points per seasonal cycle
STL_MAX_PERIOD = 48

DAY = 86400.0
WEEK = 7 * DAY


def profile_series(y: pd.Series) -> dict:
    """Profile one series (float values, DatetimeIndex) for routing.

    Returns a dict with n, n_valid, step_seconds, duration_days, missing_share,
    zero_share, adf_p, kpss_p, cv, level_shifts, acf_daily, acf_weekly, spectral_peak,
    spectral_period, stl_seasonal_strength, stl_trend_strength, period (points, or None),
    period_source ("daily", "weekly", "spectral" or None), acf_period, constant,
    noise_ratio and spikiness. Values are plain Python floats/ints/bools/None.
    """
    s = as_sorted_unique(y)
    n = int(len(y))
    finite = s[np.isfinite(s.to_numpy())]
    n_valid = int(len(finite))
    step = step_seconds(s.index) if len(s) else None
    prof: dict = {
        "n": n,
        "n_valid": n_valid,
        "step_seconds": step,
        "duration_days": None,
        "missing_share": 1.0 if n else 0.0,
        "zero_share": None,
        "constant": None,
        "adf_p": None,
        "kpss_p": None,
        "cv": None,
        "level_shifts": None,
        "acf_daily": None,
        "acf_weekly": None,
        "spectral_peak": None,
        "spectral_period": None,
        "stl_seasonal_strength": None,
        "stl_trend_strength": None,
        "period": None,
        "period_source": None,
        "acf_period": None,
        "noise_ratio": None,
        "spikiness": None,
    }
    if n_valid == 0:
        return prof
    values = finite.to_numpy()
    prof["zero_share"] = float(np.mean(values == 0.0))
    spread = float(np.nanmax(values) - np.nanmin(values))
    prof["constant"] = bool(spread == 0.0)
    mean = float(np.mean(values))
    std = float(np.std(values))
    prof["cv"] = _num(std / abs(mean)) if mean != 0.0 else None
    if step is None or step <= 0:
        prof["missing_share"] = float(1.0 - n_valid / max(n, 1))
        return prof
    grid = _on_grid(finite, step)
    span_points = len(grid)
    prof["duration_days"] = float((s.index[-1] - s.index[0]).total_seconds() / DAY)
    prof["missing_share"] = float(min(1.0, max(0.0, 1.0 - n_valid / max(span_points, 1))))
    x = _interpolate(grid[-MAX_PROFILE_POINTS:])
    if prof["constant"] or x.size < 8:
        prof["level_shifts"] = 0
        return prof

    diff_sigma = robust_sigma(np.diff(x)) / math.sqrt(2.0)
    level_sigma = robust_sigma(x)
    # share of the spread that is point-to-point noise: near 1 for white noise, near 0
    # for smooth or strongly structured series
    prof["noise_ratio"] = _num(min(diff_sigma / level_sigma, 10.0)) if level_sigma > 0 else None
    prof["spikiness"] = _num(_spikiness(x))
    prof["level_shifts"] = _level_shifts(x, diff_sigma)
    prof["adf_p"], prof["kpss_p"] = _stationarity(x[-MAX_TEST_POINTS:])

    daily_lag = int(round(DAY / step))
    weekly_lag = int(round(WEEK / step))
    prof["acf_daily"] = _acf(x, daily_lag) if daily_lag >= 2 else None
    prof["acf_weekly"] = _acf(x, weekly_lag) if weekly_lag >= 2 else None
    peak, peak_period = _spectral_peak(x)
    prof["spectral_peak"] = peak
    prof["spectral_period"] = peak_period

    period, source = _choose_period(prof, daily_lag, weekly_lag)
    prof["period"] = period
    prof["period_source"] = source
    stl_period = period if period is not None else (daily_lag if daily_lag >= 2 else None)
    if period is not None:
        prof["acf_period"] = _acf(x, period)
    if stl_period is not None and x.size >= 2 * stl_period + 1:
        prof["stl_seasonal_strength"], prof["stl_trend_strength"] = _stl_strength(x, stl_period)
    return prof


def _num(v: float | None) -> float | None:
    """A finite float, or None (JSON has no NaN)."""
    if v is None:
        return None
    v = float(v)
    return v if math.isfinite(v) else None


def _on_grid(s: pd.Series, step: float) -> np.ndarray:
    """Values placed on a regular grid of `step` seconds from the first timestamp (NaN holes)."""
    t = (s.index.asi8 - s.index.asi8[0]).astype("float64")
    unit = np.timedelta64(1, s.index.unit) / np.timedelta64(1, "s")
    pos = np.rint(t * unit / step).astype("int64")
    size = int(pos[-1]) + 1
    if size > 50 * len(s):
        # grossly irregular sampling: a grid would be mostly holes; fall back to rows
        return s.to_numpy(dtype="float64")
    grid = np.full(size, np.nan)
    grid[pos] = s.to_numpy(dtype="float64")  # a later point snapped to the same slot wins
    return grid


def _interpolate(x: np.ndarray) -> np.ndarray:
    """Linear interpolation over NaN holes (edges take the nearest value); analysis only."""
    ok = np.isfinite(x)
    if ok.all() or not ok.any():
        return x.astype("float64")
    idx = np.arange(x.size)
    return np.interp(idx, idx[ok], x[ok])


def _acf(x: np.ndarray, lag: int) -> float | None:
    """Pearson autocorrelation at `lag`, when at least two full lags of data exist."""
    if lag < 1 or x.size < 2 * lag + 1:
        return None
    a, b = x[lag:], x[:-lag]
    sa, sb = a.std(), b.std()
    if sa == 0 or sb == 0:
        return None
    return _num(float(np.mean((a - a.mean()) * (b - b.mean())) / (sa * sb)))


def _spectral_peak(x: np.ndarray) -> tuple[float | None, float | None]:
    """Share of the detrended periodogram's power in its strongest bin, and that bin's period.

    Bins with periods longer than half the series are skipped: a trend is not a season.
    """
    n = x.size
    if n < 16:
        return None, None
    t = np.arange(n)
    coef = np.polyfit(t, x, 1)
    r = x - np.polyval(coef, t)
    power = np.abs(np.fft.rfft(r)) ** 2
    power = power[2:]  # drop the mean and the one-cycle bin
    total = power.sum()
    if power.size == 0 or total <= 0:
        return None, None
    k = int(np.argmax(power))
    return _num(power[k] / total), _num(n / (k + 2))


def _choose_period(prof: dict, daily_lag: int, weekly_lag: int) -> tuple[int | None, str | None]:
    """The seasonal period in points: weekly, daily or spectral, whichever autocorrelates best."""
    candidates: list[tuple[float, int, str]] = []
    if prof["acf_weekly"] is not None and prof["acf_weekly"] >= MIN_PERIOD_ACF:
        candidates.append((prof["acf_weekly"], weekly_lag, "weekly"))
    if prof["acf_daily"] is not None and prof["acf_daily"] >= MIN_PERIOD_ACF:
        candidates.append((prof["acf_daily"], daily_lag, "daily"))
    if not candidates and prof["spectral_peak"] is not None and prof["spectral_peak"] >= MIN_SPECTRAL_PEAK:
        period = int(round(prof["spectral_period"]))
        if period >= 4:
            candidates.append((0.0, period, "spectral"))
    if not candidates:
        return None, None
    # prefer the shorter (daily) period unless the weekly one is clearly stronger: models
    # need several cycles of history and the daily cycle gives more of them
    candidates.sort(key=lambda c: c[1])
    best = candidates[0]
    for c in candidates[1:]:
        if c[0] > best[0] + 0.1:
            best = c
    return best[1], best[2]


def _stl_strength(x: np.ndarray, period: int) -> tuple[float | None, float | None]:
    """Seasonal and trend strength (Wang, Smith and Hyndman) from an STL decomposition."""
    from statsmodels.tsa.seasonal import STL

    # STL's cost grows with the period; block means bring a long period (a day of 5-minute
    # points) down to at most STL_MAX_PERIOD points per cycle, which keeps the daily refit
    # of a thousand series cheap. Averaging lowers the noise a little, so the strength is a
    # slight overestimate for very noisy series.
    factor = max(1, int(math.ceil(period / STL_MAX_PERIOD)))
    if factor > 1:
        nb = x.size // factor
        x = x[x.size - nb * factor :].reshape(nb, factor).mean(axis=1)
        period = max(2, int(round(period / factor)))
        if x.size < 2 * period + 1:
            return None, None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = STL(x, period=period, robust=False).fit()
    except (ValueError, np.linalg.LinAlgError):
        return None, None
    resid = np.asarray(res.resid)
    seas = np.asarray(res.seasonal)
    trend = np.asarray(res.trend)
    vr = float(np.var(resid))
    vs = float(np.var(seas + resid))
    vt = float(np.var(trend + resid))
    seasonal = max(0.0, 1.0 - vr / vs) if vs > 0 else 0.0
    trend_s = max(0.0, 1.0 - vr / vt) if vt > 0 else 0.0
    return _num(seasonal), _num(trend_s)


def _stationarity(x: np.ndarray) -> tuple[float | None, float | None]:
    """ADF and KPSS p-values; None where a test cannot run on this input."""
    from statsmodels.tsa.stattools import adfuller, kpss

    if x.size < 20 or np.ptp(x) == 0:
        return None, None
    adf_p = kpss_p = None
    maxlag = int(min(24, x.size // 4))
    # the regressions are small; BLAS threads only fight the other series' work for cores
    with threadpool_limits(1), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # KPSS warns when p is outside its table
        try:
            adf_p = _num(adfuller(x, maxlag=maxlag, autolag="AIC")[1])
        except (ValueError, np.linalg.LinAlgError):
            adf_p = None
        try:
            kpss_p = _num(kpss(x, regression="c", nlags="auto")[1])
        except (ValueError, OverflowError, np.linalg.LinAlgError):
            kpss_p = None
    return adf_p, kpss_p


def _level_shifts(x: np.ndarray, noise_sigma: float) -> int:
    """How many times the median of consecutive blocks jumps by far more than the noise.

    Blocks are 1/40 of the series (at least 12 points); a jump counts when it exceeds both
    five noise sigmas and three robust sigmas of all block-to-block changes.
    """
    block = max(12, x.size // 40)
    nb = x.size // block
    if nb < 3:
        return 0
    med = np.median(x[: nb * block].reshape(nb, block), axis=1)
    jumps = np.abs(np.diff(med))
    limit = max(5.0 * noise_sigma, 3.0 * robust_sigma(jumps))
    if limit <= 0:
        return int(np.count_nonzero(jumps > 0))
    return int(np.count_nonzero(jumps > limit))


def _spikiness(x: np.ndarray) -> float | None:
    """Share of points more than 5 robust sigmas away from a local (25-point) median."""
    if x.size < 25:
        return None
    local = pd.Series(x).rolling(25, center=True, min_periods=5).median().to_numpy()
    r = x - local
    sigma = robust_sigma(r)
    if sigma <= 0:
        return float(np.mean(np.abs(r) > 0))
    return float(np.mean(np.abs(r) > 5.0 * sigma))
