"""A Kubernetes API server subset over the simulated Kubernetes platform.

Served (JSON only, no auth check — loopback):

* discovery: ``/version``, ``/api``, ``/api/v1``, ``/apis``, ``/apis/{group}/{version}``;
* ``/api/v1/nodes`` list (``limit``/``continue``, ``labelSelector``, ``fieldSelector``), get, patch
  (strategic-merge, merge and JSON patch of labels, annotations, taints, ``spec.unschedulable``),
  replace; ``resourceVersion`` preconditions answer 409 Conflict;
* ``/api/v1/pods`` and ``/api/v1/namespaces/{ns}/pods`` (list, get): one pod per running GPU job
  (``nvidia.com/gpu: 1``) and one Pending/Unschedulable pod per GPU of demand that does not fit;
* ``POST /api/v1/namespaces/{ns}/pods/{name}/eviction`` (policy/v1 Eviction);
* ``/apis/metrics.k8s.io/v1beta1`` NodeMetrics/PodMetrics and ``/apis/custom.metrics.k8s.io/v1beta2``
  ``DCGM_FI_DEV_GPU_UTIL`` / ``DCGM_FI_DEV_FB_USED`` per node and pod.

What actions do to the world: ``spec.unschedulable: true`` or a NoSchedule/NoExecute taint
cordons the node (running pods continue and finish; NoExecute evicts them); setting the
``nvidia.com/mig.config`` label starts a MIG change that needs an empty node (the mig-manager's
``nvidia.com/mig.config.state`` label says ``pending``, ``success`` or ``failed``). The drain reason
recorded in the world is gpupool's hold annotation (``gpupool.k8s_keys.HOLD_ANNOTATION``) when present.
"""

from __future__ import annotations

import base64
import copy
import json
import re
from typing import Any

import numpy as np
import pandas as pd
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from gpupool.emulator.state import (
    MIG_LABEL,
    MIG_STATE_LABEL,
    WORK_NAMESPACE,
    SimConflict,
    SimInvalid,
    SimNotFound,
    SimState,
    Work,
    stable_uuid,
)
from gpupool.k8s_keys import HOLD_ANNOTATION

ROLE = "kubernetes"
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
NAMESPACES = ("default", "kube-system", WORK_NAMESPACE)
VERSION = {
    "major": "1", "minor": "30", "gitVersion": "v1.30.4", "gitCommit": "a51b3b711150f57ffc1f526a640ec058514ed596",
    "gitTreeState": "clean", "buildDate": "2024-08-14T19:04:53Z", "goVersion": "go1.22.5", "compiler": "gc",
    "platform": "linux/amd64",
}
GPU_METRICS = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED")


class ApiError(Exception):
    """A Kubernetes Status failure."""

    def __init__(self, code: int, reason: str, message: str, details: dict | None = None):
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details


def status_body(code: int, reason: str, message: str, details: dict | None = None) -> dict:
    """A ``Status`` object as the API server writes it."""
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}
    if details is not None:
        body["details"] = details
    return body


def not_found(kind: str, name: str, group: str = "") -> ApiError:
    details = {"name": name, "kind": kind}
    if group:
        details["group"] = group
    return ApiError(404, "NotFound", f'{kind}{"." + group if group else ""} "{name}" not found', details)


def _iso(ts: pd.Timestamp | None) -> str:
    return pd.Timestamp(ts).strftime("%Y-%m-%dT%H:%M:%SZ")


def _quantity_mem(mib: float) -> str:
    return f"{int(round(mib))}Mi"


# ---------------------------------------------------------------------- selectors
_SEL_SET = re.compile(r"^\s*(!?)([A-Za-z0-9_./-]+)\s*(?:(in|notin)\s*\(([^)]*)\))?\s*$")


def parse_label_selector(text: str | None):
    """A label selector as a predicate over a label dict (equality and set-based forms)."""
    if not text:
        return lambda labels: True
    reqs = []
    for part in re.split(r",(?![^()]*\))", text):
        part = part.strip()
        if not part:
            continue
        m = re.match(r"^([A-Za-z0-9_./-]+)\s*(==|=|!=)\s*([A-Za-z0-9_.-]*)$", part)
        if m:
            key, op, val = m.groups()
            reqs.append((key, "!=" if op == "!=" else "=", {val}))
            continue
        m = _SEL_SET.match(part)
        if not m:
            raise ApiError(400, "BadRequest", f"unable to parse requirement: <nil>: Invalid value: \"{part}\"")
        neg, key, op, vals = m.groups()
        if op:
            reqs.append((key, op, {v.strip() for v in vals.split(",") if v.strip()}))
        else:
            reqs.append((key, "!exists" if neg else "exists", set()))

    def match(labels: dict) -> bool:
        for key, op, vals in reqs:
            has, v = key in labels, labels.get(key)
            if op == "=" and not (has and v in vals):
                return False
            if op == "!=" and has and v in vals:
                return False
            if op == "in" and not (has and v in vals):
                return False
            if op == "notin" and has and v in vals:
                return False
            if op == "exists" and not has:
                return False
            if op == "!exists" and has:
                return False
        return True

    return match


