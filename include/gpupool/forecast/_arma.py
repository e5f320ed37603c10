"""The numerical core of the ARIMA forecaster: a regression with (S)ARIMA errors fitted by
conditional sum of squares, with the regression coefficients concentrated out.

The model, for a series ``y`` with exogenous columns ``X`` (Fourier terms):

    Delta(B) (y_t - X_t beta) = w_t,    phi(B) (w_t - mu) = theta(B) Theta(B^s) e_t,

where ``Delta(B) = (1 - B)^d (1 - B^s)^D``. Given the ARMA coefficients, the residuals are a
linear filter of ``Delta y`` and ``Delta X``, so ``beta`` and ``mu`` follow by least squares on the
filtered columns; the optimiser only walks over the (few) ARMA coefficients. Every filter is one
``scipy.signal.lfilter`` call, so one likelihood evaluation costs microseconds and a whole stepwise
order search a fraction of a second. That speed is what lets the daily refit and the hourly
update run inside the simulator's budget.

Stationarity and invertibility are enforced by construction: the optimiser works on unconstrained
values mapped through ``tanh`` to partial autocorrelations and from there to polynomial
coefficients (Durbin-Levinson), so every fitted model can be forecast.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import least_squares
from scipy.signal import lfilter

# Partial autocorrelations are kept a hair inside (-1, 1) so polynomials never sit on the unit circle.
_PACF_BOUND = 0.995


@dataclass(frozen=True)
class ArmaSpec:
    """The structure of one candidate model (what the order search walks over)."""

    p: int = 0
    q: int = 0
    d: int = 0
    D: int = 0
    Q: int = 0
    season: int = 0
    constant: bool = True

    def n_params(self, n_exog: int) -> int:
        """Number of estimated coefficients, the innovation variance excluded."""
        return self.p + self.q + self.Q + int(self.constant) + n_exog


@dataclass
class ArmaFit:
    """A fitted model: the spec, its coefficients and what is needed to filter and forecast."""

    spec: ArmaSpec
    ar: np.ndarray
    ma: np.ndarray
    sma: np.ndarray
    beta: np.ndarray
    mu: float
    sigma2: float
    css: float
    n_eff: int
    converged: bool
    raw_params: np.ndarray = field(repr=False)

    def ic(self, criterion: str, n_exog: int) -> float:
        """AIC, BIC or AICc of the conditional sum of squares likelihood."""
        k = self.spec.n_params(n_exog) + 1
        n = max(self.n_eff, 1)
        loglik = -0.5 * n * (np.log(2 * np.pi * max(self.css / n, 1e-300)) + 1.0)
        if criterion == "bic":
            return float(-2 * loglik + k * np.log(n))
        if criterion == "aicc":
            return float(-2 * loglik + 2 * k + 2 * k * (k + 1) / max(n - k - 1, 1))
        return float(-2 * loglik + 2 * k)


def pacf_to_poly(x: np.ndarray) -> np.ndarray:
    """Map unconstrained values to the coefficients of a stationary AR polynomial.

    Returns ``phi_1..phi_p`` of ``1 - phi_1 B - ... - phi_p B^p``, all roots outside the unit circle.
    """
    x = np.asarray(x, dtype=float)
    if not x.size:
        return np.zeros(0)
    # Durbin-Levinson on Python floats: the optimiser calls this for every residual evaluation,
    # and at these lengths (p <= 5) array operations cost more than the arithmetic
    phi: list[float] = []
    for r in (_PACF_BOUND * np.tanh(x)).tolist():
        phi = [a - r * b for a, b in zip(phi, reversed(phi))] + [r]
    return np.array(phi)


def poly_to_pacf(phi: np.ndarray) -> np.ndarray:
    """Inverse of :func:`pacf_to_poly` (used to warm-start the optimiser)."""
    phi = np.asarray(phi, dtype=float).copy()
    out = np.zeros(len(phi))
    for k in range(len(phi) - 1, -1, -1):
        r = float(np.clip(phi[k], -_PACF_BOUND * 0.999, _PACF_BOUND * 0.999))
        out[k] = np.arctanh(r / _PACF_BOUND)
        if k:
            phi = (phi[:k] + r * phi[:k][::-1]) / (1 - r * r)
    return out


def diff_poly(d: int, D: int, season: int) -> np.ndarray:
    """Coefficients of ``(1 - B)^d (1 - B^s)^D`` in increasing powers of B."""
    poly = np.array([1.0])
    for _ in range(d):
        poly = np.convolve(poly, [1.0, -1.0])
    for _ in range(D):
        seas = np.zeros(season + 1)
        seas[0], seas[season] = 1.0, -1.0
        poly = np.convolve(poly, seas)
    return poly


def _polys(spec: ArmaSpec, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ar = pacf_to_poly(raw[: spec.p])
    ma = -pacf_to_poly(raw[spec.p : spec.p + spec.q])
    sma = -pacf_to_poly(raw[spec.p + spec.q : spec.p + spec.q + spec.Q])
    return ar, ma, sma


def ar_ma_polys(spec: ArmaSpec, ar: np.ndarray, ma: np.ndarray, sma: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The AR polynomial ``phi(B)`` and the full MA polynomial ``theta(B) Theta(B^s)``."""
    ar_poly = np.concatenate([[1.0], -ar])
    ma_poly = np.concatenate([[1.0], ma])
    if spec.Q:
        seas = np.zeros(spec.season * spec.Q + 1)
        seas[0] = 1.0
        seas[spec.season :: spec.season] = sma
        ma_poly = np.convolve(ma_poly, seas)
    return ar_poly, ma_poly


