"""A KAI-Scheduler Queue's GPU quota follows the nodes gpupool moves: the official client's
CustomObjectsApi against the emulated API server (kmock), the Queue served being the shape of
KAI's published CRD (tests/fixtures/recorded/kai_queue.json). The PUT handler is the Kueue
tests' (``resourceVersion`` checked, 409 on a stale one, ``status`` kept), on KAI's path."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpupool.actuation import handover as ho
from gpupool.actuation.actuators.base import ActuationError
from gpupool.actuation.actuators.kubernetes import KubernetesActuator
from gpupool.actuation.power.base import PARK_REASON
from gpupool.actuation.quota import GROW, KAI, NODES_ANNOTATION, SHRINK
from memplatform import Datacenter, MemActuator
from tests.integration_actuation.test_kubernetes_quota import T0, Kueue, _node

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "recorded" / "kai_queue.json"
QUEUE = "team-ai"
SPEC = SimpleNamespace(kind="kai", queue=QUEUE)
MOVING = "gpupool: moving to slurm"


class KaiQueue(Kueue):
    """The Queue side of the emulated API server."""

    API = KAI

    def _more(self):
        pass  # KAI has no flavor: nothing else is read

    @staticmethod
    def quota_of(obj):
        return obj["spec"]["resources"]["gpu"].get("quota")

    def queue(self, name=QUEUE):
        return super().queue(name)

    def put_queue(self, quota=16, counted=None, name=QUEUE, drop_gpu=False):
        """The published Queue, named ``name`` with ``quota`` GPU units and gpupool's record."""
        obj = copy.deepcopy(json.loads(RECORDED.read_text())["body"])
        obj["metadata"]["name"] = name
        obj["spec"]["resources"]["gpu"]["quota"] = quota
        if counted is not None:
            obj["metadata"]["annotations"] = {NODES_ANNOTATION: json.dumps(counted)}
        if drop_gpu:
            del obj["spec"]["resources"]["gpu"]

        def assign():
            self.kube.k.objects[self.res, None, name] = obj

        self.kube._call(assign)


@pytest.fixture
def kai(kube):
    """Two open GPU nodes of 8 GPUs, one lent to Slurm, a CPU node; the Queue counts the open
    ones (16 GPUs) in gpupool's record."""
    kube.put("nodes", None, "k8s-gpu-01", _node("k8s-gpu-01"))
    kube.put("nodes", None, "k8s-gpu-02", _node("k8s-gpu-02"))
    kube.put("nodes", None, "gpu-n07", _node("gpu-n07", cordon=MOVING, owner="slurm"))
    kube.put("nodes", None, "k8s-cpu-01", _node("k8s-cpu-01", gpus=0))
    q = KaiQueue(kube)
    q.put_queue(16, counted={"k8s-gpu-01": 8, "k8s-gpu-02": 8})
    return q


def _actuator(kube):
    return KubernetesActuator(kube.api_client(), "kubernetes", quota=SPEC)


def test_release_shrinks_the_quota_before_the_cordon(kai):
    act = _actuator(kai.kube)
    cmds = act.release_commands("k8s-gpu-01", MOVING)
    assert [c.action for c in cmds] == [SHRINK, "cordon"]
    assert cmds[0].request == {"queue": QUEUE, "node": "k8s-gpu-01"}
    answers = [act.send(c) for c in cmds]
    assert answers[0]["changed"] and answers[0]["quota"] == "8"
    assert kai.writes == [{"quota": 8, "cordoned": ["gpu-n07"]}]  # the node was still open then
    assert kai.counted() == {"k8s-gpu-02": 8}
    gpu = kai.queue()["spec"]["resources"]["gpu"]
    assert gpu == {"quota": 8, "limit": -1, "overQuotaWeight": 1}  # limit and weight left alone
    assert kai.kube.get("nodes", None, "k8s-gpu-01")["spec"]["unschedulable"] is True


