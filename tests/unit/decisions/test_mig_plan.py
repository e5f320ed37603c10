"""MIG in the plan: a platform's ``slice_profile`` is its demand unit, the pool reads the slice
counts sources report, and the plan lays MIG-capable nodes out for a platform that asks for slices."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from gpupool import pipeline
from gpupool.jobs import allocation as service
from gpupool.decisions.layouts import NodeRecord, layout_from_inventory, node_capacity
from gpupool.config import ConfigError, parse_config
from gpupool.staging.schema import clean_sample, inventory_node

END = datetime(2026, 3, 2, 12, 0, tzinfo=timezone.utc)
WINDOW = pipeline.Window(END - timedelta(hours=1), END)


def _config(k8s_profile="1g.10gb", slice_demand=None):
    k8s = {"name": "kubernetes", "kind": "kubernetes", "conn_id": "k", "actuation": True}
    if k8s_profile:
        k8s["slice_profile"] = k8s_profile
    if slice_demand:
        k8s["slice_demand"] = slice_demand
    return parse_config({"platforms": [{"name": "slurm", "kind": "slurm", "conn_id": "s", "actuation": True}, k8s],
                         "limits": {"horizon_hours": 2, "max_moves_per_decision": 2, "cooldown_hours": 0}})


def test_slice_profile_is_checked():
    assert _config().platforms[1].slice_profile == "1g.10gb"
    assert _config(None).platforms[1].slice_profile is None
    with pytest.raises(ConfigError, match="unknown MIG profile '1g.11gb'"):
        _config("1g.11gb")
    with pytest.raises(ConfigError, match="slice_demand: only a platform with a slice_profile"):
        _config(None, "gpu_equivalent")
    with pytest.raises(ConfigError, match="slice_profile: gpupool cannot lay out MIG on OpenStack"):
        parse_config({"platforms": [{"name": "os", "kind": "openstack", "conn_id": "o", "slice_profile": "1g.10gb"}]})
    with pytest.raises(ConfigError, match="slice_profile: the virtual datacenter's platform APIs serve whole GPUs"):
        parse_config({"platforms": [{"name": "sim", "kind": "simulator", "slice_profile": "1g.10gb"}]})


@pytest.mark.parametrize("raw, gpus, model, want", [
    (None, 8, "NVIDIA H100 80GB HBM3", (8, True, "all-disabled")),
    (None, 4, "Tesla V100", (4, False, None)),
    ({"1g.10gb": 56}, 8, "NVIDIA-H100-80GB-HBM3", (8, True, "all-1g.10gb")),  # Kubernetes, with the count label
    ({"1g.10gb": 56}, 0, None, (8, True, "all-1g.10gb")),  # no count label: GPUs from the slices
    ('{"1g.10gb": 14, "3g.40gb": 4}', 4, "H100", (4, True, "custom:1g.10gb=14,3g.40gb=4")),  # as staged (JSON)
    ({"CUSTOM_MIG_1G_10GB": 7}, 1, "a100", (1, True, "all-1g.10gb")),  # an OpenStack resource class
    (None, 56, "1g.10gb", (8, True, "all-1g.10gb")),  # Slurm: gres gpu:1g.10gb:56
    ({"config": "all-2g.20gb"}, 8, "H100", (8, True, "all-2g.20gb")),
])
def test_layout_from_inventory(raw, gpus, model, want):
    assert layout_from_inventory(raw, gpus, model) == want


def test_custom_layout_serves_the_instances_big_enough():
    node = NodeRecord("n", "k", 4, mig_capable=True)
    assert node_capacity(node, "1g.10gb", "custom:1g.10gb=14,3g.40gb=4") == 18
    assert node_capacity(node, "2g.20gb", "custom:1g.10gb=14,3g.40gb=4") == 4
    assert node_capacity(node, "gpu", "custom:1g.10gb=14,3g.40gb=4") == 0


def _stage(engine, k8s_demand=20.0):
    """slurm: 3 idle A100 nodes; kubernetes: one node laid out for 1g.10gb (busy), one whole (idle)."""
    rows = [dict(platform="slurm", node=f"gpu-n{i}", snapshot_at=END, gpus=8, gpu_model="a100", mig_layout=None,
                 schedulable=True, drain_reason=None, busy_gpus=0.0) for i in range(3)]
    rows.append(dict(platform="kubernetes", node="k8s-0", snapshot_at=END, gpus=8, gpu_model="NVIDIA-H100-80GB-HBM3",
                     mig_layout={"1g.10gb": 56}, schedulable=True, drain_reason=None, busy_gpus=8.0))
    rows.append(dict(platform="kubernetes", node="k8s-1", snapshot_at=END, gpus=8, gpu_model="NVIDIA-H100-80GB-HBM3",
                     mig_layout=None, schedulable=True, drain_reason=None, busy_gpus=0.0))
    samples = []
    for p, v in (("slurm", 4.0), ("kubernetes", k8s_demand)):
        samples += [dict(platform=p, cluster="", entity_kind="platform", entity_id="", metric="gpu_allocated",
                         ts=END - timedelta(minutes=m), value=v, expected=v, score=0.0, is_anomaly=False, filled=False,
                         detector="sr", clean_value=v) for m in (5, 30, 55)]
    with engine.begin() as conn:
        conn.execute(inventory_node.insert(), rows)
        conn.execute(clean_sample.insert(), samples)


def test_pool_reads_the_slices_sources_report(sqlite_engine):
    _stage(sqlite_engine)
    nodes, _ = service.pool_nodes(sqlite_engine, END, ["slurm", "kubernetes"], _config())
    by = {n.name: n for n in nodes}
    assert (by["k8s-0"].mig_capable, by["k8s-0"].mig_layout, by["k8s-0"].gpus) == (True, "all-1g.10gb", 8)
    assert (by["k8s-1"].mig_capable, by["k8s-1"].mig_layout) == (True, "all-disabled")
    assert by["gpu-n0"].mig_capable


@pytest.mark.parametrize("k8s_demand, slice_demand, slices", [(140.0, None, 140.0), (20.0, "gpu_equivalent", 140.0)])
def test_a_platform_asking_for_slices_gets_mig_layouts(sqlite_engine, k8s_demand, slice_demand, slices):
    _stage(sqlite_engine, k8s_demand)
    ctx = pipeline.Context(_config(slice_demand=slice_demand), sqlite_engine)
    out = service.plan_from_staging(ctx, WINDOW, ["slurm", "kubernetes"], "reactive")
    k8s = out["summary"]["platforms"]["kubernetes"]
    assert k8s["demand_unit"] == "1g.10gb" and k8s["demand_mean"][0] == pytest.approx(slices)
    assert ("is 7 slices (a GPU's worth)" if slice_demand else "is one request of a slice") in k8s["demand_from"]
    changes = out["summary"]["layout_changes"]
    assert [(c["node"], c["platform"], c["to"]) for c in changes] == [("k8s-1", "kubernetes", "all-1g.10gb")]
    # the nodes slurm lends arrive laid out for kubernetes' slices
    assert out["moves"] and all(m["to"] == "kubernetes" and m["mig_layout"] == "all-1g.10gb" for m in out["moves"])


def test_whole_gpu_platforms_keep_mig_off(sqlite_engine):
    _stage(sqlite_engine)
    ctx = pipeline.Context(_config(None), sqlite_engine)
    out = service.plan_from_staging(ctx, WINDOW, ["slurm", "kubernetes"], "reactive")
    assert out["summary"]["platforms"]["kubernetes"]["demand_unit"] == "gpu"
    # the busy node laid out for slices serves no whole GPU; the idle whole one is left as it is
    assert out["moves"] and all(m["mig_layout"] == "all-disabled" for m in out["moves"])
    # the busy node laid out for slices cannot be changed now; nothing else needs a re-layout
    assert out["summary"]["layout_changes"] == []


def _plan_with_changes(engine, changes):
    from gpupool.staging.plans import insert_plan

    return insert_plan(engine, END, policy="reactive", solver="milp", dry_run=True,
                       summary={"layout_changes": changes}, moves=[])


def _audit(engine):
    import sqlalchemy as sa

    from gpupool.staging.schema import action_audit

    with engine.connect() as conn:
        return [(r.node, r.action, r.status, r.request.get("layout")) for r in
                conn.execute(sa.select(action_audit).order_by(action_audit.c.id))]


def test_layout_changes_never_reach_a_node_without_mig_and_a_dry_run_only_audits(sqlite_engine):
    with sqlite_engine.begin() as conn:
        conn.execute(inventory_node.insert(), [
            dict(platform="kubernetes", node=n, snapshot_at=END, gpus=8, gpu_model=m, mig_layout=None,
                 schedulable=True, drain_reason=None, busy_gpus=0.0)
            for n, m in (("k8s-h100", "NVIDIA-H100-80GB-HBM3"), ("k8s-v100", "Tesla-V100-SXM2-32GB"))])
    pid = _plan_with_changes(sqlite_engine, [
        {"node": n, "platform": "kubernetes", "from": "all-disabled", "to": "all-1g.10gb"}
        for n in ("k8s-h100", "k8s-v100")])
    ctx = pipeline.Context(_config(), sqlite_engine)
    out = service.actuate_plan(ctx, pid, dry_run=True, at=END)
    assert [(a["node"], a["dry_run"]) for a in out["layouts"]["applied"]] == [("k8s-h100", True)]
    assert out["layouts"]["skipped"] == [{"node": "k8s-v100", "platform": "kubernetes", "to": "all-1g.10gb",
                                          "why": "the inventory says its GPUs cannot do MIG"}]
    assert _audit(sqlite_engine) == [("k8s-h100", "mig_layout", "dry_run", "all-1g.10gb")]


def test_a_relayout_stands_aside_while_another_writer_holds_the_node(sqlite_engine):
    """A handover step (the fast path's, the DAG's or the CLI's) holding the node's writer lock
    keeps the plan's re-layout off it: nothing is audited or sent; the next pass may apply it."""
    from gpupool.staging import handovers as store

    with sqlite_engine.begin() as conn:
        conn.execute(inventory_node.insert(), [dict(
            platform="kubernetes", node="k8s-h100", snapshot_at=END, gpus=8, gpu_model="NVIDIA-H100-80GB-HBM3",
            mig_layout=None, schedulable=True, drain_reason=None, busy_gpus=0.0)])
    pid = _plan_with_changes(sqlite_engine, [{"node": "k8s-h100", "platform": "kubernetes",
                                             "from": "all-disabled", "to": "all-1g.10gb"}])
    ctx = pipeline.Context(_config(), sqlite_engine)
    with store.node_lock(sqlite_engine, "k8s-h100") as held:
        assert held
        out = service.actuate_plan(ctx, pid, dry_run=True, at=END)
    assert not out["layouts"]["applied"] and "another writer" in out["layouts"]["skipped"][0]["why"]
    assert _audit(sqlite_engine) == []
    again = service.actuate_plan(ctx, pid, dry_run=True, at=END)
    assert [a["node"] for a in again["layouts"]["applied"]] == ["k8s-h100"]


def test_a_stale_plan_changes_no_layout(sqlite_engine):
    _stage(sqlite_engine)
    pid = _plan_with_changes(sqlite_engine, [{"node": "k8s-1", "platform": "kubernetes", "from": "all-disabled",
                                             "to": "all-1g.10gb"}])
    ctx = pipeline.Context(_config(), sqlite_engine)
    out = service.actuate_plan(ctx, pid, dry_run=True, at=END + timedelta(hours=ctx.config.limits.max_actuation_age_hours + 1))
    assert not out["layouts"]["applied"] and "older than" in out["layouts"]["skipped"][0]["why"]
    assert _audit(sqlite_engine) == []


def test_planning_in_slices_leaves_fewer_slice_hours_unmet_than_whole_gpus():
    """The same slice demand planned in whole GPUs (MIG stays off) and in 1g.10gb slices, scored
    on the layouts each plan leaves: slice requests unmet over the horizon."""
    from gpupool.decisions.planner import plan
    from gpupool.decisions.policy import Policy

    nodes = [NodeRecord(f"ai-{i}", "ai", 8, mig_capable=True, mig_layout="all-disabled") for i in range(2)]
    nodes += [NodeRecord(f"hpc-{i}", "hpc", 8, mig_capable=True, mig_layout="all-disabled") for i in range(2)]
    jobs = {"ai": [60.0, 60.0], "hpc": [8.0, 8.0]}
    policy = Policy(kind="reactive", cooldown_hours=0)
    unmet = {}
    for unit in ("gpu", "1g.10gb"):
        result = plan(nodes, {"ai": {"mean": jobs["ai"], "upper": [72.0, 72.0], "unit": unit},
                              "hpc": {"mean": jobs["hpc"], "upper": [10.0, 10.0]}}, policy)
        layout = {n.name: n.mig_layout for n in nodes}
        owner = {n.name: n.owner for n in nodes}
        layout.update({c.node: c.to_layout for c in result.layout_changes})
        for m in result.moves:
            owner[m.node], layout[m.node] = m.target, m.mig_layout
        served = sum(node_capacity(n, "1g.10gb", layout[n.name]) for n in nodes if owner[n.name] == "ai")
        hpc = sum(node_capacity(n, "gpu", layout[n.name]) for n in nodes if owner[n.name] == "hpc")
        assert hpc >= 8  # hpc's whole GPUs are never cut up for ai
        unmet[unit] = sum(max(0.0, d - served) for d in jobs["ai"])
    assert unmet["gpu"] >= 2 * (60 - 24)  # whole GPUs: one job each, at most 24 of them for ai
    assert unmet["1g.10gb"] == 0.0 and unmet["1g.10gb"] < unmet["gpu"]


def test_a_platform_whose_actuator_cannot_change_mig_is_never_sent_a_layout(sqlite_engine):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "actuation"))
    from memplatform import make

    _stage(sqlite_engine)
    pid = _plan_with_changes(sqlite_engine, [{"node": "k8s-1", "platform": "kubernetes", "from": "all-disabled",
                                             "to": "all-1g.10gb"}])
    _, acts = make(platforms=("slurm", "kubernetes"), owners={"k8s-1": "kubernetes"})
    cfg = _config().model_copy(update={"dry_run": False})
    out = service.actuate_plan(pipeline.Context(cfg, sqlite_engine), pid, dry_run=False, actuators=acts, at=END)
    assert out["live"] and not out["layouts"]["applied"]
    assert out["layouts"]["skipped"][0]["why"] == "the kubernetes actuator cannot change MIG layouts"
    assert _audit(sqlite_engine) == [] and acts["kubernetes"].sent == []


