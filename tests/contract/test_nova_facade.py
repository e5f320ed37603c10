"""The simulated Nova against a real Nova's recorded answers, at the microversions gpupool sends.

No test starts Nova (docs/operations/services.md, "Live services in the tests": ~2 minutes to start). Two recordings
hold the facade: the API reference's samples (tests/fixtures/recorded/nova_*.json, copied out of
the nova sdist by ``record_real nova``; each file names its sample) and a live Nova 34.0.0
(nova_live_*.json, ``record_real nova-live`` via scripts/nova-services.sh). openstacksdk 4.x, as the OpenStack actuator and
source use it, sends ``GET /os-services`` and ``PUT /os-services/{id}`` at compute 2.69 and
``GET /os-hypervisors/detail`` at 2.88 (against a Nova whose maximum is above those).
"""

from __future__ import annotations

import requests

from tests.contract.conftest import recorded
from tests.contract.shapes import shape_diff
from tests.contract.test_openstack_facade import token

SERVICE_NULLABLE = ("$.services[].disabled_reason", "$.service.disabled_reason")
HYPERVISOR_NULLABLE = ("$.hypervisors[].uptime", "$.hypervisors[].service.disabled_reason", "$.hypervisor.uptime",
                       "$.hypervisor.service.disabled_reason")
#: the reference lists hypervisors with ?limit=1, so its answer carries a "next" link; without a
#: limit Nova sends no hypervisors_links
WITHOUT_LINKS = lambda body: {k: v for k, v in body.items() if k != "hypervisors_links"}  # noqa: E731


def _nova(sim, method, path, version=None, **kw):
    headers = {"X-Auth-Token": token(sim)}
    if version:
        headers["OpenStack-API-Version"] = f"compute {version}"
    return requests.request(method, sim.urls["openstack"] + "/compute/v2.1" + path, headers=headers, timeout=30,
                            **kw)


def test_service_list_disable_and_enable_at_2_69(sim):
    real = recorded("nova_services_list")
    resp = _nova(sim, "GET", "/os-services", "2.69")
    assert resp.status_code == real["status"] == 200
    body = resp.json()
    assert {s["binary"] for s in body["services"]} >= {"nova-compute", "nova-scheduler"}
    assert not shape_diff(real["body"], body, nullable=SERVICE_NULLABLE)

    target = next(s for s in body["services"] if s["host"] == "compute-gpu002" and s["binary"] == "nova-compute")
    real = recorded("nova_service_disable")
    assert set(real["request_body"]) == {"status", "disabled_reason"}
    resp = _nova(sim, "PUT", f"/os-services/{target['id']}", "2.69",
                 json={**real["request_body"], "disabled_reason": "gpupool: to slurm"})
    assert resp.status_code == real["status"]
    assert not shape_diff(real["body"], resp.json(), nullable=SERVICE_NULLABLE)
    assert resp.json()["service"]["status"] == "disabled" and sim.state.node("openstack", "compute-gpu002")["cordoned"]

    real = recorded("nova_service_enable")
    resp = _nova(sim, "PUT", f"/os-services/{target['id']}", "2.69", json=real["request_body"])
    assert resp.status_code == real["status"]
    assert not shape_diff(real["body"], resp.json(), nullable=SERVICE_NULLABLE)
    assert resp.json()["service"]["disabled_reason"] is None
    assert not sim.state.node("openstack", "compute-gpu002")["cordoned"]


def test_legacy_disable_and_enable_at_2_1(sim):
    """Without a microversion header (openstacksdk's Service.disable/enable actions) Nova speaks 2.1."""
    for name, action in (("nova_service_disable_legacy", "disable-log-reason"),
                         ("nova_service_enable_legacy", "enable")):
        real = recorded(name)
        resp = _nova(sim, "PUT", f"/os-services/{action}", json={**real["request_body"], "host": "compute-gpu003"})
        assert resp.status_code == real["status"], name
        assert not shape_diff(real["body"], resp.json()), name
    assert not sim.state.node("openstack", "compute-gpu003")["cordoned"]