def parse_field_selector(text: str | None, allowed: tuple[str, ...]):
    """A field selector (``a=b``, ``a==b``, ``a!=b``, comma-joined) as a predicate over a flat dict."""
    if not text:
        return lambda fields: True
    reqs = []
    for part in text.split(","):
        m = re.match(r"^\s*([A-Za-z.]+)\s*(==|=|!=)\s*(.*?)\s*$", part)
        if not m:
            raise ApiError(400, "BadRequest", f'invalid selector: \'{text}\'; can\'t understand \'{part}\'')
        key, op, val = m.groups()
        if key not in allowed:
            raise ApiError(400, "BadRequest", f'field label not supported: {key}')
        reqs.append((key, op != "!=", val))
    return lambda fields: all((fields.get(k, "") == v) == eq for k, eq, v in reqs)


def paginate(items: list[dict], limit: str | None, cont: str | None, rv: str) -> tuple[list[dict], dict]:
    """Apply ``limit``/``continue`` to items sorted by key; returns items and list metadata."""
    start = 0
    if cont:
        try:
            token = json.loads(base64.urlsafe_b64decode(cont.encode() + b"==").decode())
            after = token["start"]
        except (ValueError, KeyError, TypeError):
            raise ApiError(400, "BadRequest", "continue key is not valid: incorrect encoded start resourceVersion "
                                              "(version meta.k8s.io/v1)") from None
        keys = [_key(i) for i in items]
        start = next((k for k, key in enumerate(keys) if key > after), len(items))
    meta: dict[str, Any] = {"resourceVersion": rv}
    n = None
    if limit not in (None, "", "0"):
        try:
            n = int(limit)
        except ValueError:
            raise ApiError(400, "BadRequest", f'invalid value for limit: "{limit}"') from None
    page = items[start:] if n is None or n <= 0 else items[start:start + n]
    if n and start + n < len(items):
        token = {"v": "meta.k8s.io/v1", "rv": int(rv), "start": _key(page[-1])}
        meta["continue"] = base64.urlsafe_b64encode(json.dumps(token).encode()).decode().rstrip("=")
        meta["remainingItemCount"] = len(items) - start - n
    return page, meta


def _key(item: dict) -> str:
    md = item["metadata"]
    return f'{md.get("namespace", "")}/{md["name"]}'


# ---------------------------------------------------------------------- objects
def node_object(state: SimState, rec: dict) -> dict:
    """The Node object of a pool node held by the Kubernetes platform."""
    meta = rec["meta"]
    name = rec["name"]
    taints = [dict(t) for t in meta.taints]
    if meta.unschedulable:
        taints.append({"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule", "timeAdded": _iso(state.now)})
    spec: dict[str, Any] = {"podCIDR": f"10.244.{state.node_index(name) % 250}.0/24",
                            "providerID": f"gpupool-sim://{name}"}
    if meta.unschedulable:
        spec["unschedulable"] = True
    if taints:
        spec["taints"] = taints
    gpus = str(rec["gpus"])
    capacity = {"cpu": "64", "memory": "527939988Ki", "nvidia.com/gpu": gpus, "pods": "110",
                "ephemeral-storage": "1919727340Ki", "hugepages-1Gi": "0", "hugepages-2Mi": "0"}
    allocatable = {**capacity, "cpu": "63500m", "memory": "526891412Ki"}
    created = _iso(rec["created"])
    ip = f"10.0.{state.node_index(name) // 250}.{state.node_index(name) % 250 + 1}"
    heartbeat = _iso(state.now)
    conditions = [
        {"type": t, "status": "False", "reason": r, "message": m, "lastHeartbeatTime": heartbeat,
         "lastTransitionTime": created}
        for t, r, m in (("MemoryPressure", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
                        ("DiskPressure", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                        ("PIDPressure", "KubeletHasSufficientPID", "kubelet has sufficient PID available"))
    ] + [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status",
          "lastHeartbeatTime": heartbeat, "lastTransitionTime": created}]
    return {
        "metadata": {
            "name": name, "uid": stable_uuid("k8s-node", name, created), "resourceVersion": str(meta.resource_version),
            "creationTimestamp": created, "labels": dict(meta.labels),
            "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                            "volumes.kubernetes.io/controller-managed-attach-detach": "true", **meta.annotations},
        },
        "spec": spec,
        "status": {
            "capacity": capacity, "allocatable": allocatable, "conditions": conditions,
            "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": stable_uuid("machine", name).replace("-", ""),
                "systemUUID": stable_uuid("system", name), "bootID": stable_uuid("boot", name, created),
                "kernelVersion": "5.15.0-113-generic", "osImage": "Ubuntu 22.04.4 LTS",
                "containerRuntimeVersion": "containerd://1.7.18", "kubeletVersion": VERSION["gitVersion"],
                "kubeProxyVersion": VERSION["gitVersion"], "operatingSystem": "linux", "architecture": "amd64",
            },
        },
    }


