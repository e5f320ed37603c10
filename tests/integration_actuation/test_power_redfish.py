"""Parking through Redfish against sushy-tools' BMC emulator (its fake systems driver, started on
loopback per test, basic auth), with ``sushy`` as the client: a bare node powered off and on
through the state machine; a Kubernetes node (kmock's emulated API server) cordoned before its
BMC powers it off, and uncordoned only once its kubelet reports Ready again, built from a
platform's ``power:`` configuration and Airflow-style connections."""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta, timezone

import pytest
import requests

from gpupool.actuation.power import machine as pm
from gpupool.actuation.power.base import PARK_REASON
from gpupool.platforms import build_power_actuators
from gpupool.actuation.power.holds import HeldPower
from gpupool.actuation.power.redfish import RedfishPower
from gpupool.actuation.actuators.kubernetes import HOLD_ANNOTATION, OWNER_LABEL
from gpupool.config import parse_config
from gpupool.staging import power as store

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=timezone.utc)
SYSTEM = "/redfish/v1/Systems/{node}"


def _power_state(bmc, system: str) -> str:
    """What the BMC itself says, read without sushy."""
    r = requests.get(f"{bmc.url}/redfish/v1/Systems/{system}", auth=(bmc.user, bmc.password), timeout=10)
    r.raise_for_status()
    return r.json()["PowerState"]


def _until(engine, actuators, node: str, state: str, start: datetime = T0, timeout: float = 40.0,
           each=None) -> None:
    """Advance the state machine (as the fast path's ticks would) until ``node`` is ``state``;
    the fake driver applies a power change 1 to 11 s after it was asked. The passes' clock runs
    with the wall clock from ``start`` (the time of the park or wake), so a BMC slowed by a busy
    machine is never taken for one that lost the command (which the machine sends again)."""
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        at = start + timedelta(seconds=1 + time.monotonic() - began)
        pm.advance_all(engine, actuators, at, dry_run=False)
        if pm.power_of(engine, node) == state:
            return
        if each is not None:
            each()
        time.sleep(1.0)
    raise AssertionError(f"{node} not {state} after {timeout}s: {store.get_power(engine, node)}")


def test_park_and_wake_a_node_through_its_bmc(redfish_bmc, sqlite_engine):
    bmc = redfish_bmc
    act = RedfishPower("lab", bmc.url, SYSTEM, username=bmc.user, password=bmc.password)
    assert act.state("gpu-r01").power == "on"
    out = pm.park(sqlite_engine, "gpu-r01", "lab", act, T0, dry_run=False, by="operator")
    assert out["state"] in (pm.PARKING, pm.PARKED)
    [row] = store.audit_rows(sqlite_engine, node="gpu-r01")
    assert (row["action"], row["status"], row["request"]["ResetType"]) == ("redfish_reset", "ok", "GracefulShutdown")
    _until(sqlite_engine, {"lab": act}, "gpu-r01", pm.PARKED)
    assert _power_state(bmc, "gpu-r01") == "Off" and _power_state(bmc, "gpu-r02") == "On"

    pm.wake(sqlite_engine, "gpu-r01", act, T0 + timedelta(hours=1), dry_run=False, by="fastpath")
    _until(sqlite_engine, {"lab": act}, "gpu-r01", pm.ON, start=T0 + timedelta(hours=1))
    assert _power_state(bmc, "gpu-r01") == "On"
    assert [(a["action"], a["request"]["ResetType"], a["status"]) for a in store.audit_rows(sqlite_engine, node="gpu-r01")] == [
        ("redfish_reset", "GracefulShutdown", "ok"), ("redfish_reset", "On", "ok")]
    assert [t["to_state"] for t in store.transitions(sqlite_engine, "gpu-r01")] == ["parking", "parked", "waking", "on"]


def test_a_bmc_that_refuses_the_user_is_an_error_retried_with_nothing_sent(redfish_bmc, sqlite_engine):
    bmc = redfish_bmc
    act = RedfishPower("lab", bmc.url, SYSTEM, username=bmc.user, password="not-the-password")
    out = pm.park(sqlite_engine, "gpu-r02", "lab", act, T0, dry_run=False)
    assert out["state"] == pm.PARKING and out["error"].startswith("will retry:") and "401" in out["error"]
    assert "not-the-password" not in out["error"]
    assert store.audit_rows(sqlite_engine, node="gpu-r02") == []
    assert _power_state(bmc, "gpu-r02") == "On"
    missing = RedfishPower("lab", bmc.url, SYSTEM, username=bmc.user, password=bmc.password)
    assert missing.state("gpu-nope").present is False


def _k8s_node(name: str, ready: bool) -> dict:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {OWNER_LABEL: "kubernetes"}}, "spec": {},
            "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def _gpu_pod(name: str, node: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "ml"},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x",
                                                       "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Running"}}


