"""Mostly idle, on/off demand: the TSB baseline and the sparse-series rule of AutoForecaster."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from gpupool.forecast.baselines import SeasonalNaiveForecaster, TSBForecaster, tsb_filter
from gpupool.forecast.select import AutoForecaster

START = "2024-03-04 00:00"


def hourly(values, start=START) -> pd.Series:
    return pd.Series(np.asarray(values, dtype=float), index=pd.date_range(start, periods=len(values), freq="h"))


def on_off(days: int, seed: int, start: float = 9.0, length: float = 9.0, p_day: float = 0.85,
           gpus: float = 16.0) -> np.ndarray:
    """Busy ``gpus`` in a daily window whose edges move by up to an hour, idle otherwise and on
    some days all day: zero in well over a quarter of the hours."""
    rng = np.random.default_rng(seed)
    out = np.zeros(24 * days)
    for d in range(days):
        if rng.random() < p_day:
            on = 24 * d + int(round(start + rng.normal(0, 0.7)))
            off = on + int(round(length + rng.normal(0, 0.7)))
            out[on:off] = gpus
    return out


def seasonal_ar(n, seed, amplitude=20.0, phi=0.8, noise=2.0):
    rng = np.random.default_rng(seed)
    e = rng.normal(scale=noise, size=n)
    x = np.zeros(n)
    for i in range(1, n):
        x[i] = phi * x[i - 1] + e[i]
    return 100 + amplitude * np.sin(2 * np.pi * np.arange(n) / 24) + x


# --------------------------------------------------------------------------- TSB


def test_tsb_recursions_by_hand():
    y = np.array([0.0, 4.0, 0.0, 0.0, 6.0])
    prob, size, sigma = tsb_filter(y, alpha_d=0.5, alpha_p=0.5)
    # initial: one non-zero in the first four points (p = 1/4), its size 4; then the five updates
    p = 0.25
    for v in y:
        p += 0.5 * ((v != 0) - p)
    assert prob[0] == pytest.approx(p) and size[0] == pytest.approx(5.0)  # 4, then halfway to 6
    assert sigma.shape == (1,) and sigma[0] > 0


def test_tsb_fit_predict_shape_columns_and_non_negative():
    y = hourly(on_off(21, seed=1))
    before = y.copy()
    model = TSBForecaster(season=24, level=90).fit(y)
    pd.testing.assert_series_equal(y, before)  # the input is not modified
    frame = model.predict(36)
    assert list(frame.columns) == ["ts", "yhat", "yhat_lower", "yhat_upper"] and len(frame) == 36
    assert frame["ts"].iloc[0] == y.index[-1] + pd.Timedelta("1h")
    values = frame[["yhat", "yhat_lower", "yhat_upper"]].to_numpy()
    assert np.all(np.isfinite(values)) and np.all(values >= 0)
    assert np.all(frame["yhat_lower"] <= frame["yhat"]) and np.all(frame["yhat"] <= frame["yhat_upper"])
    assert model.season_ == 24 and model.prob_.shape == model.size_.shape == model.sigma_.shape == (24,)
    assert np.all((model.prob_ >= 0) & (model.prob_ <= 1))
    # the forecast repeats the daily profile: the window's hours are busy, the night is idle
    yhat = frame["yhat"].to_numpy()
    hours = frame["ts"].dt.hour.to_numpy()
    assert yhat[(hours >= 11) & (hours < 16)].min() > 8 > yhat[(hours < 6)].max()
    np.testing.assert_allclose(yhat[:12], yhat[24:36])
    flat = TSBForecaster().fit(y).predict(5)["yhat"].to_numpy()
    assert np.ptp(flat) == 0 and 0 < flat[0] < 16


def test_tsb_forecasts_an_exact_on_off_pattern_exactly_and_rejects_bad_settings():
    idx = pd.date_range(START, periods=24 * 14, freq="h")
    y = pd.Series(np.where((idx.hour >= 9) & (idx.hour < 17), 24.0, 0.0), index=idx)
    frame = TSBForecaster(season=24).fit(y).predict(24)
    np.testing.assert_allclose(frame["yhat"].to_numpy(), y.to_numpy()[-24:])
    short = TSBForecaster(season=24).fit(y.iloc[:30])  # under two seasons: one phase
    assert short.season_ == 1 and np.isfinite(short.predict(3)["yhat"]).all()
    for bad in ({"alpha_d": 0.0}, {"alpha_p": 1.5}, {"season": 0}):
        with pytest.raises(ValueError, match="TSBForecaster"):
            TSBForecaster(**bad)
    with pytest.raises(RuntimeError, match="not fitted"):
        TSBForecaster().predict(3)


# --------------------------------------------------------------------------- the sparse-series rule


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_on_off_series_is_validated_on_more_origins_and_takes_a_seasonal_model(seed):
    y = hourly(on_off(28, seed=seed))
    model = AutoForecaster(horizon=24).fit(y)
    sel = model.summary_["selection"]
    assert sel["profile"]["sparse"] is True and sel["profile"]["history_zero_share"] >= 0.25
    assert len(sel["origins"]) == 28 and "tsb" in sel["validation_mae"]
    assert model.summary_["model"] in ("seasonal_naive", "tsb")
    # the rule is what makes the choice: without it the same history is validated on 14 origins
    old = AutoForecaster(horizon=24, sparse_share=None).fit(y)
    assert len(old.summary_["selection"]["origins"]) == 14 and "tsb" not in old.summary_["selection"]["validation_mae"]
    fc = model.predict(24)
    assert np.all(fc[["yhat", "yhat_lower", "yhat_upper"]].to_numpy() >= 0)


def test_a_sparse_series_keeps_seasonal_naive_when_nothing_validates_clearly_better():
    idx = pd.date_range(START, periods=24 * 28, freq="h")
    y = pd.Series(np.where((idx.hour >= 9) & (idx.hour < 17), 24.0, 0.0), index=idx)
    model = AutoForecaster(horizon=24).fit(y)
    sel = model.summary_["selection"]
    assert sel["validation_mae"]["seasonal_naive"] == 0.0
    assert model.summary_["model"] == "seasonal_naive" and "sparse series" in sel["reason"]
    snaive = SeasonalNaiveForecaster(24).fit(y).predict(24)
    np.testing.assert_allclose(model.predict(24)["yhat"].to_numpy(), snaive["yhat"].to_numpy())


def test_a_smooth_series_is_not_sparse_and_is_forecast_as_before():
    y = hourly(seasonal_ar(24 * 28, seed=4))
    new = AutoForecaster(horizon=24).fit(y)
    old = AutoForecaster(horizon=24, sparse_share=None).fit(y)
    sel = new.summary_["selection"]
    assert sel["profile"]["sparse"] is False and sel["profile"]["history_zero_share"] == 0.0
    assert "tsb" not in sel["validation_mae"] and len(sel["origins"]) == 14
    assert new.summary_["model"] not in ("seasonal_naive", "tsb")
    assert sel["chosen"] == old.summary_["selection"]["chosen"]
    pd.testing.assert_frame_equal(new.predict(24), old.predict(24))


def test_sparse_origins_are_limited_by_the_history():
    y = hourly(on_off(12, seed=5))
    sel = AutoForecaster(horizon=24).fit(y).summary_["selection"]
    # 288 points: the first origin keeps 56 points before it, origins 12 h apart
    assert sel["profile"]["sparse"] is True and len(sel["origins"]) == (288 - 24 - 56) // 12 + 1


def test_bad_sparse_settings_raise():
    with pytest.raises(ValueError, match="sparse_share"):
        AutoForecaster(sparse_share=0.0)
    with pytest.raises(ValueError, match="tsb_alpha"):
        AutoForecaster(tsb_alpha=1.5)
