"""The OpenStack actuator against the real Keystone + Placement: reserve the GPU inventory of a
host's provider tree, wait for its allocations to go, unreserve only what gpupool reserved.

The rig has no nova, so the compute-service half is off (``manage_compute_service=False``);
the Placement half is what runs here for real.
"""

from __future__ import annotations

import uuid

import pytest

from gpupool.actuation.actuators.base import ForeignHoldError
from gpupool.actuation.actuators.openstack import HELD_TRAIT, OpenStackActuator

MV = "1.28"


def _req(conn, method, url, body=None, ok=(200, 201, 204)):
    resp = getattr(conn.placement, method)(url, json=body, microversion=MV, raise_exc=False)
    assert resp.status_code in ok, (method, url, resp.status_code, resp.text)
    return resp.json() if resp.content else None


@pytest.fixture
def host(placement_rig):
    """A compute host's provider tree: root with VCPU, a child pGPU provider with 4 VGPU."""
    conn = placement_rig.connect()
    name = f"gpu-host-{uuid.uuid4().hex[:6]}"
    root = _req(conn, "post", "/resource_providers", {"name": name})
    child = _req(conn, "post", "/resource_providers",
                 {"name": f"{name}_pci_0000_81_00_0", "parent_provider_uuid": root["uuid"]})
    _req(conn, "put", f"/resource_providers/{root['uuid']}/inventories",
         {"resource_provider_generation": root["generation"], "inventories": {"VCPU": {"total": 32}}})
    _req(conn, "put", f"/resource_providers/{child['uuid']}/inventories",
         {"resource_provider_generation": child["generation"], "inventories": {"VGPU": {"total": 4}}})
    yield conn, name, root["uuid"], child["uuid"]
    conn.close()


def _allocate(conn, root, child, vgpu=1):
    consumer = str(uuid.uuid4())
    _req(conn, "put", f"/allocations/{consumer}", {
        "allocations": {root: {"resources": {"VCPU": 4}}, child: {"resources": {"VGPU": vgpu}}},
        "project_id": str(uuid.uuid4()), "user_id": str(uuid.uuid4()), "consumer_generation": None,
    })
    return consumer


def _vgpu(conn, child):
    return _req(conn, "get", f"/resource_providers/{child}/inventories/VGPU")


def test_release_reserves_gpu_inventory_and_waits_for_allocations(host):
    conn, name, root, child = host
    act = OpenStackActuator(conn, "openstack", manage_compute_service=False)
    consumer = _allocate(conn, root, child)
    st = act.owner_state(name)
    assert st.present and st.schedulable and st.busy == 5  # 4 VCPU + 1 VGPU in use

    act.release(name, "gpupool: moving to slurm")
    inv = _vgpu(conn, child)
    assert inv["reserved"] == inv["total"] == 4
    assert HELD_TRAIT in _req(conn, "get", f"/resource_providers/{child}/traits")["traits"]
    st = act.owner_state(name)
    assert st.held_by_gpupool and not act.is_released(name)  # the instance still holds a vGPU
    # no new GPU allocation fits while reserved
    resp = conn.placement.put(f"/allocations/{uuid.uuid4()}", json={
        "allocations": {child: {"resources": {"VGPU": 1}}}, "project_id": str(uuid.uuid4()),
        "user_id": str(uuid.uuid4()), "consumer_generation": None}, microversion=MV, raise_exc=False)
    assert resp.status_code == 409

    _req(conn, "delete", f"/allocations/{consumer}")
    assert act.is_released(name)
    act.release(name, "gpupool: moving to slurm")  # idempotent
    assert _vgpu(conn, child)["reserved"] == 4

    act.attach(name)
    assert _vgpu(conn, child)["reserved"] == 0
    assert HELD_TRAIT not in _req(conn, "get", f"/resource_providers/{child}/traits")["traits"]
    assert act.owner_state(name).schedulable


def test_inventory_reserved_by_an_operator_is_left_alone(host):
    conn, name, root, child = host
    act = OpenStackActuator(conn, "openstack", manage_compute_service=False)
    inv = _vgpu(conn, child)
    _req(conn, "put", f"/resource_providers/{child}/inventories/VGPU",
         {"resource_provider_generation": inv["resource_provider_generation"], "total": 4, "reserved": 4})
    st = act.owner_state(name)
    assert st.foreign_hold
    with pytest.raises(ForeignHoldError):
        act.attach(name)
    assert _vgpu(conn, child)["reserved"] == 4


def test_unknown_host_is_not_present(placement_rig):
    act = OpenStackActuator(placement_rig.connect(), "openstack", manage_compute_service=False)
    assert not act.owner_state("no-such-host").present
