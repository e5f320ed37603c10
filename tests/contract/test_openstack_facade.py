"""The simulated OpenStack against openstacksdk, the project's source, and real Keystone/Placement answers."""

from __future__ import annotations

import openstack
import pytest
import requests

from tests.contract.conftest import recorded
from tests.contract.shapes import shape_diff

PASSWORD = "gpupool-sim"


def connect(sim):
    return openstack.connection.Connection(
        auth_url=sim.urls["keystone"], username="gpupool", password=PASSWORD, project_name="gpupool",
        user_domain_name="Default", project_domain_name="Default", region_name="RegionOne")


def token(sim) -> str:
    body = {"auth": {"identity": {"methods": ["password"], "password": {"user": {
        "name": "gpupool", "domain": {"name": "Default"}, "password": PASSWORD}}},
        "scope": {"project": {"name": "gpupool", "domain": {"name": "Default"}}}}}
    resp = requests.post(sim.urls["keystone"] + "/auth/tokens", json=body, timeout=30)
    assert resp.status_code == 201
    return resp.headers["X-Subject-Token"]


def test_keystone_token_and_errors_match_real_keystone(sim):
    body = {"auth": {"identity": {"methods": ["password"], "password": {"user": {
        "name": "gpupool", "domain": {"name": "Default"}, "password": PASSWORD}}},
        "scope": {"project": {"name": "gpupool", "domain": {"name": "Default"}}}}}
    resp = requests.post(sim.urls["keystone"] + "/auth/tokens", json=body, timeout=30)
    real = recorded("keystone_token")
    assert resp.status_code == real["status"] and resp.headers["X-Subject-Token"]
    assert not shape_diff(real["body"], resp.json())
    types = {e["type"] for e in resp.json()["token"]["catalog"]}
    assert {"identity", "placement", "compute", "metric"} <= types
    body["auth"]["identity"]["password"]["user"]["password"] = "wrong"
    resp = requests.post(sim.urls["keystone"] + "/auth/tokens", json=body, timeout=30)
    assert resp.status_code == 401 and resp.json() == recorded("keystone_token_unauthorized")["body"]
    resp = requests.post(sim.urls["keystone"] + "/auth/tokens", json={"auth": {}}, timeout=30)
    assert resp.status_code == 400
    assert not shape_diff(recorded("keystone_token_bad_body")["body"], resp.json())


@pytest.mark.parametrize("name,path,version", [
    ("placement_resource_providers", "/resource_providers", "1.14"),
    ("placement_resource_provider", "/resource_providers/{uuid}", "1.14"),
    ("placement_inventories", "/resource_providers/{uuid}/inventories", "1.14"),
    ("placement_usages", "/resource_providers/{uuid}/usages", "1.14"),
    ("placement_traits", "/resource_providers/{uuid}/traits", "1.14"),
    ("placement_aggregates", "/resource_providers/{uuid}/aggregates", "1.19"),
    ("placement_not_found", "/resource_providers/00000000-0000-0000-0000-000000000000", "1.14"),
    ("placement_root", "/", None),
])
def test_placement_shapes_match_real_placement(sim, name, path, version):
    tok = token(sim)
    headers = {"X-Auth-Token": tok}
    if version:
        headers["OpenStack-API-Version"] = f"placement {version}"
    base = sim.urls["openstack"] + "/placement"
    uuid = requests.get(base + "/resource_providers", headers=headers, timeout=30).json()[
        "resource_providers"][0]["uuid"]
    resp = requests.get(base + path.format(uuid=uuid), headers=headers, timeout=30)
    real = recorded(name)
    assert resp.status_code == real["status"]
    for h in real["headers"]:
        if h.lower() != "content-type":
            assert resp.headers.get(h) == real["headers"][h]
    open_maps = ("$.inventories", "$.usages")
    assert not shape_diff(real["body"], resp.json(), open_maps=open_maps,
                          nullable=("$.resource_providers[].parent_provider_uuid", "$.parent_provider_uuid"))


def test_inventory_generation_conflict_and_bad_body(sim):
    tok = token(sim)
    h = {"X-Auth-Token": tok, "OpenStack-API-Version": "placement 1.14"}
    base = sim.urls["openstack"] + "/placement/resource_providers"
    uuid = requests.get(base, headers=h, timeout=30).json()["resource_providers"][0]["uuid"]
    inv = requests.get(f"{base}/{uuid}/inventories", headers=h, timeout=30).json()
    stale = {**inv, "resource_provider_generation": inv["resource_provider_generation"] - 1}
    resp = requests.put(f"{base}/{uuid}/inventories", json=stale, headers=h, timeout=30)
    assert resp.status_code == 409
    assert not shape_diff(recorded("placement_put_inventories_conflict")["body"], resp.json())
    resp = requests.put(f"{base}/{uuid}/inventories", json={"inventories": {}}, headers=h, timeout=30)
    assert resp.status_code == 400
    assert not shape_diff(recorded("placement_put_inventories_bad")["body"], resp.json())
    resp = requests.put(f"{base}/{uuid}/inventories", json=inv, headers=h, timeout=30)
    assert resp.status_code == 200
    assert resp.json()["resource_provider_generation"] == inv["resource_provider_generation"] + 1
    assert not shape_diff(recorded("placement_put_inventories")["body"], resp.json(), open_maps=("$.inventories",))