def test_attach_grows_the_quota_after_the_uncordon(kai):
    act = _actuator(kai.kube)
    cmds = act.attach_commands("gpu-n07")
    assert [c.action for c in cmds] == ["uncordon", GROW]
    assert cmds[1].request == {"queue": QUEUE, "node": "gpu-n07", "gpus": 8}
    for c in cmds:
        act.send(c)
    assert kai.writes == [{"quota": 24, "cordoned": []}]  # gpu-n07 was open when the queue grew
    assert kai.counted() == {"k8s-gpu-01": 8, "k8s-gpu-02": 8, "gpu-n07": 8}
    assert act.attach_commands("gpu-n07") == []


def test_a_mig_node_adds_its_gpu_units(kai):
    """KAI counts a mig-<X>g device as X units: 56 1g slices of 8 GPUs add 56."""
    node = _node("gpu-n08", gpus=0, cordon=MOVING, owner="slurm")
    node["status"]["allocatable"]["nvidia.com/mig-1g.10gb"] = "56"
    kai.kube.put("nodes", None, "gpu-n08", node)
    act = _actuator(kai.kube)
    for c in act.attach_commands("gpu-n08"):
        act.send(c)
    assert kai.quota() == 16 + 56 and kai.counted()["gpu-n08"] == 56


def test_sent_twice_acts_once(kai):
    act = _actuator(kai.kube)
    shrink = act.release_commands("k8s-gpu-01", MOVING)[0]
    act.send(shrink)
    assert not act.send(shrink)["changed"] and kai.quota() == 8
    assert [c.action for c in act.release_commands("k8s-gpu-01", MOVING)] == ["cordon"]
    grow = act.attach_commands("gpu-n07")[-1]
    act.send(grow)
    act.send(grow)
    assert kai.quota() == 16 and len(kai.writes) == 2


def test_two_writers_interleaved_lose_nothing(kai):
    """Writer A reads the queue, writer B shrinks another node in between: A's replace meets a
    409, reads again and applies its change on top of B's."""
    a, b = _actuator(kai.kube), _actuator(kai.kube)
    shrink_a = a.release_commands("k8s-gpu-01", MOVING)[0]
    shrink_b = b.release_commands("k8s-gpu-02", MOVING)[0]
    real_get = a.quota.custom.get_cluster_custom_object
    calls = []

    def get_then_b_writes(*args, **kwargs):
        obj = real_get(*args, **kwargs)
        if not calls:
            b.send(shrink_b)
        calls.append(1)
        return obj

    a.quota.custom.get_cluster_custom_object = get_then_b_writes
    assert a.send(shrink_a)["changed"]
    assert kai.conflicts == 1 and len(calls) == 2
    assert kai.quota() == 0 and kai.counted() == {}


def test_quota_never_goes_below_zero(kai):
    kai.put_queue(4, counted={"k8s-gpu-01": 8, "k8s-gpu-02": 8})  # an operator lowered it by hand
    act = _actuator(kai.kube)
    assert act.send(act.release_commands("k8s-gpu-01", MOVING)[0])["quota"] == "0"
    assert kai.quota() == 0


def test_first_sight_seeds_the_record_from_every_gpu_node_held(kube):
    """No record yet: every GPU node the platform holds counts (KAI has no flavor: the A100 too),
    a parked one too, not the one lent to Slurm nor the CPU node."""
    kube.put("nodes", None, "k8s-gpu-01", _node("k8s-gpu-01"))
    kube.put("nodes", None, "k8s-gpu-02", _node("k8s-gpu-02", product="NVIDIA-A100-SXM4-80GB"))
    kube.put("nodes", None, "k8s-gpu-03", _node("k8s-gpu-03", cordon=PARK_REASON, owner="kubernetes"))
    kube.put("nodes", None, "gpu-n07", _node("gpu-n07", cordon=MOVING, owner="slurm"))
    kube.put("nodes", None, "k8s-cpu-01", _node("k8s-cpu-01", gpus=0))
    q = KaiQueue(kube)
    q.put_queue(24)
    act = _actuator(kube)
    for c in act.release_commands("k8s-gpu-01", MOVING):
        act.send(c)
    assert q.counted() == {"k8s-gpu-02": 8, "k8s-gpu-03": 8} and q.quota() == 16


