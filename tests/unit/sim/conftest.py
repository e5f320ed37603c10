"""Fixtures of the simulator tests: tiny Helios-format traces written to tmp_path."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest


def write_helios(path: Path, start: str, demand_per_minute, total: int, util: float = 0.8) -> Path:
    """Write a per-minute Helios trace whose demand (running + pending) is ``demand_per_minute``."""
    demand = np.asarray(demand_per_minute, dtype=float)
    running = np.minimum(demand, total)
    pending = demand - running
    ts = pd.date_range(start, periods=len(demand), freq="1min")
    frame = pd.DataFrame({
        "time": ts.strftime("%Y-%m-%d %H:%M:%S"),
        "total_job_num": 1, "running_job_num": 1, "pending_job_num": 0, "total_gpujob_num": 1,
        "running_gpujob_num": 1, "pending_gpujob_num": 0,
        "total_gpu_num": total, "running_gpu_num": running, "pending_gpu_num": pending,
        "idle_gpu_num": total - running, "gpu_utilization": util,
    })
    frame.to_csv(path, index=False)
    return path


@pytest.fixture
def helios(tmp_path):
    """``helios(name, demand_per_minute, total)`` writes a trace under tmp_path and returns its path."""

    def make(name: str, demand_per_minute, total: int, start: str = "2020-05-01 00:00:00") -> Path:
        return write_helios(tmp_path / f"{name}.csv", start, demand_per_minute, total)

    return make
