"""The platform's own admission quota follows the nodes gpupool moves: a Kueue ClusterQueue.

A Kubernetes AI cluster admits work through a queue's quota, not through the nodes: a node
gpupool attaches is invisible to a ClusterQueue whose ``nominalQuota`` did not grow, and a node
it takes away keeps being admitted onto until the quota shrinks. So a Kubernetes platform
configured with ``quota: {kind: kueue, cluster_queue, flavor, resource}`` gets two more
commands, both audited like the rest:

* ``quota_shrink`` first in a release, before the cordon (and any eviction): the queue stops
  admitting onto the node before it is drained;
* ``quota_grow`` last in an attach, after the uncordon: the queue admits onto the node once it
  is open.

The change is ``spec.resourceGroups[*].flavors[name=flavor].resources[name=resource].nominalQuota``
of the ClusterQueue (``kueue.x-k8s.io/v1beta1``, cluster-scoped), by the node's GPUs (what it
reports allocatable of the resource). Only nodes of the flavor count: those carrying the
ResourceFlavor's ``spec.nodeLabels`` (all nodes when it has none); attaching a node of another
flavor leaves this quota alone.

Idempotent and safe with two writers: the ClusterQueue itself records, in the annotation
:data:`NODES_ANNOTATION` (JSON ``{"node": gpus}``), which nodes gpupool counted in it and how
many GPUs each added. A shrink subtracts only when its node leaves that record, a grow adds
only when its node enters it, and the record and the quota change in one ``replace`` carrying
the object's ``resourceVersion``: the API server answers 409 Conflict to a writer whose read is
stale, which reads again and retries. So a command sent twice acts once, and two writers never
lose each other's change. A shrink subtracts what its node added (not what the node reports
now: a re-laid-out node may report other GPUs). The quota never goes below 0.

First sight (no record on the ClusterQueue yet): its quota is taken as the operator set it, for
the GPU nodes the platform holds now, and the record is seeded with them: every node of the flavor
that reports the resource, except those gpupool moved away (owner label naming another platform, or
a gpupool hold other than a park). The node a grow is about is never in that seed (it is
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

#: the ClusterQueue annotation that records the nodes gpupool counted in its quota
NODES_ANNOTATION = "gpupool.io/quota-nodes"
#: Kueue's ClusterQueue: group, version, plural (cluster-scoped)
KUEUE = ("kueue.x-k8s.io", "v1beta1", "clusterqueues")
#: Kueue's ResourceFlavor, whose ``spec.nodeLabels`` say which nodes are of the flavor
FLAVORS = ("kueue.x-k8s.io", "v1beta1", "resourceflavors")
#: how often a replace that met a 409 Conflict is retried on a fresh read
CONFLICT_RETRIES = 10
#: the hold reason of a parked node (:data:`gpupool.actuation.power.base.PARK_REASON`): it stays
#: counted, it wakes on the same platform
_PARKED = "gpupool: parked"

SHRINK, GROW = "quota_shrink", "quota_grow"


class QueueQuota:
    """One Kueue ClusterQueue's quota for one flavor and resource, following the nodes.

    ``api_client`` is a ``kubernetes.client.ApiClient``; ``spec`` the platform's ``quota``
    configuration (:class:`gpupool.config.QuotaConfig`, or any object with ``cluster_queue``,
    ``flavor`` and ``resource``).
    """

    def __init__(self, api_client, platform: str, spec: Any):
        from kubernetes import client

        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)
        self.platform = platform
        self.queue = spec.cluster_queue
        self.flavor = spec.flavor
        self.resource = spec.resource

    @property
    def where(self) -> str:
        """The quota named for messages: queue, flavor, resource."""
        return f"ClusterQueue {self.queue!r} flavor {self.flavor!r} resource {self.resource!r}"

    # ---- commands
    def shrink_commands(self, node: str, name: str | None = None) -> list[Command]:
        """The shrink of ``node`` (``name`` in Kubernetes, where it differs), or nothing when the
        queue does not count it."""
        name = name or node
        counted = self._counted(self._read(node, SHRINK), name, node, SHRINK)
        if name not in counted:
            return []
        return [Command(self.platform, node, SHRINK, self._request(name))]

    def grow_commands(self, node: str, name: str | None = None) -> list[Command]:
        """The grow of ``node`` (``name`` in Kubernetes) by the GPUs it reports, or nothing when
        the queue counts it already."""
        name = name or node
        counted = self._counted(self._read(node, GROW), name, node, GROW)
        if name in counted:
            return []
        obj = self._read_node(node, name)
        if not self._of_flavor(obj, self._flavor_labels(node, GROW)):
            return []  # a node of another flavor: this quota does not cover it
        gpus = self._gpus_of(obj)
        if gpus <= 0:
            raise ActuationError(self.platform, node, GROW,
                                 f"the node reports no allocatable {self.resource!r}: {self.where} cannot count it")
        return [Command(self.platform, node, GROW, {**self._request(name), "gpus": gpus})]

    def _request(self, name: str) -> dict[str, Any]:
        return {"cluster_queue": self.queue, "flavor": self.flavor, "resource": self.resource, "node": name}

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
                before, after = change_quota(obj, counted, self.flavor, self.resource, name,
                                             action, int(command.request.get("gpus") or 0))
            except ValueError as exc:
                raise ActuationError(self.platform, node, action, f"{self.where}: {exc}") from None
            if after is None:
                return self._answer(before, changed=False, counted=counted)
            try:
                self.custom.replace_cluster_custom_object(*KUEUE, self.queue, obj)
            except ApiException as exc:
                if exc.status == 409 and attempt + 1 < CONFLICT_RETRIES:
                    time.sleep(random.uniform(0.01, 0.05) * (attempt + 1))  # writers out of step
                    continue
                raise ActuationError(self.platform, node, action,
                                     f"{self.where}: HTTP {exc.status} {exc.reason}: {str(exc.body)[:300]}") from exc
            except Exception as exc:  # connection refused, timeouts (urllib3)
                raise ActuationError(self.platform, node, action, f"{self.where}: {type(exc).__name__}: {exc}") from exc
            return self._answer(after, changed=True, counted=counted)
        raise ActuationError(self.platform, node, action, f"{self.where}: still conflicting after {CONFLICT_RETRIES} tries")

    def _answer(self, quota: Decimal, changed: bool, counted: dict[str, int]) -> dict[str, Any]:
        return {"cluster_queue": self.queue, "flavor": self.flavor, "resource": self.resource,
                "nominal_quota": str(quota), "changed": changed, "nodes_counted": len(counted)}

    # ---- reads
    def _read(self, node: str, action: str) -> dict:
        from kubernetes.client.exceptions import ApiException

        try:
            return self.custom.get_cluster_custom_object(*KUEUE, self.queue)
        except ApiException as exc:
            if exc.status == 404:
                raise ActuationError(self.platform, node, action, f"{self.where}: no such ClusterQueue") from exc
            raise ActuationError(self.platform, node, action, f"{self.where}: HTTP {exc.status} {exc.reason}") from exc
        except Exception as exc:
            raise ActuationError(self.platform, node, action, f"{self.where}: {type(exc).__name__}: {exc}") from exc

    def _quota_holder(self, obj: dict, node: str, action: str) -> dict:
        try:
            return quota_entry(obj, self.flavor, self.resource)
        except LookupError as exc:
            raise ActuationError(self.platform, node, action, f"{self.where}: {exc}") from None

    def _counted(self, obj: dict, name: str, node: str, action: str) -> dict[str, int]:
        """The nodes the queue counts and their GPUs: the record, or the first-sight seed;
        ActuationError when the queue has no such flavor or resource."""
        self._quota_holder(obj, node, action)  # a missing flavor or resource is said first
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
        """The GPU nodes of the flavor the platform holds now (see the module's first-sight rule)."""
        labels = self._flavor_labels(node, action)
        out: dict[str, int] = {}
        token = None
        while True:
            kwargs = {"limit": 500}
            if token:
                kwargs["_continue"] = token
            page = self.core.list_node(**kwargs)
            for obj in page.items:
                name = obj.metadata.name
                gpus = self._gpus_of(obj)
                if name != exclude and gpus > 0 and self._of_flavor(obj, labels) and self._held_here(obj):
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

    def _gpus_of(self, obj) -> int:
        alloc = (obj.status.allocatable if obj.status else None) or {}
        try:
            return int(parse_quantity(alloc.get(self.resource, 0), self.resource))
        except ValueError:
            return 0

    def _read_node(self, node: str, name: str):
        from kubernetes.client.exceptions import ApiException

        try:
            return self.core.read_node(name)
        except ApiException as exc:
            raise ActuationError(self.platform, node, GROW, f"read node: HTTP {exc.status} {exc.reason}") from exc
        except Exception as exc:
            raise ActuationError(self.platform, node, GROW, f"read node: {type(exc).__name__}: {exc}") from exc

    def _flavor_labels(self, node: str, action: str) -> dict[str, str]:
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

    @staticmethod
    def _of_flavor(obj, labels: dict[str, str]) -> bool:
        have = obj.metadata.labels or {}
        return all(have.get(k) == v for k, v in labels.items())


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


def change_quota(obj: dict, counted: dict[str, int], flavor: str, resource: str, name: str, action: str,
                 gpus: int) -> tuple[Decimal, Decimal | None]:
    """Apply a shrink or grow of node ``name`` to a read ClusterQueue ``obj`` and the record
    ``counted``, in place: the quota entry's ``nominalQuota`` and the annotation
    :data:`NODES_ANNOTATION`. Returns (quota before, quota after); after is None when the record
    says there is nothing to change (the node already left, or already entered). ValueError
    when the quota is not a quantity or the entry is missing."""
    try:
        entry = quota_entry(obj, flavor, resource)
    except LookupError as exc:
        raise ValueError(str(exc)) from None
    before = parse_quantity(entry.get("nominalQuota"), "nominalQuota")
    if action == SHRINK:
        if name not in counted:
            return before, None
        after = max(Decimal(0), before - Decimal(counted.pop(name)))
    else:
        if name in counted:
            return before, None
        counted[name] = gpus
        after = before + gpus
    entry["nominalQuota"] = format_quantity(after, entry.get("nominalQuota"))
    obj.setdefault("metadata", {}).setdefault("annotations", {})[NODES_ANNOTATION] = json.dumps(counted, sort_keys=True)
    return before, after


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