def test_reserving_all_gpus_takes_the_node_out_of_service(sim):
    tok = token(sim)
    h = {"X-Auth-Token": tok, "OpenStack-API-Version": "placement 1.14"}
    base = sim.urls["openstack"] + "/placement/resource_providers"
    rp = requests.get(base, params={"name": "compute-gpu002"}, headers=h, timeout=30).json()["resource_providers"][0]
    inv = requests.get(f"{base}/{rp['uuid']}/inventories", headers=h, timeout=30).json()
    inv["inventories"]["PGPU"]["reserved"] = inv["inventories"]["PGPU"]["total"]
    assert requests.put(f"{base}/{rp['uuid']}/inventories", json=inv, headers=h, timeout=30).status_code == 200
    assert sim.state.node("openstack", "compute-gpu002")["cordoned"]


def test_openstacksdk_lists_disables_and_enables(sim):
    conn = connect(sim)
    rps = list(conn.placement.resource_providers())
    assert sorted(rp.name for rp in rps) == [n["name"] for n in sim.state.nodes("openstack")]
    services = [s for s in conn.compute.services() if s.binary == "nova-compute"]
    assert len(services) == len(rps) and all(s.status == "enabled" for s in services)
    target = next(s for s in services if s.host == "compute-gpu003")
    out = conn.compute.disable_service(target, disabled_reason="gpupool: move to slurm")
    assert out.status == "disabled" and out.disabled_reason == "gpupool: move to slurm"
    node = sim.state.node("openstack", "compute-gpu003")
    assert node["cordoned"] and node["drain_reason"] == "gpupool: move to slurm"
    hv = {h.name: h for h in conn.compute.hypervisors(details=True)}
    assert hv["compute-gpu003"].service_details["disabled_reason"] == "gpupool: move to slurm"
    out = conn.compute.enable_service(target)
    assert out.status == "enabled" and not sim.state.node("openstack", "compute-gpu003")["cordoned"]


def test_nova_and_placement_not_found_shapes(sim):
    tok = token(sim)
    resp = requests.put(sim.urls["openstack"] + "/compute/v2.1/os-services/no-such-id",
                        json={"status": "disabled"}, timeout=30,
                        headers={"X-Auth-Token": tok, "OpenStack-API-Version": "compute 2.53"})
    assert resp.status_code == 404 and set(resp.json()) == {"itemNotFound"}
    resp = requests.put(sim.urls["openstack"] + "/compute/v2.1/os-services/x", json={"status": "maybe"},
                        headers={"X-Auth-Token": tok, "OpenStack-API-Version": "compute 2.53"}, timeout=30)
    assert resp.status_code in (400, 404)
    resp = requests.get(sim.urls["openstack"] + "/placement/resource_providers", timeout=30)
    assert resp.status_code == 401 and "errors" in resp.json()


def test_project_source_reads_inventory_and_gnocchi(sim):
    from datetime import datetime, timezone

    from gpupool.sources.openstack import GnocchiMeter, OpenStackSource

    src = OpenStackSource("openstack", connection=connect(sim), gnocchi_meters={
        "gpu_util": GnocchiMeter("gpu.util", entity_kind="node"),
    })
    inv = src.inventory(datetime(2024, 1, 2, tzinfo=timezone.utc))
    world = {n["name"]: n for n in sim.state.nodes("openstack")}
    assert {r["node"] for r in inv} == set(world)
    assert all(r["busy_gpus"] == world[r["node"]]["busy_gpus"] for r in inv)
    conn = connect(sim)
    res = conn.session.get("/v1/resource/nova_compute", endpoint_filter={"service_type": "metric"}).json()
    node_res = next(r for r in res if r["host_name"] == "compute-gpu001")
    m = conn.session.get(f"/v1/metric/{node_res['metrics']['gpu.allocated']}/measures",
                         params={"start": "2024-01-01T22:00:00+00:00", "stop": "2024-01-02T00:00:00+00:00"},
                         endpoint_filter={"service_type": "metric"}).json()
    assert len(m) == 24 and all(len(p) == 3 for p in m)
