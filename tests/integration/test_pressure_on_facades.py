"""`pressure(at)` of each platform's source through the real client libraries against the
virtual datacenter's facades, configured like a deployment: the instant read must agree with
what the simulated platform holds (its nodes, their work, the demand it cannot place)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest
import yaml

from gpupool.config import load_config
from gpupool.emulator.serve import make_state, serve_in_thread
from gpupool.platforms import build_source
from gpupool.sources.base import Pressure, SourceError

T0 = datetime(2026, 6, 1, tzinfo=timezone.utc)
NOW = T0 + timedelta(days=2)


def _scenario(tmp_path):
    # slurm's demand exceeds what it holds (something pends); the others have room
    spec = {
        "step": "5min", "decision_every": "1h", "node_gpus": 8, "move_minutes": 30, "max_moves_per_decision": 4,
        "start": T0.isoformat(), "end": (T0 + timedelta(days=3)).isoformat(), "seed": 5,
        "platforms": {
            "openstack": {"synthetic": {"base": 8, "total_gpus": 48}, "nodes": 6},
            "slurm": {"synthetic": {"base": 90, "total_gpus": 64}, "nodes": 8},
            "kubernetes": {"synthetic": {"base": 10, "daily_amplitude": 0.2, "total_gpus": 48}, "nodes": 6},
        },
    }
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.fixture
def facades(tmp_path, monkeypatch):
    state = make_state(_scenario(tmp_path), speed=0, start_at=NOW.isoformat())
    with serve_in_thread(state) as servers:
        u = servers.urls
        monkeypatch.setenv("AIRFLOW_CONN_OPENSTACK_VDC", json.dumps(
            {"conn_type": "http", "host": u["keystone"], "login": "admin", "password": "gpupool-sim",
             "extra": {"project_name": "admin"}}))
        monkeypatch.setenv("AIRFLOW_CONN_PROMETHEUS_VDC", json.dumps(
            {"conn_type": "http", "host": u["prometheus"],
             "extra": {"restd_url": u["slurmrestd"], "live_tolerance_minutes": None}}))
        monkeypatch.setenv("AIRFLOW_CONN_KUBERNETES_VDC", json.dumps(
            {"conn_type": "http", "host": u["kubernetes"], "extra": {"prometheus_url": u["prometheus"]}}))
        cfg = load_config("config/compose/platforms.yaml")
        yield state, cfg, servers


def _truth(state, role):
    nodes = state.nodes(role)
    open_ = [n for n in nodes if not n["cordoned"]]
    return {
        "capacity": float(sum(n["gpus"] for n in open_)),
        "allocated": float(sum(n["busy_gpus"] for n in open_)),
        "pending": float(len(state.pending(role))),
        "idle": tuple(sorted(n["name"] for n in open_ if n["busy_gpus"] == 0)),
        "nodes": {n["name"]: n["gpus"] for n in nodes},
    }


@pytest.mark.parametrize("platform", ["slurm", "kubernetes", "openstack"])
def test_pressure_agrees_with_the_platform(facades, platform):
    state, cfg, _ = facades
    at = state.now
    source = build_source(cfg.platform(platform), cfg)
    got = source.pressure(at.to_pydatetime())
    truth = _truth(state, platform)
    assert isinstance(got, Pressure) and got.platform == platform
    assert got.at == at.to_pydatetime()
    assert got.gpus_capacity == truth["capacity"]
    assert got.gpus_allocated == truth["allocated"]
    assert got.idle_nodes == truth["idle"]
    assert dict(got.node_gpus) == truth["nodes"]
    assert got.nodes_open == len([n for n in state.nodes(platform) if not n["cordoned"]])
    if platform == "openstack":  # Placement has no queue; the compose config's Gnocchi meter does
        assert "gpus_pending" in got.provenance and "gpu.pending" in got.provenance["gpus_pending"]
    else:
        assert got.gpus_pending == truth["pending"]
    assert set(got.provenance) >= {"gpus_allocated", "gpus_pending", "gpus_capacity"}
    json.dumps(got.as_dict())  # what staging records


def test_slurm_pends_and_the_others_have_idle_nodes(facades):
    state, cfg, _ = facades
    at = state.now.to_pydatetime()
    slurm = build_source(cfg.platform("slurm"), cfg).pressure(at)
    k8s = build_source(cfg.platform("kubernetes"), cfg).pressure(at)
    assert slurm.gpus_pending > 0 and slurm.gpus_short > 0 and slurm.idle_nodes == ()
    assert k8s.idle_nodes and k8s.gpus_short == 0


def test_a_drained_node_is_neither_idle_nor_capacity(facades):
    state, cfg, _ = facades
    at = state.now.to_pydatetime()
    source = build_source(cfg.platform("kubernetes"), cfg)
    before = source.pressure(at)
    node = before.idle_nodes[0]
    source._core.patch_node(node, {"spec": {"unschedulable": True}})  # kubectl cordon
    after = source.pressure(at)
    assert node not in after.idle_nodes and node in after.node_gpus
    assert after.gpus_capacity == before.gpus_capacity - before.node_gpus[node]
    assert after.nodes_open == before.nodes_open - 1


def test_openstack_without_a_pending_meter_reads_zero_and_says_so(facades):
    state, cfg, _ = facades
    pcfg = cfg.platform("openstack").model_copy(update={"metrics": {}})
    got = build_source(pcfg, cfg).pressure(state.now.to_pydatetime())
    assert got.gpus_pending == 0
    assert any("no notion of pending" in n for n in got.notes)


def test_an_unreachable_exporter_names_platform_and_endpoint(facades, monkeypatch):
    state, cfg, servers = facades
    monkeypatch.setenv("AIRFLOW_CONN_PROMETHEUS_VDC", json.dumps(
        {"conn_type": "http", "host": "http://127.0.0.1:9", "extra": {"restd_url": servers.urls["slurmrestd"],
                                                                      "live_tolerance_minutes": None}}))
    source = build_source(cfg.platform("slurm"), cfg)
    source.retry = source._prom.retry = type(source.retry)(attempts=1)
    with pytest.raises(SourceError) as err:
        source.pressure(state.now.to_pydatetime())
    assert err.value.platform == "slurm" and "/api/v1/query" in err.value.endpoint


def test_gpupool_fastpath_moves_an_idle_node_to_the_short_platform(facades, tmp_path, monkeypatch, capsys):
    """`gpupool fastpath` end to end through the real sources: slurm is short, the others have
    idle nodes; within the latest plan's bounds one idle node starts moving (dry run: audited,
    not sent), and `gpupool handovers` shows the fast path's move."""
    from gpupool.cli import main
    from gpupool.staging import db
    from gpupool.staging.schema import allocation_plan

    state, _, _ = facades
    at = state.now.isoformat()
    url = f"sqlite:///{tmp_path / 'staging.db'}"
    monkeypatch.setenv("GPUPOOL_STAGING_URL", url)
    engine = db.make_engine(url)
    db.upgrade(engine)
    with engine.begin() as conn:
        conn.execute(allocation_plan.insert().values(
            decided_at=state.now.to_pydatetime() - timedelta(minutes=5), policy="predictive", solver="milp",
            dry_run=True, moves=[], summary={"platforms": {p: {"demand_upper": [8.0]} for p in
                                                           ("slurm", "kubernetes", "openstack")}}))
    assert main(["fastpath", "--config", "config/compose/platforms.yaml", "--at", at]) == 0
    out = capsys.readouterr().out
    (move,) = [line for line in out.splitlines() if "MOVE" in line]
    assert "-> slurm (dry-run handover #1)" in move and "short" in move
    assert main(["handovers", "--config", "config/compose/platforms.yaml"]) == 0
    listed = capsys.readouterr().out
    assert "fast-path moves" in listed and "-> slurm" in listed
