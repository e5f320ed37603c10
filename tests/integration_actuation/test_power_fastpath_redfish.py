"""Production's parking end to end on sushy-tools' Redfish emulator: the fast path's ticks, with
the power actuator built from the platform's ``power:`` and an Airflow-style BMC connection,
park an idle node once it has been idle ``parking.idle_minutes`` beyond the warm buffer, and a
burst of pending demand on a later tick wakes it through its BMC before the tick decides, so the
decision counts it on its way and moves no node for the same shortage."""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from gpupool.actuation import handover as ho
from gpupool.actuation.power import machine as pm
from gpupool.config import parse_config
from gpupool.jobs.fastpath import run_fastpath
from gpupool.pipeline import Context
from gpupool.staging import power as store
from gpupool.staging.schema import inventory_node

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "actuation"))
from mempower import HeldSource  # noqa: E402

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=timezone.utc)
LAB = ("gpu-r01", "gpu-r02")
K8S = ("k1", "k2")


def _power_state(bmc, system: str) -> str:
    import requests

    r = requests.get(f"{bmc.url}/redfish/v1/Systems/{system}", auth=(bmc.user, bmc.password), timeout=10)
    r.raise_for_status()
    return r.json()["PowerState"]


def _settle(ctx, node: str, state: str, start: datetime, timeout: float = 40.0) -> None:
    """Carry the park or wake forward as the ticks would, the passes' clock with the wall's from
    ``start`` (a slow BMC is not taken for one that lost the command)."""
    acts = ctx.build_power_actuators(dry_run=False)
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        pm.advance_all(ctx.engine, acts, start + timedelta(seconds=1 + time.monotonic() - began), dry_run=False)
        if pm.power_of(ctx.engine, node) == state:
            return
        time.sleep(1.0)
    raise AssertionError(f"{node} not {state} after {timeout}s: {store.get_power(ctx.engine, node)}")


def test_the_fast_path_parks_an_idle_node_through_its_bmc_and_a_burst_wakes_it(redfish_bmc, sqlite_engine,
                                                                                 monkeypatch):
    bmc = redfish_bmc
    monkeypatch.setenv("AIRFLOW_CONN_BMC", json.dumps({"conn_type": "http", "login": bmc.user,
                                                       "password": bmc.password}))
    cfg = parse_config({
        "platforms": [{"name": "lab", "kind": "slurm", "conn_id": "lab", "actuation": True,
                       "power": {"means": "redfish", "bmc_address": bmc.url, "bmc_system": "/redfish/v1/Systems/{node}",
                                 "bmc_conn_id": "bmc"}},
                      {"name": "k8s", "kind": "kubernetes", "conn_id": "k8s", "actuation": True}],
        "parking": {"buffer": 0, "idle_minutes": 10}, "dry_run": False})
    ctx = Context(cfg, sqlite_engine)
    with sqlite_engine.begin() as conn:
        conn.execute(inventory_node.insert(), [
            {"platform": p, "node": n, "snapshot_at": T0 - timedelta(hours=1), "gpus": 8, "schedulable": True,
             "drain_reason": None, "busy_gpus": 8.0 if n in ("gpu-r01", "k1") else 0.0}
            for p, nodes in (("lab", LAB), ("k8s", K8S)) for n in nodes])

    def tick(at, pending=0.0, held=()):
        sources = {"lab": HeldSource("lab", LAB, {"gpu-r01"}, held, pending), "k8s": HeldSource("k8s", K8S, {"k1"})}
        return run_fastpath(ctx, at, dry_run=False, sources=sources, actuators={})

    for i in range(2):  # idle, but not yet for idle_minutes on the ticks' readings
        assert tick(T0 + timedelta(minutes=5 * i))["power"]["parks"] == []
    at = T0 + timedelta(minutes=10)
    out = tick(at)
    assert [(p["node"], p["action"]) for p in out["power"]["parks"]] == [("gpu-r02", "park")]
    _settle(ctx, "gpu-r02", pm.PARKED, at)
    assert _power_state(bmc, "gpu-r02") == "Off" and _power_state(bmc, "gpu-r01") == "On"
    assert [(a["action"], a["request"]["ResetType"]) for a in store.audit_rows(sqlite_engine, node="gpu-r02")] == [
        ("redfish_reset", "GracefulShutdown")]

    at += timedelta(minutes=5)
    out = tick(at, pending=8.0, held={"gpu-r02"})  # a burst: 8 GPUs pending on lab
    assert [w["node"] for w in out["power"]["wakes"]] == ["gpu-r02"]
    (lab,) = [d for d in out["decisions"] if d["platform"] == "lab"]
    assert "no shortage" in lab["reason"] and "on their way" in lab["reason"] and out["opened"] == []
    _settle(ctx, "gpu-r02", pm.ON, at)
    assert _power_state(bmc, "gpu-r02") == "On"
    assert [t["to_state"] for t in store.transitions(sqlite_engine, "gpu-r02") if not t["dry_run"]] == [
        "parking", "parked", "waking", "on"]
    assert [t["by"] for t in store.transitions(sqlite_engine, "gpu-r02")][::2] == ["fastpath", "fastpath"]
    assert ho.list_handovers(sqlite_engine) == []


def test_a_backfill_and_a_dry_run_send_nothing_to_the_bmc(redfish_bmc, sqlite_engine, monkeypatch):
    bmc = redfish_bmc
    monkeypatch.setenv("AIRFLOW_CONN_BMC", json.dumps({"conn_type": "http", "login": bmc.user,
                                                       "password": bmc.password}))
    cfg = parse_config({
        "platforms": [{"name": "lab", "kind": "slurm", "conn_id": "lab", "actuation": True,
                       "power": {"means": "redfish", "bmc_address": bmc.url, "bmc_system": "/redfish/v1/Systems/{node}",
                                 "bmc_conn_id": "bmc"}}],
        "parking": {"buffer": 0, "idle_minutes": 10}, "dry_run": False})
    ctx = Context(cfg, sqlite_engine)
    with sqlite_engine.begin() as conn:
        conn.execute(inventory_node.insert(), [
            {"platform": "lab", "node": n, "snapshot_at": T0 - timedelta(hours=1), "gpus": 8, "schedulable": True,
             "drain_reason": None, "busy_gpus": 8.0 if n == "gpu-r01" else 0.0} for n in LAB])
    for i in range(4):
        at = T0 + timedelta(minutes=5 * i)
        src = {"lab": HeldSource("lab", LAB, {"gpu-r01"})}
        out = run_fastpath(ctx, at, dry_run=True, sources=src, actuators={})
        back = run_fastpath(ctx, at + timedelta(days=30), backfill=True, sources=src, actuators={})
        assert back["power"]["backfill"] and back["power"]["parks"] == []
    assert [(p["node"], p["action"]) for p in out["power"]["parks"]] == [("gpu-r02", "would park")]
    assert store.audit_rows(sqlite_engine, node="gpu-r02")[0]["status"] == "dry_run"
    assert store.get_power(sqlite_engine, "gpu-r02") is None
    assert _power_state(bmc, "gpu-r02") == "On" and _power_state(bmc, "gpu-r01") == "On"