def pod_object(state: SimState, w: Work, n_nodes: int) -> dict:
    """The Pod of one GPU job (running on a node, or pending)."""
    created = _iso(w.start)
    gpu = {"nvidia.com/gpu": str(w.gpus), "cpu": "4", "memory": "32Gi"}
    spec = {
        "containers": [{"name": "main", "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                        "resources": {"requests": dict(gpu), "limits": dict(gpu)},
                        "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
                        "imagePullPolicy": "IfNotPresent"}],
        "restartPolicy": "Never", "schedulerName": "default-scheduler", "serviceAccountName": "default",
        "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst", "priority": 0,
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    }
    if w.state == "Running":
        spec["nodeName"] = w.node
        status = {
            "phase": "Running", "qosClass": "Guaranteed", "startTime": created,
            "hostIP": f"10.0.{state.node_index(w.node) // 250}.{state.node_index(w.node) % 250 + 1}",
            "podIP": f"10.244.{state.node_index(w.node) % 250}.{w.slot + 10}",
            "conditions": [{"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": created}
                           for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")],
            "containerStatuses": [{
                "name": "main", "ready": True, "restartCount": 0, "started": True,
                "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                "imageID": "nvcr.io/nvidia/pytorch@sha256:" + stable_uuid("img").replace("-", "") * 2,
                "containerID": "containerd://" + (stable_uuid("ctr", w.job_id).replace("-", "") * 2),
                "state": {"running": {"startedAt": created}},
            }],
        }
    else:
        status = {
            "phase": "Pending", "qosClass": "Guaranteed",
            "conditions": [{
                "type": "PodScheduled", "status": "False", "reason": "Unschedulable", "lastProbeTime": None,
                "lastTransitionTime": created,
                "message": f"0/{n_nodes} nodes are available: {n_nodes} Insufficient nvidia.com/gpu. preemption: "
                           f"0/{n_nodes} nodes are available: {n_nodes} No preemption victims found for incoming "
                           "pod.",
            }],
        }
    return {
        "metadata": {
            "name": w.name, "namespace": WORK_NAMESPACE, "uid": stable_uuid("pod", w.job_id),
            "resourceVersion": str(state.revision), "creationTimestamp": created,
            "labels": {"app.kubernetes.io/name": "gpu-job", "batch.kubernetes.io/job-name": w.name,
                       "gpupool.io/job-id": str(w.job_id)},
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": w.name,
                                 "uid": stable_uuid("job", w.job_id), "controller": True,
                                 "blockOwnerDeletion": True}],
        },
        "spec": spec,
        "status": status,
    }


