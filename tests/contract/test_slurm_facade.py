"""The simulated slurmrestd and the scontrol shim, against the project's Slurm source and real sinfo output."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from datetime import datetime, timezone

import requests

from tests.contract.conftest import recorded
from tests.contract.shapes import shape_diff


def scontrol(sim, *args):
    env = dict(os.environ, GPUPOOL_SIM_SLURMRESTD_URL=sim.urls["slurm"])
    return subprocess.run([sys.executable, "-m", "gpupool.emulator.scontrol", *args], env=env,
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
    assert resp.status_code == 500 and resp.json()["errors"][0]["error_number"] and resp.json()["jobs"] == []
    resp = requests.get(f"{base}/node/nope", timeout=30)
    assert resp.status_code == 500 and resp.json()["errors"] and resp.json()["nodes"] == []


# --- the facade against Debian's slurmrestd 22.05 (openapi/v0.0.38), recorded by record_real.py -----

#: fields whose null-ness depends on how a job was submitted (--mem, --time, --nice, -c) or on
#: whether a node was ever drained or busy: either side may be null there
JOB_NULLABLE = tuple(f"$.jobs[].{k}" for k in ("memory_per_node", "cpus_per_task", "time_limit", "nice"))
NODE_NULLABLE = tuple(f"$.nodes[].{k}" for k in ("owner", "reason_set_by_user", "tres_used"))
#: socket and core numbers are keys of these maps
JOB_MAPS = ("$.jobs[].job_resources.allocated_nodes[].sockets",
            "$.jobs[].job_resources.allocated_nodes[].sockets.*.cores")


def _get(sim, rel, method="GET"):
    return requests.request(method, sim.urls["slurm"] + "/slurm/v0.0.38/" + rel, timeout=30)


def _route_set(routes):
    """{(path with its parameters as {}, METHOD)} of Starlette routes or OpenAPI paths."""
    import re

    norm = lambda p: re.sub(r"\{[^}]+\}", "{}", p)  # noqa: E731
    if isinstance(routes, dict):
        return {(norm(p), m.upper()) for p, ms in routes.items() for m in ms}
    return {(norm(r.path), m) for r in routes for m in r.methods if m != "HEAD"}


def test_facade_serves_only_what_the_real_v0_0_38_serves(state):
    """Every v0.0.38 route of the facade exists in the real slurmrestd's /openapi/v3 with that method;
    the node update it offers is v0.0.39's, which Slurm 22.05 does not serve at all."""
    from gpupool.emulator.slurm import make_app

    real = _route_set(recorded("slurmrestd_openapi_paths")["body"]["paths"])
    fake = _route_set(make_app(state).routes)
    assert {r for r in fake if "/v0.0.38/" in r[0]} <= real
    assert ("/slurm/v0.0.38/node/{}", "POST") not in real
    assert not {r for r in real if "/v0.0.39/" in r[0]}
    assert ("/slurm/v0.0.39/node/{}", "POST") in fake


def test_node_and_job_shapes_match_recorded_slurmrestd(sim):
    from gpupool.emulator.slurm import job_object
    from gpupool.emulator.state import Work

    for name, rel in (("slurmrestd_nodes", "nodes"), ("slurmrestd_node", "node/gpu-n001")):
        real = recorded(name)
        resp = _get(sim, rel)
        assert resp.status_code == real["status"] == 200
        assert not shape_diff(real["body"], resp.json(), nullable=NODE_NULLABLE), name
    real_jobs = recorded("slurmrestd_jobs")
    resp = _get(sim, "jobs")
    assert resp.status_code == real_jobs["status"] == 200
    body = resp.json()
    assert body["jobs"] and not shape_diff(real_jobs["body"], body, open_maps=JOB_MAPS, nullable=JOB_NULLABLE)
    running = next(j for j in body["jobs"] if j["job_state"] == "RUNNING")
    real = recorded("slurmrestd_job")
    assert real["body"]["jobs"][0]["job_state"] == "RUNNING"
    resp = _get(sim, f"job/{running['job_id']}")
    assert resp.status_code == real["status"] == 200
    assert not shape_diff(real["body"], resp.json(), open_maps=JOB_MAPS, nullable=JOB_NULLABLE)
    # a pending job as the facade writes it (this world has no unmet demand at its clock)
    real = recorded("slurmrestd_job_pending")["body"]["jobs"][0]
    assert real["job_state"] == "PENDING"
    with sim.state.lock:
        fake = job_object(sim.state, Work(999, "slurm", None, 1, sim.state.now, "Pending"))
    assert fake["job_state"] == "PENDING"
    assert not shape_diff({"jobs": [real]}, {"jobs": [fake]}, open_maps=JOB_MAPS, nullable=JOB_NULLABLE)
    real = recorded("slurmrestd_ping")
    resp = _get(sim, "ping")
    assert resp.status_code == real["status"] and not shape_diff(real["body"], resp.json())
    real = recorded("slurmrestd_job_cancel")
    resp = _get(sim, f"job/{running['job_id']}", "DELETE")
    assert resp.status_code == real["status"] == 200 and not shape_diff(real["body"], resp.json())


