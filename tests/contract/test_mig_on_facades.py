"""MIG from plan to platform on the virtual datacenter's facades, through the real clients.

A platform whose users ask for ``1g.10gb`` slices gets its idle MIG-capable nodes re-laid out:
on Kubernetes by the GPU operator's ``nvidia.com/mig.config`` label (the facade's mig-manager
applies it after ``mig_minutes``), on Slurm by gpupool's drain, the node-side MIG tool (the
emulator's ``migparted``) and a GRES update through ``scontrol``, then a resume. The sources
then read the slices back, and the pool sees the new layout. A move's arrival layout is applied
by the handover's attach step the same way.
"""

from __future__ import annotations

import os
import stat
import sys
from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy as sa
import yaml

from gpupool import pipeline
from gpupool.actuation import handover as ho
from gpupool.jobs import allocation as service
from gpupool.actuation.actuators.kubernetes import KubernetesActuator
from gpupool.actuation.actuators.slurm import SlurmActuator
from gpupool.config import parse_config
from gpupool.sources.kubernetes import KubernetesSource
from gpupool.sources.slurm import SlurmSource
from gpupool.staging.plans import insert_plan
from gpupool.staging.schema import action_audit, clean_sample, inventory_node

T0 = datetime(2026, 6, 1, tzinfo=timezone.utc)
NOW = T0 + timedelta(days=1)
A100 = "NVIDIA A100-SXM4-80GB"
H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture
def vdc(tmp_path, monkeypatch):
    """Facades over slurm (3 A100 nodes) and kubernetes (3 H100 nodes), each platform's little
    work packed on its first node; ``scontrol`` and the node-side MIG tool as the emulator's shims."""
    from gpupool.emulator.serve import make_state, serve_in_thread

    spec = {"step": "5min", "decision_every": "1h", "node_gpus": 8, "move_minutes": 30, "start": T0.isoformat(),
            "end": (T0 + timedelta(days=2)).isoformat(), "seed": 3,
            "platforms": {"slurm": {"synthetic": {"base": 2, "total_gpus": 24, "noise": 0.0}, "nodes": 3,
                                    "gpu_model": A100},
                          "kubernetes": {"synthetic": {"base": 2, "total_gpus": 24, "noise": 0.0}, "nodes": 3,
                                         "gpu_model": H100}}}
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(spec))
    state = make_state(path, speed=0, start_at=NOW.isoformat())
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "scontrol"
    tool.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m gpupool.emulator.scontrol "$@"\n')
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    with serve_in_thread(state) as servers:
        monkeypatch.setenv("GPUPOOL_SIM_SLURMRESTD_URL", servers.urls["slurm"])
        monkeypatch.setenv("GPUPOOL_SIM_CONTROL_URL", servers.urls["control"])
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in sys.path if p))
        yield servers, str(bin_dir)


def _clients(servers, bin_dir):
    from kubernetes import client

    cfg = client.Configuration()
    cfg.host = servers.urls["kubernetes"]
    api = client.ApiClient(cfg)
    mig_command = [sys.executable, "-m", "gpupool.emulator.migparted", "{node}", "apply", "-c", "{layout}"]
    sources = {"kubernetes": KubernetesSource("kubernetes", api_client=api),
               "slurm": SlurmSource("slurm", restd_url=servers.urls["slurm"], live_tolerance=None)}
    actuators = {"kubernetes": KubernetesActuator(api, "kubernetes"),
                 "slurm": SlurmActuator("slurm", bin_dir=bin_dir, restd_url=servers.urls["slurm"],
                                        mig_command=mig_command)}
    return sources, actuators


def _config(slices: str):
    plats = [{"name": p, "kind": p, "conn_id": p, "actuation": True, "min_nodes": 3,
              **({"slice_profile": "1g.10gb"} if p == slices else {})} for p in ("slurm", "kubernetes")]
    return parse_config({"dry_run": False, "platforms": plats,
                         "limits": {"horizon_hours": 2, "cooldown_hours": 0, "max_actuation_age_hours": 2}})


