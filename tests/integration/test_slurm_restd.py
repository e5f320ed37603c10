"""The Slurm source's node state through the live slurmrestd, beside the `sinfo` path, on one cluster.

scripts/slurm-cluster.sh starts Debian's slurmrestd (openapi/v0.0.38, rest_auth/local on a unix
socket, as the `slurm` user) with the cluster; every answer read through it is compared with what
`sinfo --json`/`squeue --json` say at the same moment, and the live answers with the recordings
the facade's contract test uses (tests/fixtures/recorded/slurmrestd_*.json).
"""

from __future__ import annotations

import json
import subprocess
from datetime import datetime, timezone

import pytest

from gpupool.config import PlatformConfig
from gpupool.sources.base import RetryPolicy, SourceError
from gpupool.sources.factory import parse_connection, source_for
from gpupool.sources.slurm import SlurmSource
from gpupool.sources.slurmrestd import SlurmRestd
from tests.contract.conftest import recorded
from tests.contract.shapes import shape_diff

FAST_RETRY = RetryPolicy(attempts=2, base_delay=0.01, max_delay=0.02)
JOB_NULLABLE = tuple(f"$.jobs[].{k}" for k in ("memory_per_node", "cpus_per_task", "time_limit", "nice"))
JOB_MAPS = ("$.jobs[].job_resources.allocated_nodes[].sockets",
            "$.jobs[].job_resources.allocated_nodes[].sockets.*.cores")
NODE_NULLABLE = tuple(f"$.nodes[].{k}" for k in ("owner", "reason_set_by_user", "tres_used"))
#: the /slurm/ paths and methods Slurm 22.05.8's openapi/v0.0.38 lists in /openapi/v3 (docs/operations/services.md quotes them)
SERVED_V0_0_38 = {f"/slurm/v0.0.38/{rel}": ops for rel, ops in {
    "diag": ["get"], "job/submit": ["post"], "job/{job_id}": ["delete", "get", "post"], "jobs": ["get"],
    "licenses": ["get"], "node/{node_name}": ["get"], "nodes": ["get"], "partition/{partition_name}": ["get"],
    "partitions": ["get"], "ping": ["get"], "reservation/{reservation_name}": ["get"], "reservations": ["get"],
}.items()}


def _now():
    return datetime.now(timezone.utc)


def _both(cluster):
    """(through slurmrestd, through sinfo/squeue) sources of the same cluster."""
    return (SlurmSource("slurm-hpc", restd_url=cluster.restd_url, retry=FAST_RETRY),
            SlurmSource("slurm-hpc", slurm_conf=cluster.slurm_conf, retry=FAST_RETRY))


def _rows(frame):
    return sorted((r.entity_kind, r.entity_id, r.metric, r.value) for r in frame.itertuples())


def test_restd_serves_openapi_v0_0_38_of_this_slurm(slurm_cluster):
    restd = SlurmRestd(slurm_cluster.restd_url)
    ping = restd.get("ping")
    assert ping["pings"][0]["ping"] == "UP" and ping["pings"][0]["hostname"] == slurm_cluster.node
    assert ping["meta"]["plugin"]["type"] == "openapi/v0.0.38"
    version = subprocess.run(["slurmctld", "-V"], capture_output=True, text=True, check=True).stdout.split()[1]
    assert ping["meta"]["Slurm"]["release"] == version
    status, text = restd.send("GET", "/openapi/v3")
    assert status == 200
    served = {path: sorted(ops) for path, ops in json.loads(text)["paths"].items() if path.startswith("/slurm/")}
    # Everything the plugin serves: no node update, so drain/resume stay with scontrol (see
    # actuators/slurm.py). The only writes are jobs'; POST /slurm/v0.0.39/node/{node_name} came with 23.02.
    assert served == SERVED_V0_0_38
    status, text = restd.send("POST", restd.path(f"node/{slurm_cluster.node}"))
    assert status == 405 and "method is not defined" in text
    # local auth is for the unix socket only; nothing listens on TCP
    assert slurm_cluster.restd_url.startswith("unix:/")


def test_idle_node_reads_the_same_through_restd_and_sinfo(idle_slurm):
    restd, sinfo = _both(idle_slurm)
    now = _now()
    rec = restd.inventory(now)
    assert rec == sinfo.inventory(now)
    assert rec[0]["node"] == idle_slurm.node and rec[0]["gpus"] == 4 and rec[0]["schedulable"]


def test_running_and_pending_gpu_jobs_through_restd(idle_slurm):
    restd, sinfo = _both(idle_slurm)
    running = idle_slurm.sbatch(3)
    idle_slurm.wait_job_state(running, "RUNNING")
    waiting = idle_slurm.sbatch(2)
    idle_slurm.wait_job_state(waiting, "PENDING")
    now = _now()
    assert restd.inventory(now)[0]["busy_gpus"] == 3
    assert restd.inventory(now) == sinfo.inventory(now)
    snap = _rows(restd.snapshot(now))
    assert snap == _rows(sinfo.snapshot(now))
    assert ("partition", "gpu", "gpu_pending", 2.0) in snap and ("node", idle_slurm.node, "gpu_allocated", 3.0) in snap


