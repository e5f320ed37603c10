"""Kubernetes: cordon and label, wait for GPU pods to finish (or evict them), uncordon on attach.

* release: one node patch — ``spec.unschedulable: true``, label ``gpupool.io/owner=<target>``
  and annotation ``gpupool.io/hold-reason: "gpupool: moving to <target>"``. Kubernetes has no
  cordon reason, so the annotation is how gpupool recognises its own cordons: a node cordoned
  without it belongs to someone else and is never uncordoned.
* released: no GPU pod (one that requests ``nvidia.com/gpu`` or a MIG resource) is still
  pending or running on the node; DaemonSet and mirror pods (device plugin, exporters) stay.
* evict (only when the policy allows): one Eviction per GPU pod through the Eviction API, so
  PodDisruptionBudgets are respected — a 429 answer means "not now" and is retried next run; the
  refusal names the budgets (policy/v1) whose selector matches the pod, so the alert says what blocks.
* work started: the GPU pods' ``status.startTime``.
* blocking budgets: the PodDisruptionBudgets (policy/v1, the same read) that select a GPU pod on
  the node and allow no disruption now, read before an eviction is tried so a reclaim reports them
  at once.
* MIG: ``prepare`` sets the label ``nvidia.com/mig.config`` while the node is still cordoned;
  the node is ready when the GPU operator reports ``nvidia.com/mig.config.state=success``.
* attach: uncordon, label ``gpupool.io/owner=<this platform>``, drop the annotation.
* quota (a platform configured with ``quota:``): the Kueue ClusterQueue's ``nominalQuota``, the
  KAI-Scheduler Queue's GPU ``quota`` or the Volcano Queue's GPU ``capability`` shrinks first in a
  release (before the cordon) and grows last in an attach (after the uncordon),
  :mod:`gpupool.actuation.quota`.

All calls use the official ``kubernetes`` client.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Mapping

from gpupool import mig
from gpupool.actuation.actuators.base import REASON_PREFIX, ActuationError, Actuator, Command, OwnerState
from gpupool.k8s_keys import HOLD_ANNOTATION, OWNER_LABEL

MIG_CONFIG_LABEL = mig.CONFIG_LABEL
MIG_STATE_LABEL = mig.STATE_LABEL
_MOVING = f"{REASON_PREFIX} moving to "


def requests_gpu(pod: Any) -> bool:
    """Whether a pod asks for whole GPUs or MIG slices."""
    for c in list(pod.spec.containers or []) + list(pod.spec.init_containers or []):
        res = c.resources
        if res is None:
            continue
        for block in (res.requests or {}, res.limits or {}):
            if any(k == "nvidia.com/gpu" or k.startswith(mig.RESOURCE_PREFIX) for k in block):
                return True
    return False


def _is_daemon(pod: Any) -> bool:
    refs = pod.metadata.owner_references or []
    annotations = pod.metadata.annotations or {}
    return any(r.kind == "DaemonSet" for r in refs) or "kubernetes.io/config.mirror" in annotations


def selector_matches(selector: Any, labels: Mapping[str, str]) -> bool:
    """Whether a ``V1LabelSelector`` selects ``labels`` (an empty selector selects every pod, as a
    policy/v1 PodDisruptionBudget's does; a missing one selects none)."""
    if selector is None:
        return False
    for k, v in (selector.match_labels or {}).items():
        if labels.get(k) != v:
            return False
    for expr in selector.match_expressions or []:
        have, values = labels.get(expr.key), set(expr.values or [])
        op = expr.operator
        if (op == "In" and have not in values) or (op == "NotIn" and have in values) \
                or (op == "Exists" and expr.key not in labels) or (op == "DoesNotExist" and expr.key in labels):
            return False
    return True


class KubernetesActuator(Actuator):
    """Release and attach nodes of one Kubernetes cluster.

    Parameters
    ----------
    api_client:
        A ``kubernetes.client.ApiClient`` (from a kubeconfig or in-cluster configuration).
    platform:
        The configured platform name.
    names:
        Pool node name -> Kubernetes node name, where they differ.
    quota:
        The platform's ``quota`` configuration (:class:`gpupool.config.QuotaConfig`); None:
        no queue follows the nodes.
    """

    can_evict = True
    relayout_holds_itself = True  # the mig-manager cordons, re-lays out and uncordons the node
    can_relayout = True

    def __init__(self, api_client, platform: str = "kubernetes", names: Mapping[str, str] | None = None,
                 quota: Any = None):
        from kubernetes import client

        from gpupool.actuation.quota import queue_quota

        self._client = client
        self.core = client.CoreV1Api(api_client)
        self.policy = client.PolicyV1Api(api_client)
        self.platform = platform
        self.names = dict(names or {})
        self.quota = queue_quota(api_client, platform, quota) if quota is not None else None

    def _name(self, node: str) -> str:
        return self.names.get(node, node)

    def _call(self, node: str, action: str, fn, *args, **kwargs):
        from kubernetes.client.exceptions import ApiException

        try:
            return fn(*args, **kwargs)
        except ApiException as exc:
            raise ActuationError(self.platform, node, action, f"HTTP {exc.status} {exc.reason}: {str(exc.body)[:300]}") from exc
        except Exception as exc:  # connection refused, timeouts (urllib3)
            raise ActuationError(self.platform, node, action, f"{type(exc).__name__}: {exc}") from exc

    def _read_node(self, node: str):
        from kubernetes.client.exceptions import ApiException

        try:
            return self.core.read_node(self._name(node))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise ActuationError(self.platform, node, "read node", f"HTTP {exc.status} {exc.reason}") from exc
        except Exception as exc:
            raise ActuationError(self.platform, node, "read node", f"{type(exc).__name__}: {exc}") from exc

    def gpu_pods(self, node: str) -> list[Any]:
        """Non-terminal GPU pods on ``node`` (DaemonSet and mirror pods excluded)."""
        pods = self._call(node, "list pods", self.core.list_pod_for_all_namespaces,
                          field_selector=f"spec.nodeName={self._name(node)}")
        out = []
        for pod in pods.items:
            if (pod.spec.node_name or "") != self._name(node):
                continue
            if (pod.status.phase if pod.status else None) in ("Succeeded", "Failed"):
                continue
            if _is_daemon(pod) or not requests_gpu(pod):
                continue
            out.append(pod)
        return out

    # ---- reads
    def owner_state(self, node: str) -> OwnerState:
        """Cordon flag, gpupool's hold annotation, owner and MIG labels, GPU pods."""
        obj = self._read_node(node)
        if obj is None:
            return OwnerState(self.platform, node, present=False, schedulable=False)
        labels = obj.metadata.labels or {}
        annotations = obj.metadata.annotations or {}
        cordoned = bool(obj.spec.unschedulable) if obj.spec else False
        reason = None
        if cordoned:
            reason = annotations.get(HOLD_ANNOTATION) or "cordoned (no gpupool hold annotation)"
        pods = self.gpu_pods(node)
        return OwnerState(
            self.platform, node, present=True, schedulable=not cordoned, hold_reason=reason, busy=len(pods),
            detail={"owner_label": labels.get(OWNER_LABEL), "mig_config": labels.get(MIG_CONFIG_LABEL),
                    "mig_config_state": labels.get(MIG_STATE_LABEL),
                    "gpu_pods": [f"{p.metadata.namespace}/{p.metadata.name}" for p in pods]},
        )

    def is_released(self, node: str) -> bool:
        """Cordoned by gpupool and no GPU pod left."""
        st = self.owner_state(node)
        return st.held_by_gpupool and st.busy == 0

    def work_started(self, node: str) -> list[datetime]:
        """``status.startTime`` of the GPU pods on ``node`` (UTC); a pod not started yet has none."""
        out = []
        for pod in self.gpu_pods(node):
            t = pod.status.start_time if pod.status else None
            if isinstance(t, datetime):
                out.append(t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t.astimezone(timezone.utc))
        return out

    def blocking_budgets(self, node: str) -> list[str]:
        """``namespace/name`` of the PodDisruptionBudgets that select a GPU pod on ``node`` and
        allow no disruption now (``status.disruptionsAllowed`` 0, or not computed yet: the API
        server refuses an eviction then too). :class:`ActuationError` when the pods or the budgets
        cannot be read: a caller that only reports them says it could not tell."""
        out: set[str] = set()
        listed: dict[str, list[Any]] = {}
        for pod in self.gpu_pods(node):
            ns = pod.metadata.namespace
            if ns not in listed:
                listed[ns] = self._call(node, "list budgets",
                                        self.policy.list_namespaced_pod_disruption_budget, ns).items
            labels = pod.metadata.labels or {}
            for pdb in listed[ns]:
                allowed = pdb.status.disruptions_allowed if pdb.status is not None else None
                if pdb.spec is not None and not allowed and selector_matches(pdb.spec.selector, labels):
                    out.add(f"{ns}/{pdb.metadata.name}")
        return sorted(out)

    def pod_budgets(self, namespace: str, pod: str) -> list[str]:
        """``namespace/name (disruptionsAllowed N)`` of the PodDisruptionBudgets whose selector
        matches the pod's labels; empty when the pod or the budgets cannot be read."""
        try:
            labels = self.core.read_namespaced_pod(pod, namespace).metadata.labels or {}
            budgets = self.policy.list_namespaced_pod_disruption_budget(namespace).items
        except Exception:  # the refusal is reported either way; the names only make it clearer
            return []
        out = []
        for pdb in budgets:
            if pdb.spec is not None and selector_matches(pdb.spec.selector, labels):
                allowed = pdb.status.disruptions_allowed if pdb.status is not None else None
                out.append(f"{namespace}/{pdb.metadata.name} (disruptionsAllowed {allowed})")
        return sorted(out)

    @staticmethod
    def _whole_without_mig(obj, mig_layout: str) -> bool:
        """Whole GPUs asked of a node with no MIG label and no slice resource: MIG is off already
        (a cluster without the GPU operator's mig-manager never labels it)."""
        if mig_layout not in mig.WHOLE_LAYOUTS or obj is None:
            return False
        alloc = (obj.status.allocatable if obj.status else None) or {}
        return MIG_CONFIG_LABEL not in (obj.metadata.labels or {}) and not any(
            k.startswith(mig.RESOURCE_PREFIX) for k in alloc)

    def is_prepared(self, node: str, mig_layout: str | None) -> bool:
        """The node carries ``mig_layout`` and the GPU operator reports success."""
        if not mig_layout:
            return True
        obj = self._read_node(node)
        if self._whole_without_mig(obj, mig_layout):
            return True
        labels = (obj.metadata.labels or {}) if obj is not None else {}
        return labels.get(MIG_CONFIG_LABEL) == mig_layout and labels.get(MIG_STATE_LABEL) == "success"

    # ---- writes
    def release_commands(self, node: str, reason: str) -> list[Command]:
        """The queue's quota shrink first (where configured), then cordon, owner label (the
        target named in ``reason``) and hold annotation."""
        owner = reason[len(_MOVING):].strip() if reason.startswith(_MOVING) else "pool"
        body = {"spec": {"unschedulable": True},
                "metadata": {"labels": {OWNER_LABEL: owner}, "annotations": {HOLD_ANNOTATION: reason}}}
        shrink = self.quota.shrink_commands(node, self._name(node)) if self.quota is not None else []
        return shrink + [Command(self.platform, node, "cordon", {"node": self._name(node), "patch": body})]

    def evict_commands(self, node: str) -> list[Command]:
        """One Eviction per GPU pod still on the node (PodDisruptionBudgets decide)."""
        return [
            Command(self.platform, node, "evict", {"namespace": p.metadata.namespace, "pod": p.metadata.name})
            for p in self.gpu_pods(node)
        ]

    def prepare_commands(self, node: str, mig_layout: str | None) -> list[Command]:
        """Label ``nvidia.com/mig.config`` when the node should arrive with another layout."""
        if not mig_layout:
            return []
        obj = self._read_node(node)
        labels = (obj.metadata.labels or {}) if obj is not None else {}
        if labels.get(MIG_CONFIG_LABEL) == mig_layout or self._whole_without_mig(obj, mig_layout):
            return []
        body = {"metadata": {"labels": {MIG_CONFIG_LABEL: mig_layout}}}
        return [Command(self.platform, node, "mig_config", {"node": self._name(node), "patch": body})]

    def attach_commands(self, node: str) -> list[Command]:
        """Uncordon a node gpupool cordoned; label it as this platform's; then the queue's
        quota grow (where configured and the queue does not count the node yet: also after an
        uncordon that went out in an earlier run)."""
        st = self.owner_state(node)
        self.refuse_foreign(st, "uncordon")
        grow = self.quota.grow_commands(node, self._name(node)) if self.quota is not None else []
        if st.schedulable and st.detail.get("owner_label") == self.platform:
            return grow
        body = {"spec": {"unschedulable": None},
                "metadata": {"labels": {OWNER_LABEL: self.platform}, "annotations": {HOLD_ANNOTATION: None}}}
        return [Command(self.platform, node, "uncordon", {"node": self._name(node), "patch": body})] + grow

    def send(self, command: Command) -> dict[str, Any]:
        """Patch the node, create an Eviction or change the queue's quota; uncordon re-checks
        the hold right before."""
        from kubernetes.client.exceptions import ApiException

        from gpupool.actuation.quota import GROW, SHRINK

        node, action, req = command.node, command.action, command.request
        if action in (SHRINK, GROW):
            if self.quota is None:
                raise ActuationError(self.platform, node, action, "no quota configured on this platform")
            return self.quota.send(command)
        if action in ("cordon", "uncordon", "mig_config"):
            if action == "uncordon":
                self.refuse_foreign(self.owner_state(node), "uncordon")
            obj = self._call(node, action, self.core.patch_node, req["node"], req["patch"])
            return {"unschedulable": bool(obj.spec.unschedulable) if obj.spec else False,
                    "labels": {k: v for k, v in (obj.metadata.labels or {}).items() if k.startswith(("gpupool.io/", "nvidia.com/mig"))}}
        if action == "evict":
            body = self._client.V1Eviction(
                metadata=self._client.V1ObjectMeta(name=req["pod"], namespace=req["namespace"]))
            try:
                self.core.create_namespaced_pod_eviction(req["pod"], req["namespace"], body)
            except ApiException as exc:
                if exc.status == 404:
                    return {"evicted": False, "gone": True}
                if exc.status == 429:
                    budgets = self.pod_budgets(req["namespace"], req["pod"])
                    by = (f"PodDisruptionBudget {', '.join(budgets)}" if budgets
                          else "a PodDisruptionBudget (none found matching the pod's labels)")
                    pod = f"{req['namespace']}/{req['pod']}"
                    raise ActuationError(self.platform, node, action,
                                         f"pod {pod}: eviction refused by {by} (429)") from exc
                raise ActuationError(self.platform, node, action, f"HTTP {exc.status} {exc.reason}") from exc
            except Exception as exc:
                raise ActuationError(self.platform, node, action, f"{type(exc).__name__}: {exc}") from exc
            return {"evicted": True}
        raise ActuationError(self.platform, node, action, "unknown action")
