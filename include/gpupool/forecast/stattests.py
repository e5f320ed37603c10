"""The statistical tests of the forecasting procedure, wrapped to return plain floats and to
never raise on the degenerate inputs the procedure can meet (short or constant pieces)."""

from __future__ import annotations

import warnings

import numpy as np
from scipy.stats import chi2
from statsmodels.tools.sm_exceptions import InterpolationWarning
from statsmodels.tsa.stattools import adfuller, kpss


def adf_pvalue(x: np.ndarray) -> float:
    """ADF p-value (constant, lag by AIC); small means no unit root. 1.0 when not computable."""
    x = np.asarray(x, dtype=float)
    if len(x) < 12 or np.ptp(x) == 0:
        return 1.0
    maxlag = int(min(np.floor(12 * (len(x) / 100) ** 0.25), len(x) // 3 - 2))
    try:
        return float(adfuller(x, maxlag=max(maxlag, 0), regression="c", autolag="AIC", result_object=False)[1])
    except (ValueError, np.linalg.LinAlgError):
        return 1.0


def kpss_pvalue(x: np.ndarray) -> float:
    """KPSS p-value (level); small means not stationary. Bounded to [0.01, 0.1] by its table."""
    x = np.asarray(x, dtype=float)
    if len(x) < 12 or np.ptp(x) == 0:
        return 0.1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InterpolationWarning)
        try:
            return float(kpss(x, regression="c", nlags="auto", result_object=False)[1])
        except (ValueError, OverflowError, np.linalg.LinAlgError):
            return 0.1


def ljung_box_pvalue(x: np.ndarray, lags: int, dof: int = 0) -> float:
    """Ljung-Box p-value of ``x`` up to ``lags``; small means not white noise."""
    x = np.asarray(x, dtype=float)
    n = len(x)
    lags = int(min(lags, n - 2))
    if lags < 1:
        return 1.0
    xc = x - x.mean()
    denom = float(xc @ xc)
    if denom <= 0:
        return 1.0
    acf = np.array([xc[k:] @ xc[:-k] for k in range(1, lags + 1)]) / denom
    stat = n * (n + 2) * float(np.sum(acf**2 / (n - np.arange(1, lags + 1))))
    df = max(lags - dof, 1)
    return float(chi2.sf(stat, df))
