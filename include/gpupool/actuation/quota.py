"""The platform's own admission quota follows the nodes gpupool moves: a Kueue ClusterQueue, a
KAI-Scheduler Queue or a Volcano Queue.

A Kubernetes AI cluster admits work through a queue's quota, not through the nodes: a node
gpupool attaches is invisible to a queue whose quota did not grow, and a node it takes away
keeps being admitted onto until the quota shrinks. So a Kubernetes platform configured with
``quota:`` gets two more commands, both audited like the rest:

* ``quota_shrink`` first in a release, before the cordon (and any eviction): the queue stops
  admitting onto the node before it is drained;
* ``quota_grow`` last in an attach, after the uncordon: the queue admits onto the node once it
  is open.

:class:`QueueQuota` is the mechanism; one subclass per CRD shape says where the number lives and
how a node counts:

* :class:`KueueQuota` (``{kind: kueue, cluster_queue, flavor, resource}``):
  ``spec.resourceGroups[*].flavors[name=flavor].resources[name=resource].nominalQuota`` of the
  ClusterQueue (``kueue.x-k8s.io/v1beta1``, cluster-scoped), by what the node reports allocatable
  of the resource. Only nodes of the flavor count: those carrying the ResourceFlavor's
  ``spec.nodeLabels`` (all nodes when it has none); a node of another flavor leaves it alone.
* :class:`KaiQuota` (``{kind: kai, queue}``): ``spec.resources.gpu.quota`` of the Queue
  (``scheduling.run.ai/v2``, cluster-scoped), a JSON number of KAI's GPU units: a node adds its
  allocatable ``nvidia.com/gpu`` plus X per ``nvidia.com/mig-<X>g.*`` device. KAI has no
  flavor: every GPU node of the platform counts. ``limit`` and ``overQuotaWeight`` beside it are
  left as the operator set them; a quota of -1 (unlimited) cannot follow nodes and is refused.
* :class:`VolcanoQuota` (``{kind: volcano, queue, resource}``): ``spec.capability[resource]`` of
  the Queue (``scheduling.volcano.sh/v1beta1``, cluster-scoped), a quantity, by what the node
  reports allocatable of the resource; ``spec.deserved[resource]`` and
  ``spec.guarantee.resource[resource]`` follow by the same change where the queue sets them.
  Volcano has no flavor: every node reporting the resource counts. A capability without the
  resource is unlimited (Volcano then caps the queue at what the cluster has): it cannot follow
  nodes and is refused.

Idempotent and safe with two writers: the queue itself records, in the annotation
:data:`NODES_ANNOTATION` (JSON ``{"node": gpus}``), which nodes gpupool counted in it and how
many GPUs each added. A shrink subtracts only when its node leaves that record, a grow adds
only when its node enters it, and the record and the quota change in one ``replace`` carrying
the object's ``resourceVersion``: the API server answers 409 Conflict to a writer whose read is
stale, which reads again and retries. So a command sent twice acts once, and two writers never
lose each other's change. A shrink subtracts what its node added (not what the node reports
now: a re-laid-out node may report other GPUs). The quota never goes below 0.

First sight (no record on the queue yet): its quota is taken as the operator set it, for the
GPU nodes the platform holds now, and the record is seeded with them: every node the queue
covers that reports GPUs, except those gpupool moved away (owner label naming another platform,
or a gpupool hold other than a park). The node a grow is about is never in that seed (it is
arriving: a grow is only built while the node is still held for the move). So a node attached
before the quota was configured is subtracted once on its first release, and a parked node
that wakes adds nothing.
"""

from __future__ import annotations

import json
import random
import time
from decimal import Decimal
from typing import Any

from gpupool.actuation.actuators.base import ActuationError, Command
from gpupool.actuation.marks import is_gpupool_reason
from gpupool.k8s_keys import HOLD_ANNOTATION, OWNER_LABEL

