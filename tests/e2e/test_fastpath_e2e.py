"""The fast path end to end: the `gpupool_fastpath` DAG, run by Airflow (`dag.test()`, one run
per 5-minute logical date as the simulated clock reaches it), against the virtual datacenter
served by `gpupool sim serve` at a speed-up, through the real sources and actuators of kind
slurm (Prometheus + slurmrestd, drain/resume through `scontrol`) and kubernetes (the API
server facade), with actuation on. A burst on slurm while kubernetes has idle nodes: the first
handover starts within 5 simulated minutes of the burst reaching the exporter and completes
within `move_minutes` + 5. With `dry_run` on, nothing reaches the platforms and the audit
shows what would have been sent.

Why `dag.test()` and not a scheduler: a scheduler's 5-minute cron runs on wall time, so a
simulated half hour would take a real half hour; the runs here are the DAG's own task, at the
logical dates the scheduler would give it, with the simulated clock as their time.

The datacenter between the platforms: in a real one a provisioning system (re-imaging,
re-registration) hands a node released by one platform to the next. Here the simulator's
control API plays it (`POST /sim/v1/nodes/{name}/move`: the node is in transit for the
scenario's `move_minutes`), wrapped around the target's real actuator by
:class:`ProvisionedActuator`, the one thing this test adds to what the product builds.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pandas as pd
import pytest
import requests
import sqlalchemy as sa
import yaml

from gpupool.allocate.actuators.base import REASON_PREFIX, ActuationError, Actuator, Command, OwnerState

pytestmark = pytest.mark.slow

T0 = datetime(2026, 6, 1, tzinfo=timezone.utc)
NOW = T0 + timedelta(days=1)  # where the served clock starts
BURST = NOW + timedelta(minutes=10)  # slurm's demand jumps from 24 to 48 GPUs (it holds 32)
MOVE_MINUTES = 15
SPEED = 60  # simulated seconds per wall second: a 5-minute tick every 5 s
TICK = timedelta(minutes=5)
TICKS = 7  # NOW + 5 min .. NOW + 35 min: the burst, and the move with a tick to spare


# ------------------------------------------------------------------------------ the datacenter


def _trace(path: Path, running: list[float], pending: list[float], total: float) -> Path:
    idx = pd.date_range(T0, T0 + timedelta(days=2), freq="5min", inclusive="left")
    pd.DataFrame({"time": idx.strftime("%Y-%m-%dT%H:%M:%SZ"), "running_gpu_num": running,
                  "pending_gpu_num": pending, "total_gpu_num": total}).to_csv(path, index=False)
    return path


def _scenario(tmp_path: Path) -> Path:
    idx = pd.date_range(T0, T0 + timedelta(days=2), freq="5min", inclusive="left")
    burst = idx >= pd.Timestamp(BURST)
    slurm = _trace(tmp_path / "slurm.csv", [32.0 if b else 24.0 for b in burst], [16.0 if b else 0.0 for b in burst], 32)
    k8s = _trace(tmp_path / "kubernetes.csv", [8.0] * len(idx), [0.0] * len(idx), 32)
    spec = {"step": "5min", "decision_every": "1h", "node_gpus": 8, "move_minutes": MOVE_MINUTES,
            "max_moves_per_decision": 4, "seed": 11,
            "platforms": {"slurm": {"trace": str(slurm), "nodes": 4},
                          "kubernetes": {"trace": str(k8s), "nodes": 4, "gpu_model": "NVIDIA H100 80GB HBM3"}}}
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _config(tmp_path: Path) -> Path:
    cfg = {
        "step": "5min", "dry_run": False,
        "platforms": [
            {"name": "slurm", "kind": "slurm", "conn_id": "prometheus_vdc", "min_nodes": 1, "actuation": True,
             "prometheus_match": {"cluster": "slurm"}},
            {"name": "kubernetes", "kind": "kubernetes", "conn_id": "kubernetes_vdc", "min_nodes": 1,
             "actuation": True, "prometheus_match": {"cluster": "kubernetes"},
             "metrics": {  # as config/compose/platforms.yaml: the facade exports DCGM, no kube-state-metrics
                 "gpu_capacity": {"expr": "count by (Hostname) (DCGM_FI_DEV_GPU_UTIL)", "entity_kind": "node",
                                  "entity": "{Hostname}", "node_label": "Hostname"},
                 "gpu_allocated": {"expr": 'count by (Hostname) (DCGM_FI_DEV_GPU_UTIL{pod!=""})',
                                   "entity_kind": "node", "entity": "{Hostname}", "node_label": "Hostname"},
                 "gpu_pending": None}},
        ],
    }
    path = tmp_path / "platforms.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _connect(monkeypatch, tmp_path: Path, urls: dict) -> None:
    """The connections a deployment would define, and `scontrol` as the Slurm actuator runs it."""
    bin_dir = tmp_path / "slurm-bin"
    bin_dir.mkdir(exist_ok=True)
    shim = bin_dir / "scontrol"
    shim.write_text(f"#!/bin/sh\nGPUPOOL_SIM_SLURMRESTD_URL={urls['slurmrestd']} "
                    f"exec {sys.executable} -m gpupool.emulator.scontrol \"$@\"\n")
    shim.chmod(0o755)
    (tmp_path / "slurm.conf").write_text("# the simulated cluster: scontrol reads slurmrestd\n")
    monkeypatch.setenv("AIRFLOW_CONN_PROMETHEUS_VDC", json.dumps(
        {"conn_type": "http", "host": urls["prometheus"],
         "extra": {"restd_url": urls["slurmrestd"], "live_tolerance_minutes": None,
                   "slurm_conf": str(tmp_path / "slurm.conf"), "bin_dir": str(bin_dir)}}))
    monkeypatch.setenv("AIRFLOW_CONN_KUBERNETES_VDC", json.dumps(
        {"conn_type": "http", "host": urls["kubernetes"], "extra": {"prometheus_url": urls["prometheus"]}}))


class ProvisionedActuator(Actuator):
    """A platform's real actuator, with the datacenter's provisioning in front of its attach.

    A node released elsewhere is not known here until provisioning brings it: attach first asks
    the simulator's control API to move it (``provision``), then, once it has arrived, sends the
    platform's own attach commands (resume / uncordon where it arrives held)."""

    attach_brings_node = True

    def __init__(self, inner: Actuator, control_url: str):
        self.inner, self.control = inner, control_url.rstrip("/")

    @property
    def platform(self) -> str:  # type: ignore[override]
        return self.inner.platform

    @property
    def can_evict(self) -> bool:  # type: ignore[override]
        return self.inner.can_evict

    def _pool_entry(self, node: str) -> dict:
        nodes = requests.get(f"{self.control}/sim/v1/pool", timeout=10).json()["nodes"]
        return next(n for n in nodes if n["name"] == node)

    def owner_state(self, node: str) -> OwnerState:
        st = self.inner.owner_state(node)
        if st.present:
            return st
        e = self._pool_entry(node)
        if e["in_transit"] and e["platform"] == self.platform:
            return OwnerState(self.platform, node, present=True, schedulable=False,
                              hold_reason=f"{REASON_PREFIX} arriving in {e['available_in_minutes']:.0f} min")
        return st

    def is_released(self, node: str) -> bool:
        return self.inner.is_released(node)

    def release_commands(self, node: str, reason: str) -> list[Command]:
        return self.inner.release_commands(node, reason)

    def evict_commands(self, node: str) -> list[Command]:
        return self.inner.evict_commands(node)

    def prepare_commands(self, node, mig_layout):
        return self.inner.prepare_commands(node, mig_layout)

    def is_prepared(self, node, mig_layout) -> bool:
        return self.inner.is_prepared(node, mig_layout)

    def attach_commands(self, node: str) -> list[Command]:
        if self.inner.owner_state(node).present:
            return self.inner.attach_commands(node)
        if self._pool_entry(node)["in_transit"]:
            return []  # provisioning is bringing it
        return [Command(self.platform, node, "provision", {"move": node, "to": self.platform})]

    def send(self, command: Command):
        if command.action != "provision":
            return self.inner.send(command)
        r = requests.post(f"{self.control}/sim/v1/nodes/{command.node}/move", json={"to": self.platform}, timeout=10)
        if r.status_code != 202:
            raise ActuationError(self.platform, command.node, "provision", f"HTTP {r.status_code}: {r.text[:200]}")
        return r.json()


