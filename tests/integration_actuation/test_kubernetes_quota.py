"""A Kueue ClusterQueue's nominalQuota follows the nodes gpupool moves: the official client's
CustomObjectsApi against the emulated API server (kmock), the ClusterQueue served being the
recorded answer (tests/fixtures/recorded/kueue_clusterqueue.json).

kmock does not serve PUT on a named object; the handler here answers it as the API server does
for a custom resource: the body's ``metadata.resourceVersion`` must be the stored one (else 409
Conflict, absent: 422), the object is replaced but its ``status`` (a subresource) kept, and the
``resourceVersion`` moves on. The handler also notes, at each write, whether each node was
cordoned then, so a test can say what the queue saw first.
"""

from __future__ import annotations

import copy
import json
import re
import threading
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpupool.actuation import handover as ho
from gpupool.actuation.actuators.base import ActuationError
from gpupool.actuation.actuators.kubernetes import HOLD_ANNOTATION, OWNER_LABEL, KubernetesActuator
from gpupool.actuation.power.base import PARK_REASON
from gpupool.actuation.power.holds import KubernetesHold
from gpupool.actuation.quota import FLAVORS, GROW, KUEUE, NODES_ANNOTATION, SHRINK
from memplatform import Datacenter, MemActuator

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=timezone.utc)
RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "recorded" / "kueue_clusterqueue.json"
RECORDED_FLAVOR = RECORDED.with_name("kueue_resourceflavor.json")
QUEUE, FLAVOR, GPU = "cluster-queue", "default-flavor", "nvidia.com/gpu"
H100, A100 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB"  # the flavor's nodeLabels name H100
SPEC = SimpleNamespace(cluster_queue=QUEUE, flavor=FLAVOR, resource=GPU)


def _node(name, gpus=8, cordon=None, owner=None, product=H100):
    meta = {"name": name, "labels": {"nvidia.com/gpu.product": product}, "annotations": {}}
    if owner:
        meta["labels"][OWNER_LABEL] = owner
    if cordon:
        meta["annotations"][HOLD_ANNOTATION] = cordon
    alloc = {"cpu": "64", "memory": "512Gi"}
    if gpus:
        alloc[GPU] = str(gpus)
    return {"apiVersion": "v1", "kind": "Node", "metadata": meta, "spec": {"unschedulable": bool(cordon)},
            "status": {"allocatable": alloc, "capacity": dict(alloc)}}


class Kueue:
    """The ClusterQueue side of the emulated API server (see the module docstring)."""

    API = KUEUE

    def __init__(self, kube):
        import kmock

        self.kube = kube
        self.res = kmock.resource(*self.API)
        self.writes: list[dict] = []  # each accepted replace: quota and the nodes cordoned then
        self.conflicts = 0
        kube.put("pods", "web", "api-0", {  # a CPU pod: the node's pod list has something to filter
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "api-0", "namespace": "web"},
            "spec": {"nodeName": "k8s-cpu-01", "containers": [{"name": "c", "image": "x", "resources": {}}]},
            "status": {"phase": "Running"}})
        path = re.compile(rf"^/apis/{re.escape(self.API[0])}/{self.API[1]}/{self.API[2]}/[^/]+$")
        kube._call(lambda: kube.k["put", path] << self._replace)
        self._more()

    def _more(self):
        """What else the queue needs served: the ResourceFlavor."""
        import kmock

        flavor = json.loads(RECORDED_FLAVOR.read_text())["body"]

        def put_flavor():
            self.kube.k.objects[kmock.resource(*FLAVORS), None, FLAVOR] = flavor

        self.kube._call(put_flavor)

    def _replace(self, request):
        import kmock

        key = (self.res, None, request.name)
        try:
            cur = self.kube.k.objects[key]
        except KeyError:
            cur = None
        if cur is None or cur.deleted:
            raise kmock.KubernetesError(status=404, reason="NotFound",
                                        message=f'{self.API[2]}.{self.API[0]} "{request.name}" not found')
        body = request.data
        rv = (body.get("metadata") or {}).get("resourceVersion")
        if not rv:
            raise kmock.KubernetesError(status=422, reason="Invalid",
                                        message="metadata.resourceVersion: Invalid value: 0x0: must be specified for an update")
        stored = cur.raw
        if rv != stored["metadata"]["resourceVersion"]:
            self.conflicts += 1
            raise kmock.KubernetesError(
                status=409, reason="Conflict",
                message=f'Operation cannot be fulfilled on {self.API[2]}.{self.API[0]} "{request.name}": the object '
                        "has been modified; please apply your changes to the latest version and try again")
        new = copy.deepcopy(body)
        new["status"] = copy.deepcopy(stored.get("status"))
        new["metadata"]["resourceVersion"] = str(int(rv) + 1)
        self.kube.k.objects[key] = new
        cordoned = sorted(name for (res, _, name), obj in self.kube.k.objects.items()
                          if getattr(res, "plural", None) == "nodes" and not obj.deleted
                          and (obj.raw.get("spec") or {}).get("unschedulable"))
        self.writes.append({"quota": self.quota_of(new), "cordoned": cordoned})
        return new

    @staticmethod
    def quota_of(obj):
        from gpupool.actuation.quota import quota_entry

        return quota_entry(obj, FLAVOR, GPU)["nominalQuota"]

    def put_queue(self, quota="16", counted=None, name=QUEUE, drop_flavor=False, drop_gpu=False):
        """The recorded ClusterQueue, named ``name`` with ``quota`` GPUs and gpupool's record."""
        obj = copy.deepcopy(json.loads(RECORDED.read_text())["body"])
        obj["metadata"]["name"] = name
        flavor = obj["spec"]["resourceGroups"][0]["flavors"][0]
        next(r for r in flavor["resources"] if r["name"] == GPU)["nominalQuota"] = quota
        if counted is not None:
            obj["metadata"]["annotations"] = {NODES_ANNOTATION: json.dumps(counted)}
        if drop_flavor:
            flavor["name"] = "spot"
        if drop_gpu:
            group = obj["spec"]["resourceGroups"][0]
            group["coveredResources"].remove(GPU)
            flavor["resources"] = [r for r in flavor["resources"] if r["name"] != GPU]

        def assign():
            self.kube.k.objects[self.res, None, name] = obj

        self.kube._call(assign)

    def queue(self, name=QUEUE):
        return self.kube._call(lambda: copy.deepcopy(self.kube.k.objects[self.res, None, name].raw))

    def quota(self):
        return self.quota_of(self.queue())

    def counted(self):
        return json.loads(self.queue()["metadata"]["annotations"][NODES_ANNOTATION])


