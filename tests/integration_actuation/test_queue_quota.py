"""A platform's queue quota follows the nodes gpupool moves, whichever queue holds it: a Kueue
ClusterQueue's ``nominalQuota``, a KAI-Scheduler Queue's GPU ``quota``, a Volcano Queue's
``capability``. The official client's CustomObjectsApi against the emulated API server (kmock),
each queue served as its published object (queue_harness.py); every case here runs on each
shape, what only one shape has is in test_kubernetes_quota.py (Kueue), test_kai_quota.py and
test_volcano_quota.py."""

from __future__ import annotations

import json

import pytest

from gpupool.actuation import handover as ho
from gpupool.actuation.actuators.base import ActuationError
from gpupool.actuation.actuators.kubernetes import KubernetesActuator
from gpupool.actuation.power.base import PARK_REASON
from gpupool.actuation.quota import GROW, SHRINK
from memplatform import Datacenter, MemActuator
from tests.integration_actuation.queue_harness import A100, MOVING, SHAPES, T0, _node, held_world


@pytest.fixture(params=list(SHAPES))
def queue(request, kube):
    """The held world (queue_harness.held_world) with a queue of each shape."""
    return held_world(kube, SHAPES[request.param])


def _actuator(q):
    return KubernetesActuator(q.kube.api_client(), "kubernetes", quota=q.SPEC)


def test_release_shrinks_the_quota_before_the_cordon(queue):
    act = _actuator(queue)
    cmds = act.release_commands("k8s-gpu-01", MOVING)
    assert [c.action for c in cmds] == [SHRINK, "cordon"]
    assert cmds[0].request == {**queue.REQUEST, "node": "k8s-gpu-01"}
    answers = [act.send(c) for c in cmds]
    assert answers[0]["changed"] and answers[0][queue.ANSWER_KEY] == "8"
    assert queue.writes == [{"quota": queue.written(8), "cordoned": ["gpu-n07"]}]  # the node was still open then
    assert queue.quota() == queue.written(8)
    assert queue.counted() == {"k8s-gpu-02": 8}
    assert queue.kube.get("nodes", None, "k8s-gpu-01")["spec"]["unschedulable"] is True


def test_attach_grows_the_quota_after_the_uncordon(queue):
    act = _actuator(queue)
    cmds = act.attach_commands("gpu-n07")
    assert [c.action for c in cmds] == ["uncordon", GROW]
    assert cmds[1].request == {**queue.REQUEST, "node": "gpu-n07", "gpus": 8}
    for c in cmds:
        act.send(c)
    assert queue.writes == [{"quota": queue.written(24), "cordoned": []}]  # gpu-n07 was open when the queue grew
    assert queue.counted() == {"k8s-gpu-01": 8, "k8s-gpu-02": 8, "gpu-n07": 8}
    assert act.attach_commands("gpu-n07") == []  # open and counted: nothing left to send


def test_sent_twice_acts_once(queue):
    act = _actuator(queue)
    shrink = act.release_commands("k8s-gpu-01", MOVING)[0]
    act.send(shrink)
    again = act.send(shrink)
    assert not again["changed"] and again[queue.ANSWER_KEY] == "8" and queue.quota() == queue.written(8)
    assert [c.action for c in act.release_commands("k8s-gpu-01", MOVING)] == ["cordon"]
    grow = act.attach_commands("gpu-n07")[-1]
    act.send(grow)
    act.send(grow)
    assert queue.quota() == queue.written(16) and len(queue.writes) == 2


def test_uncordon_sent_but_grow_lost_is_grown_next_time(queue):
    """A run that died after the uncordon: the next attach sends the grow alone."""
    act = _actuator(queue)
    act.send(act.attach_commands("gpu-n07")[0])
    cmds = act.attach_commands("gpu-n07")
    assert [c.action for c in cmds] == [GROW]
    act.send(cmds[0])
    assert queue.quota() == queue.written(24)


def _b_writes_between_a_read_and_its_replace(a, b, command_b):
    """Writer B sends ``command_b`` right after writer A's first read of the queue."""
    real_get = a.quota.custom.get_cluster_custom_object
    calls = []

    def get_then_b_writes(*args, **kwargs):
        obj = real_get(*args, **kwargs)
        if not calls:
            b.send(command_b)
        calls.append(1)
        return obj

    a.quota.custom.get_cluster_custom_object = get_then_b_writes
    return calls


def test_two_writers_interleaved_lose_nothing(queue):
    """Writer A reads the queue, writer B shrinks another node in between: A's replace meets a
    409, reads again and applies its change on top of B's."""
    a, b = _actuator(queue), _actuator(queue)
    shrink_a = a.release_commands("k8s-gpu-01", MOVING)[0]
    shrink_b = b.release_commands("k8s-gpu-02", MOVING)[0]
    calls = _b_writes_between_a_read_and_its_replace(a, b, shrink_b)
    assert a.send(shrink_a)["changed"]
    assert queue.conflicts == 1 and len(calls) == 2
    assert queue.quota() == queue.written(0) and queue.counted() == {}


def test_two_writers_of_one_node_subtract_once(queue):
    a, b = _actuator(queue), _actuator(queue)
    shrink = a.release_commands("k8s-gpu-01", MOVING)[0]
    _b_writes_between_a_read_and_its_replace(a, b, shrink)
    assert not a.send(shrink)["changed"]  # after the 409 it finds the node already subtracted
    assert queue.conflicts == 1 and queue.quota() == queue.written(8)


