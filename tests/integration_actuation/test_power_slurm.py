"""Parking on the real one-node Slurm through its own power saving: the power state machine
sends ``POWER_DOWN_ASAP`` / ``POWER_UP`` with ``scontrol``, Slurm runs the cluster's
SuspendProgram / ResumeProgram (scripts/slurm-cluster.sh: they record each call, and resume
restarts slurmd as a booting node would), and ``sinfo`` shows the node powered down while it
is parked. Each test leaves the node powered up and idle for the other Slurm tests."""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta, timezone

import pytest

from gpupool.actuation.power import machine as pm
from gpupool.actuation.power.base import PARK_REASON
from gpupool.actuation.power.slurm import SlurmPower
from gpupool.actuation.actuators.slurm import SlurmActuator
from gpupool.staging import power as store

from realservices import reset_slurm

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=timezone.utc)


def _node(c) -> dict:
    return json.loads(c.run("sinfo", "--json", "-n", c.node).stdout)["nodes"][0]


def _flags(c) -> set[str]:
    return {str(f).upper() for f in _node(c).get("state_flags") or []}


def _wait(pred, timeout: float = 60.0, step: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step)
    return False


def _calls(c) -> list[str]:
    path = c.dir / "power" / "calls"
    return path.read_text().split("\n")[:-1] if path.exists() else []


def power_up(c) -> None:
    """Bring the node back on whatever a test left it in: jobs cancelled, a power-down let run
    to its end, then POWER_UP, until slurmd answers again."""
    c.cancel_all()
    if not _wait(lambda: not _flags(c) & {"POWER_DOWN", "POWERING_DOWN"}, 60):
        raise TimeoutError(f"node {c.node} still powering down: {sorted(_flags(c))}")
    if "POWERED_DOWN" in _flags(c):
        c.run("scontrol", "update", f"NodeName={c.node}", "State=POWER_UP")
    if not _wait(lambda: not _flags(c) & {"POWERED_DOWN", "POWERING_UP", "NOT_RESPONDING"}, 60):
        raise TimeoutError(f"node {c.node} not back up: {sorted(_flags(c))}")
    reset_slurm(c, resume_unless_idle=True)


@pytest.fixture
def slurm_power(slurm_rig):
    """The rig powered up, idle, with no jobs, before and after the test."""
    power_up(slurm_rig)
    yield slurm_rig
    power_up(slurm_rig)


def _power(c) -> SlurmPower:
    return SlurmPower(SlurmActuator("slurm", slurm_conf=c.slurm_conf))


def _until(engine, act, c, state: str, start: datetime = T0, timeout: float = 60.0) -> None:
    """Advance the state machine (as the fast path's ticks would) until the node is ``state``;
    the passes' clock runs with the wall clock from ``start`` (the park's or wake's time), so a
    Slurm slowed by a busy machine is never taken for one that lost the command."""
    began = time.monotonic()

    def moved() -> bool:
        at = start + timedelta(seconds=1 + time.monotonic() - began)
        pm.advance_all(engine, {"slurm": act}, at, dry_run=False)
        return pm.power_of(engine, c.node) == state

    assert _wait(moved, timeout, 1.0), (store.get_power(engine, c.node), sorted(_flags(c)))


def test_park_powers_the_node_down_through_slurm_and_wake_brings_it_back(slurm_power, sqlite_engine):
    c = slurm_power
    act = _power(c)
    calls = len(_calls(c))
    out = pm.park(sqlite_engine, c.node, "slurm", act, T0, dry_run=False, by="operator")
    assert out["state"] in (pm.PARKING, pm.PARKED)
    [row] = store.audit_rows(sqlite_engine, node=c.node)
    assert (row["action"], row["status"]) == ("power_down_asap", "ok")
    assert row["request"]["argv"][-2:] == ["State=POWER_DOWN_ASAP", f"Reason={PARK_REASON}"]
    _until(sqlite_engine, act, c, pm.PARKED)
    assert "POWERED_DOWN" in _flags(c) and _node(c)["reason"] == PARK_REASON
    assert c.node_state().endswith("~")  # Slurm itself knows the node is powered down
    assert _calls(c)[calls:] == [f"suspend {c.node}"]  # Slurm ran its SuspendProgram

    out = pm.wake(sqlite_engine, c.node, act, T0 + timedelta(hours=1), dry_run=False, by="operator")
    assert out["state"] in (pm.WAKING, pm.ON)
    _until(sqlite_engine, act, c, pm.ON, start=T0 + timedelta(hours=1))
    assert _calls(c)[calls:] == [f"suspend {c.node}", f"resume {c.node}"]
    assert [(a["action"], a["status"]) for a in store.audit_rows(sqlite_engine, node=c.node)] == [
        ("power_down_asap", "ok"), ("power_up", "ok")]
    assert [(t["from_state"], t["to_state"]) for t in store.transitions(sqlite_engine, c.node)] == [
        ("on", "parking"), ("parking", "parked"), ("parked", "waking"), ("waking", "on")]
    job = c.sbatch(1, 30)  # a woken node runs work again
    c.wait_job_state(job, "RUNNING", timeout=30)


def test_a_busy_node_parks_after_its_job_and_a_wake_meanwhile_follows(slurm_power, sqlite_engine):
    c = slurm_power
    act = _power(c)
    job = c.sbatch(1, 6)
    c.wait_job_state(job, "RUNNING")
    out = pm.park(sqlite_engine, c.node, "slurm", act, T0, dry_run=False)
    assert out["state"] == pm.PARKING and "1 unit(s) of work" in out["error"]
    assert {"DRAIN", "POWER_DOWN"} <= _flags(c)  # Slurm drains it and lets the job finish
    out = pm.wake(sqlite_engine, c.node, act, T0 + timedelta(minutes=1), dry_run=False)
    assert out["action"] == "wake after park"  # Slurm cannot take a POWER_DOWN_ASAP back
    _until(sqlite_engine, act, c, pm.ON, start=T0 + timedelta(minutes=1), timeout=90)
    assert [t["to_state"] for t in store.transitions(sqlite_engine, c.node)] == ["parking", "parked", "waking", "on"]
    assert next(j for j in c.jobs() if j["job_id"] == job)["job_state"] == "COMPLETED"


def test_a_node_someone_else_drained_is_not_parked(slurm_power, sqlite_engine):
    c = slurm_power
    act = _power(c)
    c.drain("ops: GPU 1 Xid 48, ticket 99")
    out = pm.park(sqlite_engine, c.node, "slurm", act, T0, dry_run=False)
    assert out["state"] == pm.ON and "park given up" in out["error"] and "ticket 99" in out["error"]
    assert store.audit_rows(sqlite_engine, node=c.node) == []
    assert "DRAIN" in _flags(c) and not _flags(c) & {"POWER_DOWN", "POWERING_DOWN", "POWERED_DOWN"}


def test_a_dry_run_park_sends_nothing(slurm_power, sqlite_engine):
    c = slurm_power
    calls = len(_calls(c))
    out = pm.park(sqlite_engine, c.node, "slurm", _power(c), T0, dry_run=True)
    assert out["dry_run"] and out["would_send"][0]["action"] == "power_down_asap"
    assert [a["status"] for a in store.audit_rows(sqlite_engine, node=c.node)] == ["dry_run"]
    time.sleep(2)
    assert not _flags(c) & {"POWER_DOWN", "POWERING_DOWN", "POWERED_DOWN"} and len(_calls(c)) == calls
