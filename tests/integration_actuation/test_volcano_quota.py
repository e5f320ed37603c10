"""A Volcano Queue's GPU capability follows the nodes gpupool moves: what only Volcano's shape has
(``deserved`` and ``guarantee`` following the capability where the queue sets them, quantities
written back as strings, the resource configurable). The official client's CustomObjectsApi
against the emulated API server (kmock), the Queue served being the shape of Volcano's published
CRD and docs (tests/fixtures/recorded/volcano_queue.json: written from them, not recorded from a
live Volcano) through the harness of queue_harness.py; the cases every queue shape shares
(grow after attach, shrink before release, sent twice, two writers and their 409, unlimited or
malformed queues refused) are in test_queue_quota.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gpupool.actuation.actuators.base import ActuationError
from gpupool.actuation.actuators.kubernetes import KubernetesActuator
from gpupool.actuation.quota import GROW, SHRINK
from tests.integration_actuation.queue_harness import GPU, MOVING, VolcanoQueue, _node, held_world


@pytest.fixture
def volcano(kube):
    """The held world (queue_harness.held_world) with a Volcano Queue: capability 16 GPUs,
    deserved 16, guarantee 8."""
    return held_world(kube, VolcanoQueue)


def _actuator(kube, spec=VolcanoQueue.SPEC):
    return KubernetesActuator(kube.api_client(), "kubernetes", quota=spec)


def _gpus(q):
    obj = q.queue()
    return q.quota_of(obj), q.deserved_of(obj), q.guarantee_of(obj)


def test_deserved_and_guarantee_follow_the_capability(volcano):
    act = _actuator(volcano.kube)
    shrink = act.release_commands("k8s-gpu-01", MOVING)[0]
    answer = act.send(shrink)
    assert answer == {"queue": "team-ai", "resource": GPU, "capability": "8", "deserved": "8", "guarantee": "0",
                      "changed": True, "nodes_counted": 1}
    assert _gpus(volcano) == ("8", "8", "0")
    grow = act.attach_commands("gpu-n07")[-1]
    assert grow.action == GROW
    assert act.send(grow)["guarantee"] == "8"
    assert _gpus(volcano) == ("16", "16", "8")
    spec = volcano.queue()["spec"]  # the other resources and keys as the operator set them
    fixture = volcano.fixture()["spec"]
    for where in ("capability", "deserved"):
        assert {k: v for k, v in spec[where].items() if k != GPU} == {k: v for k, v in fixture[where].items() if k != GPU}
    assert spec["guarantee"]["resource"]["memory"] == "128Gi"
    assert (spec["priority"], spec["reclaimable"], spec["weight"]) == (100, True, 1)


def test_a_guarantee_shrinks_no_lower_than_zero(volcano):
    act = _actuator(volcano.kube)
    for node in ("k8s-gpu-01", "k8s-gpu-02"):
        act.send(act.release_commands(node, MOVING)[0])
    assert _gpus(volcano) == ("0", "0", "0")  # guarantee 8 - 16 stops at 0


@pytest.mark.parametrize("deserved, guarantee", [(None, None), ("16", None), (None, "8")])
def test_only_what_the_queue_sets_follows(volcano, deserved, guarantee):
    """A queue that sets no GPU ``deserved`` (the proportion plugin's queues) or no ``guarantee``
    gets none written: only the capability and what it sets change."""
    volcano.put_queue("16", counted={"k8s-gpu-01": 8, "k8s-gpu-02": 8}, deserved=deserved, guarantee=guarantee)
    act = _actuator(volcano.kube)
    answer = act.send(act.release_commands("k8s-gpu-01", MOVING)[0])
    expected = ("8", None if deserved is None else "8", None if guarantee is None else "0")
    assert _gpus(volcano) == expected
    assert ("deserved" in answer, "guarantee" in answer) == (deserved is not None, guarantee is not None)
    spec = volcano.queue()["spec"]
    assert set(spec["deserved"]) == {"cpu", "memory"} | ({GPU} if deserved else set())


@pytest.mark.parametrize("written, after", [(16, "24"), ("16000m", "24"), ("16", "24")])
def test_quantities_are_read_in_any_form_and_written_as_strings(volcano, written, after):
    volcano.put_queue(written, counted={"k8s-gpu-01": 8, "k8s-gpu-02": 8})
    act = _actuator(volcano.kube)
    for c in act.attach_commands("gpu-n07"):
        act.send(c)
    assert volcano.quota() == after


def test_the_resource_is_the_configured_one(volcano):
    """``quota.resource`` names a MIG resource: a node counts by its slices of it, and a node
    without it is not opened."""
    mig = "nvidia.com/mig-1g.10gb"
    spec = SimpleNamespace(kind="volcano", queue="team-ai", resource=mig)
    obj = volcano.fixture()
    obj["spec"]["capability"][mig] = "14"
    obj["metadata"]["annotations"] = {"gpupool.io/quota-nodes": "{}"}
    volcano.store(obj)
    node = _node("gpu-n08", gpus=0, cordon=MOVING, owner="slurm")
    node["status"]["allocatable"][mig] = "56"
    volcano.kube.put("nodes", None, "gpu-n08", node)
    act = _actuator(volcano.kube, spec)
    cmds = act.attach_commands("gpu-n08")
    assert cmds[-1].request == {"queue": "team-ai", "resource": mig, "node": "gpu-n08", "gpus": 56}
    for c in cmds:
        act.send(c)
    after = volcano.queue()["spec"]
    assert after["capability"][mig] == "70" and after["capability"][GPU] == "16"  # the whole GPUs left alone
    assert mig not in after["deserved"]  # the queue sets no deserved of it: none written
    with pytest.raises(ActuationError, match="reports no allocatable 'nvidia.com/mig-1g.10gb'"):
        act.attach_commands("gpu-n07")
    assert [c.action for c in act.release_commands("gpu-n08", MOVING)] == [SHRINK, "cordon"]
