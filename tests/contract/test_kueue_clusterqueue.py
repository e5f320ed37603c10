"""The ClusterQueue paths gpupool's queue quota reads and writes (gpupool.actuation.quota) exist
in the published answer of Kueue's API (tests/fixtures/recorded/kueue_clusterqueue.json), and a
change keeps its shape: the same keys and types, the annotation gpupool adds aside. The
integration tests (tests/integration_actuation/test_kubernetes_quota.py, test_queue_quota.py) serve this same answer."""

from __future__ import annotations

import copy

import pytest

from gpupool.actuation.quota import GROW, KUEUE, NODES_ANNOTATION, SHRINK, change_quota, parse_quantity, quota_entry
from tests.contract.conftest import recorded
from tests.contract.shapes import shape_diff

FLAVOR, GPU = "default-flavor", "nvidia.com/gpu"


@pytest.fixture
def real() -> dict:
    return recorded("kueue_clusterqueue")["body"]


def test_the_object_is_the_one_the_client_asks_for(real):
    group, version, plural = KUEUE
    assert real["apiVersion"] == f"{group}/{version}" and real["kind"] == "ClusterQueue" and plural == "clusterqueues"
    assert "namespace" not in real["metadata"]  # cluster-scoped: the client's *_cluster_custom_object calls
    assert isinstance(real["metadata"]["resourceVersion"], str)  # what a replace carries back


def test_the_quota_entry_is_where_the_code_looks(real):
    entry = quota_entry(real, FLAVOR, GPU)
    assert parse_quantity(entry["nominalQuota"], "nominalQuota") == 16
    for group in real["spec"]["resourceGroups"]:  # Kueue's validation: one entry per covered resource
        assert all([r["name"] for r in f["resources"]] == group["coveredResources"] for f in group["flavors"])
    with pytest.raises(LookupError, match="no such flavor"):
        quota_entry(real, "spot", GPU)
    with pytest.raises(LookupError, match="no such resource"):
        quota_entry(real, FLAVOR, "amd.com/gpu")


@pytest.mark.parametrize("action, gpus, after", [(SHRINK, 0, "8"), (GROW, 8, "24")])
def test_a_change_keeps_the_shape(real, action, gpus, after):
    obj = copy.deepcopy(real)
    counted = {"gpu-a": 8} if action == SHRINK else {}
    before, new = change_quota(obj, counted, FLAVOR, GPU, "gpu-a", action, gpus)
    assert before == 16 and str(new) == after and quota_entry(obj, FLAVOR, GPU)["nominalQuota"] == after
    annotations = obj["metadata"].pop("annotations")
    assert set(annotations) == {NODES_ANNOTATION}
    assert shape_diff(real, obj) == []
    assert obj["status"] == real["status"]  # a subresource: a replace of the object leaves it alone


def test_the_flavor_says_its_nodes_where_the_code_looks():
    from gpupool.actuation.quota import FLAVORS

    flavor = recorded("kueue_resourceflavor")["body"]
    group, version, plural = FLAVORS
    assert flavor["apiVersion"] == f"{group}/{version}" and flavor["kind"] == "ResourceFlavor"
    assert plural == "resourceflavors" and "namespace" not in flavor["metadata"]
    assert isinstance(flavor["spec"]["nodeLabels"], dict) and flavor["spec"]["nodeLabels"]


def _created(body: dict) -> dict:
    """A recorded object as an operator writes it: what the server sets left out."""
    obj = copy.deepcopy(body)
    obj.pop("status", None)
    obj["metadata"] = {"name": obj["metadata"]["name"]}
    return obj


def test_the_facade_serves_the_recorded_shapes_and_the_quota_follows_a_node(sim):
    """The virtual datacenter's Kubernetes API stores Kueue's objects as the API server does
    (created, read back in the published shape, replaced only with the current
    resourceVersion), and the actuator's queue quota follows a node moved on it."""
    from types import SimpleNamespace

    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from gpupool.actuation.actuators.base import moving_reason
    from gpupool.actuation.actuators.kubernetes import KubernetesActuator
    from gpupool.actuation.quota import FLAVORS

    cfg = client.Configuration()
    cfg.host = sim.urls["kubernetes"]
    api = client.ApiClient(cfg)
    custom = client.CustomObjectsApi(api)
    assert "kueue.x-k8s.io" in {g.name for g in client.ApisApi(api).get_api_versions().groups}
    flavor = _created(recorded("kueue_resourceflavor")["body"])
    flavor["spec"]["nodeLabels"] = {}  # every node of the world is of the flavor
    custom.create_cluster_custom_object(*FLAVORS, flavor)
    custom.create_cluster_custom_object(*KUEUE, _created(recorded("kueue_clusterqueue")["body"]))
    real = recorded("kueue_clusterqueue")["body"]
    served = custom.get_cluster_custom_object(*KUEUE, real["metadata"]["name"])
    assert shape_diff(real, served) == []
    stale = copy.deepcopy(served)
    served["spec"]["stopPolicy"] = "Hold"
    custom.replace_cluster_custom_object(*KUEUE, served["metadata"]["name"], served)
    with pytest.raises(ApiException) as err:
        custom.replace_cluster_custom_object(*KUEUE, stale["metadata"]["name"], stale)
    assert err.value.status == 409

    spec = SimpleNamespace(cluster_queue=real["metadata"]["name"], flavor=FLAVOR, resource=GPU)
    act = KubernetesActuator(api, "kubernetes", quota=spec)
    nodes = sim.state.nodes("kubernetes")
    name = next(n["name"] for n in nodes if n["busy_gpus"] == 0)
    gpus = next(n["gpus"] for n in nodes if n["name"] == name)
    assert [c.action for c in act.release_commands(name, moving_reason("slurm"))] == [SHRINK, "cordon"]
    act.release(name, moving_reason("slurm"))
    after = custom.get_cluster_custom_object(*KUEUE, spec.cluster_queue)
    assert quota_entry(after, FLAVOR, GPU)["nominalQuota"] == str(16 - gpus)
    act.attach(name)
    after = custom.get_cluster_custom_object(*KUEUE, spec.cluster_queue)
    assert quota_entry(after, FLAVOR, GPU)["nominalQuota"] == "16"
