"""Per-series model choice by validation inside the history (AutoForecaster)."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pandas as pd
import pytest
from statsmodels.tsa.holtwinters import ExponentialSmoothing

from gpupool.forecast import select
from gpupool.forecast.arima import ArimaForecaster
from gpupool.forecast.baselines import SeasonalNaiveForecaster
from gpupool.forecast.select import AutoForecaster, profile_series
from gpupool.sim.synthetic import step_demand

START = "2024-03-04 00:00"


def hourly(values, start=START) -> pd.Series:
    return pd.Series(np.asarray(values, dtype=float), index=pd.date_range(start, periods=len(values), freq="h"))


def seasonal_ar(n, seed, amplitude=20.0, phi=0.8, noise=2.0):
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    e = rng.normal(scale=noise, size=n)
    x = np.zeros(n)
    for i in range(1, n):
        x[i] = phi * x[i - 1] + e[i]
    return 100 + amplitude * np.sin(2 * np.pi * t / 24) + x


def mae(frame, truth):
    return float(np.mean(np.abs(frame["yhat"].to_numpy() - truth)))


# --------------------------------------------------------------------------- profile


def test_profile_tells_step_intermittent_constant_and_regular_apart():
    steps = step_demand("2026-01-01", "2026-01-29", seed=3)
    idle = step_demand("2026-01-01", "2026-01-29", nodes=0, steps_per_week=0.5, seed=1)
    assert profile_series(steps.to_numpy())["kind"] == "step"
    assert profile_series(idle.to_numpy())["kind"] == "intermittent"
    assert profile_series(np.full(100, 16.0))["kind"] == "constant"
    assert profile_series(seasonal_ar(24 * 14, 0))["kind"] == "regular"
    p = profile_series(steps.to_numpy())
    assert p["median_step"] == 8.0 and p["steps"] >= 1


def test_step_demand_moves_in_whole_nodes_rarely():
    y = step_demand("2026-01-01", "2026-02-01", gpus_per_node=4, max_nodes=2, steps_per_week=2, seed=5)
    assert set(np.unique(y.to_numpy())) <= {0.0, 4.0, 8.0}
    moves = np.diff(y.to_numpy())
    assert set(np.abs(moves[moves != 0])) == {4.0}
    assert 1 <= np.count_nonzero(moves) <= 30
    pd.testing.assert_series_equal(y, step_demand("2026-01-01", "2026-02-01", gpus_per_node=4, max_nodes=2,
                                                  steps_per_week=2, seed=5))


# --------------------------------------------------------------------------- step-like series


def test_a_recent_step_is_followed_not_smoothed():
    flat = np.r_[np.full(24 * 20, 8.0), np.full(24 * 5, 16.0), np.full(10, 24.0)]
    model = AutoForecaster(horizon=24).fit(hourly(flat))
    fc = model.predict(24)
    sel = model.summary_["selection"]
    assert sel["profile"]["kind"] == "step"
    assert model.summary_["model"] == "naive"
    assert np.allclose(fc["yhat"].to_numpy(), 24.0)
    # seasonal naive would repeat yesterday's 16 for most of the day; the last value does not
    truth = np.full(24, 24.0)
    snaive = SeasonalNaiveForecaster(24).fit(hourly(flat)).predict(24)
    assert mae(fc, truth) == 0.0 < mae(snaive, truth)
    assert "ets" not in sel["validation_mae"]  # not over-modelled: no trend model on a step series


@pytest.mark.parametrize("seed", range(6))
def test_step_series_never_worse_than_seasonal_naive_on_the_next_day(seed):
    y = step_demand("2026-01-01", "2026-01-30", gpus_per_node=8, max_nodes=3, steps_per_week=1.5, seed=seed)
    train, truth = y.iloc[:-24], y.to_numpy()[-24:]
    auto = AutoForecaster(horizon=24).fit(train).predict(24)
    snaive = SeasonalNaiveForecaster(24).fit(train).predict(24)
    assert mae(auto, truth) <= mae(snaive, truth) + 1e-9
    assert np.isfinite(auto[["yhat", "yhat_lower", "yhat_upper"]].to_numpy()).all()


def test_intermittent_series_keeps_the_last_value_and_zero_floor():
    y = step_demand("2026-01-01", "2026-01-29", nodes=0, max_nodes=1, steps_per_week=0.7, seed=2)
    model = AutoForecaster(horizon=24).fit(y)
    fc = model.predict(24)
    assert model.summary_["selection"]["profile"]["kind"] in ("intermittent", "step")
    assert np.allclose(fc["yhat"].to_numpy(), y.iloc[-1])
    assert (fc["yhat_lower"] >= 0).all()


# --------------------------------------------------------------------------- choice and record


def test_summary_records_every_candidate_the_choice_and_the_reason():
    y = hourly(seasonal_ar(24 * 21, 1))
    model = AutoForecaster(horizon=24).fit(y)
    s = model.summary_
    sel = s["selection"]
    assert set(sel["validation_mae"]) >= {"arima", "seasonal_naive", "naive", "ets"}
    assert all(v >= 0 for v in sel["validation_mae"].values())
    assert sel["chosen"] and abs(sum(sel["weights"].values()) - 1) < 1e-9
    assert s["model"] == (sel["chosen"][0] if len(sel["chosen"]) == 1 else "combination")
    best = min((v, k) for k, v in sel["validation_mae"].items() if k != "combination")[1]
    assert best in sel["chosen"]
    assert len(sel["origins"]) == 14 and sel["reason"]
    assert s["p"] is not None and s["d"] is not None  # the ARIMA procedure's own record stays
    json.dumps(s, allow_nan=False)


def test_exactly_repeating_days_are_repeated_and_ties_go_to_arima():
    day = np.r_[np.full(8, 10.0), np.linspace(10, 50, 8), np.full(8, 50.0)]
    model = AutoForecaster(horizon=24).fit(hourly(np.tile(day, 21)))
    val = model.summary_["selection"]["validation_mae"]
    assert val["seasonal_naive"] == 0.0 and val["naive"] > 1.0
    # the seasonally differenced ARIMA is exact too: on a tie the procedure of the design goes first
    assert model.summary_["model"] == ("arima" if val["arima"] == 0.0 else "seasonal_naive")
    assert np.allclose(model.predict(24)["yhat"].to_numpy(), day)


def test_random_walk_is_not_forecast_by_seasonal_naive():
    rng = np.random.default_rng(4)
    model = AutoForecaster(horizon=24).fit(hourly(200 + np.cumsum(rng.normal(size=24 * 21))))
    sel = model.summary_["selection"]
    assert "seasonal_naive" not in sel["chosen"]
    assert sel["validation_mae"]["seasonal_naive"] > min(sel["validation_mae"]["naive"], sel["validation_mae"]["arima"])


def test_a_failing_candidate_is_recorded_and_skipped(monkeypatch):
    def broken(*args, **kwargs):
        raise FloatingPointError("diverged")

    monkeypatch.setattr(select, "_fit_holt_winters", broken)
    model = AutoForecaster(horizon=24).fit(hourly(seasonal_ar(24 * 21, 2)))
    sel = model.summary_["selection"]
    assert "ets" not in sel["validation_mae"] and "diverged" in sel["failed"]["ets"]
    assert np.isfinite(model.predict(24)[["yhat", "yhat_lower", "yhat_upper"]].to_numpy()).all()


def test_too_short_to_validate_runs_the_arima_procedure_alone():
    y = hourly(seasonal_ar(24 * 4, 3))
    model = AutoForecaster(horizon=24).fit(y)
    assert model.summary_["selection"]["reason"].startswith("history of 96 points too short")
    ref = ArimaForecaster().fit(y).predict(24)
    assert np.allclose(model.predict(24)["yhat"].to_numpy(), ref["yhat"].to_numpy())


def test_warm_start_reaches_the_arima_candidate():
    y = hourly(seasonal_ar(24 * 21, 5))
    cold = AutoForecaster(horizon=24).fit(y.iloc[:-24])
    warm = AutoForecaster(horizon=24, orders=cold.summary_).fit(y)
    assert warm.summary_["warm_start"] is True and cold.summary_["warm_start"] is False
    assert warm.summary_["d"] == cold.summary_["d"]


def test_bad_settings_raise():
    for kwargs in ({"horizon": 0}, {"level": 150}, {"calibrate": "maybe"}, {"refit": "always"}):
        with pytest.raises(ValueError):
            AutoForecaster(**kwargs)
    with pytest.raises(RuntimeError):
        AutoForecaster().predict(3)


# --------------------------------------------------------------------------- intervals


def test_intervals_cover_about_their_level_over_many_origins():
    y = seasonal_ar(24 * 40, 6)
    inside = []
    for day in range(22, 40, 2):
        train, truth = hourly(y[: 24 * day]), y[24 * day : 24 * day + 24]
        fc = AutoForecaster(horizon=24, level=90).fit(train).predict(24)
        inside.append((truth >= fc["yhat_lower"].to_numpy()) & (truth <= fc["yhat_upper"].to_numpy()))
    coverage = float(np.mean(inside))
    assert 0.75 <= coverage <= 0.99


def test_narrow_model_intervals_are_widened_to_the_validation_errors():
    # white noise around a daily cycle whose amplitude jumped a week ago: the model's in-sample
    # sigma understates the recent errors, validation widens the interval
    rng = np.random.default_rng(7)
    t = np.arange(24 * 21)
    y = 50 + np.where(t < 24 * 14, 1.0, 3.0) * rng.normal(size=len(t))
    off = AutoForecaster(horizon=24, calibrate="off").fit(hourly(y))
    on = AutoForecaster(horizon=24).fit(hourly(y))
    w_off = (off.predict(24)["yhat_upper"] - off.predict(24)["yhat_lower"]).mean()
    w_on = (on.predict(24)["yhat_upper"] - on.predict(24)["yhat_lower"]).mean()
    assert on.summary_["selection"]["interval"]["scale"] > 1.0
    assert w_on > w_off


# --------------------------------------------------------------------------- the Holt-Winters candidate


def test_holt_winters_recursion_matches_statsmodels():
    rng = np.random.default_rng(8)
    t = np.arange(24 * 20)
    x = 50 + 10 * np.sin(2 * np.pi * t / 24) * (1 + t / 200) + np.cumsum(rng.normal(size=len(t))) + rng.normal(size=len(t))
    hw = select._fit_holt_winters(x, 24, "heuristic")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = ExponentialSmoothing(x, trend="add", damped_trend=True, seasonal="add", seasonal_periods=24,
                                   initialization_method="heuristic").fit(use_brute=False)
    assert hw.gamma > 0  # the seasonal update is exercised
    _, _, _, resid = select._hw_filter(hw, x)
    assert np.allclose(resid, x - res.fittedvalues, atol=1e-8)
    mean, se = select._holt_winters_forecast(hw, x, 23)
    # statsmodels' forecast agrees before the first full season (at step 24 it reuses a stale season)
    assert np.allclose(mean, res.forecast(23), atol=1e-8)
    assert np.all(np.diff(se) >= 0) and se[0] == pytest.approx(np.sqrt(np.mean(resid**2)))


def test_arima_candidate_is_estimated_on_the_last_four_weeks_and_forecasts_from_the_end():
    values = seasonal_ar(24 * 41, 9, amplitude=6.0, phi=0.8, noise=1.0)
    y = hourly(values[:-24])
    first = len(y) - 24 - 13 * 12  # 108 hours (4.5 days) after the start of the four weeks
    for window, n_obs in (("4w", 24 * 28), (None, first)):
        model = AutoForecaster(horizon=24, arima_window=window, seasonal="fourier").fit(y)
        s = model.summary_
        assert s["n_obs"] == n_obs and s["start"] == y.index[first - n_obs].isoformat()
        assert any(f["period"] == 24 for f in s["fourier"])  # the daily cycle is Fourier terms
        # filtered from the end of the history with the terms in phase, ARIMA beats repeating
        # yesterday; twelve hours out of phase it would miss by about the cycle's amplitude
        val = s["selection"]["validation_mae"]
        assert val["arima"] < val["seasonal_naive"]
    with pytest.raises(ValueError):
        AutoForecaster(arima_window=0)


def test_holt_winters_states_at_every_origin_in_one_pass_equal_separate_filters():
    x = seasonal_ar(24 * 15, 12)
    hw = select._fit_holt_winters(x, 24, "heuristic")
    stops = [0, 5, 24 * 7, 24 * 12, 24 * 15]
    last, states = select._hw_filter_states(hw, x, stops)
    for stop, (level, trend, season) in zip(stops, states):
        ref = select._hw_filter(hw, x[:stop])
        assert (level, trend) == (ref[0], ref[1]) and np.array_equal(season, ref[2])
    assert np.array_equal(last[3], select._hw_filter(hw, x)[3])


def test_keep_orders_for_keeps_the_arima_orders_and_the_holt_winters_parameters_within_the_span():
    y = hourly(seasonal_ar(24 * 21, 13))
    cold = AutoForecaster(horizon=24).fit(y.iloc[:-1])
    assert cold.summary_["ets"]["kept"] is False and cold.summary_["orders_kept"] is False
    warm = AutoForecaster(horizon=24, orders=cold.summary_, keep_orders_for="1D").fit(y)
    ets, ets0 = warm.summary_["ets"], cold.summary_["ets"]
    assert ets["kept"] is True and warm.summary_["orders_kept"] is True
    assert [ets[k] for k in ("alpha", "beta", "gamma", "phi", "estimated_through")] == \
        [ets0[k] for k in ("alpha", "beta", "gamma", "phi", "estimated_through")]
    assert "ets" in warm.validation_["mae"]
    # a day later both are estimated again; without keep_orders_for they always are
    stale = AutoForecaster(horizon=24, orders=cold.summary_, keep_orders_for="1D").fit(
        hourly(seasonal_ar(24 * 22, 13)).iloc[:-1])
    assert stale.summary_["ets"]["kept"] is False and stale.summary_["orders_kept"] is False
    again = AutoForecaster(horizon=24, orders=cold.summary_).fit(y)
    assert again.summary_["ets"]["kept"] is False and again.summary_["orders_kept"] is False


def test_the_forecast_stage_searches_orders_about_once_a_day():
    from gpupool.forecast import stage as forecast_stage

    y = hourly(seasonal_ar(24 * 21, 14))
    _, first = forecast_stage.demand_forecast(y.iloc[:-2], 24)
    _, next_hour = forecast_stage.demand_forecast(y.iloc[:-1], 24, warm=forecast_stage.warm_start(first))
    assert first["orders_kept"] is False and next_hour["orders_kept"] is True
    assert next_hour["orders_searched_through"] == first["orders_searched_through"]
    _, next_day = forecast_stage.demand_forecast(hourly(seasonal_ar(24 * 22, 14)).iloc[:-1], 24,
                                           warm=forecast_stage.warm_start(next_hour))
    assert next_day["orders_kept"] is False