def difference(values: np.ndarray, spec: ArmaSpec) -> np.ndarray:
    """Apply ``Delta(B)`` along the first axis, dropping the first ``d + s D`` rows."""
    poly = diff_poly(spec.d, spec.D, spec.season)
    lag = len(poly) - 1
    if lag == 0:
        return np.asarray(values, dtype=float)
    return lfilter(poly, [1.0], values, axis=0)[lag:]


class _Problem:
    """Differenced data of one candidate spec, ready for repeated residual evaluations."""

    def __init__(self, spec: ArmaSpec, y: np.ndarray, exog: np.ndarray | None, condition: int = 0):
        self.spec = spec
        cols = [y[:, None]]
        if exog is not None and exog.shape[1]:
            cols.append(exog)
        stacked = np.hstack(cols) if len(cols) > 1 else cols[0]
        self.w = difference(stacked, spec)  # column 0 is Delta y, then Delta X
        if spec.constant:
            self.w = np.hstack([self.w, np.ones((len(self.w), 1))])
        # Conditioning: the first p residuals depend on pre-sample values and are left out. The
        # criterion compares models only when they sum over the same residuals, so a search
        # passes one common ``condition`` (its largest p) to every candidate.
        self.start = max(spec.p, condition)
        self.n_eff = len(self.w) - self.start

    def residuals(self, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ar, ma, sma = _polys(self.spec, raw)
        ar_poly, ma_poly = ar_ma_polys(self.spec, ar, ma, sma)
        filt = lfilter(ar_poly, ma_poly, self.w, axis=0)[self.start :]
        target, design = filt[:, 0], filt[:, 1:]
        if design.shape[1]:
            # Normal equations: a handful of columns, so this is far cheaper than an SVD, and
            # the Fourier columns are orthogonal enough for it to be well conditioned.
            gram = design.T @ design
            try:
                coef = np.linalg.solve(gram, design.T @ target)
            except np.linalg.LinAlgError:
                coef, *_ = np.linalg.lstsq(design, target, rcond=None)
            return target - design @ coef, coef
        return target, np.zeros(0)


def fit_css(
    spec: ArmaSpec,
    y: np.ndarray,
    exog: np.ndarray | None = None,
    start: np.ndarray | None = None,
    maxiter: int = 50,
    condition: int = 0,
) -> ArmaFit:
    """Fit one spec by conditional sum of squares; ``start`` warm-starts the ARMA coefficients,
    ``condition`` is the number of leading residuals left out (at least ``p``)."""
    prob = _Problem(spec, y, exog, condition)
    n_arma = spec.p + spec.q + spec.Q
    if prob.n_eff <= spec.n_params(0 if exog is None else exog.shape[1]) + 2:
        raise ValueError("too few observations for this model")
    converged = True
    if n_arma:
        x0 = np.zeros(n_arma) if start is None or len(start) != n_arma else np.asarray(start, float)
        try:
            sol = least_squares(lambda r: prob.residuals(r)[0], x0, method="lm", max_nfev=maxiter * (n_arma + 1))
            raw = sol.x
            converged = bool(sol.success) and np.all(np.isfinite(raw))
        except (ValueError, np.linalg.LinAlgError):
            raw, converged = x0, False
    else:
        raw = np.zeros(0)
    resid, coef = prob.residuals(raw)
    if not np.all(np.isfinite(resid)):
        raise FloatingPointError("non-finite residuals")
    ar, ma, sma = _polys(spec, raw)
    css = float(resid @ resid)
    n_params = spec.n_params(0 if exog is None else exog.shape[1])
    sigma2 = css / max(prob.n_eff - n_params, 1)
    n_exog = 0 if exog is None else exog.shape[1]
    beta = coef[:n_exog]
    mu = float(coef[n_exog]) if spec.constant else 0.0
    # The constant column was filtered like the data, so its coefficient is the mean of w itself.
    return ArmaFit(spec, ar, ma, sma, beta, mu, sigma2, css, prob.n_eff, converged, raw)


def _mean_of_w(fit: ArmaFit) -> float:
    return fit.mu


def innovations(fit: ArmaFit, y: np.ndarray, exog: np.ndarray | None) -> np.ndarray:
    """One-step residuals of the whole (differenced) series under fixed coefficients."""
    spec = fit.spec
    z = y - (exog @ fit.beta if exog is not None and len(fit.beta) else 0.0)
    w = difference(z, spec) - _mean_of_w(fit)
    ar_poly, ma_poly = ar_ma_polys(spec, fit.ar, fit.ma, fit.sma)
    return lfilter(ar_poly, ma_poly, w)


def forecast(
    fit: ArmaFit,
    y: np.ndarray,
    exog: np.ndarray | None,
    exog_future: np.ndarray | None,
    h: int,
    resid: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Point forecasts and forecast standard errors for steps 1..h after the end of ``y``."""
    spec = fit.spec
    z = y - (exog @ fit.beta if exog is not None and len(fit.beta) else 0.0)
    if resid is None:
        resid = innovations(fit, y, exog)
    ar_poly, ma_poly = ar_ma_polys(spec, fit.ar, fit.ma, fit.sma)
    full_ar = np.convolve(ar_poly, diff_poly(spec.d, spec.D, spec.season))  # 1 + a_1 B + ...
    const = _mean_of_w(fit) * float(np.sum(ar_poly))  # phi(1) * mean(w)
    n_ar, n_ma = len(full_ar) - 1, len(ma_poly) - 1
    hist = np.concatenate([np.zeros(max(n_ar - len(z), 0)), z[-n_ar:] if n_ar else np.zeros(0)])
    e_hist = np.concatenate([np.zeros(max(n_ma - len(resid), 0)), resid[-n_ma:] if n_ma else np.zeros(0)])
    zs = np.concatenate([hist, np.zeros(h)])
    es = np.concatenate([e_hist, np.zeros(h)])
    a_rev = full_ar[1:][::-1]
    m_rev = ma_poly[1:][::-1]
    for i in range(h):
        t_z, t_e = n_ar + i, n_ma + i
        val = const
        if n_ar:
            val -= a_rev @ zs[t_z - n_ar : t_z]
        if n_ma:
            val += m_rev @ es[t_e - n_ma : t_e]
        zs[t_z] = val
    mean = zs[n_ar:]
    if exog_future is not None and len(fit.beta):
        mean = mean + exog_future @ fit.beta
    impulse = np.zeros(h)
    impulse[0] = 1.0
    psi = lfilter(ma_poly, full_ar, impulse)
    se = np.sqrt(fit.sigma2 * np.cumsum(psi**2))
    return mean, se
