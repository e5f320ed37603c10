"""The Slurm actuator against the real one-node Slurm: drain waits for the running GPU job,
resume only a gpupool drain, and a whole handover through the state machine."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import pytest

from gpupool.actuation import handover as ho
from gpupool.actuation.actuators.base import ActuationError, ForeignHoldError
from gpupool.actuation.actuators.slurm import SlurmActuator
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


def _same_view(a, b, node):
    """Owner state through slurmrestd and through sinfo/squeue, read back to back: equal, detail included."""
    sa, sb = a.owner_state(node), b.owner_state(node)
    assert sa == sb, (sa, sb)
    return sa


def test_drain_and_resume_read_through_slurmrestd(slurm_idle):
    """Drain/resume are sent with scontrol (22.05's slurmrestd has no node update); every read the
    handover relies on (held, reason, busy jobs, released) comes from slurmrestd and agrees with sinfo."""
    c = slurm_idle
    via_restd = SlurmActuator("slurm", slurm_conf=c.slurm_conf, restd_url=c.restd_url)
    via_cli = SlurmActuator("slurm", slurm_conf=c.slurm_conf)
    job = c.sbatch(1, 300)
    c.wait_job_state(job, "RUNNING")
    st = _same_view(via_restd, via_cli, c.node)
    assert st.schedulable and st.busy == 1 and st.detail["jobs"] == [job]

    via_restd.release(c.node, "gpupool: moving to kubernetes")
    st = _same_view(via_restd, via_cli, c.node)
    assert st.held_by_gpupool and st.busy == 1 and not via_restd.is_released(c.node)
    assert "DRAIN" in st.detail["flags"] and st.detail["state"] == "mixed"
    c.run("scancel", str(job))
    assert _wait(lambda: via_restd.is_released(c.node)), via_restd.owner_state(c.node)
    assert via_cli.is_released(c.node)

    via_restd.attach(c.node)
    assert _wait(lambda: "NOT_RESPONDING" not in via_restd.owner_state(c.node).detail["flags"])
    st = _same_view(via_restd, via_cli, c.node)
    assert st.schedulable and st.hold_reason is None and st.busy == 0


def test_restd_reads_refuse_a_foreign_drain(slurm_idle):
    c = slurm_idle
    act = SlurmActuator("slurm", slurm_conf=c.slurm_conf, restd_url=c.restd_url)
    c.drain("GPU 2 Xid 79, ticket 4711")
    with pytest.raises(ForeignHoldError, match="ticket 4711"):
        act.attach(c.node)
    assert act.owner_state("no-such-node").present is False


def test_connection_extra_restd_url_reaches_the_actuator(slurm_idle, monkeypatch):
    import json

    from gpupool.config import GpupoolConfig
    from gpupool.platforms import build_actuator

    c = slurm_idle
    cfg = GpupoolConfig.model_validate({"platforms": [{"name": "slurm", "kind": "slurm", "conn_id": "slurm_hpc"}]})
    monkeypatch.setenv("AIRFLOW_CONN_SLURM_HPC", json.dumps(
        {"conn_type": "http", "host": "127.0.0.1", "extra": {"slurm_conf": c.slurm_conf, "restd_url": c.restd_url}}))
    act = build_actuator(cfg.platforms[0], cfg)
    assert isinstance(act, SlurmActuator) and act.restd is not None and act.restd.url == c.restd_url
    assert act.owner_state(c.node).schedulable


def _job(c, job_id):
    return next((j for j in c.jobs() if j["job_id"] == job_id), None)


def test_requeue_puts_the_running_job_back_in_the_queue_and_empties_the_node(slurm_idle):
    """Evict = `scontrol requeue`: the job is PENDING again under its own id (its place in the
    queue), the drained node empties and does not get it back, and sending again changes nothing."""
    c = slurm_idle
    act = SlurmActuator("slurm", slurm_conf=c.slurm_conf)
    assert act.can_evict and act.evict_commands(c.node) == [] and act.work_started(c.node) == []
    job = c.sbatch(1, 300)
    c.wait_job_state(job, "RUNNING")
    started = act.work_started(c.node)
    assert started == [datetime.fromtimestamp(_job(c, job)["start_time"], tz=timezone.utc)]
    assert started[0].tzinfo is not None and abs(time.time() - started[0].timestamp()) < 60

    act.release(c.node, "gpupool: reclaimed by kubernetes")
    cmds = act.evict_commands(c.node)
    assert [(cmd.action, cmd.request["argv"]) for cmd in cmds] == [("requeue", ["scontrol", "requeue", str(job)])]
    assert act.send(cmds[0]) == {"job_id": job, "requeued": True, "stdout": ""}
    assert _wait(lambda: act.is_released(c.node)), act.owner_state(c.node)
    assert _job(c, job)["job_state"] == "PENDING" and _job(c, job)["restart_cnt"] == 1
    assert act.work_started(c.node) == [] and act.evict_commands(c.node) == []

    again = act.send(cmds[0])  # an audited command sent twice (a run that died after sending)
    assert again["requeued"] is False and "pending" in again["detail"].lower()
    time.sleep(1.5)  # the drain keeps the requeued job off the node
    assert _job(c, job)["job_state"] == "PENDING" and act.is_released(c.node)


def test_requeue_refused_for_a_job_that_may_not_be_requeued(slurm_idle):
    """A job submitted with --no-requeue stays running; the refusal names the job (the reclaim waits)."""
    c = slurm_idle
    act = SlurmActuator("slurm", slurm_conf=c.slurm_conf, restd_url=c.restd_url)
    job = c.sbatch(1, 300, "--no-requeue")
    c.wait_job_state(job, "RUNNING")
    act.release(c.node, "gpupool: reclaimed by kubernetes")
    (cmd,) = act.evict_commands(c.node)
    with pytest.raises(ActuationError, match=rf"requeue of node .*job {job} was not requeued: .*disabled"):
        act.send(cmd)
    assert _job(c, job)["job_state"] == "RUNNING" and not act.is_released(c.node)
    c.run("scancel", str(job))  # emptied before the fixture resumes the node (else it reads "mixed")
    assert _wait(lambda: act.is_released(c.node)), act.owner_state(c.node)


def test_work_started_agrees_through_slurmrestd_and_pool_names(slurm_idle):
    from gpupool.actuation.actuators.base import NamedActuator

    c = slurm_idle
    via_restd = SlurmActuator("slurm", slurm_conf=c.slurm_conf, restd_url=c.restd_url)
    via_cli = SlurmActuator("slurm", slurm_conf=c.slurm_conf)
    first = c.sbatch(1, 300)
    c.wait_job_state(first, "RUNNING")
    time.sleep(1.1)
    second = c.sbatch(1, 300)
    c.wait_job_state(second, "RUNNING")
    want = sorted(datetime.fromtimestamp(_job(c, j)["start_time"], tz=timezone.utc) for j in (first, second))
    assert sorted(via_restd.work_started(c.node)) == sorted(via_cli.work_started(c.node)) == want
    named = NamedActuator(via_restd, {"gpu-pool-01": c.node})
    assert sorted(named.work_started("gpu-pool-01")) == want
    c.cancel_all()  # an open node left busy would read "mixed" to the fixture's reset, which resumes it
    assert _wait(lambda: c.node_state().rstrip("*") == "idle"), c.node_state()


def test_reclaim_handover_requeues_when_eviction_is_allowed(slurm_idle, sqlite_engine):
    c = slurm_idle
    slurm = SlurmActuator("slurm", slurm_conf=c.slurm_conf)
    dc = Datacenter(("kubernetes",), {c.node: "slurm"})
    acts = {"slurm": slurm, "kubernetes": MemActuator(dc, "kubernetes")}
    job = c.sbatch(1, 300)
    c.wait_job_state(job, "RUNNING")
    hid = ho.open_handover(sqlite_engine, c.node, "slurm", "kubernetes", T0, dry_run=False)
    ho.advance_all(sqlite_engine, acts, T0, dry_run=False, allow_evict=True)
    assert _wait(lambda: slurm.is_released(c.node))
    ho.advance_all(sqlite_engine, acts, T0 + timedelta(minutes=1), dry_run=False, allow_evict=True)
    assert ho.get_handover(sqlite_engine, hid).state == ho.DONE
    assert [(r["action"], r["status"]) for r in ho.audit_rows(sqlite_engine, hid)][:2] == [("drain", "ok"),
                                                                                          ("requeue", "ok")]
    assert _job(c, job)["job_state"] == "PENDING"