def _provisioned(monkeypatch, control_url: str) -> None:
    from gpupool import pipeline

    built = pipeline.Context.build_actuators

    def build_actuators(self, platforms=None, lookup=None):
        return {p: ProvisionedActuator(a, control_url) for p, a in built(self, platforms, lookup=lookup).items()}

    monkeypatch.setattr(pipeline.Context, "build_actuators", build_actuators)


def _plan(engine, at: datetime) -> None:
    """An hourly plan that lets both lend (it reserves nothing and moves nothing)."""
    from gpupool.staging.schema import allocation_plan

    with engine.begin() as conn:
        conn.execute(allocation_plan.insert().values(
            decided_at=at, policy="predictive", solver="milp", dry_run=False, moves=[],
            summary={"platforms": {"slurm": {"demand_upper": [0.0]}, "kubernetes": {"demand_upper": [0.0]}}}))


def _dag(dags_root: Path):
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(dags_root / "dags" / "gpupool_fastpath.py")).dags["gpupool_fastpath"]


def _tick(dag, at: datetime, dry_run: bool) -> None:
    run = dag.test(logical_date=at, run_conf={"dry_run": dry_run})
    assert str(run.state).endswith("success"), (at, run.state)


@pytest.fixture(scope="module")
def dag(dags_root, airflow_home, tmp_path_factory):
    """The fast-path DAG after one run on the embedded default, so the timed runs below start
    warm (imports, the DAG's serialization in Airflow's database) while the served clock runs."""
    dag = _dag(dags_root)
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("GPUPOOL_CONFIG", raising=False)
        mp.setenv("GPUPOOL_STAGING_URL", f"sqlite:///{tmp_path_factory.mktemp('warm') / 'staging.db'}")
        _tick(dag, NOW - TICK, dry_run=True)
    return dag