#: the queue annotation that records the nodes gpupool counted in its quota
NODES_ANNOTATION = "gpupool.io/quota-nodes"
#: Kueue's ClusterQueue: group, version, plural (cluster-scoped)
KUEUE = ("kueue.x-k8s.io", "v1beta1", "clusterqueues")
#: Kueue's ResourceFlavor, whose ``spec.nodeLabels`` say which nodes are of the flavor
FLAVORS = ("kueue.x-k8s.io", "v1beta1", "resourceflavors")
#: KAI-Scheduler's Queue: group, version, plural (cluster-scoped)
KAI = ("scheduling.run.ai", "v2", "queues")
#: Volcano's Queue: group, version, plural (cluster-scoped)
VOLCANO = ("scheduling.volcano.sh", "v1beta1", "queues")
#: how often a replace that met a 409 Conflict is retried on a fresh read
CONFLICT_RETRIES = 10
#: the hold reason of a parked node (:data:`gpupool.actuation.power.base.PARK_REASON`): it stays
#: counted, it wakes on the same platform
_PARKED = "gpupool: parked"

SHRINK, GROW = "quota_shrink", "quota_grow"


def queue_quota(api_client, platform: str, spec: Any) -> "QueueQuota":
    """The quota of the platform's ``quota`` configuration (:class:`gpupool.config.QuotaConfig`):
    a :class:`KaiQuota` for ``kind: kai``, a :class:`VolcanoQuota` for ``kind: volcano``, else a
    :class:`KueueQuota`."""
    kind = getattr(spec, "kind", "kueue")
    if kind == "kai":
        return KaiQuota(api_client, platform, spec)
    if kind == "volcano":
        return VolcanoQuota(api_client, platform, spec)
    if kind == "kueue":
        return KueueQuota(api_client, platform, spec)
    raise ValueError(f"quota: no queue of kind {kind!r}")


