"""The Slurm source's node state against a real one-node Slurm cluster with fake GPUs."""

from __future__ import annotations

import shutil
from datetime import datetime, timedelta, timezone

import pytest

from gpupool.sources.base import INVENTORY_KEYS, RetryPolicy, SourceError
from gpupool.sources.slurm import SlurmSource

FAST_RETRY = RetryPolicy(attempts=2, base_delay=0.01, max_delay=0.02)


def _now():
    return datetime.now(timezone.utc)


def _source(cluster, **kw):
    kw.setdefault("retry", FAST_RETRY)
    return SlurmSource("slurm-hpc", slurm_conf=cluster.slurm_conf, **kw)


def _only(records):
    assert len(records) == 1, records
    return records[0]


def test_idle_node_with_fake_gpus(idle_slurm):
    rec = _only(_source(idle_slurm).inventory(_now()))
    assert tuple(rec) == INVENTORY_KEYS
    assert rec == {
        "node": idle_slurm.node, "platform": "slurm-hpc", "gpus": 4, "gpu_model": "tesla", "mig_layout": None,
        "schedulable": True, "drain_reason": None, "busy_gpus": 0,
    }


def test_gpu_jobs_show_as_busy_gpus_and_pending_work(idle_slurm):
    src = _source(idle_slurm)
    running = idle_slurm.sbatch(3)
    idle_slurm.wait_job_state(running, "RUNNING")
    waiting = idle_slurm.sbatch(2)
    assert _only(src.inventory(_now()))["busy_gpus"] == 3
    jobs = {j["job_id"]: j for j in idle_slurm.jobs()}
    assert jobs[waiting]["job_state"] == "PENDING"
    snap = src.snapshot(_now())
    by_metric = {(r.metric, r.entity_id): r.value for r in snap.itertuples()}
    assert by_metric[("gpu_capacity", idle_slurm.node)] == 4
    assert by_metric[("gpu_allocated", idle_slurm.node)] == 3
    assert by_metric[("gpu_pending", "gpu")] == 2
    idle_slurm.cancel_all()
    assert _only(src.inventory(_now()))["busy_gpus"] == 0


def test_drain_and_resume(idle_slurm):
    src = _source(idle_slurm)
    idle_slurm.drain("gpupool: handover to openstack")
    rec = _only(src.inventory(_now()))
    assert rec["schedulable"] is False and rec["drain_reason"] == "gpupool: handover to openstack"
    idle_slurm.resume()
    rec = _only(src.inventory(_now()))
    assert rec["schedulable"] is True and rec["drain_reason"] is None


def test_not_responding_node_is_not_schedulable(idle_slurm):
    """Right after RESUME slurmctld marks the node NOT_RESPONDING until slurmd answers a ping."""
    src = _source(idle_slurm)
    idle_slurm.drain("x")
    idle_slurm.run("scontrol", "update", f"NodeName={idle_slurm.node}", "State=RESUME")
    rec = _only(src.inventory(_now()))
    # read after the inventory: a node still NOT_RESPONDING now was so when the source read it
    if "*" not in idle_slurm.node_state():
        pytest.skip("slurmd answered the ping before the source read the node: nothing to check this time")
    assert rec["schedulable"] is False and rec["drain_reason"] == "not responding"


def test_draining_node_with_a_job_keeps_its_busy_gpus(idle_slurm):
    src = _source(idle_slurm)
    job = idle_slurm.sbatch(1)
    idle_slurm.wait_job_state(job, "RUNNING")
    idle_slurm.drain("maintenance by another tool")
    rec = _only(src.inventory(_now()))
    assert (rec["schedulable"], rec["drain_reason"], rec["busy_gpus"]) == (False, "maintenance by another tool", 1)


def test_state_of_the_past_cannot_be_recovered(slurm_cluster):
    at = _now() - timedelta(days=2)
    with pytest.raises(SourceError, match="live only and cannot be recovered") as err:
        _source(slurm_cluster).inventory(at)
    assert err.value.window == at.strftime("%Y-%m-%dT%H:%M:%SZ")
    # A simulated clock (or an operator who knows better) can switch the check off.
    assert _source(slurm_cluster, live_tolerance=None).inventory(at)


def test_unreachable_controller_is_a_retryable_error(slurm_cluster, tmp_path):
    conf = (slurm_cluster.dir / "slurm.conf").read_text()
    port = slurm_cluster.ctld_port
    # Nothing listens on port 9; a short MessageTimeout keeps Slurm's own retries brief.
    conf = conf.replace(f"SlurmctldPort={port}", "SlurmctldPort=9") + "MessageTimeout=1\n"
    (tmp_path / "slurm.conf").write_text(conf)
    shutil.copy(slurm_cluster.dir / "gres.conf", tmp_path / "gres.conf")
    src = SlurmSource("slurm-hpc", slurm_conf=str(tmp_path / "slurm.conf"), retry=FAST_RETRY, timeout=20)
    # sinfo exits 0 and reports the failure inside its JSON: that must not read as "no nodes".
    with pytest.raises(SourceError) as err:
        src.inventory(_now())
    assert err.value.retryable and "Slurm reported errors" in str(err.value)
    assert "sinfo --json" in err.value.endpoint
    with pytest.raises(SourceError, match="Slurm reported errors"):
        src.snapshot(_now())


def test_missing_sinfo_is_a_clear_error(slurm_cluster):
    with pytest.raises(SourceError, match="not found") as err:
        _source(slurm_cluster, sinfo="/nonexistent/sinfo").inventory(_now())
    assert not err.value.retryable
