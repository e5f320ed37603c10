"""Reading Helios traces: demand = running + pending, files summed, rows averaged into the step."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from gpupool.sim.traces import TraceError, read_helios


def hourly(values) -> np.ndarray:
    """Per-minute demand holding each of ``values`` for one hour."""
    return np.repeat(np.asarray(values, dtype=float), 60)



def test_rows_finer_than_the_step_are_averaged(helios):
    minutes = np.r_[np.full(30, 10.0), np.full(30, 30.0), np.full(60, 8.0)]
    path = helios("a", minutes, total=16)
    out = read_helios(path, "1h")
    assert list(out["demand"]) == [20.0, 8.0]
    assert out.index[0] == pd.Timestamp("2020-05-01", tz="UTC")
    assert str(out.index.tz) == "UTC"
    half = read_helios(path, "30min")
    assert list(half["demand"]) == [10.0, 30.0, 8.0, 8.0]
    # pending is what did not run on the traced cluster
    assert list(half["pending"]) == [0.0, 14.0, 0.0, 0.0]


def test_several_files_are_summed(helios):
    a = helios("a", hourly([4, 6]), total=8)
    b = helios("b", hourly([1, 2]), total=16)
    out = read_helios([a, b], "1h")
    assert list(out["demand"]) == [5.0, 8.0]
    assert list(out["total"]) == [24.0, 24.0]


def test_missing_column_names_the_file(tmp_path):
    bad = tmp_path / "bad.csv"
    pd.DataFrame({"time": ["2020-05-01 00:00:00"], "running_gpu_num": [1]}).to_csv(bad, index=False)
    with pytest.raises(TraceError, match=r"bad\.csv.*pending_gpu_num"):
        read_helios(bad, "5min")


def test_files_over_different_ranges_are_refused(helios):
    a = helios("a", hourly([4, 6]), total=8)
    b = helios("b", hourly([4, 6, 7]), total=8)
    with pytest.raises(TraceError, match="same range"):
        read_helios([a, b], "1h")


def test_unreadable_file(tmp_path):
    with pytest.raises(TraceError, match="cannot read"):
        read_helios(tmp_path / "nope.csv", "5min")


@pytest.mark.parametrize("column, value, match", [
    ("total_gpu_num", "1e308", r"line 3, column 'total_gpu_num': value 1e\+308 is beyond 1,000,000 GPUs \(MAX_GPU_COUNT\)"),
    ("total_gpu_num", "8e10", r"line 3, column 'total_gpu_num': value 80000000000\.0 is beyond 1,000,000 GPUs"),
    ("pending_gpu_num", "1e7", r"line 3, column 'pending_gpu_num': value 10000000\.0 is beyond"),
    ("time", "2300-05-01 00:01:00", r"line 3, column 'time': 2300-05-01T00:01:00\+00:00 is outside the times a trace "
     r"may name \(1970-01-01 \.\. 2200-01-01\)"),
])
def test_a_count_beyond_the_bound_or_a_time_outside_the_span_is_refused(helios, column, value, match):
    """A cluster of 8e10 GPUs would build a world of 1e10 nodes; 1e308 was a traceback."""
    from gpupool.sim.traces import MAX_GPU_COUNT

    path = helios("a", [4] * 3, total=8)
    frame = pd.read_csv(path, dtype=str)
    frame.loc[1, column] = value
    frame.to_csv(path, index=False)
    with pytest.raises(TraceError, match=match):
        read_helios(path, "1min")
    frame.loc[1, column] = frame.loc[0, column] if column == "time" else str(MAX_GPU_COUNT)
    frame.loc[1, "time"] = "2020-05-01 00:01:00"
    frame.to_csv(path, index=False)
    assert len(read_helios(path, "1min")) == 3  # the bound itself reads