class QueueQuota:
    """One queue's GPU quota following the nodes: the mechanism, common to every CRD shape.

    A subclass says which object (:attr:`API`, :attr:`queue`), where its number lives
    (:meth:`slot`, or :meth:`slots` where several numbers follow the nodes together; :meth:`parse`,
    :meth:`format`), which nodes it covers (:meth:`selector`, :meth:`covers`) and what a node adds
    (:meth:`units_of`). ``api_client`` is a ``kubernetes.client.ApiClient``.
    """

    API: tuple[str, str, str]
    #: the object's kind, for messages
    KIND = "queue"
    #: what a node must report to be counted, for messages
    UNITS = "GPUs"
    #: the key of the quota in a command's answer
    ANSWER_KEY = "quota"

    def __init__(self, api_client, platform: str, queue: str):
        from kubernetes import client

        # no client: only :meth:`change` on an object read elsewhere (the contract tests)
        self.custom = client.CustomObjectsApi(api_client) if api_client is not None else None
        self.core = client.CoreV1Api(api_client) if api_client is not None else None
        self.platform = platform
        self.queue = queue

    # ---- the shape (subclasses)
    @property
    def where(self) -> str:
        """The quota named for messages."""
        return f"{self.KIND} {self.queue!r}"

    def request_fields(self) -> dict[str, Any]:
        """What a command's request and answer say of the queue."""
        raise NotImplementedError

    def slot(self, obj: dict, write: bool = False) -> tuple[dict, str]:
        """The dict holding the quota in ``obj`` and its key; LookupError saying what is missing
        (``write``: create what a missing quota defaults from)."""
        raise NotImplementedError

    def slots(self, obj: dict, write: bool = False) -> list[tuple[dict, str, str]]:
        """Every place the number lives in ``obj``, as (holder, key, what to call it in a message:
        empty for the one place): the first is the quota the answer reports; the others change by
        the same GPUs. LookupError saying what is missing. Default: :meth:`slot` alone."""
        holder, key = self.slot(obj, write)
        return [(holder, key, "")]

    def parse(self, value: Any) -> Decimal:
        """The quota's value as a Decimal; ValueError when it cannot follow nodes."""
        raise NotImplementedError

    def more_answer(self, obj: dict) -> dict[str, Any]:
        """What else a command's answer says of the queue ``obj`` (the other places the number lives)."""
        return {}

    def format(self, value: Decimal, like: Any) -> Any:
        """``value`` written as the object wants it."""
        raise NotImplementedError

    def units_of(self, obj) -> int:
        """What node ``obj`` (a ``V1Node``) adds to the quota."""
        raise NotImplementedError

    def selector(self, node: str, action: str) -> Any:
        """What :meth:`covers` needs, read once per decision (None: every node)."""
        return None

    def covers(self, obj, selector: Any) -> bool:
        """Whether node ``obj`` counts in this queue."""
        return True

    # ---- commands
    def shrink_commands(self, node: str, name: str | None = None) -> list[Command]:
        """The shrink of ``node`` (``name`` in Kubernetes, where it differs), or nothing when the
        queue does not count it."""
        name = name or node
        counted = self._counted(self._read(node, SHRINK), name, node, SHRINK)
        if name not in counted:
            return []
        return [Command(self.platform, node, SHRINK, {**self.request_fields(), "node": name})]

    def grow_commands(self, node: str, name: str | None = None) -> list[Command]:
        """The grow of ``node`` (``name`` in Kubernetes) by the GPUs it reports, or nothing when
        the queue counts it already."""
        name = name or node
        counted = self._counted(self._read(node, GROW), name, node, GROW)
        if name in counted:
            return []
        obj = self._read_node(node, name)
        if not self.covers(obj, self.selector(node, GROW)):
            return []  # a node of another flavor: this quota does not cover it
        gpus = self.units_of(obj)
        if gpus <= 0:
            raise ActuationError(self.platform, node, GROW,
                                 f"the node reports no allocatable {self.UNITS}: {self.where} cannot count it")
        return [Command(self.platform, node, GROW, {**self.request_fields(), "node": name, "gpus": gpus})]

    def send(self, command: Command) -> dict[str, Any]:
        """Apply a shrink or grow: read, change the record and the quota, replace with the
        read's ``resourceVersion``; on 409 Conflict read again (up to :data:`CONFLICT_RETRIES`)."""
        from kubernetes.client.exceptions import ApiException

        node, action, name = command.node, command.action, command.request["node"]
        if action not in (SHRINK, GROW):
            raise ActuationError(self.platform, node, action, "not a quota action")
        for attempt in range(CONFLICT_RETRIES):
            obj = self._read(node, action)
            counted = self._counted(obj, name, node, action)
            try:
                before, after = self.change(obj, counted, name, action, int(command.request.get("gpus") or 0))
            except ValueError as exc:
                raise ActuationError(self.platform, node, action, f"{self.where}: {exc}") from None
            if after is None:
                return self._answer(before, changed=False, counted=counted, obj=obj)
            try:
                self.custom.replace_cluster_custom_object(*self.API, self.queue, obj)
            except ApiException as exc:
                if exc.status == 409 and attempt + 1 < CONFLICT_RETRIES:
                    time.sleep(random.uniform(0.01, 0.05) * (attempt + 1))  # writers out of step
                    continue
                raise ActuationError(self.platform, node, action,
                                     f"{self.where}: HTTP {exc.status} {exc.reason}: {str(exc.body)[:300]}") from exc
            except Exception as exc:  # connection refused, timeouts (urllib3)
                raise ActuationError(self.platform, node, action, f"{self.where}: {type(exc).__name__}: {exc}") from exc
            return self._answer(after, changed=True, counted=counted, obj=obj)
        raise ActuationError(self.platform, node, action, f"{self.where}: still conflicting after {CONFLICT_RETRIES} tries")

    def change(self, obj: dict, counted: dict[str, int], name: str, action: str,
               gpus: int) -> tuple[Decimal, Decimal | None]:
        """Apply a shrink or grow of node ``name`` to a read queue ``obj`` and the record
        ``counted``, in place: the quota (every place of :meth:`slots`, each by the same GPUs,
        none below 0) and the annotation :data:`NODES_ANNOTATION`. Returns (quota before, quota
        after) of the first place; after is None when the record says there is nothing to change
        (the node already left, or already entered). ValueError when the quota is missing or
        cannot follow nodes."""
        values = self._values(obj)
        before = values[0]
        if action == SHRINK:
            if name not in counted:
                return before, None
            delta = -Decimal(counted.pop(name))
        else:
            if name in counted:
                return before, None
            counted[name] = gpus
            delta = Decimal(gpus)
        for (holder, key, _), value in zip(self.slots(obj, write=True), values):
            holder[key] = self.format(max(Decimal(0), value + delta), holder.get(key))
        obj.setdefault("metadata", {}).setdefault("annotations", {})[NODES_ANNOTATION] = json.dumps(counted, sort_keys=True)
        return before, max(Decimal(0), before + delta)

    def _values(self, obj: dict) -> list[Decimal]:
        """The number at each of :meth:`slots`; ValueError saying which is missing or cannot follow nodes."""
        try:
            slots = self.slots(obj)
        except LookupError as exc:
            raise ValueError(str(exc)) from None
        values = []
        for holder, key, called in slots:
            try:
                values.append(self.parse(holder.get(key)))
            except ValueError as exc:
                raise ValueError(f"{called}: {exc}" if called else str(exc)) from None
        return values

    def _answer(self, quota: Decimal, changed: bool, counted: dict[str, int], obj: dict) -> dict[str, Any]:
        return {**self.request_fields(), self.ANSWER_KEY: str(quota), **self.more_answer(obj), "changed": changed,
                "nodes_counted": len(counted)}

    # ---- reads
    def _read(self, node: str, action: str) -> dict:
        from kubernetes.client.exceptions import ApiException

        try:
            return self.custom.get_cluster_custom_object(*self.API, self.queue)
        except ApiException as exc:
            if exc.status == 404:
                raise ActuationError(self.platform, node, action, f"{self.where}: no such {self.KIND}") from exc
            raise ActuationError(self.platform, node, action, f"{self.where}: HTTP {exc.status} {exc.reason}") from exc
        except Exception as exc:
            raise ActuationError(self.platform, node, action, f"{self.where}: {type(exc).__name__}: {exc}") from exc

    def _check(self, obj: dict, node: str, action: str) -> None:
        """ActuationError when the read queue has no quota where the shape says, or one that
        cannot follow nodes."""
        try:
            self._values(obj)
        except ValueError as exc:
            raise ActuationError(self.platform, node, action, f"{self.where}: {exc}") from None

    def _counted(self, obj: dict, name: str, node: str, action: str) -> dict[str, int]:
        """The nodes the queue counts and their GPUs: the record, or the first-sight seed;
        ActuationError when the queue has no quota where the shape says."""
        self._check(obj, node, action)  # a missing flavor or resource is said first
        text = ((obj.get("metadata") or {}).get("annotations") or {}).get(NODES_ANNOTATION)
        if text is None:
            try:
                return self._seed(node, action, exclude=name if action == GROW else None)
            except ActuationError:
                raise
            except Exception as exc:
                raise ActuationError(self.platform, node, action,
                                     f"{self.where}: listing the nodes to seed the record: {type(exc).__name__}: {exc}") from exc
        try:
            counted = json.loads(text)
            if not isinstance(counted, dict):
                raise ValueError("not a JSON object")
            return {str(k): int(v) for k, v in counted.items()}
        except (ValueError, TypeError) as exc:
            raise ActuationError(self.platform, node, action,
                                 f"{self.where}: annotation {NODES_ANNOTATION} is not a JSON object of node: GPUs "
                                 f"({exc}); fix or remove it") from exc

    def _seed(self, node: str, action: str, exclude: str | None) -> dict[str, int]:
        """The GPU nodes the queue covers that the platform holds now (see the module's first-sight rule)."""
        selector = self.selector(node, action)
        out: dict[str, int] = {}
        token = None
        while True:
            kwargs = {"limit": 500}
            if token:
                kwargs["_continue"] = token
            page = self.core.list_node(**kwargs)
            for obj in page.items:
                name = obj.metadata.name
                gpus = self.units_of(obj)
                if name != exclude and gpus > 0 and self.covers(obj, selector) and self._held_here(obj):
                    out[name] = gpus
            token = page.metadata._continue if page.metadata is not None else None
            if not token:
                return out

    def _held_here(self, obj) -> bool:
        """Not moved away by gpupool: no owner label of another platform, no gpupool hold but a park."""
        labels = obj.metadata.labels or {}
        owner = labels.get(OWNER_LABEL)
        if owner not in (None, self.platform):
            return False
        cordoned = bool(obj.spec.unschedulable) if obj.spec else False
        hold = (obj.metadata.annotations or {}).get(HOLD_ANNOTATION)
        return not (cordoned and is_gpupool_reason(hold) and hold.strip() != _PARKED)

    def _read_node(self, node: str, name: str):
        from kubernetes.client.exceptions import ApiException

        try:
            return self.core.read_node(name)
        except ApiException as exc:
            raise ActuationError(self.platform, node, GROW, f"read node: HTTP {exc.status} {exc.reason}") from exc
        except Exception as exc:
            raise ActuationError(self.platform, node, GROW, f"read node: {type(exc).__name__}: {exc}") from exc