@pytest.fixture
def kueue(kube):
    """Two open GPU nodes of 8 GPUs, one lent to Slurm, a CPU node; the ClusterQueue counts the
    open ones (16 GPUs) in gpupool's record."""
    kube.put("nodes", None, "k8s-gpu-01", _node("k8s-gpu-01"))
    kube.put("nodes", None, "k8s-gpu-02", _node("k8s-gpu-02"))
    kube.put("nodes", None, "gpu-n07", _node("gpu-n07", cordon="gpupool: moving to slurm", owner="slurm"))
    kube.put("nodes", None, "k8s-cpu-01", _node("k8s-cpu-01", gpus=0))
    q = Kueue(kube)
    q.put_queue("16", counted={"k8s-gpu-01": 8, "k8s-gpu-02": 8})
    return q


def _actuator(kube, spec=SPEC):
    return KubernetesActuator(kube.api_client(), "kubernetes", quota=spec)


def test_release_shrinks_the_quota_before_the_cordon(kueue):
    act = _actuator(kueue.kube)
    cmds = act.release_commands("k8s-gpu-01", "gpupool: moving to slurm")
    assert [c.action for c in cmds] == [SHRINK, "cordon"]
    assert cmds[0].request == {"cluster_queue": QUEUE, "flavor": FLAVOR, "resource": GPU, "node": "k8s-gpu-01"}
    answers = [act.send(c) for c in cmds]
    assert answers[0]["changed"] and answers[0]["nominal_quota"] == "8"
    assert kueue.writes == [{"quota": "8", "cordoned": ["gpu-n07"]}]  # the node was still open then
    assert kueue.quota() == "8"  # a string quantity stays a string
    assert kueue.counted() == {"k8s-gpu-02": 8}
    assert kueue.kube.get("nodes", None, "k8s-gpu-01")["spec"]["unschedulable"] is True


def test_attach_grows_the_quota_after_the_uncordon(kueue):
    act = _actuator(kueue.kube)
    cmds = act.attach_commands("gpu-n07")
    assert [c.action for c in cmds] == ["uncordon", GROW]
    assert cmds[1].request["gpus"] == 8
    for c in cmds:
        act.send(c)
    assert kueue.writes == [{"quota": "24", "cordoned": []}]  # gpu-n07 was open when the queue grew
    assert kueue.counted() == {"k8s-gpu-01": 8, "k8s-gpu-02": 8, "gpu-n07": 8}
    assert act.attach_commands("gpu-n07") == []  # open and counted: nothing left to send