def test_quota_never_goes_below_zero(queue):
    queue.put_queue(queue.written(4), counted={"k8s-gpu-01": 8, "k8s-gpu-02": 8})  # an operator lowered it by hand
    act = _actuator(queue)
    assert act.send(act.release_commands("k8s-gpu-01", MOVING)[0])[queue.ANSWER_KEY] == "0"
    assert queue.quota() == queue.written(0)


def test_handover_audits_shrink_first_and_grow_last(queue, sqlite_engine):
    k8s = _actuator(queue)
    dc = Datacenter(("slurm",), {"k8s-gpu-01": "kubernetes", "gpu-n07": "slurm"})
    acts = {"slurm": MemActuator(dc, "slurm"), "kubernetes": k8s}
    out = ho.open_handover(sqlite_engine, "k8s-gpu-01", "kubernetes", "slurm", T0, dry_run=False)
    into = ho.open_handover(sqlite_engine, "gpu-n07", "slurm", "kubernetes", T0, dry_run=False)
    report = ho.advance_all(sqlite_engine, acts, T0, dry_run=False)
    assert {h["id"]: h["state"] for h in report["handovers"]} == {out: ho.DONE, into: ho.DONE}
    assert [(r["platform"], r["action"]) for r in ho.audit_rows(sqlite_engine, out)] == [
        ("kubernetes", SHRINK), ("kubernetes", "cordon"), ("slurm", "resume")]
    assert [(r["platform"], r["action"]) for r in ho.audit_rows(sqlite_engine, into)] == [
        ("slurm", "drain"), ("kubernetes", "uncordon"), ("kubernetes", GROW)]
    assert queue.counted() == {"k8s-gpu-02": 8, "gpu-n07": 8} and queue.quota() == queue.written(16)


@pytest.mark.parametrize("kind, case", [(kind, case) for kind, shape in SHAPES.items() for case in shape.SPOILED])
def test_a_queue_that_cannot_follow_stops_the_release_before_anything_is_sent(kube, sqlite_engine, kind, case):
    """A queue missing, or whose quota is missing, unlimited or not a quantity: the release fails
    before anything is sent, naming the queue; the handover retries at the next run."""
    q = held_world(kube, SHAPES[kind])
    q.spoil(case)
    message = q.SPOILED[case]
    act = _actuator(q)
    with pytest.raises(ActuationError) as err:
        act.release_commands("k8s-gpu-01", MOVING)
    text = str(err.value)
    assert message in text and all(s in text for s in q.NAMED)
    dc = Datacenter(("slurm",), {"k8s-gpu-01": "kubernetes"})
    hid = ho.open_handover(sqlite_engine, "k8s-gpu-01", "kubernetes", "slurm", T0, dry_run=False)
    ho.advance_all(sqlite_engine, {"slurm": MemActuator(dc, "slurm"), "kubernetes": act}, T0, dry_run=False)
    h = ho.get_handover(sqlite_engine, hid)
    assert h.state == ho.RELEASING and message in h.error  # retried next run, nothing sent
    assert not kube.get("nodes", None, "k8s-gpu-01")["spec"]["unschedulable"]
    assert ho.audit_rows(sqlite_engine, hid) == [] and q.writes == []
    with pytest.raises(ActuationError) as err:  # nor an attach
        act.attach_commands("gpu-n07")
    assert message in str(err.value)
    assert kube.get("nodes", None, "gpu-n07")["spec"]["unschedulable"] is True


def test_a_node_without_gpus_is_not_opened(queue):
    queue.kube.put("nodes", None, "gpu-n08", _node("gpu-n08", gpus=0, cordon=MOVING, owner="slurm"))
    with pytest.raises(ActuationError, match=queue.NO_UNITS):
        _actuator(queue).attach_commands("gpu-n08")
    assert queue.kube.get("nodes", None, "gpu-n08")["spec"]["unschedulable"] is True


def test_platforms_yaml_quota_reaches_the_actuator(queue):
    """`platforms[].quota` in the configuration: the built actuator shrinks that queue."""
    from gpupool.config import parse_config
    from gpupool.platforms import build_actuator

    cfg = parse_config({"platforms": [{
        "name": "kubernetes", "kind": "kubernetes", "conn_id": "ai", "actuation": True, "quota": queue.CONFIG}]})
    env = {"AIRFLOW_CONN_AI": json.dumps({"conn_type": "http", "host": queue.kube.url})}
    act = build_actuator(cfg.platforms[0], cfg, env=env)
    for c in act.release_commands("k8s-gpu-01", MOVING):
        act.send(c)
    assert queue.quota() == queue.written(8)


@pytest.mark.parametrize("kind", ["kai", "volcano"])
def test_first_sight_seeds_the_record_from_every_gpu_node_held(kube, kind):
    """No record yet, a queue without flavors (KAI, Volcano): every GPU node the platform holds
    counts (the A100 too), a parked one too, not the one lent to Slurm nor the CPU node."""
    kube.put("nodes", None, "k8s-gpu-01", _node("k8s-gpu-01"))
    kube.put("nodes", None, "k8s-gpu-02", _node("k8s-gpu-02", product=A100))
    kube.put("nodes", None, "k8s-gpu-03", _node("k8s-gpu-03", cordon=PARK_REASON, owner="kubernetes"))
    kube.put("nodes", None, "gpu-n07", _node("gpu-n07", cordon=MOVING, owner="slurm"))
    kube.put("nodes", None, "k8s-cpu-01", _node("k8s-cpu-01", gpus=0))
    q = SHAPES[kind](kube)
    q.put_queue(q.written(24))
    act = _actuator(q)
    for c in act.release_commands("k8s-gpu-01", MOVING):
        act.send(c)
    assert q.counted() == {"k8s-gpu-02": 8, "k8s-gpu-03": 8} and q.quota() == q.written(16)