def test_handover_audits_shrink_first_and_grow_last(kai, sqlite_engine):
    k8s = _actuator(kai.kube)
    dc = Datacenter(("slurm",), {"k8s-gpu-01": "kubernetes", "gpu-n07": "slurm"})
    acts = {"slurm": MemActuator(dc, "slurm"), "kubernetes": k8s}
    out = ho.open_handover(sqlite_engine, "k8s-gpu-01", "kubernetes", "slurm", T0, dry_run=False)
    into = ho.open_handover(sqlite_engine, "gpu-n07", "slurm", "kubernetes", T0, dry_run=False)
    report = ho.advance_all(sqlite_engine, acts, T0, dry_run=False)
    assert {h["id"]: h["state"] for h in report["handovers"]} == {out: ho.DONE, into: ho.DONE}
    assert [r["action"] for r in ho.audit_rows(sqlite_engine, out)] == [SHRINK, "cordon", "resume"]
    assert [r["action"] for r in ho.audit_rows(sqlite_engine, into)] == ["drain", "uncordon", GROW]
    assert kai.counted() == {"k8s-gpu-02": 8, "gpu-n07": 8} and kai.quota() == 16


@pytest.mark.parametrize("case, message", [
    ("no queue", "no such Queue"),
    ("unlimited", "unlimited"),
])
def test_a_missing_or_unlimited_queue_stops_the_release_before_anything_is_sent(kai, sqlite_engine, case, message):
    if case == "no queue":
        kai.kube._call(lambda: kai.kube.k.objects[kai.res, None, QUEUE].delete())
    else:
        kai.put_queue(-1, counted={"k8s-gpu-01": 8})
    act = _actuator(kai.kube)
    with pytest.raises(ActuationError) as err:
        act.release_commands("k8s-gpu-01", MOVING)
    assert message in str(err.value) and repr(QUEUE) in str(err.value)
    dc = Datacenter(("slurm",), {"k8s-gpu-01": "kubernetes"})
    hid = ho.open_handover(sqlite_engine, "k8s-gpu-01", "kubernetes", "slurm", T0, dry_run=False)
    ho.advance_all(sqlite_engine, {"slurm": MemActuator(dc, "slurm"), "kubernetes": act}, T0, dry_run=False)
    h = ho.get_handover(sqlite_engine, hid)
    assert h.state == ho.RELEASING and message in h.error  # retried next run, nothing sent
    assert not kai.kube.get("nodes", None, "k8s-gpu-01")["spec"]["unschedulable"]
    assert ho.audit_rows(sqlite_engine, hid) == []


def test_a_queue_without_gpu_resources_starts_from_zero(kai):
    """KAI's default for an unset quota is 0: the first grow writes ``spec.resources.gpu.quota``."""
    kai.put_queue(counted={}, drop_gpu=True)
    act = _actuator(kai.kube)
    for c in act.attach_commands("gpu-n07"):
        act.send(c)
    assert kai.queue()["spec"]["resources"]["gpu"] == {"quota": 8}


def test_a_node_without_gpus_is_not_opened(kai):
    kai.kube.put("nodes", None, "gpu-n08", _node("gpu-n08", gpus=0, cordon=MOVING, owner="slurm"))
    with pytest.raises(ActuationError, match="reports no allocatable GPUs"):
        _actuator(kai.kube).attach_commands("gpu-n08")
    assert kai.kube.get("nodes", None, "gpu-n08")["spec"]["unschedulable"] is True


def test_platforms_yaml_quota_reaches_the_actuator(kai):
    """`platforms[].quota: {kind: kai, queue}` in the configuration: the built actuator shrinks that Queue."""
    from gpupool.config import parse_config
    from gpupool.platforms import build_actuator

    cfg = parse_config({"platforms": [{
        "name": "kubernetes", "kind": "kubernetes", "conn_id": "ai", "actuation": True,
        "quota": {"kind": "kai", "queue": QUEUE}}]})
    env = {"AIRFLOW_CONN_AI": json.dumps({"conn_type": "http", "host": kai.kube.url})}
    act = build_actuator(cfg.platforms[0], cfg, env=env)
    for c in act.release_commands("k8s-gpu-01", MOVING):
        act.send(c)
    assert kai.quota() == 8
