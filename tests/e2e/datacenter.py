"""The virtual datacenter as the end-to-end tests drive it: `gpupool sim serve` at a speed-up as
its own process, the connections and `scontrol` a deployment of kinds slurm and kubernetes has
against it, and the provisioning between platforms (:class:`ProvisionedActuator`).

Not a test module (pytest collects only test_*.py): tests/e2e/conftest.py puts this directory on
sys.path. test_fastpath_e2e.py and test_handover_maintenance_dags.py share it.

The datacenter between the platforms: in a real one a provisioning system (re-imaging,
re-registration) hands a node released by one platform to the next. Here the simulator's
control API plays it (`POST /sim/v1/nodes/{name}/move`: the node is in transit for the
scenario's `move_minutes`), wrapped around the target's real actuator by
:class:`ProvisionedActuator`, the one thing these tests add to what the product builds.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pandas as pd
import pytest
import requests
import yaml

from gpupool.actuation.actuators.base import REASON_PREFIX, ActuationError, Actuator, Command, OwnerState
from gpupool.actuation.power.base import OFF as POWER_OFF, ON as POWER_ON, PowerActuator, PowerReading


def write_trace(path: Path, start: datetime, running: list[float], pending: list[float], total: float) -> Path:
    """A 5-minute demand trace of two days from ``start`` (the simulator's CSV columns)."""
    idx = pd.date_range(start, start + timedelta(days=2), freq="5min", inclusive="left")
    pd.DataFrame({"time": idx.strftime("%Y-%m-%dT%H:%M:%SZ"), "running_gpu_num": running,
                  "pending_gpu_num": pending, "total_gpu_num": total}).to_csv(path, index=False)
    return path


def write_scenario(tmp_path: Path, slurm: Path, kubernetes: Path, move_minutes: int) -> Path:
    """The two-platform scenario the e2e tests serve: slurm and kubernetes, four 8-GPU nodes each
    (kubernetes' H100s), from the traces ``slurm`` and ``kubernetes`` (:func:`write_trace`)."""
    spec = {"step": "5min", "decision_every": "1h", "node_gpus": 8, "move_minutes": move_minutes,
            "max_moves_per_decision": 4, "seed": 11,
            "platforms": {"slurm": {"trace": str(slurm), "nodes": 4},
                          "kubernetes": {"trace": str(kubernetes), "nodes": 4, "gpu_model": "NVIDIA H100 80GB HBM3"}}}
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def write_config(tmp_path: Path) -> Path:
    """platforms.yaml of a deployment with slurm and kubernetes, both actuating, dry_run off."""
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


def warm_dag(dags_root: Path, dag_id: str, warm_dir: Path, at: datetime, run_conf: dict | None = None):
    """DAG ``dag_id`` (``dags/<dag_id>.py``) after one run at ``at`` on the embedded default (no
    GPUPOOL_CONFIG, a staging file in ``warm_dir``), so the timed runs of a test start warm
    (imports, the DAG's serialization in Airflow's database) while the served clock runs."""
    from airflow.dag_processing.dagbag import DagBag

    dag = DagBag(dag_folder=str(dags_root / "dags" / f"{dag_id}.py")).dags[dag_id]
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("GPUPOOL_CONFIG", raising=False)
        mp.setenv("GPUPOOL_STAGING_URL", f"sqlite:///{warm_dir / 'staging.db'}")
        run = dag.test(logical_date=at, run_conf=run_conf) if run_conf is not None else dag.test(logical_date=at)
        assert str(run.state).endswith("success"), (dag_id, at, run.state)
    return dag


def record_plan(engine, at: datetime, upper: dict[str, float] | None = None) -> None:
    """An hourly plan in staging that lets every platform lend (it reserves nothing and moves
    nothing): the plan the fast path's tick reads; ``upper``: each platform's demand bound."""
    from gpupool.staging.schema import allocation_plan

    bounds = {"slurm": 0.0, "kubernetes": 0.0, **(upper or {})}
    with engine.begin() as conn:
        conn.execute(allocation_plan.insert().values(
            decided_at=at, policy="predictive", solver="milp", dry_run=False, moves=[],
            summary={"platforms": {p: {"demand_upper": [v]} for p, v in bounds.items()}}))


def connect(monkeypatch, tmp_path: Path, urls: dict) -> None:
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
        return pool(self.control)[node]

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

    def work_started(self, node: str):
        """When the work on ``node`` began, as the platform's own actuator reads it (a reclaim
        ends borrowed work only once it ran its owner's ``min_runtime_minutes``)."""
        return self.inner.work_started(node)

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


class DatacenterBMC(PowerActuator):
    """A platform's real power actuator (its BMCs are sushy-tools' Redfish emulator), with the
    datacenter following the BMCs: a node whose BMC reads Off is powered off in the served world
    (it serves nobody; its Kubernetes node goes NotReady), and one whose BMC reads On again boots
    there, serving (and Ready) the scenario's ``parking.wake_minutes`` later. The BMC emulator
    keeps power state in memory and nothing else; this is the one link between the two."""

    def __init__(self, inner: PowerActuator, control_url: str, boot_minutes: float | None = None):
        super().__init__(inner.names)
        self.inner, self.control, self.boot_minutes = inner, control_url.rstrip("/"), boot_minutes
        self.platform, self.means, self.actions = inner.platform, inner.means, inner.actions

    def _follow(self, node: str, reading: PowerReading) -> None:
        if reading.present and reading.power in (POWER_OFF, POWER_ON):
            entry = pool(self.control).get(node)
            if entry is not None and entry["powered"] != (reading.power == POWER_ON):
                body = {"on": reading.power == POWER_ON}
                if self.boot_minutes is not None:
                    body["minutes"] = self.boot_minutes
                requests.post(f"{self.control}/sim/v1/nodes/{node}/power", json=body,
                              timeout=10)  # a 409 (work on it) is read again on the next pass

    def state(self, node: str) -> PowerReading:
        reading = self.inner.state(node)  # a Kubernetes node's hold reads Ready from the booted datacenter
        self._follow(node, reading)
        return reading

    def park_commands(self, node: str) -> list[Command]:
        return self.inner.park_commands(node)

    def wake_commands(self, node: str) -> list[Command]:
        return self.inner.wake_commands(node)

    def send(self, command: Command):
        out = self.inner.send(command)
        if command.action == "redfish_reset":
            self._follow(command.node, self.inner.state(command.node))
        return out


def powered(monkeypatch, control_url: str, boot_minutes: float | None = None) -> None:
    """Every power actuator the product builds gets the datacenter following its BMCs."""
    from gpupool import pipeline

    built = pipeline.Context.build_power_actuators

    def build_power_actuators(self, platforms=None, dry_run=True, lookup=None):
        return {p: DatacenterBMC(a, control_url, boot_minutes)
                for p, a in built(self, platforms, dry_run=dry_run, lookup=lookup).items()}

    monkeypatch.setattr(pipeline.Context, "build_power_actuators", build_power_actuators)


def provisioned(monkeypatch, control_url: str) -> None:
    """Every actuator the product builds gets the datacenter's provisioning in front of it."""
    from gpupool import pipeline

    built = pipeline.Context.build_actuators

    def build_actuators(self, platforms=None, lookup=None):
        return {p: ProvisionedActuator(a, control_url) for p, a in built(self, platforms, lookup=lookup).items()}

    monkeypatch.setattr(pipeline.Context, "build_actuators", build_actuators)


@contextlib.contextmanager
def serve(scenario: Path, start_at: datetime, speed: float) -> Iterator[dict]:
    """`gpupool sim serve` at a speed-up, on ephemeral ports, as its own process; its clock
    starts at ``start_at`` when it starts serving. Yields the facades' URLs."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpupool.cli", "sim", "serve", str(scenario), "--speed", str(speed),
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


def sim_now(urls: dict) -> datetime:
    """The served clock."""
    return pd.Timestamp(requests.get(f"{urls['control']}/sim/v1/clock", timeout=10).json()["now"]).to_pydatetime()


def pool(control_url: str) -> dict[str, dict]:
    """Every node of the datacenter by name: owner, schedulable, drain reason, work, transit."""
    nodes = requests.get(f"{control_url.rstrip('/')}/sim/v1/pool", timeout=10).json()["nodes"]
    return {n["name"]: n for n in nodes}