def test_drain_by_scontrol_is_what_restd_reports(idle_slurm):
    restd, sinfo = _both(idle_slurm)
    idle_slurm.drain("gpupool: handover to openstack")
    now = _now()
    rec = restd.inventory(now)[0]
    assert (rec["schedulable"], rec["drain_reason"]) == (False, "gpupool: handover to openstack")
    assert rec == sinfo.inventory(now)[0]
    idle_slurm.resume()
    now = _now()
    rec = restd.inventory(now)[0]
    assert rec["schedulable"] and rec["drain_reason"] is None
    assert rec == sinfo.inventory(now)[0]


def test_restd_url_in_the_connection_extra_reads_through_restd(idle_slurm):
    pcfg = PlatformConfig(name="slurm-hpc", kind="slurm", conn_id="slurm_hpc")
    conn = parse_connection("slurm_hpc", json.dumps(
        {"conn_type": "http", "host": "127.0.0.1", "port": 9, "extra": {"restd_url": idle_slurm.restd_url}}))
    src = source_for(pcfg, conn)
    assert src._node_endpoint().startswith(idle_slurm.restd_url + "/slurm/v0.0.38/nodes")
    assert src.inventory(_now()) == _both(idle_slurm)[1].inventory(_now())


def test_live_answers_keep_the_recorded_shapes(idle_slurm):
    """The recordings the facade is held to are still what this slurmrestd answers."""
    restd = SlurmRestd(idle_slurm.restd_url)
    job = idle_slurm.sbatch(1)
    idle_slurm.wait_job_state(job, "RUNNING")
    idle_slurm.drain("gpupool: shape check")
    for name, rel, kw in (("slurmrestd_nodes", "nodes", {"nullable": NODE_NULLABLE}),
                          ("slurmrestd_node", f"node/{idle_slurm.node}", {"nullable": NODE_NULLABLE}),
                          ("slurmrestd_jobs", "jobs", {"open_maps": JOB_MAPS, "nullable": JOB_NULLABLE}),
                          ("slurmrestd_job", f"job/{job}", {"open_maps": JOB_MAPS, "nullable": JOB_NULLABLE}),
                          ("slurmrestd_ping", "ping", {}),
                          ("slurmrestd_node_unknown", "node/no-such-node", {}),
                          ("slurmrestd_job_unknown", "job/999999", {})):
        status, text = restd.send("GET", restd.path(rel))
        real, live = recorded(name), json.loads(text)
        if name == "slurmrestd_jobs":  # jobs earlier tests cancelled linger (MinJobAge): compare the running
            live["jobs"] = [j for j in live["jobs"] if j["job_state"] == "RUNNING"]
            assert live["jobs"] and real["body"]["jobs"][0]["job_state"] == "RUNNING"
        assert status == real["status"], name
        assert not shape_diff(real["body"], live, **kw), name
    status, text = restd.send("GET", "/slurm/v0.0.38/no-such-path")
    real = recorded("slurmrestd_unknown_path")
    assert (status, text) == (real["status"], real["body"])


def test_no_restd_on_the_socket_is_a_retryable_error(slurm_cluster, tmp_path):
    src = SlurmSource("slurm-hpc", restd_url=f"unix:{tmp_path}/absent.sock", retry=FAST_RETRY)
    with pytest.raises(SourceError, match="no slurmrestd listening") as err:
        src.inventory(_now())
    assert err.value.retryable and err.value.endpoint == f"unix:{tmp_path}/absent.sock/slurm/v0.0.38/nodes"


def test_start_is_idempotent_and_brings_back_a_stopped_restd(slurm_cluster):
    """A second start on a running cluster only checks it, and restarts slurmrestd if it is gone."""
    import os
    import signal
    import time

    from realservices import run_script

    out = run_script("slurm-cluster.sh", "start", slurm_cluster.dir)
    assert "already running" in out
    pid = int((slurm_cluster.dir / "slurmrestd.pid").read_text())
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    src = SlurmSource("slurm-hpc", restd_url=slurm_cluster.restd_url, retry=FAST_RETRY)
    with pytest.raises(SourceError, match="no slurmrestd listening"):
        src.inventory(_now())
    out = run_script("slurm-cluster.sh", "start", slurm_cluster.dir)
    assert "already running" in out and "slurmrestd on unix:" in out
    assert int((slurm_cluster.dir / "slurmrestd.pid").read_text()) != pid
    assert src.inventory(_now())[0]["node"] == slurm_cluster.node