def test_hypervisors_at_2_88_and_2_53(sim):
    real = recorded("nova_hypervisors_detail")
    resp = _nova(sim, "GET", "/os-hypervisors/detail", "2.88")
    assert resp.status_code == real["status"] == 200
    body = resp.json()
    assert "hypervisors_links" not in body and len(body["hypervisors"]) == len(sim.state.nodes("openstack"))
    assert not shape_diff(WITHOUT_LINKS(real["body"]), body, nullable=HYPERVISOR_NULLABLE)

    real = recorded("nova_hypervisor_show")
    resp = _nova(sim, "GET", f"/os-hypervisors/{body['hypervisors'][0]['id']}", "2.88")
    assert resp.status_code == real["status"]
    assert not shape_diff(real["body"], resp.json(), nullable=HYPERVISOR_NULLABLE)

    # 2.53 still carries the resource figures, with cpu_info an object (a JSON string before 2.28)
    real = recorded("nova_hypervisors_detail_v2_53")
    resp = _nova(sim, "GET", "/os-hypervisors/detail", "2.53")
    assert resp.status_code == real["status"]
    assert not shape_diff(WITHOUT_LINKS(real["body"]), resp.json(), nullable=HYPERVISOR_NULLABLE)


# --- against a live Nova 34.0.0 (nova-api, nova-conductor, nova-compute with the fake driver, on
# PostgreSQL and RabbitMQ), recorded by record_real.record_nova_live: tests/fixtures/recorded/nova_live_*.json


def test_services_match_live_nova(sim):
    real = recorded("nova_live_services_list")
    resp = _nova(sim, "GET", "/os-services", "2.69")
    assert resp.status_code == real["status"]
    assert resp.headers["OpenStack-API-Version"] == real["headers"]["OpenStack-API-Version"] == "compute 2.69"
    assert not shape_diff(real["body"], resp.json(), nullable=SERVICE_NULLABLE)
    real = recorded("nova_live_services_host")
    resp = _nova(sim, "GET", "/os-services?binary=nova-compute&host=compute-gpu001", "2.69")
    assert resp.status_code == real["status"] and len(resp.json()["services"]) == len(real["body"]["services"]) == 1
    sid = resp.json()["services"][0]["id"]
    for name, body in (("nova_live_service_disable", {"status": "disabled", "disabled_reason": "gpupool: x"}),
                       ("nova_live_service_enable", {"status": "enabled"})):
        real = recorded(name)
        resp = _nova(sim, "PUT", f"/os-services/{sid}", "2.69", json=body)
        assert resp.status_code == real["status"], name
        assert not shape_diff(real["body"], resp.json(), nullable=SERVICE_NULLABLE), name
        assert resp.json()["service"]["status"] == real["body"]["service"]["status"]
    for name, action, extra in (("nova_live_service_disable_legacy", "disable-log-reason", {"disabled_reason": "x"}),
                                ("nova_live_service_enable_legacy", "enable", {})):
        real = recorded(name)
        resp = _nova(sim, "PUT", f"/os-services/{action}",
                     json={"host": "compute-gpu001", "binary": "nova-compute", **extra})
        assert resp.status_code == real["status"], name
        assert not shape_diff(real["body"], resp.json()), name


def test_service_errors_match_live_nova(sim):
    sid = _nova(sim, "GET", "/os-services?binary=nova-compute&host=compute-gpu001", "2.69").json()["services"][0]["id"]
    for name, path, body in (
            ("nova_live_service_not_found", "/os-services/00000000-0000-0000-0000-000000000000", {"status": "disabled"}),
            ("nova_live_service_bad_status", f"/os-services/{sid}", {"status": "maybe"})):
        real = recorded(name)
        resp = _nova(sim, "PUT", path, "2.69", json=body)
        assert resp.status_code == real["status"], name
        assert not shape_diff(real["body"], resp.json()), name
        assert resp.json() == real["body"], name


def test_hypervisors_match_live_nova(sim):
    real = recorded("nova_live_hypervisors_detail")
    resp = _nova(sim, "GET", "/os-hypervisors/detail", "2.88")
    assert resp.status_code == real["status"]
    assert not shape_diff(real["body"], resp.json(), nullable=HYPERVISOR_NULLABLE)
    hid = resp.json()["hypervisors"][0]["id"]
    real = recorded("nova_live_hypervisor_show")
    resp = _nova(sim, "GET", f"/os-hypervisors/{hid}", "2.88")
    assert resp.status_code == real["status"]
    assert not shape_diff(real["body"], resp.json(), nullable=HYPERVISOR_NULLABLE)
    real = recorded("nova_live_hypervisors_detail_v2_53")
    resp = _nova(sim, "GET", "/os-hypervisors/detail", "2.53")
    assert resp.status_code == real["status"]
    assert not shape_diff(real["body"], resp.json(), nullable=HYPERVISOR_NULLABLE)
    real = recorded("nova_live_hypervisor_not_found")
    resp = _nova(sim, "GET", "/os-hypervisors/00000000-0000-0000-0000-000000000000", "2.88")
    assert resp.status_code == real["status"] and resp.json() == real["body"]