def _allocatable(obj) -> dict:
    return (obj.status.allocatable if obj.status else None) or {}


class KueueQuota(QueueQuota):
    """A Kueue ClusterQueue's ``nominalQuota`` for one flavor and resource; ``spec`` has
    ``cluster_queue``, ``flavor`` and ``resource``."""

    API = KUEUE
    KIND = "ClusterQueue"
    ANSWER_KEY = "nominal_quota"

    def __init__(self, api_client, platform: str, spec: Any):
        super().__init__(api_client, platform, spec.cluster_queue)
        self.flavor = spec.flavor
        self.resource = spec.resource
        self.UNITS = repr(self.resource)

    @property
    def where(self) -> str:
        return f"ClusterQueue {self.queue!r} flavor {self.flavor!r} resource {self.resource!r}"

    def request_fields(self) -> dict[str, Any]:
        return {"cluster_queue": self.queue, "flavor": self.flavor, "resource": self.resource}

    def slot(self, obj: dict, write: bool = False) -> tuple[dict, str]:
        return quota_entry(obj, self.flavor, self.resource), "nominalQuota"

    def parse(self, value: Any) -> Decimal:
        return parse_quantity(value, "nominalQuota")

    def format(self, value: Decimal, like: Any) -> Any:
        return format_quantity(value, like)

    def units_of(self, obj) -> int:
        try:
            return int(parse_quantity(_allocatable(obj).get(self.resource, 0), self.resource))
        except ValueError:
            return 0

    def selector(self, node: str, action: str) -> dict[str, str]:
        """The ResourceFlavor's ``spec.nodeLabels`` (empty: every node is of the flavor)."""
        from kubernetes.client.exceptions import ApiException

        try:
            obj = self.custom.get_cluster_custom_object(*FLAVORS, self.flavor)
        except ApiException as exc:
            if exc.status == 404:
                raise ActuationError(self.platform, node, action, f"{self.where}: no such ResourceFlavor") from exc
            raise ActuationError(self.platform, node, action,
                                 f"{self.where}: reading the ResourceFlavor: HTTP {exc.status} {exc.reason}") from exc
        except Exception as exc:
            raise ActuationError(self.platform, node, action,
                                 f"{self.where}: reading the ResourceFlavor: {type(exc).__name__}: {exc}") from exc
        return dict((obj.get("spec") or {}).get("nodeLabels") or {})

    def covers(self, obj, selector: dict[str, str]) -> bool:
        have = obj.metadata.labels or {}
        return all(have.get(k) == v for k, v in selector.items())


