"""The ``gpupool forecast`` CSV contract, the long-frame entry point and the baselines."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from gpupool.forecast import (
    MeanForecaster,
    NaiveForecaster,
    SeasonalNaiveForecaster,
    forecast_csv,
    forecast_long,
)
from gpupool.forecast.io import OUTPUT_COLUMNS


def demand(n: int, seed: int = 0) -> pd.Series:
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    y = 40 + 15 * np.sin(2 * np.pi * t / 24) + rng.normal(scale=2.0, size=n)
    return pd.Series(y, index=pd.date_range("2024-05-01", periods=n, freq="h"))


def write_input(path, series: pd.Series) -> None:
    pd.DataFrame({"time": series.index.strftime("%Y-%m-%d %H:%M:%S"), "gpus": series.to_numpy()}).to_csv(
        path, index=False
    )


def test_forecast_csv_contract(tmp_path):
    series = demand(24 * 10)
    src, out, summary_path = tmp_path / "in.csv", tmp_path / "out.csv", tmp_path / "s.json"
    write_input(src, series)
    summary = forecast_csv(src, horizon=36, out=out, level=80, season=24, summary_json=summary_path)

    table = pd.read_csv(out)
    assert list(table.columns) == OUTPUT_COLUMNS == ["step", "timestamp", "yhat", "yhat_lower", "yhat_upper"]
    assert table["step"].tolist() == list(range(1, 37))
    stamps = pd.to_datetime(table["timestamp"])
    assert stamps.iloc[0] == series.index[-1] + pd.Timedelta(hours=1)
    assert (stamps.diff().dropna() == pd.Timedelta(hours=1)).all()
    assert np.isfinite(table[["yhat", "yhat_lower", "yhat_upper"]].to_numpy()).all()

    written = json.loads(summary_path.read_text())
    assert written == summary
    for key in ("d", "p", "q", "D", "Q", "fourier", "criterion", "criterion_value", "criterion_values",
                "adf_pvalue", "kpss_pvalue", "ljungbox_pvalue", "residual_ljungbox_pvalue", "fallback",
                "clipped", "season", "horizon"):
        assert key in written, key
    assert written["level"] == 80 and written["horizon"] == 36 and written["season"] == 24


def test_forecast_csv_detects_the_period_without_a_hint(tmp_path):
    src, out = tmp_path / "in.csv", tmp_path / "out.csv"
    write_input(src, demand(24 * 10, seed=1))
    summary = forecast_csv(src, horizon=5, out=out)
    assert summary["season"] == 24
    assert len(pd.read_csv(out)) == 5


def test_forecast_csv_falls_back_on_a_tiny_input_without_nan(tmp_path):
    src, out = tmp_path / "in.csv", tmp_path / "out.csv"
    write_input(src, demand(5))
    summary = forecast_csv(src, horizon=4, out=out)
    assert summary["fallback"].startswith("short series")
    assert pd.read_csv(out)[["yhat", "yhat_lower", "yhat_upper"]].notna().all().all()


def test_forecast_csv_rejects_a_bad_horizon(tmp_path):
    src = tmp_path / "in.csv"
    write_input(src, demand(48))
    with pytest.raises(ValueError):
        forecast_csv(src, horizon=0, out=tmp_path / "out.csv")


def test_forecast_long_many_series_with_warm_start():
    a, b = demand(24 * 8, 2), demand(24 * 8, 3) * 2
    frame = pd.concat(
        [pd.DataFrame({"series_id": "slurm", "ts": a.index, "y": a.to_numpy()}),
         pd.DataFrame({"series_id": "k8s", "ts": b.index, "y": b.to_numpy()})]
    )
    before = frame.copy()
    fc, summaries = forecast_long(frame, horizon=6)
    pd.testing.assert_frame_equal(frame, before)
    assert list(fc.columns) == ["series_id", "step", "ts", "yhat", "yhat_lower", "yhat_upper"]
    assert sorted(summaries) == ["k8s", "slurm"] and len(fc) == 12
    fc2, summaries2 = forecast_long(frame, horizon=6, orders=summaries)
    assert all(s["warm_start"] for s in summaries2.values())
    assert np.isfinite(fc2[["yhat", "yhat_lower", "yhat_upper"]].to_numpy()).all()


# --------------------------------------------------------------------------- baselines


def test_seasonal_naive_repeats_last_season_with_growing_intervals():
    y = demand(24 * 5)
    model = SeasonalNaiveForecaster(season=24).fit(y)
    fc = model.predict(48)
    assert list(fc.columns) == ["ts", "yhat", "yhat_lower", "yhat_upper"]
    assert np.allclose(fc["yhat"].to_numpy(), np.r_[y.to_numpy()[-24:], y.to_numpy()[-24:]])
    width = (fc["yhat_upper"] - fc["yhat_lower"]).to_numpy()
    assert width[30] > width[10]
    assert model.summary_["season"] == 24


def test_seasonal_naive_detects_daily_period_and_handles_short_input():
    y = demand(24 * 3)
    assert SeasonalNaiveForecaster().fit(y).season_ == 24
    short = SeasonalNaiveForecaster().fit(y.iloc[:5])
    assert short.season_ == 1
    assert np.allclose(short.predict(3)["yhat"], y.iloc[4])


def test_mean_and_naive_baselines():
    y = demand(100)
    m = MeanForecaster().fit(y).predict(4)
    assert np.allclose(m["yhat"], y.mean())
    w = MeanForecaster(window=24).fit(y).predict(1)
    assert w["yhat"].iloc[0] == pytest.approx(y.iloc[-24:].mean())
    n = NaiveForecaster().fit(y).predict(3)
    assert np.allclose(n["yhat"], y.iloc[-1])


def test_baseline_update_appends_and_clips():
    y = pd.Series([0.0, 1.0, 0.0, 2.0, 0.0, 1.0], index=pd.date_range("2024-01-01", periods=6, freq="h"))
    model = MeanForecaster().fit(y)
    fc = model.predict(2)
    assert (fc["yhat_lower"] >= 0).all() and model.summary_["clipped"] is True
    model.update(pd.Series([10.0], index=[y.index[-1] + pd.Timedelta(hours=1)]))
    assert model.predict(1)["yhat"].iloc[0] == pytest.approx(np.mean([0, 1, 0, 2, 0, 1, 10]))