# ---------------------------------------------------------------------- patching
def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (strategic merge behaves the same on the fields a Node lets us patch)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if k.startswith("$"):
            continue
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def _pointer(path: str) -> list[str]:
    if not path.startswith("/"):
        raise ApiError(400, "BadRequest", f"the server rejected our request due to an error in our request: "
                                          f"invalid JSON patch path {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def json_patch(doc: dict, ops: list) -> dict:
    """RFC 6902 JSON patch (add, replace, remove, test) over plain objects and lists."""
    doc = copy.deepcopy(doc)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise ApiError(400, "BadRequest", "the server rejected our request due to an error in our request")
        parts = _pointer(op["path"])
        parent = doc
        for p in parts[:-1]:
            parent = parent[int(p)] if isinstance(parent, list) else parent.setdefault(p, {})
        last = parts[-1]
        kind = op["op"]
        try:
            if kind in ("add", "replace"):
                if isinstance(parent, list):
                    if last == "-":
                        parent.append(op["value"])
                    elif kind == "add":
                        parent.insert(int(last), op["value"])
                    else:
                        parent[int(last)] = op["value"]
                else:
                    if kind == "replace" and last not in parent:
                        raise KeyError(last)
                    parent[last] = op["value"]
            elif kind == "remove":
                if isinstance(parent, list):
                    parent.pop(int(last))
                else:
                    del parent[last]
            elif kind == "test":
                cur = parent[int(last)] if isinstance(parent, list) else parent[last]
                if cur != op.get("value"):
                    raise ApiError(422, "Invalid", f"testing value {op['path']} failed")
            else:
                raise ApiError(400, "BadRequest", f"Unexpected kind: {kind}")
        except (KeyError, IndexError, ValueError) as exc:
            raise ApiError(422, "Invalid", f"the server rejected our request due to an error in our request: "
                                           f"doc is missing path: \"{op['path']}\": {exc}") from None
    return doc


def _validate_node(name: str, obj: dict) -> None:
    causes = []
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    for field in ("labels", "annotations"):
        val = meta.get(field)
        if val is not None and not isinstance(val, dict):
            raise ApiError(400, "BadRequest", f"json: cannot unmarshal into Go struct field ObjectMeta.metadata.{field}")
        for k, v in (val or {}).items():
            if not isinstance(v, str):
                raise ApiError(400, "BadRequest", f"json: cannot unmarshal {type(v).__name__} into Go struct field "
                                                  f"ObjectMeta.metadata.{field} of type string")
            if field == "labels" and (len(v) > 63 or not re.fullmatch(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?", v)):
                causes.append({"reason": "FieldValueInvalid", "field": f"metadata.labels", "message":
                               f'Invalid value: "{v}": a valid label must be an empty string or consist of '
                               "alphanumeric characters, '-', '_' or '.', and must start and end with an "
                               "alphanumeric character"})
    if "unschedulable" in spec and not isinstance(spec["unschedulable"], bool):
        raise ApiError(400, "BadRequest", "json: cannot unmarshal into Go struct field NodeSpec.spec.unschedulable "
                                          "of type bool")
    taints = spec.get("taints") or []
    if not isinstance(taints, list):
        raise ApiError(400, "BadRequest", "json: cannot unmarshal object into Go struct field NodeSpec.spec.taints "
                                          "of type []v1.Taint")
    for i, t in enumerate(taints):
        if not isinstance(t, dict):
            raise ApiError(400, "BadRequest", "json: cannot unmarshal into Go struct field NodeSpec.spec.taints")
        if t.get("effect") not in TAINT_EFFECTS:
            causes.append({"reason": "FieldValueNotSupported", "field": f"spec.taints[{i}].effect",
                           "message": f'Unsupported value: "{t.get("effect", "")}": supported values: '
                                      '"NoSchedule", "PreferNoSchedule", "NoExecute"'})
        if not t.get("key"):
            causes.append({"reason": "FieldValueRequired", "field": f"spec.taints[{i}].key",
                           "message": "Required value"})
    if causes:
        detail = ", ".join(f'{c["field"]}: {c["message"]}' for c in causes)
        raise ApiError(422, "Invalid", f'Node "{name}" is invalid: {detail}',
                       {"name": name, "kind": "Node", "causes": causes})


def apply_node(state: SimState, name: str, new: dict) -> None:
    """Carry a patched/replaced Node object into the world: labels, taints, cordon, MIG layout."""
    rec = state.node(ROLE, name)
    meta = rec["meta"]
    _validate_node(name, new)
    md, spec = new.get("metadata") or {}, new.get("spec") or {}
    labels = dict(md.get("labels") or {})
    annotations = {k: v for k, v in (md.get("annotations") or {}).items()
                   if k not in ("node.alpha.kubernetes.io/ttl", "volumes.kubernetes.io/controller-managed-attach-detach")}
    taints = [t for t in (spec.get("taints") or []) if t.get("key") != UNSCHEDULABLE_TAINT]
    for t in taints:
        if t.get("effect") == "NoExecute" and "timeAdded" not in t:
            t["timeAdded"] = _iso(state.now)
    blocking = [t for t in taints if t.get("effect") in ("NoSchedule", "NoExecute")]
    want_cordon = bool(spec.get("unschedulable")) or bool(blocking)
    old_mig = meta.labels.get(MIG_LABEL)
    new_mig = labels.get(MIG_LABEL)
    labels[MIG_STATE_LABEL] = meta.labels.get(MIG_STATE_LABEL, labels.get(MIG_STATE_LABEL, "success")) \
        if rec["mig_capable"] else labels.get(MIG_STATE_LABEL, "")
    if not rec["mig_capable"]:
        labels.pop(MIG_STATE_LABEL, None)
    meta.labels, meta.annotations, meta.taints = labels, annotations, taints
    meta.unschedulable = bool(spec.get("unschedulable"))
    reason = annotations.get(HOLD_ANNOTATION) or (
        f"kubernetes: taint {blocking[0]['key']}:{blocking[0]['effect']}" if blocking and not spec.get("unschedulable")
        else "kubernetes: cordoned")
    if want_cordon and (not rec["cordoned"] or reason != rec["drain_reason"]):
        state.cordon(ROLE, name, reason, via="kubernetes")
    elif not want_cordon and rec["cordoned"] and meta.cordon_via == "kubernetes":
        state.uncordon(ROLE, name)
    if any(t.get("effect") == "NoExecute" for t in blocking):
        for w in state.running(ROLE):
            if w.node == name:
                state.evict(ROLE, w.job_id)
    if new_mig != old_mig and new_mig is not None:
        if not rec["mig_capable"]:
            raise ApiError(422, "Invalid", f'Node "{name}" is invalid: metadata.labels[{MIG_LABEL}]: node '
                                           f"{name} ({rec['gpu_model']}) is not MIG-capable",
                           {"name": name, "kind": "Node"})
        change = state.request_mig(ROLE, name, new_mig)
        meta.labels[MIG_STATE_LABEL] = change.state
        if change.state == "failed":
            meta.annotations["nvidia.com/mig.config.state.message"] = change.message
    state._bump(name)  # noqa: SLF001 - the node object changed even when the world did not


# ---------------------------------------------------------------------- app
def make_app(state: SimState) -> Starlette:
    """The Kubernetes API server app over ``state``."""

    def respond(obj: Any, code: int = 200) -> JSONResponse:
        return JSONResponse(obj, status_code=code)

    def guarded(fn):
        async def handler(request: Request):
            try:
                with state.lock:
                    state.sync()
                    return await fn(request)
            except ApiError as exc:
                return respond(status_body(exc.code, exc.reason, exc.message, exc.details), exc.code)
            except SimNotFound as exc:
                return respond(status_body(404, "NotFound", f'"{exc}" not found'), 404)
            except SimConflict as exc:
                return respond(status_body(409, "Conflict", str(exc)), 409)
            except SimInvalid as exc:
                return respond(status_body(422, "Invalid", str(exc)), 422)
        return handler

    def node_or_404(name: str) -> dict:
        try:
            return state.node(ROLE, name)
        except SimNotFound:
            raise not_found("nodes", name) from None

    built: dict[str, tuple] = {}

    def once_per_state(kind: str, build) -> list[dict]:
        """``build()``, kept while the pool is the same (clock step and revision): a client
        listing ten thousand objects page by page must not have them all rebuilt per page."""
        key = (state.clock_i, state.revision)
        if kind not in built or built[kind][0] != key:
            built[kind] = (key, build())
        return built[kind][1]

    def all_pods() -> list[dict]:
        def build() -> list[dict]:
            n_nodes = len(state.nodes(ROLE))
            works = state.running(ROLE) + state.pending(ROLE)
            return [pod_object(state, w, n_nodes) for w in works]

        return once_per_state("pods", build)

    def pod_fields(p: dict) -> dict:
        return {"metadata.name": p["metadata"]["name"], "metadata.namespace": p["metadata"]["namespace"],
                "spec.nodeName": p["spec"].get("nodeName", ""), "status.phase": p["status"]["phase"],
                "spec.schedulerName": p["spec"]["schedulerName"]}

    def listing(kind: str, items: list[dict], request: Request, fields=None, field_names=()) -> dict:
        q = request.query_params
        match = parse_label_selector(q.get("labelSelector"))
        fmatch = parse_field_selector(q.get("fieldSelector"), field_names)
        items = [i for i in items if match(i["metadata"].get("labels") or {})
                 and fmatch(fields(i) if fields else {"metadata.name": i["metadata"]["name"]})]
        items.sort(key=_key)
        page, meta = paginate(items, q.get("limit"), q.get("continue"), str(state.revision))
        return {"kind": kind, "apiVersion": "v1", "metadata": meta, "items": page}

    # ---- discovery
    async def version(request):
        return respond(VERSION)

    async def api(request):
        host = request.url.netloc
        return respond({"kind": "APIVersions", "versions": ["v1"],
                        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": host}]})

    def resource(name, kind, namespaced, verbs, group_version=None, singular=""):
        return {"name": name, "singularName": singular, "namespaced": namespaced, "kind": kind, "verbs": verbs}

    async def api_v1(request):
        return respond({"kind": "APIResourceList", "groupVersion": "v1", "resources": [
            resource("namespaces", "Namespace", False, ["get", "list"], singular="namespace"),
            resource("nodes", "Node", False, ["get", "list", "patch", "update"], singular="node"),
            resource("pods", "Pod", True, ["get", "list"], singular="pod"),
            {**resource("pods/eviction", "Eviction", True, ["create"]), "group": "policy", "version": "v1"},
        ]})

    groups = {
        "metrics.k8s.io": "v1beta1", "custom.metrics.k8s.io": "v1beta2", "policy": "v1",
    }

    async def apis(request):
        return respond({"kind": "APIGroupList", "apiVersion": "v1", "groups": [
            {"name": g, "versions": [{"groupVersion": f"{g}/{v}", "version": v}],
             "preferredVersion": {"groupVersion": f"{g}/{v}", "version": v}} for g, v in groups.items()]})

    async def group_version(request):
        g, v = request.path_params["group"], request.path_params["version"]
        if groups.get(g) != v:
            return respond(status_body(404, "NotFound", "the server could not find the requested resource"), 404)
        if g == "metrics.k8s.io":
            res = [resource("nodes", "NodeMetrics", False, ["get", "list"]),
                   resource("pods", "PodMetrics", True, ["get", "list"])]
        elif g == "custom.metrics.k8s.io":
            res = [resource(f"{kind}/{m}", "MetricValueList", ns, ["get"])
                   for m in GPU_METRICS for kind, ns in (("nodes", False), ("pods", True))]
        else:
            res = [resource("poddisruptionbudgets", "PodDisruptionBudget", True, ["get", "list"])]
        return respond({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": f"{g}/{v}", "resources": res})

    # ---- namespaces
    @guarded
    async def namespaces(request):
        items = [{"metadata": {"name": ns, "uid": stable_uuid("ns", ns), "resourceVersion": "1",
                               "creationTimestamp": _iso(state.world.start),
                               "labels": {"kubernetes.io/metadata.name": ns}},
                  "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}} for ns in NAMESPACES]
        return respond(listing("NamespaceList", items, request))

    # ---- nodes
    @guarded
    async def list_nodes(request):
        items = once_per_state("nodes", lambda: [node_object(state, rec) for rec in state.nodes(ROLE)])
        return respond(listing("NodeList", items, request, field_names=("metadata.name",)))

    @guarded
    async def get_node(request):
        obj = node_object(state, node_or_404(request.path_params["name"]))
        return respond({"kind": "Node", "apiVersion": "v1", **obj})

    async def read_body(request: Request) -> Any:
        raw = await request.body()
        try:
            return json.loads(raw or b"null")
        except ValueError as exc:
            raise ApiError(400, "BadRequest", f"the server rejected our request due to an error in our request: "
                                              f"invalid character in JSON body ({exc.msg})") from None

    def check_rv(name: str, current: dict, wanted: Any) -> None:
        if wanted not in (None, "") and str(wanted) != current["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on nodes "{name}": the object has been '
                                            "modified; please apply your changes to the latest version and try again",
                           {"name": name, "kind": "nodes"})

    @guarded
    async def patch_node(request):
        name = request.path_params["name"]
        rec = node_or_404(name)
        current = node_object(state, rec)
        ctype = (request.headers.get("content-type") or "").split(";")[0].strip()
        body = await read_body(request)
        if ctype == "application/json-patch+json":
            if not isinstance(body, list):
                raise ApiError(400, "BadRequest", "json: cannot unmarshal object into Go value of type jsonpatch.Patch")
            new = json_patch(current, body)
        elif ctype in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            if not isinstance(body, dict):
                raise ApiError(400, "BadRequest", "the server rejected our request due to an error in our request")
            check_rv(name, current, (body.get("metadata") or {}).get("resourceVersion"))
            new = merge_patch(current, body)
        else:
            raise ApiError(415, "UnsupportedMediaType", f'the body of the request was in an unknown format - accepted '
                           f'media types include: application/json-patch+json, application/merge-patch+json, '
                           f'application/apply-patch+yaml')
        if (new.get("metadata") or {}).get("name", name) != name:
            raise ApiError(400, "BadRequest", f'the name of the object ({new["metadata"]["name"]}) does not match the '
                                              f'name on the URL ({name})')
        apply_node(state, name, new)
        return respond({"kind": "Node", "apiVersion": "v1", **node_object(state, state.node(ROLE, name))})

    @guarded
    async def replace_node(request):
        name = request.path_params["name"]
        current = node_object(state, node_or_404(name))
        body = await read_body(request)
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the server rejected our request due to an error in our request")
        md = body.get("metadata") or {}
        if md.get("name") != name:
            raise ApiError(400, "BadRequest", f'the name of the object ({md.get("name")}) does not match the name on '
                                              f"the URL ({name})")
        if not md.get("resourceVersion"):
            raise ApiError(422, "Invalid", f'Node "{name}" is invalid: metadata.resourceVersion: Invalid value: 0x0: '
                                           "must be specified for an update", {"name": name, "kind": "Node"})
        check_rv(name, current, md["resourceVersion"])
        apply_node(state, name, body)
        return respond({"kind": "Node", "apiVersion": "v1", **node_object(state, state.node(ROLE, name))})

    # ---- pods
    field_names = ("metadata.name", "metadata.namespace", "spec.nodeName", "status.phase", "spec.schedulerName")

    @guarded
    async def list_pods(request):
        ns = request.path_params.get("namespace")
        items = [p for p in all_pods() if ns is None or p["metadata"]["namespace"] == ns]
        return respond(listing("PodList", items, request, fields=pod_fields, field_names=field_names))

    def find_pod(ns: str, name: str) -> dict:
        for p in all_pods():
            if p["metadata"]["namespace"] == ns and p["metadata"]["name"] == name:
                return p
        raise not_found("pods", name)

    @guarded
    async def get_pod(request):
        p = find_pod(request.path_params["namespace"], request.path_params["name"])
        return respond({"kind": "Pod", "apiVersion": "v1", **p})

    @guarded
    async def evict(request):
        ns, name = request.path_params["namespace"], request.path_params["name"]
        body = await read_body(request)
        if not isinstance(body, dict) or body.get("kind") not in (None, "Eviction"):
            raise ApiError(400, "BadRequest", "the server rejected our request due to an error in our request")
        bname = (body.get("metadata") or {}).get("name")
        if bname and bname != name:
            raise ApiError(400, "BadRequest", f"name in URL does not match name in Eviction object")
        pod = find_pod(ns, name)
        if pod["status"]["phase"] == "Running":
            state.evict(ROLE, int(pod["metadata"]["labels"]["gpupool.io/job-id"]))
        # a pending pod is deleted and recreated at once by its Job: the demand stays
        return respond({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}, 201)

    # ---- metrics.k8s.io
    def gpu_now() -> dict[str, dict]:
        """Per node and per pod: GPU utilisation (percent) and framebuffer used (MiB) now."""
        c = state.clock_i
        e = state.exported(ROLE, max(0, c - 1), c)
        out_nodes, out_pods = {}, {}
        if e["platform"] is None or e["i1"] <= e["i0"]:
            return {"nodes": out_nodes, "pods": out_pods}
        running = {(w.node, w.slot): w for w in state.running(ROLE)}
        for rec in state.nodes(ROLE):
            j = state.node_index(rec["name"])
            util = e["util"][j, :rec["gpus"], -1]
            busy = np.array([(rec["name"], k) in running for k in range(rec["gpus"])])
            util = np.where(busy, util if e["reported"][-1] else 0.0, 0.0)
            mem_total = 81920.0 if "80" in rec["gpu_model"] else 40960.0
            mem = np.where(busy, mem_total * (0.3 + 0.6 * util / 100.0), 0.0)
            out_nodes[rec["name"]] = {"util": float(util.mean()) if len(util) else 0.0, "mem": float(mem.sum()),
                                      "busy": int(busy.sum())}
            for k in np.nonzero(busy)[0]:
                w = running[(rec["name"], int(k))]
                out_pods[w.name] = {"util": float(util[k]), "mem": float(mem[k]), "work": w}
        return {"nodes": out_nodes, "pods": out_pods}

    def node_metrics(name: str, g: dict) -> dict:
        busy = g["busy"]
        return {"metadata": {"name": name, "creationTimestamp": _iso(state.now),
                             "labels": dict(state.meta[name].labels)},
                "timestamp": _iso(state.now), "window": "20.05s",
                "usage": {"cpu": f"{250 + busy * 3500}m", "memory": f"{8 + busy * 24}Gi"}}

    def pod_metrics(name: str, g: dict) -> dict:
        return {"metadata": {"name": name, "namespace": WORK_NAMESPACE, "creationTimestamp": _iso(state.now),
                             "labels": {"app.kubernetes.io/name": "gpu-job"}},
                "timestamp": _iso(state.now), "window": "16.5s",
                "containers": [{"name": "main", "usage": {"cpu": "3500m", "memory": "24Gi"}}]}

    def mlist(kind: str, items: list[dict], group: str, version: str) -> dict:
        return {"kind": kind, "apiVersion": f"{group}/{version}", "metadata": {}, "items": items}

    @guarded
    async def nodes_metrics(request):
        g = gpu_now()["nodes"]
        return respond(mlist("NodeMetricsList", [node_metrics(n, v) for n, v in sorted(g.items())],
                             "metrics.k8s.io", "v1beta1"))

    @guarded
    async def node_metrics_one(request):
        name = request.path_params["name"]
        g = gpu_now()["nodes"]
        if name not in g:
            raise not_found("nodes", name, "metrics.k8s.io")
        return respond({"kind": "NodeMetrics", "apiVersion": "metrics.k8s.io/v1beta1", **node_metrics(name, g[name])})

    @guarded
    async def pods_metrics(request):
        ns = request.path_params.get("namespace")
        g = gpu_now()["pods"]
        items = [pod_metrics(n, v) for n, v in sorted(g.items()) if ns in (None, WORK_NAMESPACE)]
        return respond(mlist("PodMetricsList", items, "metrics.k8s.io", "v1beta1"))

    @guarded
    async def pod_metrics_one(request):
        ns, name = request.path_params["namespace"], request.path_params["name"]
        g = gpu_now()["pods"]
        if ns != WORK_NAMESPACE or name not in g:
            raise not_found("pods", name, "metrics.k8s.io")
        return respond({"kind": "PodMetrics", "apiVersion": "metrics.k8s.io/v1beta1", **pod_metrics(name, g[name])})

    # ---- custom.metrics.k8s.io
    def metric_value(kind: str, name: str, ns: str | None, metric: str, v: dict) -> dict:
        value = v["util"] if metric == "DCGM_FI_DEV_GPU_UTIL" else v["mem"]
        described = {"kind": kind, "name": name, "apiVersion": "/v1"}
        if ns:
            described["namespace"] = ns
        return {"describedObject": described, "metric": {"name": metric},
                "timestamp": _iso(state.now), "windowSeconds": 60, "value": f"{int(round(value * 1000))}m"}

    @guarded
    async def custom_metric(request):
        ns = request.path_params.get("namespace")
        kind, target, metric = (request.path_params["kind"], request.path_params["target"],
                                request.path_params["metric"])
        if kind not in ("nodes", "pods") or (kind == "nodes") == (ns is not None):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if metric not in GPU_METRICS:
            raise ApiError(404, "NotFound", f'the server could not find the metric {metric} for {kind}',
                           {"group": "custom.metrics.k8s.io", "kind": kind})
        g = gpu_now()
        objects = g["nodes"] if kind == "nodes" else (g["pods"] if ns == WORK_NAMESPACE else {})
        match = parse_label_selector(request.query_params.get("labelSelector"))
        if target == "*":
            names = [n for n in sorted(objects)
                     if match(state.meta[n].labels if kind == "nodes" else {"app.kubernetes.io/name": "gpu-job"})]
        elif target in objects:
            names = [target]
        else:
            raise ApiError(404, "NotFound", f'the server could not find the metric {metric} for {kind} {target}',
                           {"group": "custom.metrics.k8s.io", "kind": kind, "name": target})
        items = [metric_value("Node" if kind == "nodes" else "Pod", n, ns, metric, objects[n]) for n in names]
        return respond(mlist("MetricValueList", items, "custom.metrics.k8s.io", "v1beta2"))

    async def fallback(request, exc):
        return respond(status_body(404, "NotFound", "the server could not find the requested resource",
                                   {}), 404)

    async def method_not_allowed(request, exc):
        return respond(status_body(405, "MethodNotAllowed",
                                   f"the server does not allow this method on the requested resource"), 405)

    cm = "/apis/custom.metrics.k8s.io/v1beta2"
    routes = [
        Route("/version", version, methods=["GET"]),
        Route("/api", api, methods=["GET"]),
        Route("/api/v1", api_v1, methods=["GET"]),
        Route("/apis", apis, methods=["GET"]),
        Route("/api/v1/namespaces", namespaces, methods=["GET"]),
        Route("/api/v1/nodes", list_nodes, methods=["GET"]),
        Route("/api/v1/nodes/{name}", get_node, methods=["GET"]),
        Route("/api/v1/nodes/{name}", patch_node, methods=["PATCH"]),
        Route("/api/v1/nodes/{name}", replace_node, methods=["PUT"]),
        Route("/api/v1/pods", list_pods, methods=["GET"]),
        Route("/api/v1/namespaces/{namespace}/pods", list_pods, methods=["GET"]),
        Route("/api/v1/namespaces/{namespace}/pods/{name}", get_pod, methods=["GET"]),
        Route("/api/v1/namespaces/{namespace}/pods/{name}/eviction", evict, methods=["POST"]),
        Route("/apis/metrics.k8s.io/v1beta1/nodes", nodes_metrics, methods=["GET"]),
        Route("/apis/metrics.k8s.io/v1beta1/nodes/{name}", node_metrics_one, methods=["GET"]),
        Route("/apis/metrics.k8s.io/v1beta1/pods", pods_metrics, methods=["GET"]),
        Route("/apis/metrics.k8s.io/v1beta1/namespaces/{namespace}/pods", pods_metrics, methods=["GET"]),
        Route("/apis/metrics.k8s.io/v1beta1/namespaces/{namespace}/pods/{name}", pod_metrics_one, methods=["GET"]),
        Route(cm + "/{kind}/{target}/{metric}", custom_metric, methods=["GET"]),
        Route(cm + "/namespaces/{namespace}/{kind}/{target}/{metric}", custom_metric, methods=["GET"]),
        Route("/apis/{group}/{version}", group_version, methods=["GET"]),
    ]
    return Starlette(routes=routes, exception_handlers={404: fallback, 405: method_not_allowed})