@contextlib.contextmanager
def _vdc(tmp_path: Path, start_at: datetime):
    """`gpupool sim serve` at a speed-up, on ephemeral ports, as its own process; its clock
    starts at ``start_at`` when it starts serving. Yields the facades' URLs."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpupool.cli", "sim", "serve", str(_scenario(tmp_path)), "--speed", str(SPEED),
         "--start-at", start_at.isoformat(),
         *[a for name in ("prometheus", "kubernetes", "openstack", "slurm", "control") for a in (f"--{name}-port", "0")]],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        if not line:
            pytest.fail(f"gpupool sim serve did not start: {proc.stderr.read()[-2000:]}")
        yield json.loads(line)["urls"]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _sim_now(urls) -> datetime:
    return pd.Timestamp(requests.get(f"{urls['control']}/sim/v1/clock", timeout=10).json()["now"]).to_pydatetime()


def _deployment(monkeypatch, tmp_path: Path, urls: dict, staging_url: str):
    """Connections, configuration and staging (with an hourly plan) as a deployment has them."""
    from gpupool.staging import db

    _connect(monkeypatch, tmp_path, urls)
    _provisioned(monkeypatch, urls["control"])
    monkeypatch.setenv("GPUPOOL_CONFIG", str(_config(tmp_path)))
    monkeypatch.setenv("GPUPOOL_STAGING_URL", staging_url)
    engine = db.make_engine(staging_url)
    db.upgrade(engine)
    _plan(engine, NOW)
    return engine


def _pool(urls) -> dict[str, dict]:
    return {n["name"]: n for n in requests.get(f"{urls['control']}/sim/v1/pool", timeout=10).json()["nodes"]}


def test_a_burst_is_answered_within_minutes(dag, tmp_path, monkeypatch, staging_url):
    from gpupool.allocate import handover as ho
    from gpupool.config import load_config
    from gpupool.platforms import build_source
    from gpupool.sources.prometheus import as_query_tuple
    from gpupool.staging import fastpath as store

    with _vdc(tmp_path, NOW) as urls:
        engine = _deployment(monkeypatch, tmp_path, urls, staging_url)
        for k in range(1, TICKS + 1):
            at = NOW + k * TICK
            while _sim_now(urls) < at:  # the run for a logical date starts once the clock reached it
                time.sleep(0.2)
            _tick(dag, at, dry_run=False)
            lag = _sim_now(urls) - at
            # a run that ends later than the next logical date measures the test's host, not gpupool
            assert lag <= TICK, f"the run for {at} ended {lag} after it: the runs fell behind the simulated clock"

        # when the burst reached telemetry: the first minute the exporter's pending GPUs show it,
        # asked as slurm's pressure() asks
        cfg = load_config(os.environ["GPUPOOL_CONFIG"])
        slurm = build_source(cfg.platform("slurm"), cfg)
        expr = f"sum({as_query_tuple(slurm.queries['gpu_pending'])[0].expr})"
        minutes = [NOW + timedelta(minutes=m) for m in range(0, 30)]
        seen = next(t for t in minutes if (slurm._prom.instant_sum(expr, t, "gpu_pending") or 0) > 0)
        pool = _pool(urls)
    assert seen >= BURST

    live = [h for h in ho.list_handovers(engine) if not h.dry_run]
    assert live, store.recent_decisions(engine, 20)
    first = min(live, key=lambda h: h.created_at)
    assert (first.from_platform, first.to_platform) == ("kubernetes", "slurm")
    assert first.created_at - seen <= timedelta(minutes=5), (first.created_at, seen)
    assert first.state == ho.DONE, first
    assert first.updated_at - first.created_at <= timedelta(minutes=MOVE_MINUTES + 5), first
    sent = [(r["platform"], r["action"], r["status"]) for r in ho.audit_rows(engine, first.id)]
    assert ("kubernetes", "cordon", "ok") in sent and ("slurm", "provision", "ok") in sent
    assert pool[first.node]["platform"] == "slurm" and pool[first.node]["schedulable"]
    (move,) = [r for r in store.recent_decisions(engine, 50, moves_only=True) if r["handover_id"] == first.id]
    assert not move["dry_run"] and "short" in move["reason"]


def test_dry_run_sends_nothing_and_audits_what_it_would(dag, tmp_path, monkeypatch, staging_url):
    from gpupool.allocate import handover as ho
    from gpupool.staging.schema import action_audit

    at = BURST + 2 * TICK
    with _vdc(tmp_path, at) as urls:
        engine = _deployment(monkeypatch, tmp_path, urls, staging_url)
        before = _pool(urls)
        _tick(dag, at, dry_run=True)
        after = _pool(urls)

    (h,) = ho.list_handovers(engine)
    assert h.dry_run and h.state == ho.DONE and (h.from_platform, h.to_platform) == ("kubernetes", "slurm")
    rows = ho.audit_rows(engine, h.id)
    assert rows and all(r["status"] == "dry_run" and r["dry_run"] for r in rows)
    assert {r["platform"] for r in rows} == {"kubernetes", "slurm"}  # the release and the attach it would send

    def held(pool):
        return {n: (e["platform"], e["schedulable"], e["drain_reason"]) for n, e in pool.items()}

    assert held(after) == held(before)  # nothing reached the platforms
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(action_audit)
                            .where(action_audit.c.dry_run.is_(False))).scalar() == 0
