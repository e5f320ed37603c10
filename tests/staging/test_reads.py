"""One hourly demand: the forecast is fitted on, the pool page shows, and the report plots the
same numbers for the same staged data, on SQLite and on the real PostgreSQL."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import numpy as np
import pandas as pd
import pytest

from gpupool import pipeline, poolview, report
from gpupool.config import default_config
from gpupool.forecast import arima
from gpupool.staging import loader, reads

START = datetime(2026, 11, 1, 0, tzinfo=timezone.utc)
END = START + timedelta(hours=3)
SPIKE = pd.Timestamp("2026-11-01T01:20Z")
GAP = pd.Timestamp("2026-11-01T02:05Z")  # gpu_pending missing at this instant


def _stage(engine) -> None:
    """Three hours of platform totals with a spike in gpu_allocated (cleaned to 10) and one
    instant where gpu_pending is missing."""
    ts = pd.date_range(START, END, freq="5min", inclusive="left")
    rows = []
    for i, t in enumerate(ts):
        alloc = 500.0 if t == SPIKE else 10.0 + (i % 4)
        rows.append(("gpu_allocated", t, alloc))
        if t != GAP:
            rows.append(("gpu_pending", t, 2.0 + (i % 3)))
        rows.append(("gpu_capacity", t, 64.0))
    frame = pd.DataFrame(rows, columns=["metric", "ts", "value"]).assign(
        platform="p1", cluster="", entity_kind="platform", entity_id="", unit="gpus")
    loader.replace_slice(engine, loader.Slice("sample", {"platform": "p1"}, START, END), frame)
    clean = frame[frame["metric"] == "gpu_allocated"].drop(columns="unit").assign(
        expected=10.0, score=0.0, is_anomaly=False, filled=False, detector="sr")
    clean["clean_value"] = clean["value"]
    spike = clean["ts"] == SPIKE
    clean.loc[spike, ["is_anomaly", "clean_value", "score"]] = [True, 10.0, 9.0]
    loader.replace_slice(engine, loader.Slice("clean_sample", {"platform": "p1"}, START, END), clean)


def _forecast_input(engine, monkeypatch) -> pd.Series:
    seen = {}

    class Stop(Exception):
        pass

    def fit(self, history):
        seen["history"] = history
        raise Stop

    monkeypatch.setattr(arima.ArimaForecaster, "fit", fit)
    with pytest.raises(Stop):
        pipeline.forecast_demand(pipeline.Context(default_config(), engine), "p1", pipeline.Window(END - timedelta(hours=1), END))
    return seen["history"]


def test_forecast_pool_page_and_report_use_one_hourly_demand(engine, monkeypatch, tmp_path):
    _stage(engine)
    expected, info = reads.hourly_demand(engine, "p1", START, END)
    assert info["clean_points"] == 36 and len(expected) == 3
    # the spike is cleaned, the instant without gpu_pending does not count
    hour1 = [10.0 + (i % 4) + 2.0 + (i % 3) for i in range(12, 24)]
    assert expected.iloc[1] == pytest.approx(np.mean(hour1))
    hour2 = [10.0 + (i % 4) + 2.0 + (i % 3) for i in range(24, 36) if i != 25]
    assert expected.iloc[2] == pytest.approx(np.mean(hour2))

    fitted = _forecast_input(engine, monkeypatch)
    monkeypatch.undo()  # the report forecasts each hour with the real model
    page = poolview.pool_state(engine, at=END, hours=3)["platforms"]["p1"]["demand"]
    report.write_report(engine, START, END, tmp_path / "r", whatif=False)
    table = pd.read_csv(tmp_path / "r" / "demand_hourly.csv", parse_dates=["ts"])

    np.testing.assert_allclose(fitted.to_numpy(), expected.to_numpy())
    np.testing.assert_allclose([d["value"] for d in page], expected.round(3).to_numpy())
    assert [pd.Timestamp(d["ts"]) for d in page] == list(expected.index)
    np.testing.assert_allclose(table.loc[table["platform"] == "p1", "demand"].to_numpy(), expected.to_numpy())
