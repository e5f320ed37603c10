"""The statistical tests of the procedure against statsmodels and against a hand-computed statistic."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import chi2
from statsmodels.stats.diagnostic import acorr_ljungbox

from gpupool.forecast.stattests import ljung_box_pvalue


def _q_by_hand(x: np.ndarray, lags: int) -> float:
    # Q = n (n + 2) sum_k r_k^2 / (n - k), r_k the sample autocorrelation at lag k
    n = len(x)
    xc = x - x.mean()
    denom = sum(v * v for v in xc)
    q = 0.0
    for k in range(1, lags + 1):
        r = sum(xc[t] * xc[t - k] for t in range(k, n)) / denom
        q += r * r / (n - k)
    return n * (n + 2) * q


@pytest.mark.parametrize("lags, dof", [(5, 0), (10, 2), (3, 5)])
def test_ljung_box_matches_statsmodels_and_the_formula(lags, dof):
    rng = np.random.default_rng(0)
    e = rng.normal(size=301)
    x = e[1:] + 0.4 * e[:-1]  # MA(1): autocorrelated at lag 1
    p = ljung_box_pvalue(x, lags, dof)
    df = max(lags - dof, 1)
    assert p == pytest.approx(chi2.sf(_q_by_hand(x, lags), df), rel=1e-9)
    if lags > dof:
        ref = acorr_ljungbox(x, lags=[lags], model_df=dof)["lb_pvalue"].iloc[0]
        assert p == pytest.approx(float(ref), rel=1e-12)


def test_ljung_box_tells_white_noise_from_autocorrelation():
    rng = np.random.default_rng(1)
    noise = rng.normal(size=500)
    walk_steps = np.convolve(noise, [1.0, 0.8, 0.6], mode="valid")
    assert ljung_box_pvalue(noise, 10) > 0.05
    assert ljung_box_pvalue(walk_steps, 10) < 1e-6


@pytest.mark.parametrize("x", [np.zeros(50), np.full(50, 3.0), np.arange(2.0), np.array([1.0, np.nan, 2.0, 3.0])])
def test_ljung_box_degenerate_inputs_answer_one(x):
    assert ljung_box_pvalue(x, 10) == 1.0