class KaiQuota(QueueQuota):
    """A KAI-Scheduler Queue's ``spec.resources.gpu.quota``; ``spec`` has ``queue``. Every GPU
    node counts, by KAI's GPU units (:func:`kai_gpu_units`)."""

    API = KAI
    KIND = "Queue"
    UNITS = "GPUs (nvidia.com/gpu or nvidia.com/mig-*)"

    def __init__(self, api_client, platform: str, spec: Any):
        super().__init__(api_client, platform, spec.queue)

    @property
    def where(self) -> str:
        return f"KAI Queue {self.queue!r}"

    def request_fields(self) -> dict[str, Any]:
        return {"queue": self.queue}

    def slot(self, obj: dict, write: bool = False) -> tuple[dict, str]:
        """``spec.resources.gpu``; an absent one is a quota of 0 (KAI's default), created on write."""
        spec = obj.get("spec")
        if not isinstance(spec, dict):
            raise LookupError("the Queue has no spec")
        if write:
            return spec.setdefault("resources", {}).setdefault("gpu", {}), "quota"
        return ((spec.get("resources") or {}).get("gpu") or {}), "quota"

    def parse(self, value: Any) -> Decimal:
        if value is None:
            return Decimal(0)  # unset: no guaranteed GPUs
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"spec.resources.gpu.quota {value!r} is not a number")
        quota = Decimal(str(value))
        if quota < 0:
            raise ValueError(f"spec.resources.gpu.quota is {value} (unlimited): it cannot follow nodes; "
                             "give the queue a number of GPUs")
        return quota

    def format(self, value: Decimal, like: Any) -> Any:
        return int(value) if value == value.to_integral_value() else float(value)

    def units_of(self, obj) -> int:
        return kai_gpu_units(_allocatable(obj))