@pytest.fixture
def k8s_platform(kube, redfish_bmc, monkeypatch):
    """A Kubernetes platform whose node gpu-k01 (``k8s-node-k01`` to Kubernetes) has a BMC,
    configured with ``power:``; the connections are Airflow-style ``AIRFLOW_CONN_*``."""
    kube.put("nodes", None, "k8s-node-k01", _k8s_node("k8s-node-k01", ready=True))
    exporter = _gpu_pod("dcgm-k01", "k8s-node-k01")  # a DaemonSet's pod: it never holds a park back
    exporter["metadata"].update(namespace="kube-system", ownerReferences=[
        {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "dcgm", "uid": "u1"}])
    kube.put("pods", "kube-system", "dcgm-k01", exporter)
    host, port = kube.url.split("://", 1)[1].rsplit(":", 1)
    env = {"AIRFLOW_CONN_K8S": json.dumps({"conn_type": "http", "host": host, "port": int(port),
                                           "extra": {"scheme": "http", "verify": False}}),
           "AIRFLOW_CONN_BMC": json.dumps({"conn_type": "http", "login": redfish_bmc.user,
                                           "password": redfish_bmc.password})}
    cfg = parse_config({
        "platforms": [{"name": "kubernetes", "kind": "kubernetes", "conn_id": "k8s", "actuation": True,
                       "power": {"means": "redfish", "bmc_address": redfish_bmc.url, "bmc_system": SYSTEM,
                                 "bmc_conn_id": "bmc", "power_off": "force"}}],
        "pool": {"nodes": [{"node": "gpu-k01", "gpus": 8, "names": {"kubernetes": "k8s-node-k01"}}]},
        "dry_run": False})
    acts = build_power_actuators(cfg, dry_run=False, env=env)
    assert isinstance(acts["kubernetes"], HeldPower) and acts["kubernetes"].means == "kubernetes+redfish"
    assert build_power_actuators(cfg, dry_run=True, env=env) == {}  # a dry run builds none: nothing is sent
    return kube, redfish_bmc, acts


def test_a_kubernetes_node_is_cordoned_before_power_off_and_uncordoned_when_ready(k8s_platform, sqlite_engine):
    kube, bmc, acts = k8s_platform
    kube.put("pods", "ml", "train-0", _gpu_pod("train-0", "k8s-node-k01"))
    out = pm.park(sqlite_engine, "gpu-k01", "kubernetes", acts["kubernetes"], T0, dry_run=False, by="plan")
    assert out["state"] == pm.PARKING and "1 unit(s) of work" in out["error"]
    node = kube.get("nodes", None, "k8s-node-k01")
    assert node["spec"]["unschedulable"] is True
    assert node["metadata"]["annotations"][HOLD_ANNOTATION] == PARK_REASON
    assert node["metadata"]["labels"][OWNER_LABEL] == "kubernetes"  # it still belongs here: it wakes here
    assert [a["action"] for a in store.audit_rows(sqlite_engine, node="gpu-k01")] == ["cordon"]
    assert _power_state(bmc, "gpu-k01") == "On"  # work on it: not powered off

    kube.patch("pods", "ml", "train-0", {"status": {"phase": "Succeeded"}})  # the job ends
    _until(sqlite_engine, acts, "gpu-k01", pm.PARKED)
    assert _power_state(bmc, "gpu-k01") == "Off"
    assert [(a["action"], a["request"].get("ResetType")) for a in store.audit_rows(sqlite_engine, node="gpu-k01")] == [
        ("cordon", None), ("redfish_reset", "ForceOff")]
    kube.patch("nodes", None, "k8s-node-k01", {"status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}})

    pm.wake(sqlite_engine, "gpu-k01", acts["kubernetes"], T0 + timedelta(hours=2), dry_run=False, by="fastpath")
    ready = []

    def kubelet():  # once the BMC has it on, the kubelet comes back a little later
        if _power_state(bmc, "gpu-k01") == "On":
            ready.append(True)
            if len(ready) == 2:
                kube.patch("nodes", None, "k8s-node-k01",
                           {"status": {"conditions": [{"type": "Ready", "status": "True"}]}})

    _until(sqlite_engine, acts, "gpu-k01", pm.ON, start=T0 + timedelta(hours=2), each=kubelet)
    assert len(ready) >= 2  # on and not Ready yet: the node stayed cordoned meanwhile
    node = kube.get("nodes", None, "k8s-node-k01")
    assert not node["spec"].get("unschedulable") and HOLD_ANNOTATION not in (node["metadata"].get("annotations") or {})
    assert [a["action"] for a in store.audit_rows(sqlite_engine, node="gpu-k01")] == [
        "cordon", "redfish_reset", "redfish_reset", "uncordon"]


def test_someone_elses_cordon_is_never_parked_nor_lifted(k8s_platform, sqlite_engine):
    kube, bmc, acts = k8s_platform
    kube.patch("nodes", None, "k8s-node-k01", {"spec": {"unschedulable": True}})  # kubectl cordon by an operator
    out = pm.park(sqlite_engine, "gpu-k01", "kubernetes", acts["kubernetes"], T0, dry_run=False)
    assert out["state"] == pm.ON and "park given up" in out["error"], out
    assert store.audit_rows(sqlite_engine, node="gpu-k01") == [] and _power_state(bmc, "gpu-k01") == "On"
    assert kube.get("nodes", None, "k8s-node-k01")["spec"]["unschedulable"] is True
