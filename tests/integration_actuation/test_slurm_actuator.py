"""The Slurm actuator against the real one-node Slurm: drain waits for the running GPU job,
resume only a gpupool drain, and a whole handover through the state machine."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import pytest

from gpupool.allocate import handover as ho
from gpupool.allocate.actuators.base import ForeignHoldError
from gpupool.allocate.actuators.slurm import SlurmActuator
from memplatform import Datacenter, MemActuator

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=timezone.utc)


def _wait(pred, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.2)
    return False


def test_drain_waits_for_running_gpu_job_then_resume(slurm_idle):
    c = slurm_idle
    act = SlurmActuator("slurm", slurm_conf=c.slurm_conf)
    job = c.sbatch(1, 4)
    c.wait_job_state(job, "RUNNING")
    assert act.owner_state(c.node).schedulable and act.owner_state(c.node).busy == 1

    act.release(c.node, "gpupool: moving to kubernetes")
    st = act.owner_state(c.node)
    assert st.held_by_gpupool and st.hold_reason == "gpupool: moving to kubernetes"
    assert st.busy == 1 and not act.is_released(c.node)  # the job keeps running: drain waits
    queued = c.sbatch(1, 60)  # new work does not land on a draining node
    time.sleep(0.5)
    assert next(j["job_state"] for j in c.jobs() if j["job_id"] == queued) == "PENDING"
    c.run("scancel", str(queued))
    assert _wait(lambda: act.is_released(c.node)), act.owner_state(c.node)  # the 4 s job ended by itself

    act.attach(c.node)
    st = act.owner_state(c.node)
    assert st.schedulable and st.hold_reason is None
    assert c.run("sinfo", "-h", "-n", c.node, "-o", "%T").stdout.strip().rstrip("*") == "idle"


def test_never_resumes_a_node_someone_else_drained(slurm_idle):
    c = slurm_idle
    act = SlurmActuator("slurm", slurm_conf=c.slurm_conf)
    c.drain("GPU 2 Xid 79, ticket 4711")
    st = act.owner_state(c.node)
    assert st.foreign_hold and not st.held_by_gpupool
    with pytest.raises(ForeignHoldError, match="ticket 4711"):
        act.attach(c.node)
    assert "DRAIN" in act.owner_state(c.node).detail["flags"]


def test_handover_out_of_slurm_and_rollback_by_reverse_handover(slurm_idle, sqlite_engine):
    c = slurm_idle
    slurm = SlurmActuator("slurm", slurm_conf=c.slurm_conf)
    dc = Datacenter(("kubernetes",), {c.node: "slurm"})  # the other side, in memory
    acts = {"slurm": slurm, "kubernetes": MemActuator(dc, "kubernetes")}
    job = c.sbatch(1, 300)
    c.wait_job_state(job, "RUNNING")

    hid = ho.open_handover(sqlite_engine, c.node, "slurm", "kubernetes", T0, dry_run=False)
    ho.advance_all(sqlite_engine, acts, T0, dry_run=False)
    h = ho.get_handover(sqlite_engine, hid)
    assert h.state == ho.RELEASING and "1 unit(s) of work" in h.error
    assert dc.open_on(c.node) == []
    rows = ho.audit_rows(sqlite_engine, hid)
    assert [(r["action"], r["status"]) for r in rows] == [("drain", "ok")]
    assert rows[0]["request"]["argv"][-1] == "Reason=gpupool: moving to kubernetes"

    c.run("scancel", str(job))
    assert _wait(lambda: slurm.is_released(c.node))
    ho.advance_all(sqlite_engine, acts, T0 + timedelta(minutes=5), dry_run=False)
    assert ho.get_handover(sqlite_engine, hid).state == ho.DONE
    assert dc.open_on(c.node) == ["kubernetes"] and not slurm.owner_state(c.node).schedulable

    out = ho.rollback(sqlite_engine, hid, acts, at=T0 + timedelta(minutes=10))
    rev = ho.get_handover(sqlite_engine, out["reverse_id"])
    assert rev.state == ho.DONE, rev
    assert slurm.owner_state(c.node).schedulable and dc.open_on(c.node) == []
    assert [r["action"] for r in ho.audit_rows(sqlite_engine, rev.id)] == ["drain", "resume"]
