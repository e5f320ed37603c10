"""A KAI-Scheduler Queue's GPU quota follows the nodes gpupool moves: what only KAI's shape has
(GPU units, ``limit`` and ``overQuotaWeight`` beside the quota, an unset quota of 0). The
official client's CustomObjectsApi against the emulated API server (kmock), the Queue served
being the shape of KAI's published CRD (tests/fixtures/recorded/kai_queue.json) through the
harness of queue_harness.py; the cases every queue shape shares are in test_queue_quota.py."""

from __future__ import annotations

import pytest

from gpupool.actuation.actuators.kubernetes import KubernetesActuator
from tests.integration_actuation.queue_harness import MOVING, KaiQueue, _node, held_world


@pytest.fixture
def kai(kube):
    """The held world (queue_harness.held_world) with a KAI Queue of 16 GPU units."""
    return held_world(kube, KaiQueue)


def _actuator(kube):
    return KubernetesActuator(kube.api_client(), "kubernetes", quota=KaiQueue.SPEC)


def test_limit_and_weight_are_left_alone(kai):
    act = _actuator(kai.kube)
    for c in act.release_commands("k8s-gpu-01", MOVING):
        act.send(c)
    assert kai.queue()["spec"]["resources"]["gpu"] == {"quota": 8, "limit": -1, "overQuotaWeight": 1}


def test_a_mig_node_adds_its_gpu_units(kai):
    """KAI counts a mig-<X>g device as X units: 56 1g slices of 8 GPUs add 56."""
    node = _node("gpu-n08", gpus=0, cordon=MOVING, owner="slurm")
    node["status"]["allocatable"]["nvidia.com/mig-1g.10gb"] = "56"
    kai.kube.put("nodes", None, "gpu-n08", node)
    act = _actuator(kai.kube)
    for c in act.attach_commands("gpu-n08"):
        act.send(c)
    assert kai.quota() == 16 + 56 and kai.counted()["gpu-n08"] == 56


def test_a_queue_without_gpu_resources_starts_from_zero(kai):
    """KAI's default for an unset quota is 0: the first grow writes ``spec.resources.gpu.quota``."""
    kai.put_queue(counted={}, drop_gpu=True)
    act = _actuator(kai.kube)
    for c in act.attach_commands("gpu-n07"):
        act.send(c)
    assert kai.queue()["spec"]["resources"]["gpu"] == {"quota": 8}
