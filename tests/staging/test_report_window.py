"""The report and the pool page over a staged window: the forecast plot covers every hour of the
window (not only the hours a pipeline run issued a forecast for), and every marked demand point
says what the detect stage decided (cleaned as a telemetry fault, or kept as a real burst), on
SQLite and on the real PostgreSQL."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from datetime import datetime, timedelta, timezone

import numpy as np
import pandas as pd
import pytest

from gpupool import poolview, report
from gpupool.staging import forecasts, loader, reads

DATA_START = datetime(2026, 10, 29, 0, tzinfo=timezone.utc)
START = datetime(2026, 10, 31, 0, tzinfo=timezone.utc)  # the report's window: the last day
END = START + timedelta(days=1)
SPIKE = pd.Timestamp("2026-10-31T03:10Z")  # an exporter spike, cleaned
DROP = pd.Timestamp("2026-10-31T09:35Z")  # a fall to zero, cleaned
BURST = pd.Timestamp("2026-10-31T15:00Z")  # the start of a real burst: flagged, kept
ISSUED = pd.Timestamp("2026-10-31T20:00Z")  # the one hour a pipeline run issued a forecast for


def _stage(engine) -> None:
    """Three days of a daily demand rhythm for platform p1, with the detect stage's decisions on
    three points, and one stored forecast."""
    ts = pd.date_range(DATA_START, END, freq="5min", inclusive="left")
    hours = ts.hour + ts.minute / 60
    alloc = 30 + 12 * np.cos(2 * np.pi * (hours - 14) / 24) + np.where(ts >= BURST, 15.0, 0.0) * (ts < BURST + pd.Timedelta("3h"))
    rows = pd.concat([
        pd.DataFrame({"metric": "gpu_allocated", "ts": ts, "value": alloc}),
        pd.DataFrame({"metric": "gpu_pending", "ts": ts, "value": 2.0}),
        pd.DataFrame({"metric": "gpu_capacity", "ts": ts, "value": 64.0}),
    ], ignore_index=True).assign(platform="p1", cluster="", entity_kind="platform", entity_id="", unit="gpus")
    raw = rows.copy()
    raw.loc[(raw["metric"] == "gpu_allocated") & (raw["ts"] == SPIKE), "value"] = 400.0
    raw.loc[(raw["metric"] == "gpu_allocated") & (raw["ts"] == DROP), "value"] = 0.0
    loader.replace_slice(engine, loader.Slice("sample", {"platform": "p1"}, DATA_START, END), raw)
    clean = raw[raw["metric"] != "gpu_capacity"].drop(columns="unit").assign(
        expected=np.nan, score=0.0, is_anomaly=False, cleaned=False, filled=False, detector="svr")
    clean["clean_value"] = clean["value"]
    alloc_rows = clean["metric"] == "gpu_allocated"
    for at in (SPIKE, DROP):
        here = alloc_rows & (clean["ts"] == at)
        true_value = float(rows.loc[(rows["metric"] == "gpu_allocated") & (rows["ts"] == at), "value"].iloc[0])
        clean.loc[here, ["is_anomaly", "cleaned", "clean_value", "expected"]] = [True, True, true_value, true_value]
    clean.loc[alloc_rows & (clean["ts"] == BURST), "is_anomaly"] = True  # an alarm, the value kept
    loader.replace_slice(engine, loader.Slice("clean_sample", {"platform": "p1"}, DATA_START, END), clean)
    steps = pd.DataFrame({"ts": [ISSUED, ISSUED + pd.Timedelta("1h")], "yhat": [33.0, 34.0],
                          "yhat_lower": [30.0, 29.0], "yhat_upper": [36.0, 39.0]})
    forecasts.replace_forecast(engine, "p1", "demand", ISSUED.to_pydatetime(), model="arima", summary={},
                               level=90.0, steps=steps)


def test_the_forecast_plot_spans_the_window_and_the_marks_say_what_was_decided(engine, tmp_path):
    _stage(engine)
    report.write_report(engine, START, END, tmp_path / "r", whatif=False)
    fc = pd.read_csv(tmp_path / "r" / "forecast_hourly.csv", parse_dates=["ts"])
    hours = pd.date_range(START, END, freq="1h", inclusive="left")
    # one forecast for every hour of the window, each issued before its hour
    assert list(fc["ts"]) == list(hours)
    assert (fc["platform"] == "p1").all()
    stored = fc[fc["source"] == "stored"]
    assert list(stored["ts"]) == [ISSUED] and stored["yhat"].iloc[0] == pytest.approx(33.0)
    assert (fc.loc[fc["ts"] != ISSUED, "source"] == "replayed").all()
    assert fc[["yhat", "yhat_lower", "yhat_upper"]].notna().all().all()
    assert (fc["yhat_lower"] <= fc["yhat"]).all() and (fc["yhat"] <= fc["yhat_upper"]).all()
    # a replayed forecast follows the demand's daily rhythm: not one flat line
    assert fc["yhat"].max() - fc["yhat"].min() > 10

    marks = reads.cleaning_decisions(engine, START, END)
    assert list(zip(marks["ts"], marks["decision"], marks["fault"])) == [
        (SPIKE, "cleaned", "spike"), (DROP, "cleaned", "drop"), (BURST, "kept", "")]
    page = (tmp_path / "r" / "index.html").read_text()
    assert "2 demand points cleaned as telemetry faults, 1 flagged and kept" in page
    for label in ("cleaned: telemetry fault (spike)", "cleaned: telemetry fault (drop)", "kept: real burst"):
        assert f"<td>{label}</td>" in page

    state = poolview.pool_state(engine, at=END, hours=24)
    points = state["platforms"]["p1"]["anomalies"]
    assert [(pd.Timestamp(a["ts"]), a["label"]) for a in points] == [
        (SPIKE, "cleaned: telemetry fault (spike)"), (DROP, "cleaned: telemetry fault (drop)"), (BURST, "kept: real burst")]
    assert points[0]["demand_at"] == pytest.approx(402.0)  # marked on the demand as reported there
    assert points[2]["cleaned_to"] is None and points[0]["cleaned_to"] == pytest.approx(
        30 + 12 * np.cos(2 * np.pi * (3 + 10 / 60 - 14) / 24), abs=1e-3)
    html = poolview.render_html(state)
    assert "2 points cleaned as telemetry faults, 1 flagged and kept as real bursts" in html
    assert re.findall(r"<circle[^>]*data-decision='(\w+)'", html) == ["cleaned", "cleaned", "kept"]


def _number_pairs(text: str) -> list[tuple[float, float]]:
    nums = [float(x) for x in re.findall(r"-?\d+(?:\.\d+)?", text)]
    return list(zip(nums[0::2], nums[1::2]))


@pytest.mark.parametrize("hours", [3, 24])
def test_every_chart_is_drawn_inside_its_viewbox_and_scales_to_its_card(hours):
    """The SVG the page draws: no fixed pixel width (it scales to 100 % of its card), and every
    shape's coordinates inside the viewBox, with a forecast band running past the demand."""
    at = pd.Timestamp("2026-11-01T12:00Z")
    demand = [{"ts": (at - pd.Timedelta(hours=h)).isoformat(), "value": 40.0 + h} for h in range(hours, 0, -1)]
    band = [{"ts": (at + pd.Timedelta(hours=h)).isoformat(), "yhat": 50.0, "lower": -5.0, "upper": 500.0}
            for h in range(0, 24)]
    platform = {"nodes": 8, "gpus": 64, "demand": demand, "capacity": [dict(d, value=64.0) for d in demand],
                "forecast_issued_at": at.isoformat(), "forecast": band,
                "anomalies": [{"ts": demand[0]["ts"], "metric": "gpu_allocated", "value": 900.0, "cleaned_to": 40.0,
                               "detector": "sr", "decision": "cleaned", "fault": "spike",
                               "label": "cleaned: telemetry fault (spike)"}]}
    svg = ET.fromstring(poolview._svg_chart(platform))
    assert svg.get("width") == "100%" and svg.get("height") is None and svg.get("overflow") == "hidden"
    _, _, w, h = (float(v) for v in svg.get("viewBox").split())
    points: list[tuple[float, float]] = []
    for el in svg.iter():
        tag = el.tag.split("}")[-1]
        if tag == "polygon":
            points += _number_pairs(el.get("points"))
        elif tag == "path":
            points += _number_pairs(el.get("d"))
        elif tag == "circle":
            points.append((float(el.get("cx")), float(el.get("cy"))))
        elif tag == "text":
            points.append((float(el.get("x")), float(el.get("y"))))
    assert len(points) > hours + 24
    assert all(0 <= x <= w and 0 <= y <= h for x, y in points), [p for p in points if not (0 <= p[0] <= w and 0 <= p[1] <= h)]
