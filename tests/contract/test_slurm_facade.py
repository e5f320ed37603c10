"""The simulated slurmrestd and the scontrol shim, against the project's Slurm source and real sinfo output."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime, timezone

import requests

from tests.contract.conftest import recorded
from tests.contract.shapes import shape_diff


def scontrol(sim, *args):
    env = dict(os.environ, GPUPOOL_SIM_SLURMRESTD_URL=sim.urls["slurm"])
    return subprocess.run([sys.executable, "-m", "gpupool.sim.facades.scontrol", *args], env=env,
                          capture_output=True, text=True, timeout=60)


def test_nodes_shape_matches_real_slurm_and_source_reads_them(sim):
    from gpupool.sources.slurm import SlurmSource

    body = requests.get(sim.urls["slurm"] + "/slurm/v0.0.38/nodes", timeout=30).json()
    real = recorded("slurm_sinfo_json")["body"]
    diff = shape_diff(real["nodes"][0], body["nodes"][0],
                      nullable=tuple(f"$.{k}" for k in ("owner", "reason_set_by_user", "tres_used")))
    assert not diff
    assert set(real) <= set(body) | {"warnings"}
    src = SlurmSource("slurm", restd_url=sim.urls["slurm"], live_tolerance=None)
    inv = src.inventory(datetime(2024, 1, 2, tzinfo=timezone.utc))
    world = {n["name"]: n for n in sim.state.nodes("slurm")}
    assert {r["node"] for r in inv} == set(world)
    assert all(r["busy_gpus"] == world[r["node"]]["busy_gpus"] and r["gpus"] == 8 for r in inv)


def test_scontrol_drain_and_resume(sim):
    out = scontrol(sim, "update", "NodeName=gpu-n002", "State=DRAIN", "Reason=gpupool: to kubernetes")
    assert out.returncode == 0, out.stderr
    node = sim.state.node("slurm", "gpu-n002")
    assert node["cordoned"] and node["drain_reason"] == "gpupool: to kubernetes"
    show = scontrol(sim, "show", "node", "gpu-n002")
    assert "State=" in show.stdout and "+DRAIN" in show.stdout and "Reason=gpupool: to kubernetes" in show.stdout
    js = scontrol(sim, "show", "node", "--json")
    assert js.returncode == 0 and '"nodes"' in js.stdout
    bad = scontrol(sim, "update", "NodeName=gpu-n002", "State=DRAIN")
    assert bad.returncode == 1 and "must specify a reason" in bad.stderr
    missing = scontrol(sim, "update", "NodeName=nope", "State=RESUME")
    assert missing.returncode == 1 and "Invalid node name" in missing.stderr
    assert scontrol(sim, "update", "NodeName=gpu-n002", "State=RESUME").returncode == 0
    assert not sim.state.node("slurm", "gpu-n002")["cordoned"]


def test_jobs_running_pending_and_cancel(sim):
    base = sim.urls["slurm"] + "/slurm/v0.0.38"
    jobs = requests.get(base + "/jobs", timeout=30).json()["jobs"]
    running = [j for j in jobs if j["job_state"] == "RUNNING"]
    assert len(running) == sum(n["busy_gpus"] for n in sim.state.nodes("slurm"))
    victim = running[0]
    assert requests.delete(f"{base}/job/{victim['job_id']}", timeout=30).status_code == 200
    assert victim["job_id"] not in {j["job_id"] for j in requests.get(base + "/jobs", timeout=30).json()["jobs"]}
    resp = requests.get(f"{base}/job/1", timeout=30)
    assert resp.status_code == 404 and resp.json()["errors"][0]["error_number"]
    resp = requests.get(f"{base}/node/nope", timeout=30)
    assert resp.status_code == 404 and resp.json()["errors"]