def _stage(engine, sources, at, demand):
    rows = [{**r, "snapshot_at": at} for s in sources.values() for r in s.inventory(at)]
    samples = [dict(platform=p, cluster="", entity_kind="platform", entity_id="", metric="gpu_allocated",
                    ts=at - timedelta(minutes=m), value=v, expected=v, score=0.0, is_anomaly=False, filled=False,
                    detector="sr", clean_value=v) for p, v in demand.items() for m in (5, 30, 55)]
    with engine.begin() as conn:
        conn.execute(inventory_node.insert(), rows)
        conn.execute(clean_sample.insert(), samples)


def _plan_and_actuate(engine, cfg, actuators, at):
    ctx = pipeline.Context(cfg, engine)
    out = service.plan_from_staging(ctx, pipeline.Window(at - timedelta(hours=1), at), ["slurm", "kubernetes"],
                                    "reactive")
    pid = insert_plan(engine, at, policy="reactive", solver=out["solver"], dry_run=False, summary=out["summary"],
                      moves=out["moves"])
    return out, service.actuate_plan(ctx, pid, dry_run=False, actuators=actuators, at=at)


def _audit(engine):
    with engine.connect() as conn:
        return [(r.platform, r.node, r.action, r.status) for r in
                conn.execute(sa.select(action_audit).order_by(action_audit.c.id))]


def test_kubernetes_asking_for_slices_gets_its_idle_nodes_laid_out(vdc, sqlite_engine):
    servers, bin_dir = vdc
    state = servers.state
    sources, actuators = _clients(servers, bin_dir)
    at = state.now.to_pydatetime()
    idle = sorted(n["name"] for n in state.nodes("kubernetes") if n["busy_gpus"] == 0)
    busy = sorted(n["name"] for n in state.nodes("kubernetes") if n["busy_gpus"] > 0)
    assert idle and busy
    _stage(sqlite_engine, sources, at, {"slurm": 2.0, "kubernetes": 140.0})
    out, report = _plan_and_actuate(sqlite_engine, _config("kubernetes"), actuators, at)
    changes = out["summary"]["layout_changes"]
    assert {c["node"] for c in changes} == set(idle) and all(c["to"] == "all-1g.10gb" for c in changes)
    assert sorted(a["node"] for a in report["layouts"]["applied"]) == idle and not report["layouts"]["failed"]
    assert [a for a in _audit(sqlite_engine) if a[2] == "mig_config"] == [
        ("kubernetes", n, "mig_config", "ok") for n in idle]
    assert all(state.node("kubernetes", n)["meta"].labels["nvidia.com/mig.config.state"] == "pending" for n in idle)
    # the operator's change takes its time; then the source reads the slices and the pool the layout
    state.advance("30min")
    at2 = state.now.to_pydatetime()
    inv = {r["node"]: r for r in sources["kubernetes"].inventory(at2)}
    assert all(inv[n]["mig_layout"] == {"1g.10gb": 56} and inv[n]["gpus"] == 8 for n in idle)
    assert inv[busy[0]]["mig_layout"] is None  # the busy node was left alone
    _stage(sqlite_engine, sources, at2, {"slurm": 2.0, "kubernetes": 140.0})
    nodes, _ = service.pool_nodes(sqlite_engine, at2, ["slurm", "kubernetes"], _config("kubernetes"))
    assert {n.name: n.mig_layout for n in nodes if n.name in idle} == {n: "all-1g.10gb" for n in idle}
    # a second pass of the same plan sends nothing more
    again = service.actuate_plan(pipeline.Context(_config("kubernetes"), sqlite_engine), report["plan_id"],
                                 dry_run=False, actuators=actuators, at=at2)
    assert not again["layouts"]["applied"] and all("already" in s["why"] for s in again["layouts"]["skipped"])


