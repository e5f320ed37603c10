"""Parking end to end: the `gpupool_fastpath` DAG, run by Airflow (`dag.test()`, one run per
5-minute logical date as the simulated clock reaches it), against the virtual datacenter served by
`gpupool sim serve` at a speed-up, with the Kubernetes platform's nodes behind BMCs (sushy-tools'
Redfish emulator, its fake driver) configured with `power:` and an Airflow-style BMC connection.

Kubernetes runs one node's work while its three other nodes sit idle: once idle
`parking.idle_minutes`, the ticks cordon them and power them off through their BMCs (beyond a
warm buffer of none). A burst then leaves pods Pending: the next tick wakes parked nodes before
it decides (and moves no node for what the wakes answer), their BMCs power them on, the
datacenter boots them, and once their kubelets are Ready the hold is lifted and the burst runs
on them, within the wake time plus one tick.

The datacenter follows the BMCs through datacenter.py's :class:`DatacenterBMC` (a node the BMC
powers off stops serving in the served world), the one thing this test adds to the product.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pandas as pd
import pytest
import yaml

import datacenter  # tests/e2e/, on sys.path by conftest.py

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from realservices import start_redfish  # noqa: E402

pytestmark = pytest.mark.slow

T0 = datetime(2026, 6, 1, tzinfo=timezone.utc)
NOW = T0 + timedelta(days=1)  # where the served clock starts
BURST = NOW + timedelta(minutes=30)  # kubernetes' demand jumps from 8 to 24 GPUs (one powered node holds 8)
SPEED = 15  # simulated seconds per wall second: a 5-minute tick every 20 s, a BMC's 1-11 s under 3 min
TICK = timedelta(minutes=5)
TICKS = 13  # NOW + 5 min .. NOW + 65 min: parks by +20, the burst at +30, wakes served by +55
BOOT_MINUTES = 3  # the datacenter's boot once a BMC has a node on
WAKE_MINUTES = 10  # parking.wake_minutes: what the rule plans a wake to take (BMC, boot, Ready)
K8S_NODES = ("k8s-gpu001", "k8s-gpu002", "k8s-gpu003", "k8s-gpu004")


def _scenario(tmp_path: Path) -> Path:
    idx = pd.date_range(T0, T0 + timedelta(days=2), freq="5min", inclusive="left")
    burst = idx >= pd.Timestamp(BURST)
    slurm = datacenter.write_trace(tmp_path / "slurm.csv", T0, [24.0] * len(idx), [0.0] * len(idx), 32)
    k8s = datacenter.write_trace(tmp_path / "kubernetes.csv", T0, [24.0 if b else 8.0 for b in burst],
                                 [0.0] * len(idx), 32)
    return datacenter.write_scenario(tmp_path, slurm, k8s, 15)


def _config(tmp_path: Path, bmc) -> Path:
    path = datacenter.write_config(tmp_path)
    cfg = yaml.safe_load(path.read_text())
    (k8s,) = [p for p in cfg["platforms"] if p["name"] == "kubernetes"]
    k8s["power"] = {"means": "redfish", "bmc_address": bmc.url, "bmc_system": "/redfish/v1/Systems/{node}",
                    "bmc_conn_id": "bmc_vdc", "power_off": "force",
                    # the deadline a busy test machine's slow runs must not reach; what is measured is
                    # when the burst runs, below
                    "timeout_minutes": 30}
    cfg["parking"] = {"buffer": 0, "idle_minutes": 10, "wake_minutes": WAKE_MINUTES}
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope="module")
def dag(dags_root, airflow_home, tmp_path_factory):
    """The fast-path DAG after one run on the embedded default (imports and serialization warm)."""
    return datacenter.warm_dag(dags_root, "gpupool_fastpath", tmp_path_factory.mktemp("warm"), NOW - TICK,
                               {"dry_run": True})


@pytest.fixture
def bmc():
    emu = start_redfish(K8S_NODES)
    yield emu
    emu.stop()


def test_idle_nodes_park_through_their_bmcs_and_a_burst_wakes_them_in_time(dag, bmc, tmp_path, monkeypatch,
                                                                          staging_url):
    from gpupool.actuation import handover as ho
    from gpupool.actuation.power import machine as pm
    from gpupool.staging import db
    from gpupool.staging import power as store

    served: dict[str, datetime] = {}  # node -> the first tick it runs work again after its wake
    with datacenter.serve(_scenario(tmp_path), NOW, SPEED) as urls:
        datacenter.connect(monkeypatch, tmp_path, urls)
        datacenter.provisioned(monkeypatch, urls["control"])
        datacenter.powered(monkeypatch, urls["control"], BOOT_MINUTES)
        monkeypatch.setenv("AIRFLOW_CONN_BMC_VDC", json.dumps({"conn_type": "http", "login": bmc.user,
                                                               "password": bmc.password}))
        monkeypatch.setenv("GPUPOOL_CONFIG", str(_config(tmp_path, bmc)))
        monkeypatch.setenv("GPUPOOL_STAGING_URL", staging_url)
        engine = db.make_engine(staging_url)
        db.upgrade(engine)
        datacenter.record_plan(engine, NOW, {"slurm": 24.0, "kubernetes": 8.0})
        powered_at: list[tuple[datetime, dict]] = []
        for k in range(1, TICKS + 1):
            at = NOW + k * TICK
            while datacenter.sim_now(urls) < at:
                time.sleep(0.2)
            run = dag.test(logical_date=at, run_conf={"dry_run": False})
            assert str(run.state).endswith("success"), (at, run.state)
            pool = datacenter.pool(urls["control"])
            powered_at.append((at, {n: (pool[n]["powered"], pool[n]["busy_gpus"]) for n in K8S_NODES}))
            for n in K8S_NODES:
                if at > BURST and pool[n]["powered"] and pool[n]["busy_gpus"] > 0:
                    served.setdefault(n, at)
        final = datacenter.pool(urls["control"])

    parks = [t for n in K8S_NODES for t in store.transitions(engine, n) if t["to_state"] == pm.PARKING]
    assert len(parks) == 3 and all(t["by"] == "fastpath" and not t["dry_run"] for t in parks), parks
    assert all(t["at"] < BURST for t in parks)  # the idle nodes parked before the burst
    off_before = [state for at, state in powered_at if at == BURST][0]
    assert sum(1 for on, _ in off_before.values() if not on) == 3, powered_at  # the datacenter had them off
    wakes = [t for n in K8S_NODES for t in store.transitions(engine, n) if t["to_state"] == pm.WAKING]
    # 24 GPUs wanted with 8 powered: at least two wakes; the rise carried over the wake time may want all three
    assert len(wakes) >= 2, wakes
    woke = min(t["at"] for t in wakes)
    assert BURST < woke <= BURST + 2 * TICK  # the tick that saw the burst's Pending pods (or the next)
    # the burst runs in full (24 GPUs on kubernetes' nodes) within the wake time plus one tick of the wakes
    whole = next(at for at, state in powered_at if at > BURST and sum(b for _, b in state.values()) >= 24)
    assert whole - woke <= timedelta(minutes=WAKE_MINUTES) + TICK, powered_at
    assert sum(1 for t in wakes if t["node"] in served) >= 2, (wakes, served)
    sent = {n: [(a["action"], a["request"].get("ResetType")) for a in store.audit_rows(engine, node=n)] for n in K8S_NODES}
    parked = {t["node"] for t in parks}
    for n in K8S_NODES:
        if n not in parked:  # the node with work: never touched
            assert sent[n] == [], sent
            continue
        # cordoned before its BMC powered it off (a reset the emulator had not applied 5 minutes on is sent
        # again: at this speed-up its 1-11 s are up to 5.5 simulated minutes), then on, then uncordoned
        assert sent[n][0] == ("cordon", None) and ("redfish_reset", "ForceOff") in sent[n], sent
        if any(t["node"] == n for t in wakes):
            assert sent[n][-2:] == [("redfish_reset", "On"), ("uncordon", None)], sent
    assert [(h.created_at, h.reason) for h in ho.list_handovers(engine) if not h.dry_run] == []  # the wakes answered it: no move
    assert all(final[n]["platform"] == "kubernetes" for n in K8S_NODES)
