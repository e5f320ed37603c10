"""The statistical tests of the forecasting procedure, wrapped to return plain floats and to
never raise on the degenerate inputs the procedure can meet (short or constant pieces)."""

from __future__ import annotations

import warnings

import numpy as np
from statsmodels.tools.sm_exceptions import InterpolationWarning
from statsmodels.stats.diagnostic import acorr_ljungbox
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
    """Ljung-Box p-value of ``x`` up to ``lags`` (statsmodels' ``acorr_ljungbox``); small means
    not white noise. ``dof`` fitted ARMA coefficients are taken off the chi-square's degrees of
    freedom, leaving at least one. 1.0 when not computable (too short or constant)."""
    x = np.asarray(x, dtype=float)
    n = len(x)
    lags = int(min(lags, n - 2))
    if lags < 1 or not np.all(np.isfinite(x)) or np.ptp(x) == 0:
        return 1.0
    model_df = int(min(max(dof, 0), lags - 1))
    table = acorr_ljungbox(x, lags=[lags], model_df=model_df)
    p = float(table["lb_pvalue"].iloc[0])
    return p if np.isfinite(p) else 1.0
