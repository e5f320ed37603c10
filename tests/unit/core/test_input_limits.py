"""Small inputs whose grids would be huge are refused in one line, before any memory is taken."""

from __future__ import annotations

import pandas as pd
import pytest

from gpupool.cli import main
from gpupool.forecast.io import MAX_GRID_POINTS, forecast_csv
from gpupool.sim.scenario import scenario_from_dict
from gpupool.sim.traces import MAX_WORLD_STEPS, TraceError, read_helios
from gpupool.sim.world import World
from gpupool.tsio import SeriesInputError


def test_forecast_refuses_a_grid_beyond_the_limit_naming_step_and_span(tmp_path, capsys):
    # a thousand one-second samples, then a point a day for a year: the grid is the span at 1 s
    secs = pd.date_range("2026-01-01", periods=1000, freq="s")
    days = pd.date_range("2026-01-02", periods=365, freq="D")
    path = tmp_path / "mixed.csv"
    pd.DataFrame({"ts": secs.append(days).strftime("%Y-%m-%d %H:%M:%S"), "v": 1.0}).to_csv(path, index=False)
    with pytest.raises(SeriesInputError) as err:
        forecast_csv(path, 24, tmp_path / "o.csv")
    text = str(err.value)
    assert str(path) in text and "0 days 00:00:01" in text and f"{MAX_GRID_POINTS:,}" in text and "365 days" in text
    assert main(["forecast", str(path), "--horizon", "24", "--out", str(tmp_path / "o.csv")]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert not (tmp_path / "o.csv").exists()


def _helios(path, times):
    pd.DataFrame({"time": times, "running_gpu_num": 1, "pending_gpu_num": 0, "total_gpu_num": 8}).to_csv(path, index=False)


def test_a_trace_spanning_a_century_is_refused_naming_span_and_step(tmp_path):
    path = tmp_path / "century.csv"
    _helios(path, ["1990-01-01 00:00", "2040-01-01 00:00", "2090-01-01 00:00"])
    with pytest.raises(TraceError) as err:
        read_helios(path, "5min")
    text = str(err.value)
    assert str(path) in text and "1990-01-01" in text and "2090-01-01" in text and "0 days 00:05:00" in text
    assert f"{MAX_WORLD_STEPS:,}" in text
    _helios(path, ["2026-01-01 00:00", "2026-01-02 00:00", "2026-01-03 00:00"])  # a short one still reads
    assert len(read_helios(path, "5min")) == 2 * 288 + 1


def test_a_synthetic_window_beyond_the_limit_is_refused(tmp_path):
    raw = {
        "step": "5min", "start": "1990-01-01", "end": "2090-01-01", "node_gpus": 8,
        "platforms": {"slurm": {"synthetic": {"base": 10, "total_gpus": 16}, "nodes": 2}},
    }
    with pytest.raises(TraceError, match=r"the scenario's window: spans 1990-01-01 .*steps of 0 days 00:05:00"):
        World(scenario_from_dict(raw, where="test"))
