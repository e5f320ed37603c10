"""The OpenStack source against real Keystone (password auth) and Placement."""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from faultproxy import Fault, FaultProxy

from gpupool.canonical import SAMPLE_COLUMNS
from gpupool.sources.base import INVENTORY_KEYS, RetryPolicy, SourceError
from gpupool.sources.openstack import GnocchiMeter, OpenStackSource

FAST_RETRY = RetryPolicy(attempts=2, base_delay=0.01, max_delay=0.02)
MV = "1.28"


def _now():
    return datetime.now(timezone.utc)


def _post(conn, path, body):
    resp = conn.placement.post(path, json=body, microversion=MV, raise_exc=False)
    assert resp.status_code in (200, 201, 204), (path, resp.status_code, resp.text)
    return resp


def _put(conn, path, body=None):
    resp = conn.placement.put(path, json=body, microversion=MV, raise_exc=False)
    assert resp.status_code in (200, 201, 204), (path, resp.status_code, resp.text)
    return resp


def _provider(conn, name, parent=None):
    body = {"name": name, "uuid": str(uuid.uuid4())}
    if parent:
        body["parent_provider_uuid"] = parent
    _post(conn, "/resource_providers", body)
    return body["uuid"]


def _inventory(conn, rp, inventories):
    gen = conn.placement.get(f"/resource_providers/{rp}", microversion=MV).json()["generation"]
    _put(conn, f"/resource_providers/{rp}/inventories",
         {"resource_provider_generation": gen, "inventories": inventories})


def _traits(conn, rp, traits):
    gen = conn.placement.get(f"/resource_providers/{rp}", microversion=MV).json()["generation"]
    _put(conn, f"/resource_providers/{rp}/traits", {"resource_provider_generation": gen, "traits": traits})


def _allocate(conn, consumer, rp, resources):
    _put(conn, f"/allocations/{consumer}", {
        "allocations": {rp: {"resources": resources}}, "consumer_generation": None,
        "project_id": str(uuid.uuid4()), "user_id": str(uuid.uuid4()),
    })


@pytest.fixture(scope="module")
def cloud(openstack_services):
    """Four compute nodes in Placement, built through the real API.

    cn1: two physical GPUs as child providers with 8 VGPU each (A100), 2 VGPU allocated on one
    cn2: 4 PGPU on the root, 1 allocated, compute service disabled (COMPUTE_STATUS_DISABLED)
    cn3: CPUs only (not a GPU node)
    cn4: 2 CUSTOM_PCI_NVIDIA_H100, all reserved
    """
    conn = openstack_services.connect()
    _put(conn, "/traits/CUSTOM_GPU_MODEL_A100")
    _put(conn, "/resource_classes/CUSTOM_PCI_NVIDIA_H100")
    ids = {}
    ids["cn1"] = _provider(conn, "cn1")
    _inventory(conn, ids["cn1"], {"VCPU": {"total": 64}, "MEMORY_MB": {"total": 512000}})
    for i in range(2):
        rp = ids[f"cn1_pgpu{i}"] = _provider(conn, f"cn1_pci_0000_8{i}_00_0", parent=ids["cn1"])
        _inventory(conn, rp, {"VGPU": {"total": 8, "max_unit": 8}})
        _traits(conn, rp, ["CUSTOM_GPU_MODEL_A100"])
    _allocate(conn, str(uuid.uuid4()), ids["cn1_pgpu0"], {"VGPU": 2})
    ids["cn2"] = _provider(conn, "cn2")
    _inventory(conn, ids["cn2"], {"VCPU": {"total": 64}, "PGPU": {"total": 4, "max_unit": 4}})
    _traits(conn, ids["cn2"], ["COMPUTE_STATUS_DISABLED"])
    _allocate(conn, str(uuid.uuid4()), ids["cn2"], {"PGPU": 1})
    ids["cn3"] = _provider(conn, "cn3")
    _inventory(conn, ids["cn3"], {"VCPU": {"total": 32}})
    ids["cn4"] = _provider(conn, "cn4")
    _inventory(conn, ids["cn4"], {"CUSTOM_PCI_NVIDIA_H100": {"total": 2, "reserved": 2, "max_unit": 2}})
    return openstack_services, conn, ids


def _source(services, **kw):
    kw.setdefault("retry", FAST_RETRY)
    kw.setdefault("with_nova", False)
    return OpenStackSource(
        "openstack-cloud", auth_url=services.keystone_url, username="gpupool",
        password=kw.pop("password", services.credentials["gpupool"]), project_name="gpupool",
        region_name="RegionOne", **kw,
    )


def test_inventory_from_placement(cloud):
    services, _, _ = cloud
    recs = _source(services).inventory(_now())
    assert all(tuple(r) == INVENTORY_KEYS for r in recs)
    assert recs == [
        {"node": "cn1", "platform": "openstack-cloud", "gpus": 2, "gpu_model": "a100", "mig_layout": {"VGPU": 16},
         "schedulable": True, "drain_reason": None, "busy_gpus": 1},
        {"node": "cn2", "platform": "openstack-cloud", "gpus": 4, "gpu_model": None, "mig_layout": None,
         "schedulable": False, "drain_reason": "COMPUTE_STATUS_DISABLED", "busy_gpus": 1},
        {"node": "cn4", "platform": "openstack-cloud", "gpus": 2, "gpu_model": None, "mig_layout": None,
         "schedulable": False, "drain_reason": "all GPU inventory reserved", "busy_gpus": 0},
    ]


