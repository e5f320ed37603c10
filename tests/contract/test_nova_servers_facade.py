"""The simulated Nova's servers and their live migration, held to what a real Nova answers.

No real Nova runs here (tests/contract/test_nova_facade.py says why) and ``nova_live_*`` holds no
servers: the recording's Nova (scripts/nova-services.sh) has no image service to boot one from.
So the servers are held to two other sources: the Nova API reference's admin sample of
``GET /servers/detail`` (``nova_servers_detail_admin``, copied out of the nova 34.0.0 sdist by
``record_real nova``; Nova's functional api_samples tests generate it from the real API) and the
``os-migrateLive`` request sample (``nova_server_live_migrate``: 202 without a body, per
``@wsgi.response(202)`` in nova/api/openstack/compute/migrate_server.py); and to openstacksdk's own
models: every key the facade answers is an attribute of ``openstack.compute.v2.server.Server``, and
the request openstacksdk sends for ``live_migrate_server`` (captured from the SDK itself) is one the
facade and the recorded sample agree on. Refusals use Nova's messages for the microversions before
2.34, where the scheduler's checks answer synchronously ("No valid host was found.", 400).
"""

from __future__ import annotations

import requests

from tests.contract.conftest import recorded
from tests.contract.shapes import shape_diff
from tests.contract.test_openstack_facade import connect, token

OPEN = ("$.servers[].addresses", "$.servers[].metadata", "$.servers[].flavor.extra_specs",
        "$.server.addresses", "$.server.metadata", "$.server.flavor.extra_specs")
NULLABLE = tuple(f"{root}.{k}" for root in ("$.servers[]", "$.server") for k in (
    "description", "locked_reason", "OS-EXT-SRV-ATTR:user_data", "key_name", "trusted_image_certificates",
    "OS-EXT-STS:task_state", "OS-SRV-USG:terminated_at"))


def _nova(sim, method, path, version="2.95", **kw):
    headers = {"X-Auth-Token": token(sim), "OpenStack-API-Version": f"compute {version}"}
    return requests.request(method, sim.urls["openstack"] + "/compute/v2.1" + path, headers=headers, timeout=30,
                            **kw)


def _busy(sim) -> dict:
    return next(n for n in sim.state.nodes("openstack") if n["busy_gpus"] > 0)


def test_servers_detail_matches_the_admin_sample_and_filters_by_host(sim):
    real = recorded("nova_servers_detail_admin")
    node = _busy(sim)
    resp = _nova(sim, "GET", f"/servers/detail?all_tenants=True&host={node['name']}")
    assert resp.status_code == real["status"] == 200
    body = resp.json()
    assert len(body["servers"]) == int(node["busy_gpus"])
    assert {s["OS-EXT-SRV-ATTR:host"] for s in body["servers"]} == {node["name"]}
    real_body = {k: v for k, v in real["body"].items() if k != "servers_links"}  # the sample asked ?limit=1
    assert not shape_diff(real_body, body, open_maps=OPEN, nullable=NULLABLE)

    one = body["servers"][0]
    resp = _nova(sim, "GET", f"/servers/{one['id']}")
    assert resp.status_code == 200 and resp.json() == {"server": one}
    # without all_tenants a caller sees its own project's servers only: gpupool's has none
    assert _nova(sim, "GET", f"/servers/detail?host={node['name']}").json() == {"servers": []}
    assert _nova(sim, "GET", "/servers/00000000-0000-0000-0000-000000000000").status_code == 404


def test_every_key_the_facade_answers_is_an_openstacksdk_server_attribute(sim):
    from openstack.compute.v2.server import Server

    known = set(Server._body_mapping())
    server = _nova(sim, "GET", "/servers/detail?all_tenants=1").json()["servers"][0]
    assert set(server) - known == set()
    parsed = Server.existing(**server)
    assert parsed.compute_host == server["OS-EXT-SRV-ATTR:host"]
    assert parsed.launched_at == server["OS-SRV-USG:launched_at"] and parsed.created_at == server["created"]


def test_live_migrate_request_as_openstacksdk_sends_it(sim, monkeypatch):
    """The SDK's body and microversion are captured, then sent to the facade unchanged."""
    from openstack.compute.v2.server import Server

    sent = []
    original = Server._action

    def capture(self, session, body, microversion=None):
        sent.append((body, microversion))
        return original(self, session, body, microversion=microversion)

    monkeypatch.setattr(Server, "_action", capture)
    real = recorded("nova_server_live_migrate")
    node = _busy(sim)
    server = _nova(sim, "GET", f"/servers/detail?all_tenants=True&host={node['name']}").json()["servers"][0]
    connect(sim).compute.live_migrate_server(server["id"], host=None, block_migration="auto")
    (body, microversion), = sent
    assert microversion == "2.30" and body == {"os-migrateLive": {"host": None, "block_migration": "auto"}}
    assert set(body["os-migrateLive"]) <= set(real["request_body"]["os-migrateLive"])
    assert int(sim.state.node("openstack", node["name"])["busy_gpus"]) == int(node["busy_gpus"]) - 1
    assert server["id"] not in {s["id"] for s in _nova(sim, "GET", "/servers/detail?all_tenants=1").json()["servers"]
                                if s["OS-EXT-SRV-ATTR:host"] == node["name"]}


def test_live_migrate_answers_as_nova_does(sim):
    real = recorded("nova_server_live_migrate")
    node = _busy(sim)
    sid = _nova(sim, "GET", f"/servers/detail?all_tenants=True&host={node['name']}").json()["servers"][0]["id"]
    target = next(n["name"] for n in sim.state.nodes("openstack") if n["busy_gpus"] == 0)

    bad = _nova(sim, "POST", f"/servers/{sid}/action", "2.30", json={"os-migrateLive": {"host": None}})
    assert bad.status_code == 400 and "'block_migration' is a required property" in bad.json()["badRequest"]["message"]
    extra = {"os-migrateLive": {**real["request_body"]["os-migrateLive"], "host": None, "disk_over_commit": False}}
    assert _nova(sim, "POST", f"/servers/{sid}/action", "2.30", json=extra).status_code == 400
    assert _nova(sim, "POST", f"/servers/{sid}/action", "2.30",
                 json={"os-migrateLive": {**real["request_body"]["os-migrateLive"], "host": node["name"]}}
                 ).status_code == 400  # to its own host
    assert _nova(sim, "POST", f"/servers/{sid}/action", json={"os-stop": None}).status_code == 404

    resp = _nova(sim, "POST", f"/servers/{sid}/action", "2.30",
                 json={"os-migrateLive": {**real["request_body"]["os-migrateLive"], "host": target}})
    assert resp.status_code == real["status"] == 202 and resp.content == b""


def test_no_valid_host_when_no_other_enabled_host_has_room(sim):
    node = _busy(sim)
    for other in sim.state.nodes("openstack"):
        if other["name"] != node["name"] and other["busy_gpus"] < other["gpus"]:
            sim.state.cordon("openstack", other["name"], "operator: maintenance", via="nova")
    sid = _nova(sim, "GET", f"/servers/detail?all_tenants=True&host={node['name']}").json()["servers"][0]["id"]
    resp = _nova(sim, "POST", f"/servers/{sid}/action", "2.30",
                 json={"os-migrateLive": {"host": None, "block_migration": "auto"}})
    assert resp.status_code == 400
    assert resp.json()["badRequest"]["message"].startswith("No valid host was found.")
    assert int(sim.state.node("openstack", node["name"])["busy_gpus"]) == int(node["busy_gpus"])
