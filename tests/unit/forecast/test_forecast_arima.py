"""The ARIMA procedure: recorded choices, seasonality, intervals, fallbacks, update, warm start."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from gpupool.forecast import _arma
from gpupool.forecast.arima import ArimaForecaster, fourier_terms

START = "2024-03-04 00:00"


def hourly(values, start=START) -> pd.Series:
    return pd.Series(np.asarray(values, dtype=float), index=pd.date_range(start, periods=len(values), freq="h"))


def ar1(n, phi, rng, mean=0.0, scale=1.0):
    e = rng.normal(scale=scale, size=n + 200)
    x = np.zeros(n + 200)
    for t in range(1, n + 200):
        x[t] = phi * x[t - 1] + e[t]
    return mean + x[200:]


def daily_cycle(n, rng, amplitude=20.0, level=100.0, noise=3.0):
    t = np.arange(n)
    shape = amplitude * np.sin(2 * np.pi * t / 24) + 0.5 * amplitude * np.cos(4 * np.pi * t / 24)
    return level + shape + ar1(n, 0.5, rng, scale=noise)


def assert_no_nan(frame: pd.DataFrame) -> None:
    assert list(frame.columns) == ["ts", "yhat", "yhat_lower", "yhat_upper"]
    assert np.isfinite(frame[["yhat", "yhat_lower", "yhat_upper"]].to_numpy()).all()
    assert (frame["yhat_lower"] <= frame["yhat"]).all() and (frame["yhat"] <= frame["yhat_upper"]).all()


# --------------------------------------------------------------------------- procedure choices


def test_random_walk_is_differenced_and_stationary_ar_is_not():
    rng = np.random.default_rng(1)
    walk = 500 + np.cumsum(rng.normal(size=400))
    m_walk = ArimaForecaster(season=1, lower_bound=None).fit(hourly(walk))
    assert m_walk.summary_["model"] == "arima"
    assert m_walk.summary_["d"] == 1
    assert m_walk.summary_["adf_pvalues"][0] > 0.05  # the unit root is not rejected at d = 0

    stationary = ar1(400, 0.6, rng, mean=50.0)
    m_ar = ArimaForecaster(season=1, lower_bound=None).fit(hourly(stationary))
    assert m_ar.summary_["d"] == 0
    assert m_ar.summary_["adf_pvalue"] < 0.05
    assert m_ar.summary_["p"] + m_ar.summary_["q"] >= 1  # autocorrelated: ARMA terms were chosen
    assert m_ar.summary_["white_noise"] is False
    for key in ("kpss_pvalue", "ljungbox_pvalue", "residual_ljungbox_pvalue", "criterion_value"):
        assert isinstance(m_ar.summary_[key], float)


def test_white_noise_gets_no_arma_terms_and_forecasts_the_mean():
    rng = np.random.default_rng(2)
    y = 30 + rng.normal(size=300)
    model = ArimaForecaster(season=1).fit(hourly(y))
    s = model.summary_
    assert s["white_noise"] is True and s["d"] == 0
    assert (s["p"], s["q"]) == (0, 0)
    fc = model.predict(5)
    assert np.allclose(fc["yhat"], y.mean(), atol=1e-6)


def test_criterion_is_configurable_and_bic_is_not_larger_than_aic():
    rng = np.random.default_rng(3)
    y = ar1(400, 0.7, rng, mean=20.0)
    aic = ArimaForecaster(season=1, criterion="aic").fit(hourly(y)).summary_
    bic = ArimaForecaster(season=1, criterion="bic").fit(hourly(y)).summary_
    assert aic["criterion"] == "aic" and bic["criterion"] == "bic"
    assert bic["p"] + bic["q"] <= aic["p"] + aic["q"]
    with pytest.raises(ValueError):
        ArimaForecaster(criterion="hqic")


def test_residual_check_and_search_are_recorded():
    rng = np.random.default_rng(4)
    y = ar1(300, 0.5, rng, mean=10.0)
    s = ArimaForecaster(season=1).fit(hourly(y)).summary_
    assert s["search"] == "stepwise"
    assert isinstance(s["residual_check_passed"], bool)
    assert isinstance(s["widened"], bool)
    assert s["models_fitted"] >= 4
    assert s["criterion_values"]  # the candidates and their criterion values
    json.dumps(s, allow_nan=False)  # strict JSON: no NaN/inf, no numpy types


# --------------------------------------------------------------------------- seasonality


def test_daily_cycle_is_modelled_and_beats_a_non_seasonal_fit():
    rng = np.random.default_rng(5)
    y = daily_cycle(24 * 21 + 48, rng)
    train, test = hourly(y[:-48]), y[-48:]
    seasonal = ArimaForecaster().fit(train)
    plain = ArimaForecaster(season=1).fit(train)  # season=1: no seasonal period at all
    s = seasonal.summary_
    assert s["season"] == 24 and 24 in s["periods"]
    assert s["D"] == 1 or any(f["period"] == 24 for f in s["fourier"])
    mae_seasonal = np.mean(np.abs(seasonal.predict(48)["yhat"].to_numpy() - test))
    mae_plain = np.mean(np.abs(plain.predict(48)["yhat"].to_numpy() - test))
    assert mae_seasonal < 0.5 * mae_plain


def test_weak_daily_cycle_uses_fourier_terms_chosen_by_criterion():
    rng = np.random.default_rng(6)
    n = 24 * 21
    t = np.arange(n)
    y = 50 + 3 * np.sin(2 * np.pi * t / 24) + ar1(n, 0.8, rng, scale=2.0)
    s = ArimaForecaster().fit(hourly(y)).summary_
    assert s["D"] == 0
    daily = [f for f in s["fourier"] if f["period"] == 24]
    assert daily and 1 <= daily[0]["terms"] <= 10


def test_fourier_terms_skip_duplicate_harmonics():
    x = fourier_terms(np.arange(24 * 14), [(24, 12), (168, 7)])
    # 24: 12 cos + 11 sin (sin(pi t) is zero); 168: harmonic 7 equals daily harmonic 1 -> 6 pairs.
    assert x.shape[1] == 23 + 12
    assert np.linalg.matrix_rank(x) == x.shape[1]


# --------------------------------------------------------------------------- intervals


def test_intervals_clipped_at_zero_and_flagged():
    rng = np.random.default_rng(7)
    y = np.clip(2 + ar1(300, 0.3, rng, scale=2.0), 0, None)
    model = ArimaForecaster(season=1).fit(hourly(y))
    fc = model.predict(24)
    assert_no_nan(fc)
    assert (fc["yhat_lower"] >= 0).all()
    assert model.summary_["clipped"] is True
    assert fc.attrs["clipped"] is True


def test_upper_bound_is_capacity_and_unclipped_is_not_flagged():
    rng = np.random.default_rng(8)
    y = 60 + ar1(300, 0.5, rng, scale=1.0)
    unclipped = ArimaForecaster(season=1).fit(hourly(y))
    unclipped.predict(12)
    assert unclipped.summary_["clipped"] is False
    capped = ArimaForecaster(season=1, upper_bound=61.0).fit(hourly(y))
    fc = capped.predict(12)
    assert (fc["yhat_upper"] <= 61.0).all() and capped.summary_["clipped"] is True


def test_interval_level_widens_intervals():
    rng = np.random.default_rng(9)
    y = 100 + np.cumsum(rng.normal(size=300))
    model = ArimaForecaster(season=1, lower_bound=None).fit(hourly(y))
    w90 = model.predict(10)
    w50 = model.predict(10, level=50)
    assert ((w90["yhat_upper"] - w90["yhat_lower"]) > (w50["yhat_upper"] - w50["yhat_lower"])).all()
    assert np.allclose(w90["yhat"], w50["yhat"])
    widths = (w90["yhat_upper"] - w90["yhat_lower"]).to_numpy()
    assert np.all(np.diff(widths) >= -1e-9)  # an integrated model's uncertainty grows


# --------------------------------------------------------------------------- fallbacks


@pytest.mark.parametrize(
    "values, reason",
    [
        (np.arange(10.0), "short series"),
        (np.r_[np.arange(30.0), np.arange(10.0)], "short series"),  # fewer than two days
        (np.full(200, 7.0), "constant series"),
        (np.zeros(200), "all zeros"),
    ],
)
def test_fallbacks_never_nan_and_record_reason(values, reason):
    model = ArimaForecaster().fit(hourly(values))
    fc = model.predict(30)
    assert_no_nan(fc)
    assert model.summary_["fallback"].startswith(reason)
    assert model.summary_["model"] in ("seasonal_naive", "mean")
    json.dumps(model.summary_, allow_nan=False)


@pytest.mark.parametrize("value", [7.0, 0.0])
def test_flat_series_forecast_their_value_with_no_spread(value):
    fc = ArimaForecaster().fit(hourly(np.full(200, value))).predict(30)
    assert np.allclose(fc[["yhat", "yhat_lower", "yhat_upper"]].to_numpy(), value)


def test_short_series_of_one_period_uses_seasonal_naive():
    rng = np.random.default_rng(10)
    y = daily_cycle(30, rng)
    model = ArimaForecaster().fit(hourly(y))
    assert model.summary_["model"] == "seasonal_naive"
    fc = model.predict(24)
    assert np.allclose(fc["yhat"].to_numpy(), y[-24:])


def test_many_gaps_fall_back_and_few_gaps_are_interpolated():
    rng = np.random.default_rng(11)
    y = daily_cycle(24 * 14, rng)
    holey = y.copy()
    holey[rng.random(len(y)) < 0.4] = np.nan
    model = ArimaForecaster().fit(hourly(holey))
    assert model.summary_["fallback"].startswith("gaps")
    assert_no_nan(model.predict(24))

    few = y.copy()
    few[[50, 51, 200]] = np.nan
    series = hourly(few).drop(hourly(few).index[[100, 101]])  # missing rows, not only NaN values
    model = ArimaForecaster().fit(series)
    assert model.summary_["fallback"] is None
    assert model.summary_["missing_filled"] == 5
    assert_no_nan(model.predict(24))


def test_failed_estimation_falls_back_with_reason(monkeypatch):
    rng = np.random.default_rng(12)
    y = daily_cycle(24 * 10, rng)

    def broken(*args, **kwargs):
        raise FloatingPointError("diverged")

    monkeypatch.setattr(_arma, "fit_css", broken)
    model = ArimaForecaster().fit(hourly(y))
    assert "estimation failed" in model.summary_["fallback"]
    assert model.summary_["model"] == "seasonal_naive"
    assert_no_nan(model.predict(48))


def test_non_convergence_falls_back_with_reason(monkeypatch):
    rng = np.random.default_rng(19)
    y = daily_cycle(24 * 10, rng)

    class NotConverged:
        def __init__(self, x0):
            self.x, self.success = np.asarray(x0, dtype=float), False

    monkeypatch.setattr(_arma, "least_squares", lambda fun, x0, **kwargs: NotConverged(x0))
    model = ArimaForecaster().fit(hourly(y))
    assert model.summary_["fallback"].startswith("estimation failed")
    assert "did not converge" in model.summary_["fallback"]
    assert_no_nan(model.predict(30))


def test_input_is_not_mutated_and_unsorted_duplicates_are_handled():
    rng = np.random.default_rng(13)
    y = hourly(daily_cycle(24 * 8, rng))
    shuffled = pd.concat([y.iloc[::-1], y.iloc[:3]])
    before = shuffled.copy()
    model = ArimaForecaster().fit(shuffled)
    pd.testing.assert_series_equal(shuffled, before)
    fc = model.predict(3)
    assert fc["ts"].iloc[0] == y.index[-1] + pd.Timedelta(hours=1)


def test_predict_before_fit_and_bad_horizon_raise():
    with pytest.raises(RuntimeError):
        ArimaForecaster().predict(3)
    model = ArimaForecaster().fit(hourly(np.arange(100.0)))
    with pytest.raises(ValueError):
        model.predict(0)


# --------------------------------------------------------------------------- update and warm start


def test_update_filters_without_reestimating():
    rng = np.random.default_rng(14)
    y = ar1(400, 0.7, rng, mean=40.0)
    orders = {"p": 1, "q": 1, "d": 0, "D": 0, "Q": 0, "constant": True, "fourier": []}
    model = ArimaForecaster(season=1, orders=orders).fit(hourly(y[:380]))
    # the warm start fixes d = D = 0 and no Fourier terms; the search may move p and q
    assert (model.summary_["d"], model.summary_["D"], model.summary_["fourier"]) == (0, 0, [])
    ar, ma, mu = model.fit_.ar.tolist(), model.fit_.ma.tolist(), model.fit_.mu
    assert len(ar) + len(ma) >= 1
    tail = hourly(y, START).iloc[380:]
    tail_before = tail.copy()
    model.update(tail)
    pd.testing.assert_series_equal(tail, tail_before)
    assert model.fit_.ar.tolist() == ar and model.fit_.ma.tolist() == ma and model.fit_.mu == mu
    assert model.summary_["n_obs_filtered"] == 400
    fc = model.predict(3)
    assert fc["ts"].iloc[0] == tail.index[-1] + pd.Timedelta(hours=1)
    # By hand, with zeros before the first point: w_t = y_t - mu,
    # e_t = w_t - sum_i phi_i w_{t-i} - sum_j theta_j e_{t-j}; the forecast continues the recursion
    # with future innovations zero.
    w = [v - mu for v in y]
    e = []
    for t in range(len(w)):
        val = w[t]
        val -= sum(ar[i] * w[t - 1 - i] for i in range(len(ar)) if t - 1 - i >= 0)
        val -= sum(ma[j] * e[t - 1 - j] for j in range(len(ma)) if t - 1 - j >= 0)
        e.append(val)
    for k in range(3):
        t = len(w)
        w.append(sum(ar[i] * w[t - 1 - i] for i in range(len(ar))) + sum(ma[j] * e[t - 1 - j] for j in range(len(ma))))
        e.append(0.0)
    expected = np.array(w[-3:]) + mu
    assert np.allclose(fc["yhat"].to_numpy(), expected, rtol=1e-9)


def test_update_matches_hand_computed_ar1_step():
    rng = np.random.default_rng(18)
    y = ar1(400, 0.6, rng, mean=40.0)
    model = ArimaForecaster(season=1, criterion="bic", orders={"p": 1, "q": 0, "d": 0, "D": 0, "Q": 0, "constant": True,
                                              "fourier": []}).fit(hourly(y))
    assert (model.summary_["p"], model.summary_["d"], model.summary_["q"]) == (1, 0, 0)
    phi, mu = model.fit_.ar[0], model.fit_.mu
    assert 0.4 < phi < 0.8 and abs(mu - 40.0) < 1.0
    new_value = mu + 10.0
    model.update(hourly([new_value], start=hourly(y).index[-1] + pd.Timedelta(hours=1)))
    fc = model.predict(3)
    expected = [mu + phi ** k * (new_value - mu) for k in (1, 2, 3)]
    assert np.allclose(fc["yhat"].to_numpy(), expected)
    assert model.fit_.ar[0] == phi  # filtered, not re-estimated


def test_update_moves_forecast_with_a_shock_and_replaces_known_points():
    rng = np.random.default_rng(15)
    y = daily_cycle(24 * 14, rng)
    model = ArimaForecaster().fit(hourly(y))
    before = model.predict(6)["yhat"].to_numpy()
    shock = hourly([y[-24] + 40.0], start=hourly(y).index[-1] + pd.Timedelta(hours=1))
    after = model.update(shock).predict(6)
    assert after["yhat"].iloc[0] > before[1]  # the level jump carries into the next hour
    # A late correction of an already-known hour replaces it rather than appending.
    n = model.summary_["n_obs_filtered"]
    model.update(shock * 0 + y[-24])
    assert model.summary_["n_obs_filtered"] == n


def test_update_of_a_fallback_model_appends():
    model = ArimaForecaster().fit(hourly(np.full(100, 3.0)))
    model.update(hourly([3.0, 3.0], start=hourly(np.zeros(100)).index[-1] + pd.Timedelta(hours=1)))
    fc = model.predict(2)
    assert fc["ts"].iloc[0] == pd.Timestamp(START) + pd.Timedelta(hours=102)
    assert_no_nan(fc)


def test_warm_start_reuses_orders_with_fewer_models():
    rng = np.random.default_rng(16)
    y = daily_cycle(24 * 21, rng)
    cold = ArimaForecaster().fit(hourly(y[:-24]))
    warm = ArimaForecaster(orders=cold.summary_).fit(hourly(y))
    assert warm.summary_["warm_start"] is True
    assert warm.summary_["d"] == cold.summary_["d"] and warm.summary_["D"] == cold.summary_["D"]
    assert warm.summary_["fourier"] == cold.summary_["fourier"]
    assert warm.summary_["models_fitted"] < cold.summary_["models_fitted"]
    assert_no_nan(warm.predict(24))


def test_warm_start_from_hand_written_orders_outside_the_first_search_bounds():
    rng = np.random.default_rng(17)
    y = ar1(300, 0.5, rng, mean=10.0)
    orders = {"p": 5, "q": 0, "d": 0, "D": 0, "Q": 0, "constant": True, "fourier": []}
    model = ArimaForecaster(season=1, orders=orders).fit(hourly(y))
    assert model.summary_["fallback"] is None
    assert_no_nan(model.predict(5))


def test_warm_start_searched_within_keep_orders_for_keeps_the_orders_without_a_search():
    rng = np.random.default_rng(20)
    y = hourly(daily_cycle(24 * 21, rng))
    cold = ArimaForecaster().fit(y.iloc[:-1])
    assert cold.summary_["orders_kept"] is False
    assert cold.summary_["orders_searched_through"] == y.index[-1].isoformat()
    warm = ArimaForecaster(orders=cold.summary_, keep_orders_for="1D").fit(y)
    s = warm.summary_
    assert s["orders_kept"] is True and s["models_fitted"] == 1  # the kept orders, nothing else
    for key in ("p", "q", "d", "D", "Q", "constant", "fourier", "orders_searched_through", "adf_pvalues"):
        assert s[key] == cold.summary_[key], key
    # only the coefficients are re-estimated, on the history at hand
    assert s["n_obs"] == cold.summary_["n_obs"] + 1 and s["coefficients"] != cold.summary_["coefficients"]
    assert_no_nan(warm.predict(24))
    # without keep_orders_for the warm start only seeds the search, as before
    seeded = ArimaForecaster(orders=cold.summary_).fit(y)
    assert seeded.summary_["orders_kept"] is False and seeded.summary_["models_fitted"] > 1


def test_a_warm_start_searched_longer_ago_than_keep_orders_for_searches_again():
    rng = np.random.default_rng(19)
    y = hourly(daily_cycle(24 * 21, rng))
    old = ArimaForecaster().fit(y.iloc[:-24])  # searched a day before the end
    model = ArimaForecaster(orders=old.summary_, keep_orders_for="1D").fit(y)
    assert model.summary_["orders_kept"] is False and model.summary_["models_fitted"] > 1
    assert model.summary_["orders_searched_through"] == (y.index[-1] + pd.Timedelta(hours=1)).isoformat()
    # a kept model hands its search's time on: the next hour keeps, a day after the search does not
    kept = ArimaForecaster(orders=model.summary_, keep_orders_for="1D").fit(y.iloc[1:])
    assert kept.summary_["orders_kept"] is True
    later = hourly(daily_cycle(24 * 22, np.random.default_rng(19)))
    again = ArimaForecaster(orders=kept.summary_, keep_orders_for="1D").fit(later)
    assert again.summary_["orders_kept"] is False


def test_kept_orders_that_fail_the_residual_check_they_passed_fall_back_to_the_search():
    rng = np.random.default_rng(21)
    y = hourly(ar1(300, 0.8, rng, mean=10.0))
    end = (y.index[-1] + pd.Timedelta(hours=1)).isoformat()
    # orders said to be searched an hour ago that leave an AR(1) in the residuals
    orders = {"p": 0, "q": 0, "d": 0, "D": 0, "Q": 0, "constant": True, "fourier": [], "search": "stepwise",
              "residual_check_passed": True, "orders_searched_through": end}
    model = ArimaForecaster(season=1, orders=orders, keep_orders_for="1D").fit(y)
    assert model.summary_["orders_kept"] is False and model.summary_["p"] + model.summary_["q"] >= 1
    assert model.summary_["residual_check_passed"] is True
