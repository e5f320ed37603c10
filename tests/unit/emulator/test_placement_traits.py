"""The Placement facade's trait API over HTTP in-process: status codes, filters, generations."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from gpupool.emulator.openstack import make_app

RECORDED = Path(__file__).resolve().parents[2] / "fixtures" / "recorded"
P = "/placement"


@pytest.fixture(scope="module")
def scenario_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("sc") / "cloud.yaml"
    path.write_text(
        "step: 5min\nnode_gpus: 4\nmove_minutes: 10\nstart: 2024-01-01\nend: 2024-01-03\nseed: 3\n"
        "platforms:\n"
        "  openstack: {synthetic: {base: 6, total_gpus: 12}, nodes: 3, gpu_model: NVIDIA A100-SXM4-80GB}\n")
    return path


@pytest.fixture
def sim(scenario_file):
    from gpupool.emulator.serve import make_state

    state = make_state(scenario_file, speed=0)
    client = TestClient(make_app(state))
    body = {"auth": {"identity": {"methods": ["password"], "password": {"user": {
        "name": "gpupool", "domain": {"name": "Default"}, "password": "gpupool-sim"}}},
        "scope": {"project": {"name": "gpupool", "domain": {"name": "Default"}}}}}
    resp = client.post("/identity/v3/auth/tokens", json=body)
    assert resp.status_code == 201
    client.headers["X-Auth-Token"] = resp.headers["X-Subject-Token"]
    return client, state


def hdr(ver: str) -> dict:
    return {"OpenStack-API-Version": f"placement {ver}"}


def first_rp(client) -> dict:
    return client.get(P + "/resource_providers", headers=hdr("1.14")).json()["resource_providers"][0]


def rp_traits(client, uuid: str, ver: str = "1.14") -> dict:
    resp = client.get(f"{P}/resource_providers/{uuid}/traits", headers=hdr(ver))
    assert resp.status_code == 200
    return resp.json()


def test_create_trait_201_then_204_and_rejects_non_custom(sim):
    client, _ = sim
    resp = client.put(P + "/traits/CUSTOM_GPUPOOL_HELD", headers=hdr("1.6"))
    assert resp.status_code == 201 and resp.content == b""
    assert resp.headers["Location"].endswith("/traits/CUSTOM_GPUPOOL_HELD")
    assert client.put(P + "/traits/CUSTOM_GPUPOOL_HELD", headers=hdr("1.6")).status_code == 204
    assert client.get(P + "/traits/CUSTOM_GPUPOOL_HELD", headers=hdr("1.6")).status_code == 204
    assert client.get(P + "/traits/CUSTOM_NEVER_MADE", headers=hdr("1.6")).status_code == 404
    for bad in ("TRAIT_X", "COMPUTE_NODE", "CUSTOM_lower", "CUSTOM_" + "A" * 249):
        resp = client.put(f"{P}/traits/{bad}", headers=hdr("1.26"))
        assert resp.status_code == 400, bad
        assert resp.json()["errors"][0]["code"] == "placement.undefined_code"
        assert 'start with the prefix "CUSTOM_"' in resp.json()["errors"][0]["detail"]
    assert client.put(P + "/traits/CUSTOM_TOO_EARLY", headers=hdr("1.5")).status_code == 404
    assert client.get(P + "/traits/CUSTOM_TOO_EARLY", headers=hdr("1.6")).status_code == 404


def test_list_traits_and_its_filters(sim):
    client, _ = sim
    client.put(P + "/traits/CUSTOM_GPUPOOL_HELD", headers=hdr("1.6"))
    every = client.get(P + "/traits", headers=hdr("1.6")).json()["traits"]
    assert {"COMPUTE_NODE", "COMPUTE_STATUS_DISABLED", "CUSTOM_GPUPOOL_HELD",
            "CUSTOM_GPU_MODEL_NVIDIA_A100_SXM4_80GB"} <= set(every) and every == sorted(every)
    got = client.get(P + "/traits", params={"name": "in:CUSTOM_GPUPOOL_HELD,COMPUTE_NODE,CUSTOM_NONE"},
                     headers=hdr("1.6")).json()["traits"]
    assert got == ["COMPUTE_NODE", "CUSTOM_GPUPOOL_HELD"]
    got = client.get(P + "/traits", params={"name": "startswith:CUSTOM_"}, headers=hdr("1.6")).json()["traits"]
    assert got == ["CUSTOM_GPUPOOL_HELD", "CUSTOM_GPU_MODEL_NVIDIA_A100_SXM4_80GB"]
    unused = client.get(P + "/traits", params={"associated": "false"}, headers=hdr("1.6")).json()["traits"]
    assert "CUSTOM_GPUPOOL_HELD" in unused and "COMPUTE_NODE" not in unused
    used = client.get(P + "/traits", params={"associated": "true"}, headers=hdr("1.6")).json()["traits"]
    assert "COMPUTE_NODE" in used and "CUSTOM_GPUPOOL_HELD" not in used
    resp = client.get(P + "/traits", params={"name": "CUSTOM_GPUPOOL_HELD"}, headers=hdr("1.6"))
    assert resp.status_code == 400 and "Badly formatted name parameter" in resp.text
    assert client.get(P + "/traits", params={"associated": "maybe"}, headers=hdr("1.6")).status_code == 400
    assert client.get(P + "/traits", params={"colour": "red"}, headers=hdr("1.6")).status_code == 400
    assert client.get(P + "/traits", headers=hdr("1.5")).status_code == 404


def test_put_provider_traits_bumps_generation_and_answers_like_get(sim):
    client, state = sim
    rp = first_rp(client)
    client.put(P + "/traits/CUSTOM_GPUPOOL_HELD", headers=hdr("1.6"))
    cur = rp_traits(client, rp["uuid"])
    body = {"resource_provider_generation": cur["resource_provider_generation"],
            "traits": sorted(cur["traits"] + ["CUSTOM_GPUPOOL_HELD"])}
    resp = client.put(f"{P}/resource_providers/{rp['uuid']}/traits", json=body, headers=hdr("1.26"))
    assert resp.status_code == 200
    out = resp.json()
    assert out["resource_provider_generation"] == cur["resource_provider_generation"] + 1
    assert "CUSTOM_GPUPOOL_HELD" in out["traits"] and out == rp_traits(client, rp["uuid"])
    recorded = json.loads((RECORDED / "placement_traits.json").read_text())["body"]
    assert set(out) == set(recorded)
    assert state.node("openstack", rp["name"])["meta"].traits == ["CUSTOM_GPUPOOL_HELD"]
    # the generation moved for every provider view, not only for traits
    inv = client.get(f"{P}/resource_providers/{rp['uuid']}/inventories", headers=hdr("1.14")).json()
    assert inv["resource_provider_generation"] == out["resource_provider_generation"]
    others = [r for r in client.get(P + "/resource_providers", headers=hdr("1.14")).json()["resource_providers"]
              if r["uuid"] != rp["uuid"]]
    assert all("CUSTOM_GPUPOOL_HELD" not in rp_traits(client, r["uuid"])["traits"] for r in others)
    # taking it off again
    body = {"resource_provider_generation": out["resource_provider_generation"],
            "traits": [t for t in out["traits"] if t != "CUSTOM_GPUPOOL_HELD"]}
    resp = client.put(f"{P}/resource_providers/{rp['uuid']}/traits", json=body, headers=hdr("1.26"))
    assert resp.status_code == 200 and "CUSTOM_GPUPOOL_HELD" not in resp.json()["traits"]
    assert state.node("openstack", rp["name"])["meta"].traits == []


def test_put_provider_traits_generation_conflict(sim):
    client, state = sim
    rp = first_rp(client)
    cur = rp_traits(client, rp["uuid"])
    stale = {"resource_provider_generation": cur["resource_provider_generation"] - 1, "traits": cur["traits"]}
    resp = client.put(f"{P}/resource_providers/{rp['uuid']}/traits", json=stale, headers=hdr("1.26"))
    assert resp.status_code == 409
    err = resp.json()["errors"][0]
    assert err["code"] == "placement.concurrent_update" and "generation already changed" in err["detail"]
    recorded = json.loads((RECORDED / "placement_put_inventories_conflict.json").read_text())["body"]
    resp = client.put(f"{P}/resource_providers/{rp['uuid']}/traits", json=stale, headers=hdr("1.14"))
    assert resp.status_code == 409 and set(resp.json()["errors"][0]) == set(recorded["errors"][0])
    assert rp_traits(client, rp["uuid"]) == cur  # nothing changed


def test_put_provider_traits_bad_requests(sim):
    client, state = sim
    rp = first_rp(client)
    url = f"{P}/resource_providers/{rp['uuid']}/traits"
    gen = rp_traits(client, rp["uuid"])["resource_provider_generation"]
    resp = client.put(url, json={"resource_provider_generation": gen, "traits": ["CUSTOM_NOT_CREATED"]},
                      headers=hdr("1.26"))
    assert resp.status_code == 400 and "No such trait CUSTOM_NOT_CREATED" in resp.text
    assert client.put(url, json={"traits": []}, headers=hdr("1.26")).status_code == 400
    assert client.put(url, json={"resource_provider_generation": gen}, headers=hdr("1.26")).status_code == 400
    assert client.put(url, json={"resource_provider_generation": gen, "traits": [], "x": 1},
                      headers=hdr("1.26")).status_code == 400
    assert client.put(url, json={"resource_provider_generation": gen, "traits": "COMPUTE_NODE"},
                      headers=hdr("1.26")).status_code == 400
    assert client.put(url, content=b"{not json", headers=hdr("1.26")).status_code == 400
    assert client.put(url, json={"resource_provider_generation": gen, "traits": []},
                      headers=hdr("1.5")).status_code == 404
    assert client.put(f"{P}/resource_providers/00000000-0000-0000-0000-000000000000/traits",
                      json={"resource_provider_generation": 1, "traits": []}, headers=hdr("1.26")).status_code == 404
    assert rp_traits(client, rp["uuid"])["resource_provider_generation"] == gen


def test_nova_owned_traits_follow_the_host_not_the_put(sim):
    client, state = sim
    rp = first_rp(client)
    cur = rp_traits(client, rp["uuid"])
    resp = client.put(f"{P}/resource_providers/{rp['uuid']}/traits", headers=hdr("1.26"), json={
        "resource_provider_generation": cur["resource_provider_generation"], "traits": ["COMPUTE_STATUS_DISABLED"]})
    assert resp.status_code == 200
    assert resp.json()["traits"] == cur["traits"]  # nova-compute puts back its own, and says the host is enabled
    assert state.node("openstack", rp["name"])["meta"].traits == []


def test_in_tree_lists_only_that_tree(sim):
    client, _ = sim
    rps = client.get(P + "/resource_providers", headers=hdr("1.14")).json()["resource_providers"]
    assert len(rps) == 3
    got = client.get(P + "/resource_providers", params={"in_tree": rps[1]["uuid"]},
                     headers=hdr("1.14")).json()["resource_providers"]
    assert [r["uuid"] for r in got] == [rps[1]["uuid"]]
    assert client.get(P + "/resource_providers", params={"in_tree": rps[1]["uuid"]},
                      headers=hdr("1.13")).status_code == 400


@pytest.mark.parametrize("marked,prefix", [(True, "gpupool:"), (False, "placement:")])
def test_full_reservation_is_gpupool_s_hold_only_with_the_trait(sim, marked, prefix):
    client, state = sim
    rp = first_rp(client)
    if marked:
        client.put(P + "/traits/CUSTOM_GPUPOOL_HELD", headers=hdr("1.6"))
        cur = rp_traits(client, rp["uuid"])
        assert client.put(f"{P}/resource_providers/{rp['uuid']}/traits", headers=hdr("1.26"), json={
            "resource_provider_generation": cur["resource_provider_generation"],
            "traits": cur["traits"] + ["CUSTOM_GPUPOOL_HELD"]}).status_code == 200
    inv = client.get(f"{P}/resource_providers/{rp['uuid']}/inventories/PGPU", headers=hdr("1.26")).json()
    inv["reserved"] = inv["total"]
    assert client.put(f"{P}/resource_providers/{rp['uuid']}/inventories/PGPU", json=inv,
                      headers=hdr("1.26")).status_code == 200
    node = state.node("openstack", rp["name"])
    assert node["cordoned"] and node["drain_reason"].startswith(prefix)
    inv = client.get(f"{P}/resource_providers/{rp['uuid']}/inventories/PGPU", headers=hdr("1.26")).json()
    inv["reserved"] = 0
    assert client.put(f"{P}/resource_providers/{rp['uuid']}/inventories/PGPU", json=inv,
                      headers=hdr("1.26")).status_code == 200
    assert not state.node("openstack", rp["name"])["cordoned"]


def test_enabling_nova_compute_leaves_a_full_reservation_in_force(sim):
    client, state = sim
    rp = first_rp(client)
    nova = {"OpenStack-API-Version": "compute 2.53"}
    svc = client.get("/compute/v2.1/os-services", params={"host": rp["name"], "binary": "nova-compute"},
                     headers=nova).json()["services"][0]
    url = f"/compute/v2.1/os-services/{svc['id']}"
    assert client.put(url, json={"status": "disabled", "disabled_reason": "gpupool: moving"},
                      headers=nova).status_code == 200
    inv = client.get(f"{P}/resource_providers/{rp['uuid']}/inventories/PGPU", headers=hdr("1.26")).json()
    inv["reserved"] = inv["total"]
    assert client.put(f"{P}/resource_providers/{rp['uuid']}/inventories/PGPU", json=inv,
                      headers=hdr("1.26")).status_code == 200
    assert client.put(url, json={"status": "enabled"}, headers=nova).status_code == 200
    node = state.node("openstack", rp["name"])
    assert node["cordoned"] and node["meta"].cordon_via == "placement"  # the GPUs stay reserved
    assert node["drain_reason"].startswith("placement:")
    assert "COMPUTE_STATUS_DISABLED" not in rp_traits(client, rp["uuid"])["traits"]
    inv = client.get(f"{P}/resource_providers/{rp['uuid']}/inventories/PGPU", headers=hdr("1.26")).json()
    inv["reserved"] = 0
    assert client.put(f"{P}/resource_providers/{rp['uuid']}/inventories/PGPU", json=inv,
                      headers=hdr("1.26")).status_code == 200
    assert not state.node("openstack", rp["name"])["cordoned"]
