"""A Kueue ClusterQueue's nominalQuota follows the nodes gpupool moves: what only Kueue's shape
has (a flavor and its ResourceFlavor, a rollback, writers in threads). The official client's
CustomObjectsApi against the emulated API server (kmock), the ClusterQueue served being the
recorded answer (tests/fixtures/recorded/kueue_clusterqueue.json) through the harness of
queue_harness.py; the cases every queue shape shares are in test_queue_quota.py.
"""

from __future__ import annotations

import threading

import pytest

from gpupool.actuation import handover as ho
from gpupool.actuation.actuators.base import ActuationError
from gpupool.actuation.actuators.kubernetes import HOLD_ANNOTATION, OWNER_LABEL, KubernetesActuator
from gpupool.actuation.power.base import PARK_REASON
from gpupool.actuation.power.holds import KubernetesHold
from gpupool.actuation.quota import FLAVORS, GROW, NODES_ANNOTATION
from memplatform import Datacenter, MemActuator
from tests.integration_actuation.queue_harness import A100, MOVING, T0, Kueue, _node, held_world

FLAVOR = Kueue.FLAVOR
SPEC = Kueue.SPEC


@pytest.fixture
def kueue(kube):
    """The held world (queue_harness.held_world) with a ClusterQueue."""
    return held_world(kube, Kueue)


def _actuator(kube, spec=SPEC):
    return KubernetesActuator(kube.api_client(), "kubernetes", quota=spec)


class CordonRefused(KubernetesActuator):
    """The API server refuses the cordon (say, RBAC lost ``patch`` on nodes) after the shrink went out."""

    def send(self, command):
        if command.action == "cordon":
            raise ActuationError(self.platform, command.node, "cordon", "nodes is forbidden (403)")
        return super().send(command)


def test_a_release_whose_cordon_failed_gives_the_quota_back_when_rolled_back(kueue, sqlite_engine):
    """The shrink went out, the cordon did not: the node stays open on Kubernetes, and the
    rollback gives the queue its GPUs back (it would otherwise stay short by the node)."""
    k8s = CordonRefused(kueue.kube.api_client(), "kubernetes", quota=SPEC)
    dc = Datacenter(("slurm",), {"k8s-gpu-01": "kubernetes"})
    acts = {"slurm": MemActuator(dc, "slurm"), "kubernetes": k8s}
    hid = ho.open_handover(sqlite_engine, "k8s-gpu-01", "kubernetes", "slurm", T0, dry_run=False)
    ho.advance_all(sqlite_engine, acts, T0, dry_run=False)
    assert kueue.quota() == "8" and "k8s-gpu-01" not in kueue.counted()
    assert kueue.kube.get("nodes", None, "k8s-gpu-01")["spec"].get("unschedulable") is not True
    out = ho.rollback(sqlite_engine, hid, acts, T0)
    assert out["state"] == ho.ROLLED_BACK
    assert kueue.quota() == "16" and kueue.counted() == {"k8s-gpu-01": 8, "k8s-gpu-02": 8}
    assert [r["action"] for r in ho.audit_rows(sqlite_engine, hid)][-1] == GROW