class VolcanoQuota(QueueQuota):
    """A Volcano Queue's ``spec.capability`` of one resource, and its ``spec.deserved`` and
    ``spec.guarantee.resource`` of it where the queue sets them; ``spec`` has ``queue`` and
    ``resource``. Every node counts, by what it reports allocatable of the resource."""

    API = VOLCANO
    KIND = "Queue"
    ANSWER_KEY = "capability"
    #: the places beside ``spec.capability`` that follow it where set: (path from spec, name in answers)
    FOLLOWERS = ((("deserved",), "deserved"), (("guarantee", "resource"), "guarantee"))

    def __init__(self, api_client, platform: str, spec: Any):
        super().__init__(api_client, platform, spec.queue)
        self.resource = getattr(spec, "resource", None) or "nvidia.com/gpu"
        self.UNITS = repr(self.resource)

    @property
    def where(self) -> str:
        return f"Volcano Queue {self.queue!r}"

    def request_fields(self) -> dict[str, Any]:
        return {"queue": self.queue, "resource": self.resource}

    def slots(self, obj: dict, write: bool = False) -> list[tuple[dict, str, str]]:
        """``spec.capability`` (required: without the resource the queue is unlimited, refused
        by :meth:`parse`), then ``spec.deserved`` and ``spec.guarantee.resource`` where they
        name the resource. Nothing is created."""
        spec = obj.get("spec")
        if not isinstance(spec, dict):
            raise LookupError("the Queue has no spec")
        capability = spec.get("capability")
        if capability is None:
            capability = {}  # no capability at all: unlimited, said by parse
        if not isinstance(capability, dict):
            raise LookupError("spec.capability is not a map of resources")
        out = [(capability, self.resource, "spec.capability")]
        for path, _ in self.FOLLOWERS:
            holder = self._follower(spec, path)
            if holder is not None:
                out.append((holder, self.resource, "spec." + ".".join(path)))
        return out

    def _follower(self, spec: dict, path: tuple[str, ...]) -> dict | None:
        """The map at ``path`` under ``spec`` when it names the resource, else None."""
        holder: Any = spec
        for key in path:
            holder = holder.get(key) if isinstance(holder, dict) else None
        if holder is None:
            return None
        if not isinstance(holder, dict):
            raise LookupError(f"spec.{'.'.join(path)} is not a map of resources")
        return holder if holder.get(self.resource) is not None else None

    def parse(self, value: Any) -> Decimal:
        if value is None:
            raise ValueError(f"no {self.resource!r} (unlimited): it cannot follow nodes; "
                             f"give the queue a capability of {self.resource}")
        if isinstance(value, bool):
            raise ValueError(f"{self.resource} {value!r} is not a quantity")
        quota = parse_quantity(value, self.resource)
        if quota < 0:
            raise ValueError(f"{self.resource} is {value!r}, below 0: it cannot follow nodes")
        return quota

    def format(self, value: Decimal, like: Any) -> Any:
        """A string quantity, whichever way the operator wrote it (what Volcano's own client writes)."""
        return format_quantity(value, "")

    def more_answer(self, obj: dict) -> dict[str, Any]:
        spec = obj.get("spec") or {}
        out = {}
        for path, name in self.FOLLOWERS:
            try:
                holder = self._follower(spec, path)
            except LookupError:
                continue
            if holder is not None:
                out[name] = str(holder[self.resource])
        return out

    def units_of(self, obj) -> int:
        try:
            return int(parse_quantity(_allocatable(obj).get(self.resource, 0), self.resource))
        except ValueError:
            return 0