def test_errors_match_recorded_slurmrestd(sim):
    """22.05 answers an unknown node or job with HTTP 500 and an `errors` list, an unknown path
    with a plain-text 404."""
    for name, rel in (("slurmrestd_node_unknown", "node/no-such-node"), ("slurmrestd_job_unknown", "job/999999")):
        real = recorded(name)
        resp = _get(sim, rel)
        assert resp.status_code == real["status"] == 500, name
        assert not shape_diff(real["body"], resp.json()), name
        assert resp.json()["errors"][0]["error"] == real["body"]["errors"][0]["error"]
    real = recorded("slurmrestd_unknown_path")
    resp = _get(sim, "no-such-path")
    assert resp.status_code == real["status"] == 404
    assert resp.text == real["body"]


def test_slurm_actuator_requeues_on_the_facade_as_on_real_slurm(sim, tmp_path):
    """The actuator as the virtual datacenter runs it (reads from slurmrestd, writes through the
    scontrol shim): requeue empties a drained node and the jobs wait pending under their own ids,
    as slurmctld keeps them, until the platform's demand runs again; a job that is no longer running
    answers ok on a second send; the shim's refusals read as real scontrol's ("Job is pending
    execution for job N")."""
    from gpupool.actuation.actuators.slurm import SlurmActuator

    shim = tmp_path / "scontrol"
    shim.write_text(f"#!/bin/sh\nGPUPOOL_SIM_SLURMRESTD_URL={sim.urls['slurm']} "
                    f"exec {sys.executable} -m gpupool.emulator.scontrol \"$@\"\n")
    shim.chmod(0o755)
    act = SlurmActuator("slurm", bin_dir=str(tmp_path), restd_url=sim.urls["slurm"])
    name = next(n["name"] for n in sim.state.nodes("slurm") if n["busy_gpus"] > 0)
    running = [w for w in sim.state.running("slurm") if w.node == name]
    assert sorted(act.work_started(name)) == sorted(w.start.to_pydatetime() for w in running)

    act.release(name, "gpupool: reclaimed by kubernetes")
    cmds = act.evict_commands(name)
    assert sorted(c.request["job_id"] for c in cmds) == sorted(w.job_id for w in running)
    assert all(act.send(c)["requeued"] for c in cmds)
    assert act.is_released(name) and act.work_started(name) == []
    ids = {w.job_id for w in running}

    def listed() -> dict[int, str]:
        jobs = requests.get(f"{sim.urls['slurm']}/slurm/v0.0.38/jobs", timeout=10).json()["jobs"]
        return {j["job_id"]: j["job_state"] for j in jobs}

    assert {i: listed().get(i) for i in ids} == {i: "PENDING" for i in ids}  # requeued: the same ids wait
    again = act.send(cmds[0])
    assert again["requeued"] is False and "pending execution" in again["detail"]

    for n in sim.state.nodes("slurm"):  # no node takes work: the platform's demand waits
        sim.state.cordon("slurm", n["name"], "operator: maintenance", via="slurm")
    sim.state.advance("10min")
    pending = sim.state.pending("slurm")
    assert pending, "the world has demand it cannot place"
    out = scontrol(sim, "requeue", str(pending[0].job_id))
    assert out.returncode == 1 and out.stderr.strip() == f"Job is pending execution for job {pending[0].job_id}"
    assert ids <= {w.job_id for w in pending}  # still waiting while the demand they are part of is unmet
    for n in sim.state.nodes("slurm"):
        if n["drain_reason"] == "operator: maintenance":
            sim.state.uncordon("slurm", n["name"])
    sim.state.advance("10min")
    # the demand runs again, under new ids: of the requeued, only as many as its unmet GPUs still wait
    # (the first requeued ran first), and nothing is listed twice
    world, i = sim.state.world, sim.state.clock_i - 1
    p = world.platforms.index("slurm")
    unmet = math.ceil(max(0.0, world.demand_[p, i] - world.capacity_at(i)[p]) - 1e-6)
    now = [w.job_id for w in sim.state.pending("slurm")]
    order = [c.request["job_id"] for c in cmds]
    assert len(now) == len(set(now)) == unmet
    assert [j for j in now if j in ids] == order[len(order) - min(unmet, len(order)):], (now, order)