def test_sent_twice_acts_once(kueue):
    act = _actuator(kueue.kube)
    shrink = act.release_commands("k8s-gpu-01", "gpupool: moving to slurm")[0]
    act.send(shrink)
    again = act.send(shrink)
    assert not again["changed"] and kueue.quota() == "8"
    assert [c.action for c in act.release_commands("k8s-gpu-01", "gpupool: moving to slurm")] == ["cordon"]
    grow = act.attach_commands("gpu-n07")[-1]
    act.send(grow)
    act.send(grow)
    assert kueue.quota() == "16" and len(kueue.writes) == 2


def test_uncordon_sent_but_grow_lost_is_grown_next_time(kueue):
    """A run that died after the uncordon: the next attach sends the grow alone."""
    act = _actuator(kueue.kube)
    uncordon = act.attach_commands("gpu-n07")[0]
    act.send(uncordon)
    cmds = act.attach_commands("gpu-n07")
    assert [c.action for c in cmds] == [GROW]
    act.send(cmds[0])
    assert kueue.quota() == "24"


def test_handover_audits_shrink_first_and_grow_last(kueue, sqlite_engine):
    k8s = _actuator(kueue.kube)
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
    assert kueue.counted() == {"k8s-gpu-02": 8, "gpu-n07": 8} and kueue.quota() == "16"


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


def test_two_writers_interleaved_lose_nothing(kueue):
    """Writer A reads the queue, writer B shrinks another node in between: A's replace meets a
    409, reads again and applies its change on top of B's."""
    a, b = _actuator(kueue.kube), _actuator(kueue.kube)
    shrink_a = a.release_commands("k8s-gpu-01", "gpupool: moving to slurm")[0]
    shrink_b = b.release_commands("k8s-gpu-02", "gpupool: moving to slurm")[0]
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
    assert kueue.conflicts == 1 and len(calls) == 2
    assert kueue.quota() == "0" and kueue.counted() == {}


def test_two_writers_of_one_node_subtract_once(kueue):
    a, b = _actuator(kueue.kube), _actuator(kueue.kube)
    shrink = a.release_commands("k8s-gpu-01", "gpupool: moving to slurm")[0]
    real_get = a.quota.custom.get_cluster_custom_object
    calls = []

    def get_then_b_writes(*args, **kwargs):
        obj = real_get(*args, **kwargs)
        if not calls:
            b.send(shrink)
        calls.append(1)
        return obj

    a.quota.custom.get_cluster_custom_object = get_then_b_writes
    assert not a.send(shrink)["changed"]  # after the 409 it finds the node already subtracted
    assert kueue.conflicts == 1 and kueue.quota() == "8"


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
            cmds = act.release_commands(n, "gpupool: moving to slurm") if i < 4 else act.attach_commands(n)
            for c in cmds:
                act.send(c)
        except Exception as exc:  # surfaced below
            errors.append(exc)

    for n in names[4:]:  # the four to attach arrive cordoned, lent to Slurm
        kube.patch("nodes", None, n, {"spec": {"unschedulable": True}, "metadata": {
            "labels": {OWNER_LABEL: "slurm"}, "annotations": {HOLD_ANNOTATION: "gpupool: moving to slurm"}}})
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
    kube.put("nodes", None, "gpu-n07", _node("gpu-n07", cordon="gpupool: moving to slurm", owner="slurm"))
    kube.put("nodes", None, "k8s-cpu-01", _node("k8s-cpu-01", gpus=0))
    kube.put("nodes", None, "k8s-a100-01", _node("k8s-a100-01", product=A100))  # another flavor's
    q = Kueue(kube)
    q.put_queue("32")
    act = _actuator(kube)
    assert NODES_ANNOTATION not in (q.queue()["metadata"].get("annotations") or {})
    for c in act.release_commands("k8s-gpu-01", "gpupool: moving to slurm"):
        act.send(c)
    assert q.counted() == {"k8s-gpu-02": 8, "k8s-gpu-03": 8, "k8s-gpu-04": 8} and q.quota() == "24"
    # the parked node wakes (the power hold lifts through attach): it was counted, nothing grows
    assert [c.action for c in KubernetesHold(act).release_commands("k8s-gpu-03")] == ["uncordon"]


def test_first_sight_grow_counts_the_arriving_node(kube):
    kube.put("nodes", None, "k8s-gpu-01", _node("k8s-gpu-01"))
    kube.put("nodes", None, "gpu-n07", _node("gpu-n07", gpus=4, cordon="gpupool: moving to slurm", owner="slurm"))
    q = Kueue(kube)
    q.put_queue(8)
    act = _actuator(kube)
    for c in act.attach_commands("gpu-n07"):
        act.send(c)
    assert q.counted() == {"k8s-gpu-01": 8, "gpu-n07": 4} and q.quota() == 12