def test_slurm_asking_for_slices_drains_relays_out_updates_gres_and_resumes(vdc, sqlite_engine):
    servers, bin_dir = vdc
    state = servers.state
    sources, actuators = _clients(servers, bin_dir)
    at = state.now.to_pydatetime()
    idle = sorted(n["name"] for n in state.nodes("slurm") if n["busy_gpus"] == 0)
    assert idle
    _stage(sqlite_engine, sources, at, {"slurm": 140.0, "kubernetes": 2.0})
    out, report = _plan_and_actuate(sqlite_engine, _config("slurm"), actuators, at)
    assert sorted(c["node"] for c in out["summary"]["layout_changes"]) == idle
    assert sorted(a["node"] for a in report["layouts"]["applied"]) == idle and not report["layouts"]["failed"]
    for n in idle:
        assert [a[2:] for a in _audit(sqlite_engine) if a[1] == n] == [
            ("drain", "ok"), ("mig_layout", "ok"), ("gres", "ok"), ("resume", "ok")]
        rec = state.node("slurm", n)
        assert rec["mig_layout"] == "all-1g.10gb" and not rec["cordoned"]  # laid out and back in service
    inv = {r["node"]: r for r in sources["slurm"].inventory(at)}
    assert all((inv[n]["gpus"], inv[n]["gpu_model"]) == (56, "1g.10gb") for n in idle)
    _stage(sqlite_engine, sources, at + timedelta(minutes=1), {"slurm": 140.0})
    nodes, _ = service.pool_nodes(sqlite_engine, at + timedelta(minutes=1), ["slurm"], _config("slurm"))
    assert {(n.name, n.gpus, n.mig_layout) for n in nodes if n.name in idle} == {(n, 8, "all-1g.10gb") for n in idle}


def test_slurm_refuses_a_layout_on_a_busy_node_and_without_a_mig_command(vdc):
    servers, bin_dir = vdc
    sources, actuators = _clients(servers, bin_dir)
    slurm = actuators["slurm"]
    busy = next(n["name"] for n in servers.state.nodes("slurm") if n["busy_gpus"] > 0)
    cmds = slurm.prepare_commands(busy, "all-1g.10gb")
    assert [c.action for c in cmds] == ["mig_layout", "gres"]
    with pytest.raises(Exception, match="drained by gpupool and empty first"):
        slurm.send(cmds[0])
    assert servers.state.node("slurm", busy)["mig_layout"] == "all-disabled"
    bare = SlurmActuator("slurm", bin_dir=bin_dir, restd_url=servers.urls["slurm"])
    with pytest.raises(Exception, match="no mig_command"):
        bare.prepare_commands(busy, "all-1g.10gb")
    assert bare.prepare_commands(busy, "all-disabled") == []  # whole GPUs already: nothing to do


def test_a_move_to_slurm_arrives_laid_out(vdc, sqlite_engine):
    """The handover's attach step applies the move's ``mig_layout`` at a Slurm target."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "unit", "actuation"))
    from memplatform import make

    servers, bin_dir = vdc
    _, actuators = _clients(servers, bin_dir)
    slurm = actuators["slurm"]
    node = next(n["name"] for n in servers.state.nodes("slurm") if n["busy_gpus"] == 0)
    slurm.release(node, "gpupool: held for the pool")  # a pool node slurm does not own: held there
    _, mem = make(platforms=("kubernetes",), owners={node: "kubernetes"})
    at = servers.state.now.to_pydatetime()
    pid = insert_plan(sqlite_engine, at, policy="reactive", solver="milp", dry_run=False, summary={},
                      moves=[{"node": node, "from": "kubernetes", "to": "slurm", "mig_layout": "all-1g.10gb"}])
    hid = ho.open_handover(sqlite_engine, node, "kubernetes", "slurm", at, plan_id=pid, dry_run=False)
    ho.advance_all(sqlite_engine, {"kubernetes": mem["kubernetes"], "slurm": slurm}, at, dry_run=False)
    assert ho.get_handover(sqlite_engine, hid).state == ho.DONE
    assert [a[2] for a in _audit(sqlite_engine) if a[0] == "slurm"] == ["mig_layout", "gres", "resume"]
    rec = servers.state.node("slurm", node)
    assert rec["mig_layout"] == "all-1g.10gb" and not rec["cordoned"]
