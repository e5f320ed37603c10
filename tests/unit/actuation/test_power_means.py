"""The pure parts of parking: the ``power:`` keys, which parks are live, what a reading means,
the BMC address patterns, and the Ironic means' calls to openstacksdk's bare-metal API (there is
no Ironic server here: a stand-in connection records the calls and answers as the SDK's Node
objects do)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest

from gpupool.actuation.power import machine as pm
from gpupool.actuation.power.base import ForeignHoldError, PowerReading, short
from gpupool.platforms import is_live, pool_names
from gpupool.actuation.power.ironic import IronicPower
from gpupool.actuation.power.redfish import RedfishPower
from gpupool.config import ConfigError, parse_config
from gpupool.staging import power as store

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=timezone.utc)


def _cfg(power, kind="kubernetes", **more):
    return parse_config({"platforms": [{"name": "p1", "kind": kind, "conn_id": "c1", "power": power, **more}]})


def test_power_keys_per_means():
    p = _cfg({"means": "redfish", "bmc_address": "https://{name}-bmc", "bmc_conn_id": "bmc"}).platforms[0].power
    assert (p.power_off, p.bmc_verify, p.timeout_minutes, p.bmc_system) == ("graceful", True, 15.0, None)
    assert _cfg({"means": "slurm"}, kind="slurm").platforms[0].power.means == "slurm"
    assert _cfg({"means": "ironic"}, kind="openstack").platforms[0].power.ironic_node == "{name}"
    assert _cfg(None).platforms[0].power is None


@pytest.mark.parametrize("power, kind, message", [
    ({"means": "redfish", "bmc_address": "https://x"}, "kubernetes", "needs bmc_address and bmc_conn_id"),
    ({"means": "slurm"}, "kubernetes", "slurm cannot park the nodes of a kubernetes platform"),
    ({"means": "ironic"}, "slurm", "ironic cannot park the nodes of a slurm platform"),
    ({"means": "slurm", "bmc_conn_id": "b"}, "slurm", r"bmc_\* keys are for means redfish"),
    ({"means": "ipmi"}, "slurm", "power.means"),
    ({"means": "slurm", "power_off": "soft"}, "slurm", "power.power_off"),
    ({"means": "slurm", "wake_minutes": 3}, "slurm", "wake_minutes"),
])
def test_bad_power_keys_are_one_clear_error(power, kind, message):
    with pytest.raises(ConfigError, match=message) as err:
        _cfg(power, kind=kind)
    assert "\n" not in str(err.value) and "platforms[p1]" in str(err.value)


def test_only_an_actuating_platform_outside_a_dry_run_parks_for_real():
    raw = {"platforms": [{"name": "s", "kind": "slurm", "conn_id": "c", "actuation": True, "power": {"means": "slurm"}},
                         {"name": "k", "kind": "kubernetes", "conn_id": "c", "actuation": False,
                          "power": {"means": "redfish", "bmc_address": "x", "bmc_conn_id": "b"}},
                         {"name": "o", "kind": "openstack", "conn_id": "c", "actuation": True}],
           "pool": {"nodes": [{"node": "n1", "gpus": 8, "names": {"s": "slurm-n1"}}]}}
    live = parse_config({**raw, "dry_run": False})
    assert [p.name for p in live.platforms if is_live(live, p, dry_run=False)] == ["s"]
    assert not any(is_live(live, p, dry_run=True) for p in live.platforms)
    dry = parse_config(raw)  # dry_run: true is the default
    assert not any(is_live(dry, p, dry_run=False) for p in dry.platforms)
    assert pool_names(live, "s") == {"n1": "slurm-n1"} and pool_names(live, "k") == {}


@pytest.mark.parametrize("power, ready, held, state", [
    ("off", False, True, "parked"), ("powering_off", False, True, "parking"), ("on", False, True, "parking"),
    ("powering_on", False, False, "waking"), ("on", False, False, "waking"), ("on", True, False, "on"),
])
def test_what_a_reading_alone_suggests(power, ready, held, state):
    r = PowerReading("p", "n", True, power, ready=ready, held=held)
    assert r.state == state
    assert r.parked == (power == "off") and r.woken == (state == "on")


def test_an_answer_quoted_in_an_error_is_one_short_line():
    assert short("a\nb\x1b[31m" + "x" * 500, 40) == "a\\nb\\x1b[31m" + "x" * 27 + "…"


def test_bmc_address_patterns_take_the_pool_id_and_the_platform_name():
    act = RedfishPower("k", "https://{name}-bmc.mgmt", "/redfish/v1/Systems/{node}", names={"gpu-1": "k8s-1"})
    assert act.where("gpu-1") == ("https://k8s-1-bmc.mgmt", "/redfish/v1/Systems/gpu-1")
    assert RedfishPower("k", "https://{node}.bmc").where("gpu-2") == ("https://gpu-2.bmc", None)
    with pytest.raises(ValueError, match="power_off"):
        RedfishPower("k", "x", power_off="soft")


class FakeBaremetal:
    """What openstacksdk's bare-metal proxy answers for a few nodes; records every call."""

    def __init__(self, **nodes):
        self.nodes = {k: dict(v) for k, v in nodes.items()}
        self.calls: list[tuple] = []

    def get_node(self, name):
        from openstack import exceptions

        self.calls.append(("get_node", name))
        if name not in self.nodes:
            raise exceptions.NotFoundException(f"node {name} could not be found")
        n = self.nodes[name]
        return SimpleNamespace(name=name, power_state=n["power"], target_power_state=n.get("target"),
                               maintenance=n.get("maintenance", False), maintenance_reason=n.get("reason"),
                               provision_state="active")

    def set_node_power_state(self, name, target, wait=False):
        self.calls.append(("set_node_power_state", name, target, wait))
        self.nodes[name]["target"] = target


