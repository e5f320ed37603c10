"""The queue side of the emulated API server (kmock) for the queue quota tests: one class per
queue shape gpupool follows (Kueue's ClusterQueue, KAI-Scheduler's and Volcano's Queue), each
serving its published object (tests/fixtures/recorded/) and saying what the shared tests
(test_queue_quota.py) expect of it.

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
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

from gpupool.actuation.actuators.kubernetes import HOLD_ANNOTATION, OWNER_LABEL
from gpupool.actuation.quota import FLAVORS, KAI, KUEUE, NODES_ANNOTATION, VOLCANO, quota_entry

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=timezone.utc)
RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "recorded"
GPU = "nvidia.com/gpu"
H100, A100 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB"  # Kueue's flavor's nodeLabels name H100
MOVING = "gpupool: moving to slurm"


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
    """A ClusterQueue (flavor ``default-flavor``, resource ``nvidia.com/gpu``) and its ResourceFlavor."""

    API = KUEUE
    NAME, FLAVOR = "cluster-queue", "default-flavor"
    FIXTURE = RECORDED / "kueue_clusterqueue.json"
    SPEC = SimpleNamespace(kind="kueue", cluster_queue=NAME, flavor=FLAVOR, resource=GPU)
    CONFIG = {"kind": "kueue", "cluster_queue": NAME, "flavor": FLAVOR}
    #: what a command's request says of the queue, and the key of the quota in its answer
    REQUEST = {"cluster_queue": NAME, "flavor": FLAVOR, "resource": GPU}
    ANSWER_KEY = "nominal_quota"
    #: what an error about the queue names, and what it says of a node without GPUs
    NAMED = (repr(NAME), repr(FLAVOR), repr(GPU))
    NO_UNITS = "reports no allocatable 'nvidia.com/gpu'"
    #: a queue that cannot follow the nodes (:meth:`spoil`) -> what the error says
    SPOILED = {"no queue": "no such ClusterQueue", "no flavor": "no such flavor",
               "no gpu": "the flavor has no such resource"}

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

        flavor = json.loads(RECORDED.joinpath("kueue_resourceflavor.json").read_text())["body"]

        def put_flavor():
            self.kube.k.objects[kmock.resource(*FLAVORS), None, self.FLAVOR] = flavor

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

    @classmethod
    def quota_of(cls, obj):
        return quota_entry(obj, cls.FLAVOR, GPU)["nominalQuota"]

    @staticmethod
    def written(n):
        """``n`` GPUs as the queue holds them after a change: the published object's quantities are
        strings, and a string stays a string."""
        return str(n)

    def fixture(self) -> dict:
        return copy.deepcopy(json.loads(self.FIXTURE.read_text())["body"])

    def store(self, obj: dict) -> None:
        def assign():
            self.kube.k.objects[self.res, None, obj["metadata"]["name"]] = obj

        self.kube._call(assign)

    def put_queue(self, quota="16", counted=None, name=None, drop_flavor=False, drop_gpu=False):
        """The recorded ClusterQueue, named ``name`` with ``quota`` GPUs and gpupool's record."""
        obj = self.fixture()
        obj["metadata"]["name"] = name or self.NAME
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
        self.store(obj)

    def spoil(self, case: str) -> None:
        """Make the queue one of :attr:`SPOILED` (the record counting ``k8s-gpu-01``)."""
        if case == "no queue":
            self.kube._call(lambda: self.kube.k.objects[self.res, None, self.NAME].delete())
        else:
            self.put_queue("16", counted={"k8s-gpu-01": 8}, drop_flavor=case == "no flavor", drop_gpu=case == "no gpu")

    def queue(self, name=None):
        return self.kube._call(lambda: copy.deepcopy(self.kube.k.objects[self.res, None, name or self.NAME].raw))

    def quota(self):
        return self.quota_of(self.queue())

    def counted(self):
        return json.loads(self.queue()["metadata"]["annotations"][NODES_ANNOTATION])


class KaiQueue(Kueue):
    """A KAI-Scheduler Queue (tests/fixtures/recorded/kai_queue.json): ``spec.resources.gpu.quota``,
    a JSON number of KAI's GPU units."""

    API = KAI
    NAME = "team-ai"
    FIXTURE = RECORDED / "kai_queue.json"
    SPEC = SimpleNamespace(kind="kai", queue=NAME)
    CONFIG = {"kind": "kai", "queue": NAME}
    REQUEST = {"queue": NAME}
    ANSWER_KEY = "quota"
    NAMED = (repr(NAME),)
    NO_UNITS = "reports no allocatable GPUs"
    SPOILED = {"no queue": "no such Queue", "unlimited": "unlimited", "not a number": "is not a number"}

    def _more(self):
        pass  # KAI has no flavor: nothing else is read

    @staticmethod
    def quota_of(obj):
        return obj["spec"]["resources"]["gpu"].get("quota")

    @staticmethod
    def written(n):
        return n  # a JSON number

    def put_queue(self, quota=16, counted=None, name=None, drop_gpu=False):
        """The published Queue, named ``name`` with ``quota`` GPU units and gpupool's record."""
        obj = self.fixture()
        obj["metadata"]["name"] = name or self.NAME
        obj["spec"]["resources"]["gpu"]["quota"] = quota
        if counted is not None:
            obj["metadata"]["annotations"] = {NODES_ANNOTATION: json.dumps(counted)}
        if drop_gpu:
            del obj["spec"]["resources"]["gpu"]
        self.store(obj)

    def spoil(self, case: str) -> None:
        if case == "no queue":
            super().spoil(case)
        else:
            self.put_queue({"unlimited": -1, "not a number": "16"}[case], counted={"k8s-gpu-01": 8})