def test_a_node_of_another_flavor_leaves_the_quota_alone(kueue):
    kueue.kube.put("nodes", None, "gpu-a01", _node("gpu-a01", cordon="gpupool: moving to slurm", owner="slurm",
                                                  product=A100))
    act = _actuator(kueue.kube)
    assert [c.action for c in act.attach_commands("gpu-a01")] == ["uncordon"]
    for c in act.attach_commands("gpu-a01"):
        act.send(c)
    assert [c.action for c in act.release_commands("gpu-a01", "gpupool: moving to slurm")] == ["cordon"]
    assert kueue.quota() == "16" and kueue.writes == []


def test_no_resource_flavor_stops_a_first_sight(kueue):
    kueue.put_queue("16")  # no record yet: the seed needs the flavor's node labels
    kueue.kube._call(lambda: kueue.kube.k.objects[kueue.res.__class__(*FLAVORS), None, FLAVOR].delete())
    with pytest.raises(ActuationError, match="no such ResourceFlavor"):
        _actuator(kueue.kube).release_commands("k8s-gpu-01", "gpupool: moving to slurm")


def test_quota_never_goes_below_zero(kueue):
    kueue.put_queue("4", counted={"k8s-gpu-01": 8, "k8s-gpu-02": 8})  # an operator lowered it by hand
    act = _actuator(kueue.kube)
    assert act.send(act.release_commands("k8s-gpu-01", "gpupool: moving to slurm")[0])["nominal_quota"] == "0"
    assert kueue.quota() == "0"


@pytest.mark.parametrize("case, message", [
    ("no queue", "no such ClusterQueue"),
    ("no flavor", "no such flavor"),
    ("no gpu", "the flavor has no such resource"),
])
def test_a_missing_queue_flavor_or_resource_stops_the_release_before_anything_is_sent(kueue, sqlite_engine,
                                                                                      case, message):
    if case == "no queue":
        kueue.kube._call(lambda: kueue.kube.k.objects[kueue.res, None, QUEUE].delete())
    else:
        kueue.put_queue("16", counted={"k8s-gpu-01": 8}, drop_flavor=case == "no flavor", drop_gpu=case == "no gpu")
    act = _actuator(kueue.kube)
    with pytest.raises(ActuationError) as err:
        act.release_commands("k8s-gpu-01", "gpupool: moving to slurm")
    text = str(err.value)
    assert message in text and all(s in text for s in (repr(QUEUE), repr(FLAVOR), repr(GPU)))
    dc = Datacenter(("slurm",), {"k8s-gpu-01": "kubernetes"})
    hid = ho.open_handover(sqlite_engine, "k8s-gpu-01", "kubernetes", "slurm", T0, dry_run=False)
    ho.advance_all(sqlite_engine, {"slurm": MemActuator(dc, "slurm"), "kubernetes": act}, T0, dry_run=False)
    h = ho.get_handover(sqlite_engine, hid)
    assert h.state == ho.RELEASING and message in h.error  # retried next run, nothing sent
    assert not kueue.kube.get("nodes", None, "k8s-gpu-01")["spec"]["unschedulable"]
    assert ho.audit_rows(sqlite_engine, hid) == []


def test_a_node_without_the_resource_is_not_opened(kueue):
    kueue.kube.put("nodes", None, "gpu-n08", _node("gpu-n08", gpus=0, cordon="gpupool: moving to slurm", owner="slurm"))
    act = _actuator(kueue.kube)
    with pytest.raises(ActuationError, match="reports no allocatable 'nvidia.com/gpu'"):
        act.attach_commands("gpu-n08")
    assert kueue.kube.get("nodes", None, "gpu-n08")["spec"]["unschedulable"] is True


def test_without_quota_nothing_changes(kueue):
    act = KubernetesActuator(kueue.kube.api_client(), "kubernetes")
    assert [c.action for c in act.release_commands("k8s-gpu-01", "gpupool: moving to slurm")] == ["cordon"]
    assert [c.action for c in act.attach_commands("gpu-n07")] == ["uncordon"]


def test_platforms_yaml_quota_reaches_the_actuator(kueue):
    """`platforms[].quota` in the configuration: the built actuator shrinks that queue."""
    from gpupool.config import parse_config
    from gpupool.platforms import build_actuator

    cfg = parse_config({"platforms": [{
        "name": "kubernetes", "kind": "kubernetes", "conn_id": "ai", "actuation": True,
        "quota": {"kind": "kueue", "cluster_queue": QUEUE, "flavor": FLAVOR}}]})
    env = {"AIRFLOW_CONN_AI": json.dumps({"conn_type": "http", "host": kueue.kube.url})}
    act = build_actuator(cfg.platforms[0], cfg, env=env)
    for c in act.release_commands("k8s-gpu-01", "gpupool: moving to slurm"):
        act.send(c)
    assert kueue.quota() == "8"
