"""The project's OpenStack actuator against the simulated cloud: hold (release) and lift (attach).

The actuator speaks openstacksdk to the facade exactly as it would to a real cloud; the test
reads back the facade's state (the world's view of the node) and what the project's OpenStack
source then reads through the same APIs.
"""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
import requests

from gpupool.actuation.actuators.base import ActuationError, ForeignHoldError
from gpupool.actuation.actuators.openstack import HELD_TRAIT, OpenStackActuator
from gpupool.sources.openstack import OpenStackSource
from tests.contract.test_openstack_facade import connect, token

AT = datetime(2024, 1, 2, tzinfo=timezone.utc)
REASON = "gpupool: moving to slurm"


def source_view(sim, name: str) -> dict:
    rows = OpenStackSource("openstack", connection=connect(sim)).inventory(AT)
    return next(r for r in rows if r["node"] == name)


def busy_node(sim) -> str:
    return next(n["name"] for n in sim.state.nodes("openstack") if n["busy_gpus"] > 0)


def placement_of_others(sim, name: str) -> dict:
    return {n["name"]: (n["meta"].reserved, list(n["meta"].traits), n["cordoned"])
            for n in sim.state.nodes("openstack") if n["name"] != name}


def test_release_holds_the_node_and_attach_lifts_it(sim):
    act = OpenStackActuator(connect(sim), "openstack")
    name = busy_node(sim)
    before = source_view(sim, name)
    others = placement_of_others(sim, name)
    assert before["schedulable"] and before["busy_gpus"] > 0

    act.release(name, REASON)

    rec = sim.state.node("openstack", name)
    assert rec["cordoned"] and rec["drain_reason"] == REASON and rec["meta"].cordon_via == "nova"
    assert rec["meta"].reserved == rec["gpus"] and rec["meta"].traits == [HELD_TRAIT]
    assert placement_of_others(sim, name) == others  # only the released host's tree was touched
    st = act.owner_state(name)
    assert st.held_by_gpupool and st.busy > 0 and not act.is_released(name)
    seen = source_view(sim, name)
    assert not seen["schedulable"] and seen["drain_reason"] == REASON
    assert seen["gpu_model"] == before["gpu_model"] and seen["gpus"] == before["gpus"]

    for _ in range(48):  # the jobs it ran end; no new one lands
        if act.is_released(name):
            break
        sim.state.advance("5min")
    assert act.is_released(name) and sim.state.node("openstack", name)["busy_gpus"] == 0

    act.attach(name)

    rec = sim.state.node("openstack", name)
    assert not rec["cordoned"] and rec["meta"].reserved == 0 and rec["meta"].traits == []
    assert act.owner_state(name).schedulable
    assert source_view(sim, name)["schedulable"]
    assert act.attach_commands(name) == []  # nothing left to lift


def test_placement_only_hold_is_gpupool_s_in_the_world(sim):
    act = OpenStackActuator(connect(sim), "openstack", manage_compute_service=False)
    name = busy_node(sim)
    act.release(name, REASON)
    rec = sim.state.node("openstack", name)
    assert rec["cordoned"] and rec["meta"].cordon_via == "placement"
    assert rec["drain_reason"].startswith("gpupool:")  # the world knows whose hold it is
    assert act.owner_state(name).held_by_gpupool
    seen = source_view(sim, name)
    assert not seen["schedulable"] and seen["drain_reason"] == "all GPU inventory reserved"
    act.release(name, REASON)  # idempotent: no second trait write, no conflict
    assert sim.state.node("openstack", name)["meta"].traits == [HELD_TRAIT]
    act.attach(name)
    rec = sim.state.node("openstack", name)
    assert not rec["cordoned"] and rec["meta"].reserved == 0 and rec["meta"].traits == []
    assert source_view(sim, name)["schedulable"]


def test_operator_reservation_is_left_alone(sim):
    name = busy_node(sim)
    h = {"X-Auth-Token": token(sim), "OpenStack-API-Version": "placement 1.26"}
    base = sim.urls["openstack"] + "/placement/resource_providers"
    rp = requests.get(base, params={"name": name}, headers=h, timeout=30).json()["resource_providers"][0]
    inv = requests.get(f"{base}/{rp['uuid']}/inventories", headers=h, timeout=30).json()
    inv["inventories"]["PGPU"]["reserved"] = inv["inventories"]["PGPU"]["total"]
    assert requests.put(f"{base}/{rp['uuid']}/inventories", json=inv, headers=h, timeout=30).status_code == 200
    assert sim.state.node("openstack", name)["drain_reason"].startswith("placement:")
    act = OpenStackActuator(connect(sim), "openstack", manage_compute_service=False)
    assert act.owner_state(name).foreign_hold
    with pytest.raises(ForeignHoldError):
        act.attach(name)
    assert sim.state.node("openstack", name)["meta"].reserved == sim.state.node("openstack", name)["gpus"]


def _servers_on(sim, name: str) -> list[dict]:
    h = {"X-Auth-Token": token(sim), "OpenStack-API-Version": "compute 2.95"}
    url = sim.urls["openstack"] + "/compute/v2.1/servers/detail"
    return requests.get(url, params={"all_tenants": "True", "host": name}, headers=h, timeout=30).json()["servers"]


def test_evict_live_migrates_every_instance_and_the_host_empties(sim):
    act = OpenStackActuator(connect(sim), "openstack")
    name = busy_node(sim)
    servers = _servers_on(sim, name)
    assert act.can_evict and len(servers) == int(sim.state.node("openstack", name)["busy_gpus"]) > 0
    want = sorted(w.start.to_pydatetime() for w in sim.state.running("openstack") if w.node == name)
    started = act.work_started(name)
    assert sorted(started) == want and all(t.tzinfo is not None and t.utcoffset().total_seconds() == 0
                                           for t in started)

    act.release(name, REASON)
    cmds = act.evict_commands(name)
    assert sorted(c.request["server"] for c in cmds) == sorted(s["id"] for s in servers)
    assert {(c.action, c.request["host"], c.request["block_migration"]) for c in cmds} == {
        ("live_migrate", None, "auto")}
    assert [act.send(c)["migrated"] for c in cmds] == [True] * len(cmds)
    assert act.is_released(name) and act.work_started(name) == [] and act.evict_commands(name) == []
    assert act.send(cmds[0]) == {"server": cmds[0].request["server"], "migrated": False, "detail": "gone"}


def test_live_migration_refused_names_the_instance_and_nova_s_reason(sim):
    act = OpenStackActuator(connect(sim), "openstack")
    name = busy_node(sim)
    for other in sim.state.nodes("openstack"):  # every other host full or out of service
        if other["name"] != name and other["busy_gpus"] < other["gpus"]:
            sim.state.cordon("openstack", other["name"], "operator: maintenance", via="nova")
    act.release(name, REASON)
    cmd = act.evict_commands(name)[0]
    with pytest.raises(ActuationError) as err:
        act.send(cmd)
    msg = str(err.value)
    assert cmd.request["server"] in msg and cmd.request["name"] in msg
    assert "HTTP 400" in msg and "No valid host was found" in msg
    assert not act.is_released(name) and len(_servers_on(sim, name)) > 0


def test_placement_only_cloud_cannot_evict_nor_tell_work_start(sim):
    act = OpenStackActuator(connect(sim), "openstack", manage_compute_service=False)
    name = busy_node(sim)
    assert not act.can_evict and act.evict_commands(name) == [] and act.work_started(name) is None