def _ironic(power_off="graceful", **nodes):
    bm = FakeBaremetal(**nodes)
    return bm, IronicPower(SimpleNamespace(baremetal=bm), "openstack", ironic_node="bm-{name}", power_off=power_off,
                           names={"gpu-1": "compute-1"})


def test_ironic_park_and_wake_calls():
    bm, act = _ironic(**{"bm-compute-1": {"power": "power on"}})
    assert act.state("gpu-1").power == "on" and act.state("gpu-1").ready
    act.park("gpu-1")
    assert bm.calls[-1] == ("set_node_power_state", "bm-compute-1", "soft power off", False)
    assert act.state("gpu-1").power == "powering_off" and act.park_commands("gpu-1") == []  # under way: nothing more
    bm.nodes["bm-compute-1"].update(power="power off", target=None)
    assert act.state("gpu-1").parked
    act.wake("gpu-1")
    assert bm.calls[-1] == ("set_node_power_state", "bm-compute-1", "power on", False)
    assert act.state("gpu-1").power == "powering_on"
    bm, act = _ironic(power_off="force", **{"bm-compute-1": {"power": "power on"}})
    assert act.park_commands("gpu-1")[0].request == {"node": "bm-compute-1", "target": "power off"}
    assert act.state("gpu-9").present is False


def test_ironic_never_touches_a_node_in_someone_elses_maintenance():
    bm, act = _ironic(**{"bm-compute-1": {"power": "power off", "maintenance": True, "reason": "PSU swap, ticket 7"}})
    with pytest.raises(ForeignHoldError, match="ticket 7"):
        act.wake_commands("gpu-1")
    assert not [c for c in bm.calls if c[0] == "set_node_power_state"]


def test_ironic_park_through_the_state_machine(sqlite_engine):
    bm, act = _ironic(**{"bm-compute-1": {"power": "power on"}})
    pm.park(sqlite_engine, "gpu-1", "openstack", act, T0, dry_run=False)
    assert pm.power_of(sqlite_engine, "gpu-1") == pm.PARKING
    bm.nodes["bm-compute-1"].update(power="power off", target=None)  # Ironic's conductor finished
    pm.advance_all(sqlite_engine, {"openstack": act}, T0 + timedelta(minutes=5), dry_run=False)
    assert pm.power_of(sqlite_engine, "gpu-1") == pm.PARKED
    [row] = store.audit_rows(sqlite_engine, node="gpu-1")
    assert (row["action"], row["request"], row["status"]) == (
        "ironic_power", {"node": "bm-compute-1", "target": "soft power off"}, "ok")
