"""The hand-written ARMA core (conditional sum of squares, lfilter forecasts) against
statsmodels' SARIMAX (exact Gaussian likelihood by the Kalman filter) on simulated data.

Tolerances: with the same coefficients, forecasts and standard errors of a long series agree to
1e-6 relative (CSS and the Kalman filter differ only in the start-up of the innovations, which an
invertible model forgets); estimated coefficients agree within 0.03 on 2000 points, and the
exact log-likelihood at the CSS estimate is within 1 of its maximum.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from statsmodels.tsa.arima_process import arma_generate_sample
from statsmodels.tsa.statespace.sarimax import SARIMAX

from gpupool.forecast import _arma
from gpupool.forecast._arma import ArmaFit, ArmaSpec


def _fixed(spec: ArmaSpec, ar=(), ma=(), sma=(), mu=0.0, sigma2=1.0) -> ArmaFit:
    return ArmaFit(spec, np.array(ar, float), np.array(ma, float), np.array(sma, float), np.zeros(0), mu,
                   sigma2, 0.0, 0, True, np.zeros(0))


def _sarimax_forecast(y, order, seasonal_order, params, h):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = SARIMAX(y, order=order, seasonal_order=seasonal_order, trend="n",
                        enforce_stationarity=False, enforce_invertibility=False)
        res = model.smooth(np.asarray(params, float))
        fc = res.get_forecast(h)
    return np.asarray(fc.predicted_mean), np.sqrt(np.asarray(fc.var_pred_mean))


def _simulate(ar, ma, n, seed, scale=1.0):
    rng = np.random.default_rng(seed)
    return arma_generate_sample(np.r_[1, -np.asarray(ar)], np.r_[1, np.asarray(ma)], n, scale=scale,
                                distrvs=rng.standard_normal, burnin=200)


def test_arma11_with_mean_forecasts_like_sarimax_for_the_same_coefficients():
    phi, theta, mu, s2 = 0.7, 0.4, 25.0, 2.0
    y = mu + _simulate([phi], [theta], 1500, 1, scale=np.sqrt(s2))
    fit = _fixed(ArmaSpec(1, 1, 0, 0, 0, 0, True), ar=[phi], ma=[theta], mu=mu, sigma2=s2)
    mean, se = _arma.forecast(fit, y, None, None, 30)
    ref_mean, ref_se = _sarimax_forecast(y - mu, (1, 0, 1), (0, 0, 0, 0), [phi, theta, s2], 30)
    assert np.allclose(mean, ref_mean + mu, rtol=1e-6, atol=1e-6)
    assert np.allclose(se, ref_se, rtol=1e-6)


def test_integrated_arima_forecasts_like_sarimax():
    phi, theta, s2 = 0.5, -0.3, 1.5
    y = 100 + np.cumsum(_simulate([phi], [theta], 1200, 2, scale=np.sqrt(s2)))
    fit = _fixed(ArmaSpec(1, 1, 1, 0, 0, 0, False), ar=[phi], ma=[theta], sigma2=s2)
    mean, se = _arma.forecast(fit, y, None, None, 24)
    ref_mean, ref_se = _sarimax_forecast(y, (1, 1, 1), (0, 0, 0, 0), [phi, theta, s2], 24)
    assert np.allclose(mean, ref_mean, rtol=1e-6)
    assert np.allclose(se, ref_se, rtol=1e-6)


def test_seasonal_difference_with_seasonal_ma_forecasts_like_sarimax():
    rng = np.random.default_rng(3)
    n, s = 24 * 60, 24
    e = rng.normal(size=n + s + 1)
    # (1 - 0.6 B) (1 - B^24) y = (1 - 0.5 B^24) e, built by filtering
    from scipy.signal import lfilter

    w = lfilter(np.r_[1, np.zeros(s - 1), -0.5], [1, -0.6], e)[: n]
    y = 50 + lfilter([1.0], np.r_[1, np.zeros(s - 1), -1.0], w)
    spec = ArmaSpec(1, 0, 0, 1, 1, s, False)
    fit = _fixed(spec, ar=[0.6], sma=[-0.5], sigma2=1.0)
    mean, se = _arma.forecast(fit, y, None, None, 48)
    ref_mean, ref_se = _sarimax_forecast(y, (1, 0, 0), (0, 1, 1, s), [0.6, -0.5, 1.0], 48)
    assert np.allclose(mean, ref_mean, rtol=1e-6)
    assert np.allclose(se, ref_se, rtol=1e-6)


@pytest.mark.parametrize("ar, ma", [([0.6], [0.3]), ([0.5, -0.3], []), ([], [0.6, 0.2])])
def test_css_estimates_agree_with_sarimax_maximum_likelihood(ar, ma):
    y = 10 + _simulate(ar, ma, 2000, 4)
    spec = ArmaSpec(len(ar), len(ma), 0, 0, 0, 0, True)
    fit = _arma.fit_css(spec, y, condition=len(ar))
    assert fit.converged
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = SARIMAX(y - y.mean(), order=(len(ar), 0, len(ma)), trend="n")
        ref = model.fit(disp=False)
    p_ref = np.asarray(ref.params)
    assert np.allclose(fit.ar, p_ref[: len(ar)], atol=0.03)
    assert np.allclose(fit.ma, p_ref[len(ar) : len(ar) + len(ma)], atol=0.03)
    assert fit.sigma2 == pytest.approx(p_ref[-1], rel=0.03)
    assert fit.mu == pytest.approx(y.mean(), abs=0.1)
    # the exact log-likelihood at the CSS estimate is within 1 of its maximum
    ll_css = model.loglike(np.r_[fit.ar, fit.ma, fit.sigma2])
    assert ref.llf - 1.0 <= ll_css <= ref.llf + 1e-6
    # and both truths are recovered
    assert np.allclose(np.r_[fit.ar, fit.ma], np.r_[ar, ma], atol=0.06)


def test_forecasts_from_each_fit_agree_with_sarimax_fit():
    y = 5 + _simulate([0.8], [0.3], 1500, 5)
    fit = _arma.fit_css(ArmaSpec(1, 1, 0, 0, 0, 0, True), y, condition=1)
    mean, se = _arma.forecast(fit, y, None, None, 12)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = SARIMAX(y, order=(1, 0, 1), trend="c").fit(disp=False).get_forecast(12)
    assert np.allclose(mean, ref.predicted_mean, atol=0.1)
    assert np.allclose(se, np.sqrt(ref.var_pred_mean), rtol=0.05)
