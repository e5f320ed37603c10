"""The objects of the Kubernetes API server subset (:mod:`gpupool.emulator.kubernetes`): Status
errors, label and field selectors, list pagination, the Node and Pod objects of the simulated
platform, JSON merge and JSON patches and how a patched Node acts on the world, and the
``metrics.k8s.io`` / ``custom.metrics.k8s.io`` answers. The app's routes live in ``kubernetes``.
"""

from __future__ import annotations

import base64
import copy
import json
import re
from typing import Any

import numpy as np
import pandas as pd

from gpupool import mig as mig_table
from gpupool.emulator.state import MIG_LABEL, MIG_STATE_LABEL, WORK_NAMESPACE, SimState, Work, stable_uuid
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
    """The 404 the API server answers for a missing object."""
    details = {"name": name, "kind": kind}
    if group:
        details["group"] = group
    return ApiError(404, "NotFound", f'{kind}{"." + group if group else ""} "{name}" not found', details)


def iso_time(ts: pd.Timestamp | None) -> str:
    """An instant as the API server writes it (seconds, ``Z``)."""
    return pd.Timestamp(ts).strftime("%Y-%m-%dT%H:%M:%SZ")


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
        keys = [object_key(i) for i in items]
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
        token = {"v": "meta.k8s.io/v1", "rv": int(rv), "start": object_key(page[-1])}
        meta["continue"] = base64.urlsafe_b64encode(json.dumps(token).encode()).decode().rstrip("=")
        meta["remainingItemCount"] = len(items) - start - n
    return page, meta


def object_key(item: dict) -> str:
    """The order the API server lists objects in: namespace, then name."""
    md = item["metadata"]
    return f'{md.get("namespace", "")}/{md["name"]}'


# ---------------------------------------------------------------------- objects
def node_object(state: SimState, rec: dict) -> dict:
    """The Node object of a pool node held by the Kubernetes platform."""
    meta = rec["meta"]
    name = rec["name"]
    taints = [dict(t) for t in meta.taints]
    if meta.unschedulable:
        taints.append({"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule", "timeAdded": iso_time(state.now)})
    spec: dict[str, Any] = {"podCIDR": f"10.244.{state.node_index(name) % 250}.0/24",
                            "providerID": f"gpupool-sim://{name}"}
    if meta.unschedulable:
        spec["unschedulable"] = True
    if taints:
        spec["taints"] = taints
    gpus = str(rec["gpus"])
    capacity = {"cpu": "64", "memory": "527939988Ki", "nvidia.com/gpu": gpus, "pods": "110",
                "ephemeral-storage": "1919727340Ki", "hugepages-1Gi": "0", "hugepages-2Mi": "0"}
    profile = mig_table.layout_profile(rec.get("mig_layout"))
    if profile in mig_table.SLICES_PER_GPU:  # the device plugin's mixed strategy: one resource per profile
        capacity["nvidia.com/gpu"] = "0"
        capacity[mig_table.RESOURCE_PREFIX + profile] = str(rec["gpus"] * mig_table.SLICES_PER_GPU[profile])
    allocatable = {**capacity, "cpu": "63500m", "memory": "526891412Ki"}
    created = iso_time(rec["created"])
    ip = f"10.0.{state.node_index(name) // 250}.{state.node_index(name) % 250 + 1}"
    heartbeat = iso_time(state.now)
    conditions = [
        {"type": t, "status": "False", "reason": r, "message": m, "lastHeartbeatTime": heartbeat,
         "lastTransitionTime": created}
        for t, r, m in (("MemoryPressure", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
                        ("DiskPressure", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                        ("PIDPressure", "KubeletHasSufficientPID", "kubelet has sufficient PID available"))
    ] + [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status",
          "lastHeartbeatTime": heartbeat, "lastTransitionTime": created} if rec.get("powered", True) else
         {"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
          "message": "Kubelet stopped posting node status.", "lastHeartbeatTime": heartbeat,
          "lastTransitionTime": heartbeat}]
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
    created = iso_time(w.start)
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
            t["timeAdded"] = iso_time(state.now)
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


# ---------------------------------------------------------------------- metrics
def gpu_now(state: SimState) -> dict[str, dict]:
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

def node_metrics(state: SimState, name: str, g: dict) -> dict:
    """The NodeMetrics (metrics.k8s.io) of node ``name`` from its entry in :func:`gpu_now`."""
    busy = g["busy"]
    return {"metadata": {"name": name, "creationTimestamp": iso_time(state.now),
                         "labels": dict(state.meta[name].labels)},
            "timestamp": iso_time(state.now), "window": "20.05s",
            "usage": {"cpu": f"{250 + busy * 3500}m", "memory": f"{8 + busy * 24}Gi"}}

def pod_metrics(state: SimState, name: str, g: dict) -> dict:
    """The PodMetrics (metrics.k8s.io) of pod ``name``."""
    return {"metadata": {"name": name, "namespace": WORK_NAMESPACE, "creationTimestamp": iso_time(state.now),
                         "labels": {"app.kubernetes.io/name": "gpu-job"}},
            "timestamp": iso_time(state.now), "window": "16.5s",
            "containers": [{"name": "main", "usage": {"cpu": "3500m", "memory": "24Gi"}}]}


def metric_value(state: SimState, kind: str, name: str, ns: str | None, metric: str, v: dict) -> dict:
    """One MetricValue (custom.metrics.k8s.io) of a node or pod from its entry in :func:`gpu_now`."""
    value = v["util"] if metric == "DCGM_FI_DEV_GPU_UTIL" else v["mem"]
    described = {"kind": kind, "name": name, "apiVersion": "/v1"}
    if ns:
        described["namespace"] = ns
    return {"describedObject": described, "metric": {"name": metric},
            "timestamp": iso_time(state.now), "windowSeconds": 60, "value": f"{int(round(value * 1000))}m"}