def test_writers_in_threads_leave_the_right_quota(kube):
    """Eight nodes released and attached by eight threads at once, each with its own client."""
    names = [f"k8s-gpu-{i:02d}" for i in range(8)]
    for i, n in enumerate(names):
        kube.put("nodes", None, n, _node(n, gpus=8 if i % 2 else 4))
    q = Kueue(kube)
    q.put_queue(60, counted={n: (8 if i % 2 else 4) for i, n in enumerate(names[:4])})
    errors = []

    def move(n, i):
        try:
            act = _actuator(kube)
            cmds = act.release_commands(n, MOVING) if i < 4 else act.attach_commands(n)
            for c in cmds:
                act.send(c)
        except Exception as exc:  # surfaced below
            errors.append(exc)

    for n in names[4:]:  # the four to attach arrive cordoned, lent to Slurm
        kube.patch("nodes", None, n, {"spec": {"unschedulable": True}, "metadata": {
            "labels": {OWNER_LABEL: "slurm"}, "annotations": {HOLD_ANNOTATION: MOVING}}})
    threads = [threading.Thread(target=move, args=(n, i)) for i, n in enumerate(names)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert q.counted() == {n: (8 if i % 2 else 4) for i, n in enumerate(names) if i >= 4}
    assert q.quota() == 60 - 24 + 24  # an int quantity stays an int
    assert len(q.writes) == 8


def test_first_sight_seeds_the_record_from_the_nodes_held(kube):
    """No record yet: the quota covers the GPU nodes the platform holds (a parked one too, not
    the one lent to Slurm); a node attached before the feature is subtracted on its release."""
    kube.put("nodes", None, "k8s-gpu-01", _node("k8s-gpu-01"))
    kube.put("nodes", None, "k8s-gpu-02", _node("k8s-gpu-02"))
    kube.put("nodes", None, "k8s-gpu-03", _node("k8s-gpu-03", cordon=PARK_REASON, owner="kubernetes"))
    kube.put("nodes", None, "k8s-gpu-04", _node("k8s-gpu-04", cordon="maintenance by hand"))
    kube.put("nodes", None, "gpu-n07", _node("gpu-n07", cordon=MOVING, owner="slurm"))
    kube.put("nodes", None, "k8s-cpu-01", _node("k8s-cpu-01", gpus=0))
    kube.put("nodes", None, "k8s-a100-01", _node("k8s-a100-01", product=A100))  # another flavor's
    q = Kueue(kube)
    q.put_queue("32")
    act = _actuator(kube)
    assert NODES_ANNOTATION not in (q.queue()["metadata"].get("annotations") or {})
    for c in act.release_commands("k8s-gpu-01", MOVING):
        act.send(c)
    assert q.counted() == {"k8s-gpu-02": 8, "k8s-gpu-03": 8, "k8s-gpu-04": 8} and q.quota() == "24"
    # the parked node wakes (the power hold lifts through attach): it was counted, nothing grows
    assert [c.action for c in KubernetesHold(act).release_commands("k8s-gpu-03")] == ["uncordon"]


def test_first_sight_grow_counts_the_arriving_node(kube):
    kube.put("nodes", None, "k8s-gpu-01", _node("k8s-gpu-01"))
    kube.put("nodes", None, "gpu-n07", _node("gpu-n07", gpus=4, cordon=MOVING, owner="slurm"))
    q = Kueue(kube)
    q.put_queue(8)
    act = _actuator(kube)
    for c in act.attach_commands("gpu-n07"):
        act.send(c)
    assert q.counted() == {"k8s-gpu-01": 8, "gpu-n07": 4} and q.quota() == 12


def test_a_node_of_another_flavor_leaves_the_quota_alone(kueue):
    kueue.kube.put("nodes", None, "gpu-a01", _node("gpu-a01", cordon=MOVING, owner="slurm",
                                                  product=A100))
    act = _actuator(kueue.kube)
    assert [c.action for c in act.attach_commands("gpu-a01")] == ["uncordon"]
    for c in act.attach_commands("gpu-a01"):
        act.send(c)
    assert [c.action for c in act.release_commands("gpu-a01", MOVING)] == ["cordon"]
    assert kueue.quota() == "16" and kueue.writes == []


def test_no_resource_flavor_stops_a_first_sight(kueue):
    kueue.put_queue("16")  # no record yet: the seed needs the flavor's node labels
    kueue.kube._call(lambda: kueue.kube.k.objects[kueue.res.__class__(*FLAVORS), None, FLAVOR].delete())
    with pytest.raises(ActuationError, match="no such ResourceFlavor"):
        _actuator(kueue.kube).release_commands("k8s-gpu-01", MOVING)


def test_without_quota_nothing_changes(kueue):
    act = KubernetesActuator(kueue.kube.api_client(), "kubernetes")
    assert [c.action for c in act.release_commands("k8s-gpu-01", MOVING)] == ["cordon"]
    assert [c.action for c in act.attach_commands("gpu-n07")] == ["uncordon"]

