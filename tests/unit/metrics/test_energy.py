"""gpupool.energy's reading of power transitions, on hand-made rows: the cases the staged
history of the metrics tests does not hold."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from gpupool import energy
from gpupool.config import parse_config

T = datetime(2026, 11, 1, tzinfo=timezone.utc)
M = timedelta(minutes=1)


def _rows(*steps):
    return [{"id": i, "node": n, "platform": p, "from_state": f, "to_state": t, "at": at, "by": "plan",
             "deadline": d, "error": None} for i, (n, p, f, t, at, d) in enumerate(steps, 1)]


def test_a_node_moved_while_parked_counts_for_each_platform_its_time_there():
    rows = _rows(("a", "slurm", "parking", "parked", T, None),
                 ("a", "kubernetes", "parked", "parked", T + 60 * M, None),
                 ("a", "kubernetes", "parked", "waking", T + 90 * M, T + 100 * M))
    assert energy.parked_seconds(rows, None, T + 10 * 60 * M) == {"slurm": 3600.0, "kubernetes": 1800.0}
    assert [w.platform for w in energy.wakes(rows)] == ["kubernetes"]  # the move is no wake


def test_a_wake_without_a_deadline_is_never_late_and_one_on_at_its_deadline_is_in_time():
    rows = _rows(("a", "slurm", "parked", "waking", T, None), ("b", "slurm", "parked", "waking", T, T + 10 * M),
                 ("b", "slurm", "waking", "on", T + 10 * M, None))
    a, b = energy.wakes(rows)
    assert not a.late(T + 999 * M) and a.latency_s is None
    assert not b.late(T + 999 * M) and b.latency_s == 600
    # seen before it came on, past the deadline: late
    assert energy.wakes(rows[:2])[1].late(T + 10 * M)


def test_a_platform_without_power_settings_or_unknown_to_the_config_gets_the_default_watts():
    cfg = parse_config({"platforms": [{"name": "k", "kind": "kubernetes", "conn_id": "k8s",
                                       "power": {"means": "redfish", "bmc_address": "https://{name}", "bmc_conn_id": "b",
                                                 "idle_watts": 900}},
                                      {"name": "s", "kind": "simulator"}]})
    assert energy.watts_of(cfg, "k") == (900.0, energy.PARKED_WATTS)
    assert energy.watts_of(cfg, "s") == energy.watts_of(cfg, "gone") == energy.watts_of(None, "k") == (
        energy.IDLE_WATTS, energy.PARKED_WATTS)
    assert energy.saved_kwh(3600, 900, 100) == pytest.approx(0.8)