def test_the_pool_reads_nvml_mig_devices(sqlite_engine):
    """A bare node read through NVML (the fake library): GPUs laid out for 1g.10gb are
    ``all-1g.10gb``; a host of GPUs without MIG can never be re-laid out."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sources"))
    from fake_nvml import FakeGpu, FakeNvml

    from gpupool.sources.nvml import NvmlSource

    hosts = {"spare-01": [FakeGpu(mig_enabled=True, mig_profiles=["1g.10gb"] * 7) for _ in range(2)],
             "spare-02": [FakeGpu(name="NVIDIA L4", mig_capable=False) for _ in range(2)]}
    rows = []
    for host, gpus in hosts.items():
        src = NvmlSource("kubernetes", node=host, nvml=FakeNvml(gpus).module, clock=lambda: END.timestamp())
        rows += [{**r, "snapshot_at": END} for r in src.inventory(END)]
    with sqlite_engine.begin() as conn:
        conn.execute(inventory_node.insert(), rows)
    nodes, _ = service.pool_nodes(sqlite_engine, END, ["kubernetes"], _config())
    by = {n.name: n for n in nodes}
    assert (by["spare-01"].gpus, by["spare-01"].mig_capable, by["spare-01"].mig_layout) == (2, True, "all-1g.10gb")
    assert (by["spare-02"].mig_capable, by["spare-02"].mig_layout) == (False, None)
    assert node_capacity(by["spare-01"], "1g.10gb", by["spare-01"].mig_layout) == 14