class VolcanoQueue(Kueue):
    """A Volcano Queue (tests/fixtures/recorded/volcano_queue.json): ``spec.capability`` of the
    GPU resource, and ``spec.deserved`` and ``spec.guarantee.resource`` of it, quantities."""

    API = VOLCANO
    NAME = "team-ai"
    FIXTURE = RECORDED / "volcano_queue.json"
    SPEC = SimpleNamespace(kind="volcano", queue=NAME, resource=GPU)
    CONFIG = {"kind": "volcano", "queue": NAME}
    REQUEST = {"queue": NAME, "resource": GPU}
    ANSWER_KEY = "capability"
    NAMED = (repr(NAME),)
    NO_UNITS = "reports no allocatable 'nvidia.com/gpu'"
    SPOILED = {"no queue": "no such Queue",
               "unlimited": "spec.capability: no 'nvidia.com/gpu' (unlimited): it cannot follow nodes",
               "no capability": "spec.capability: no 'nvidia.com/gpu' (unlimited)",
               "no spec": "the Queue has no spec",
               "not a quantity": "spec.capability: nvidia.com/gpu: 'sixteen' is not a quantity",
               "deserved not a quantity": "spec.deserved: nvidia.com/gpu: 'lots' is not a quantity",
               "guarantee negative": "spec.guarantee.resource: nvidia.com/gpu is '-8', below 0"}

    def _more(self):
        pass  # Volcano has no flavor: nothing else is read

    @staticmethod
    def quota_of(obj):
        return obj["spec"]["capability"].get(GPU)

    @staticmethod
    def deserved_of(obj):
        return (obj["spec"].get("deserved") or {}).get(GPU)

    @staticmethod
    def guarantee_of(obj):
        return ((obj["spec"].get("guarantee") or {}).get("resource") or {}).get(GPU)

    def put_queue(self, quota="16", counted=None, name=None, deserved="16", guarantee="8"):
        """The published Queue, named ``name``, with ``quota`` as its GPU capability (None: no GPU
        in it, unlimited), ``deserved`` and ``guarantee`` of GPUs (None: the queue sets none) and
        gpupool's record."""
        obj = self.fixture()
        obj["metadata"]["name"] = name or self.NAME
        spec = obj["spec"]
        for holder, value in ((spec["capability"], quota), (spec["deserved"], deserved),
                              (spec["guarantee"]["resource"], guarantee)):
            if value is None:
                del holder[GPU]
            else:
                holder[GPU] = value
        if counted is not None:
            obj["metadata"]["annotations"] = {NODES_ANNOTATION: json.dumps(counted)}
        self.store(obj)

    def spoil(self, case: str) -> None:
        if case == "no queue":
            return super().spoil(case)
        counted = {"k8s-gpu-01": 8}
        if case in ("no capability", "no spec"):
            obj = self.fixture()
            if case == "no spec":
                del obj["spec"]
            else:
                del obj["spec"]["capability"]
            obj["metadata"]["annotations"] = {NODES_ANNOTATION: json.dumps(counted)}
            self.store(obj)
            return
        self.put_queue(**{"unlimited": {"quota": None}, "not a quantity": {"quota": "sixteen"},
                          "deserved not a quantity": {"deserved": "lots"},
                          "guarantee negative": {"guarantee": "-8"}}[case], counted=counted)


#: the shapes by their ``quota.kind``
SHAPES = {"kueue": Kueue, "kai": KaiQueue, "volcano": VolcanoQueue}


def held_world(kube, shape: type[Kueue]) -> Kueue:
    """Two open GPU nodes of 8 GPUs, one lent to Slurm, a CPU node; the queue counts the open
    ones (16 GPUs) in gpupool's record."""
    kube.put("nodes", None, "k8s-gpu-01", _node("k8s-gpu-01"))
    kube.put("nodes", None, "k8s-gpu-02", _node("k8s-gpu-02"))
    kube.put("nodes", None, "gpu-n07", _node("gpu-n07", cordon=MOVING, owner="slurm"))
    kube.put("nodes", None, "k8s-cpu-01", _node("k8s-cpu-01", gpus=0))
    q = shape(kube)
    q.put_queue(q.written(16), counted={"k8s-gpu-01": 8, "k8s-gpu-02": 8})
    return q