def test_allocations_are_followed(cloud):
    services, conn, ids = cloud
    src = _source(services)
    consumer = str(uuid.uuid4())
    _allocate(conn, consumer, ids["cn1_pgpu1"], {"VGPU": 1})
    try:
        assert {r["node"]: r["busy_gpus"] for r in src.inventory(_now())}["cn1"] == 2
    finally:
        conn.placement.delete(f"/allocations/{consumer}", microversion=MV)
    assert {r["node"]: r["busy_gpus"] for r in src.inventory(_now())}["cn1"] == 1


def test_snapshot_is_canonical(cloud):
    services, _, _ = cloud
    at = datetime(2026, 11, 1, 12, tzinfo=timezone.utc)
    snap = _source(services).snapshot(at)
    assert list(snap.columns) == SAMPLE_COLUMNS and set(snap["ts"]) == {at}
    values = {(r.entity_id, r.metric): r.value for r in snap.itertuples()}
    assert values == {("cn1", "gpu_capacity"): 2, ("cn1", "gpu_allocated"): 1, ("cn2", "gpu_capacity"): 4,
                      ("cn2", "gpu_allocated"): 1, ("cn4", "gpu_capacity"): 2, ("cn4", "gpu_allocated"): 0}


def test_wrong_password_names_no_credential(cloud, caplog):
    services, _, _ = cloud
    caplog.set_level(logging.DEBUG)
    secret = "Wr0ng-Passw0rd-xyz"
    with pytest.raises(SourceError) as err:
        _source(services, password=secret).inventory(_now())
    e = err.value
    assert "authentication refused (HTTP 401)" in str(e) and not e.retryable
    assert e.platform == "openstack-cloud" and services.keystone_url in e.endpoint
    assert secret not in str(e) and secret not in caplog.text
    assert services.credentials["gpupool"] not in caplog.text


def test_nova_absent_is_a_clear_error(cloud):
    services, _, _ = cloud
    with pytest.raises(SourceError, match="compute os-services .*service not in the service catalog"):
        _source(services, with_nova=True).inventory(_now())


def test_gnocchi_absent_is_a_clear_error(cloud):
    services, _, _ = cloud
    src = _source(services, gnocchi_meters={"gpu_util": GnocchiMeter("gpu.util")})
    start = datetime(2026, 11, 1, tzinfo=timezone.utc)
    with pytest.raises(SourceError, match="metric /v1/aggregates.*service not in the service catalog") as err:
        src.usage(start, start + timedelta(hours=1))
    assert err.value.window == "2026-11-01T00:00:00Z/2026-11-01T01:00:00Z"
    with pytest.raises(SourceError, match="no Gnocchi meters configured"):
        _source(services).usage(start, start + timedelta(hours=1))


def test_keystone_down_is_retryable():
    src = OpenStackSource("openstack-cloud", auth_url="http://127.0.0.1:9/v3", username="u", password="p",
                          project_name="p", with_nova=False, retry=FAST_RETRY, timeout=2)
    with pytest.raises(SourceError, match="connection refused") as err:
        src.inventory(_now())
    assert err.value.retryable


def test_placement_5xx_is_retried(cloud):
    services, _, _ = cloud
    with FaultProxy(services.placement_url) as proxy:
        proxy.faults.append(Fault(status=503, body=b'{"errors": []}', path="/resource_providers"))
        recs = _source(services, endpoint_overrides={"placement": proxy.url}).inventory(_now())
    assert [r["node"] for r in recs] == ["cn1", "cn2", "cn4"]
    listings = [path for _, path, _ in proxy.requests if path == "/resource_providers"]
    assert len(listings) == 2 and not proxy.faults


def test_placement_timeout_and_garbage(cloud):
    services, _, _ = cloud
    with FaultProxy(services.placement_url) as proxy:
        src = _source(services, endpoint_overrides={"placement": proxy.url}, timeout=0.5,
                      retry=RetryPolicy(attempts=1))
        proxy.faults.append(Fault(delay=1.5, path="/resource_providers"))
        with pytest.raises(SourceError, match="no answer within 0.5s") as err:
            src.inventory(_now())
        assert err.value.retryable
        # the payload checks get a generous timeout: on a loaded machine a healthy answer may take > 0.5 s
        src = _source(services, endpoint_overrides={"placement": proxy.url}, timeout=10,
                      retry=RetryPolicy(attempts=1))
        proxy.faults.append(Fault(replace_body=True, body=b"<html>gateway</html>", path="/resource_providers"))
        with pytest.raises(SourceError, match="malformed payload") as err:
            src.inventory(_now())
        assert not err.value.retryable
        proxy.faults.append(Fault(replace_body=True, body=b'{"providers": []}', path="/resource_providers"))
        with pytest.raises(SourceError, match="placement /resource_providers.*malformed payload"):
            src.inventory(_now())
        proxy.faults.append(Fault(status=404, body=b"{}", path="/resource_providers"))
        with pytest.raises(SourceError, match="HTTP 404"):
            src.inventory(_now())