def kai_gpu_units(allocatable: dict) -> int:
    """KAI's GPU units of a node's allocatable: each ``nvidia.com/gpu`` 1, each
    ``nvidia.com/mig-<X>g.<Y>gb`` device X (KAI's queue documentation); unreadable counts 0."""
    import re

    units = 0
    for key, value in allocatable.items():
        if key == "nvidia.com/gpu":
            weight = 1
        else:
            m = re.fullmatch(r"nvidia\.com/mig-(\d+)g\..+", key)
            if not m:
                continue
            weight = int(m.group(1))
        try:
            units += weight * int(parse_quantity(value, key))
        except ValueError:
            continue
    return units


def change_quota(obj: dict, counted: dict[str, int], flavor: str, resource: str, name: str, action: str,
                 gpus: int) -> tuple[Decimal, Decimal | None]:
    """:meth:`QueueQuota.change` of a read ClusterQueue ``obj`` for ``flavor`` and ``resource``."""
    from types import SimpleNamespace

    spec = SimpleNamespace(cluster_queue=obj.get("metadata", {}).get("name", ""), flavor=flavor, resource=resource)
    return KueueQuota(None, "", spec).change(obj, counted, name, action, gpus)


def quota_entry(obj: dict, flavor: str, resource: str) -> dict:
    """The ``spec.resourceGroups[*].flavors[name=flavor].resources[name=resource]`` entry of a
    ClusterQueue (the dict holding ``nominalQuota``, to change in place); LookupError saying
    which is missing."""
    seen = False
    for group in (obj.get("spec") or {}).get("resourceGroups") or []:
        for fl in group.get("flavors") or []:
            if fl.get("name") != flavor:
                continue
            seen = True
            for res in fl.get("resources") or []:
                if res.get("name") == resource:
                    return res
    raise LookupError("the flavor has no such resource" if seen else "no such flavor")
def parse_quantity(value: Any, where: str) -> Decimal:
    """A Kubernetes quantity (``8``, ``"8"``, ``"1k"``) as a Decimal; ValueError naming ``where``."""
    from kubernetes.utils import parse_quantity as parse

    if value is None:
        raise ValueError(f"{where}: no nominalQuota")
    try:
        return Decimal(parse(value))
    except (ValueError, TypeError, ArithmeticError) as exc:
        raise ValueError(f"{where}: {value!r} is not a quantity") from exc


def format_quantity(value: Decimal, like: Any) -> int | str:
    """``value`` written the way the quantity it replaces was: a JSON number stays a number,
    a string stays a string (an integral value without a fraction)."""
    text = str(int(value)) if value == value.to_integral_value() else str(value.normalize())
    if isinstance(like, int) and not isinstance(like, bool) and value == value.to_integral_value():
        return int(value)
    return text
