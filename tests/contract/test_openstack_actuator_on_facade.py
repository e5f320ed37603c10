"""The project's OpenStack actuator against the simulated cloud: hold (release) and lift (attach).

The actuator speaks openstacksdk to the facade exactly as it would to a real cloud; the test
reads back the facade's state (the world's view of the node) and what the project's OpenStack
source then reads through the same APIs.
"""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
import requests

from gpupool.actuation.actuators.base import ForeignHoldError
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
