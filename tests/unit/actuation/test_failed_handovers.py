"""A handover that cannot finish never leaves its node held by gpupool, and the run that saw it
fails (so Airflow alerts): the target is checked before the drain, a dry-run pass still enforces
live deadlines, an attach that times out sends the node back. Also: ``gpupool rollback`` honours
``dry_run: true``, and pool node ids are mapped to each platform's own node name."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from gpupool import pipeline
from gpupool.actuation import handover as ho
from gpupool.jobs import allocation as service
from gpupool.config import parse_config
from gpupool.staging.schema import allocation_plan, inventory_node
from memplatform import Datacenter, MemActuator, Slot, make

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=timezone.utc)


def _ctx(engine, dry_run=False, **extra):
    raw = {"platforms": [{"name": "slurm", "kind": "slurm", "actuation": True, "conn_id": "hpc"},
                         {"name": "kubernetes", "kind": "kubernetes", "actuation": True, "conn_id": "ai"}],
           "dry_run": dry_run}
    raw.update(extra)
    return pipeline.Context(parse_config(raw), engine)


def _drained(dc, platform, node):
    slot = dc.slots[(platform, node)]
    return not slot.schedulable and (slot.reason or "").startswith("gpupool:")


def test_unknown_target_fails_before_the_source_is_drained(sqlite_engine):
    dc, acts = make(("slurm", "kubernetes"), {"n1": "slurm"})
    del dc.slots[("kubernetes", "n1")]  # the target has never heard of n1
    hid = ho.open_handover(sqlite_engine, "n1", "slurm", "kubernetes", T0, dry_run=False)
    with pytest.raises(ho.HandoverFailed, match=f"#{hid} n1 slurm -> kubernetes.*kubernetes does not know node"):
        service.advance_handovers(_ctx(sqlite_engine), T0, dry_run=False, actuators=acts)
    assert dc.slots[("slurm", "n1")].schedulable and not _drained(dc, "slurm", "n1")
    assert acts["slurm"].sent == [] and acts["kubernetes"].sent == []
    assert ho.get_handover(sqlite_engine, hid).state == ho.ROLLED_BACK
    # reported once: the next pass has nothing to say
    assert service.advance_handovers(_ctx(sqlite_engine), T0 + timedelta(minutes=5), dry_run=False,
                                     actuators=acts)["failed"] == []


def test_dry_run_switched_on_mid_handover_still_enforces_the_deadline(sqlite_engine, monkeypatch):
    dc, acts = make(("slurm", "kubernetes"), {"n1": "slurm", "n2": "slurm"})
    dc.slots[("slurm", "n1")].jobs = 1  # the release waits for this work
    hid = ho.open_handover(sqlite_engine, "n1", "slurm", "kubernetes", T0, dry_run=False, timeout=timedelta(hours=1))
    service.advance_handovers(_ctx(sqlite_engine), T0, dry_run=False, actuators=acts)
    assert _drained(dc, "slurm", "n1")
    # an operator switches dry_run on; no actuators are passed: the pass builds only the ones
    # of platforms whose live handover needs settling
    asked = []
    monkeypatch.setattr(pipeline.Context, "build_actuators",
                        lambda self, platforms=None, lookup=None: asked.append(platforms) or acts)
    dry = _ctx(sqlite_engine, dry_run=True)
    assert service.advance_handovers(dry, T0 + timedelta(minutes=30), dry_run=True)["skipped"] == [hid]
    assert asked == [] and _drained(dc, "slurm", "n1")  # before the deadline a dry pass touches nothing
    with pytest.raises(ho.HandoverFailed, match="timed out in state releasing"):
        service.advance_handovers(dry, T0 + timedelta(hours=1), dry_run=True)
    assert asked == [["kubernetes", "slurm"]]
    assert dc.slots[("slurm", "n1")].schedulable  # gpupool's hold lifted
    h = ho.get_handover(sqlite_engine, hid)
    assert h.state == ho.ROLLED_BACK and "lifted" in h.error
    rows = ho.audit_rows(sqlite_engine, hid)
    assert [(r["action"], r["status"], r["dry_run"]) for r in rows] == [("drain", "ok", False), ("resume", "ok", False)]


def test_attach_timeout_sends_the_node_back_and_fails_the_task(sqlite_engine):
    dc, acts = make(("slurm", "kubernetes"), {"n1": "slurm"})
    acts["kubernetes"].fail += [("resume", "before")] * 5  # the target never takes it
    hid = ho.open_handover(sqlite_engine, "n1", "slurm", "kubernetes", T0, dry_run=False, timeout=timedelta(hours=1))
    ctx = _ctx(sqlite_engine)
    service.advance_handovers(ctx, T0, dry_run=False, actuators=acts)
    assert ho.get_handover(sqlite_engine, hid).state == ho.ATTACHING and _drained(dc, "slurm", "n1")
    with pytest.raises(ho.HandoverFailed, match="timed out in state attaching") as err:
        service.advance_handovers(ctx, T0 + timedelta(hours=1), dry_run=False, actuators=acts)
    assert err.value.report["failed"][0]["id"] == hid
    assert dc.slots[("slurm", "n1")].schedulable and not dc.slots[("kubernetes", "n1")].schedulable
    assert ho.get_handover(sqlite_engine, hid).state == ho.ROLLED_BACK


def test_failed_handovers_are_raised_after_the_others_advance(sqlite_engine):
    dc, acts = make(("slurm", "kubernetes"), {"n1": "slurm", "n2": "slurm"})
    del dc.slots[("kubernetes", "n1")]
    bad = ho.open_handover(sqlite_engine, "n1", "slurm", "kubernetes", T0, dry_run=False)
    good = ho.open_handover(sqlite_engine, "n2", "slurm", "kubernetes", T0, dry_run=False)
    with pytest.raises(ho.HandoverFailed) as err:
        service.advance_handovers(_ctx(sqlite_engine), T0, dry_run=False, actuators=acts)
    assert [f["id"] for f in err.value.report["failed"]] == [bad]
    assert ho.get_handover(sqlite_engine, good).state == ho.DONE


def test_a_lift_that_fails_stays_failed_and_is_retried(sqlite_engine):
    dc, acts = make(("slurm", "kubernetes"), {"n1": "slurm"})
    dc.slots[("slurm", "n1")].jobs = 1
    hid = ho.open_handover(sqlite_engine, "n1", "slurm", "kubernetes", T0, dry_run=False, timeout=timedelta(hours=1))
    ctx = _ctx(sqlite_engine)
    service.advance_handovers(ctx, T0, dry_run=False, actuators=acts)
    acts["slurm"].fail.append(("resume", "before"))
    with pytest.raises(ho.HandoverFailed, match="lifting gpupool's hold at slurm failed"):
        service.advance_handovers(ctx, T0 + timedelta(hours=1), dry_run=False, actuators=acts)
    assert ho.get_handover(sqlite_engine, hid).state == ho.FAILED and _drained(dc, "slurm", "n1")
    with pytest.raises(ho.HandoverFailed):  # still alerting, and this time the hold is lifted
        service.advance_handovers(ctx, T0 + timedelta(hours=1, minutes=5), dry_run=False, actuators=acts)
    assert dc.slots[("slurm", "n1")].schedulable
    assert ho.get_handover(sqlite_engine, hid).state == ho.ROLLED_BACK


def test_rollback_honours_dry_run_in_the_configuration(sqlite_engine):
    dc, acts = make(("slurm", "kubernetes"), {"n1": "slurm"})
    dc.slots[("slurm", "n1")].jobs = 1
    hid = ho.open_handover(sqlite_engine, "n1", "slurm", "kubernetes", T0, dry_run=False)
    service.advance_handovers(_ctx(sqlite_engine), T0, dry_run=False, actuators=acts)
    sent_before = list(acts["slurm"].sent)
    out = service.rollback_handover(_ctx(sqlite_engine, dry_run=True), hid, actuators=acts, at=T0)
    assert out["dry_run"] and [c["action"] for c in out["would_send"]] == ["resume"]
    assert acts["slurm"].sent == sent_before and _drained(dc, "slurm", "n1")
    assert ho.get_handover(sqlite_engine, hid).state == ho.RELEASING
    assert [(r["action"], r["status"], r["dry_run"]) for r in ho.audit_rows(sqlite_engine, hid)][-1] == (
        "resume", "dry_run", True)
    # the same rollback with dry_run off sends it
    out = service.rollback_handover(_ctx(sqlite_engine), hid, actuators=acts, at=T0)
    assert out["state"] == ho.ROLLED_BACK and dc.slots[("slurm", "n1")].schedulable


# ------------------------------------------------------------------------------------ pool names

NAMES = {"slurm": "a01", "kubernetes": "gpu-a01.k8s"}


def _named_dc():
    """One machine, gpu-a01 in the pool, called a01 by Slurm and gpu-a01.k8s by Kubernetes."""
    dc = Datacenter(("slurm", "kubernetes"), {})
    dc.slots[("slurm", "a01")] = Slot(schedulable=True)
    dc.slots[("kubernetes", "gpu-a01.k8s")] = Slot(schedulable=False, reason="gpupool: held for the pool")
    return dc, {p: MemActuator(dc, p) for p in dc.platforms}


def _pool():
    return {"all_nodes": False, "nodes": [{"node": "gpu-a01", "gpus": 8, "names": NAMES}]}


def test_actuators_hear_each_platforms_own_node_name(sqlite_engine):
    dc, acts = _named_dc()
    ctx = _ctx(sqlite_engine, pool=_pool())
    with sqlite_engine.begin() as conn:
        pid = conn.execute(allocation_plan.insert().values(
            decided_at=T0, policy="predictive", solver="milp", dry_run=False, summary={},
            moves=[{"node": "gpu-a01", "from": "slurm", "to": "kubernetes", "gpus": 8}])).inserted_primary_key[0]
    out = service.actuate_plan(ctx, pid, dry_run=False, actuators=acts, at=T0)
    assert [o["node"] for o in out["opened"]] == ["gpu-a01"]
    assert ho.get_handover(sqlite_engine, out["opened"][0]["id"]).state == ho.DONE
    assert [(c.action, c.node) for c in acts["slurm"].sent] == [("drain", "a01")]
    assert [(c.action, c.node) for c in acts["kubernetes"].sent] == [("resume", "gpu-a01.k8s")]
    assert dc.slots[("kubernetes", "gpu-a01.k8s")].schedulable and not dc.slots[("slurm", "a01")].schedulable


def test_planner_sees_one_machine_under_its_pool_id(sqlite_engine):
    cfg = parse_config({"platforms": [{"name": "slurm", "kind": "slurm", "conn_id": "hpc"},
                                      {"name": "kubernetes", "kind": "kubernetes", "conn_id": "ai"}],
                        "pool": _pool()})
    with sqlite_engine.begin() as conn:
        conn.execute(inventory_node.insert(), [
            dict(platform="slurm", node="a01", snapshot_at=T0, gpus=8, gpu_model="A100", mig_layout=None,
                 schedulable=True, drain_reason=None, busy_gpus=0.0),
            dict(platform="kubernetes", node="gpu-a01.k8s", snapshot_at=T0, gpus=8, gpu_model="A100",
                 mig_layout=None, schedulable=False, drain_reason="gpupool: held for the pool", busy_gpus=0.0)])
    nodes, excluded = service.pool_nodes(sqlite_engine, T0, ["slurm", "kubernetes"], cfg)
    assert [(n.name, n.owner, n.in_handover) for n in nodes] == [("gpu-a01", "slurm", False)]
    assert excluded == []


def test_a_platform_name_given_to_two_pool_nodes_is_refused():
    from gpupool.config import ConfigError

    with pytest.raises(ConfigError, match="'a01' is given to two pool nodes"):
        parse_config({"platforms": [{"name": "slurm", "kind": "slurm", "conn_id": "hpc"}], "pool": {"nodes": [
            {"node": "x", "gpus": 1, "names": {"slurm": "a01"}}, {"node": "y", "gpus": 1, "names": {"slurm": "a01"}}]}})


def test_cli_rollback_with_dry_run_in_the_config_sends_nothing(tmp_path, capsys):
    """`gpupool rollback ID` under `dry_run: true`: prints what it would send, audits it as a dry
    run, changes nothing — even with no connection to build the actuators from."""
    import json

    import sqlalchemy as sa

    from gpupool.cli import main
    from gpupool.staging import db

    cfg = tmp_path / "platforms.yaml"
    cfg.write_text("dry_run: true\nplatforms:\n  - {name: slurm, kind: slurm, conn_id: hpc, actuation: true}\n"
                   "  - {name: kubernetes, kind: kubernetes, conn_id: ai, actuation: true}\n")
    url = f"sqlite:///{tmp_path / 'staging.db'}"
    engine = sa.create_engine(url)
    db.upgrade(engine)
    hid = ho.open_handover(engine, "n1", "slurm", "kubernetes", T0, dry_run=False, state=ho.RELEASING)
    from gpupool.staging.schema import action_audit

    with engine.begin() as conn:  # the drain went out earlier
        conn.execute(action_audit.insert().values(
            handover_id=hid, platform="slurm", node="n1", action="drain", request={}, status="ok", response="{}",
            dry_run=False, created_at=T0, finished_at=T0))
    assert main(["rollback", str(hid), "--config", str(cfg), "--staging-url", url]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["dry_run"] and out["would_send"] and out["would_send"][0]["platform"] == "slurm"
    assert ho.get_handover(engine, hid).state == ho.RELEASING
    rows = ho.audit_rows(engine, hid)
    assert [(r["action"], r["status"]) for r in rows] == [("drain", "ok"), ("attach", "dry_run")]
