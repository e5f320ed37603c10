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
  ``DCGM_FI_DEV_GPU_UTIL`` / ``DCGM_FI_DEV_FB_USED`` per node and pod;
* ``/apis/kueue.x-k8s.io/v1beta1`` ClusterQueues and ResourceFlavors, stored as created
  (:mod:`gpupool.emulator.kubernetes_kueue`): what gpupool's queue quota reads and replaces.

What actions do to the world: ``spec.unschedulable: true`` or a NoSchedule/NoExecute taint
cordons the node (running pods continue and finish; NoExecute evicts them); setting the
``nvidia.com/mig.config`` label starts a MIG change that needs an empty node (the mig-manager's
``nvidia.com/mig.config.state`` label says ``pending``, ``success`` or ``failed``). The drain reason
recorded in the world is gpupool's hold annotation (``gpupool.k8s_keys.HOLD_ANNOTATION``) when present.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from gpupool.emulator.kubernetes_objects import (
    GPU_METRICS,
    NAMESPACES,
    ROLE,
    VERSION,
    ApiError,
    apply_node,
    gpu_now,
    iso_time,
    json_patch,
    merge_patch,
    metric_value,
    node_metrics,
    node_object,
    not_found,
    object_key,
    paginate,
    parse_field_selector,
    parse_label_selector,
    pod_metrics,
    pod_object,
    status_body,
)
from gpupool.emulator.kubernetes_kueue import GROUP as KUEUE_GROUP
from gpupool.emulator.kubernetes_kueue import VERSION as KUEUE_VERSION
from gpupool.emulator.kubernetes_kueue import KueueStore
from gpupool.emulator.state import WORK_NAMESPACE, SimConflict, SimInvalid, SimNotFound, SimState, stable_uuid


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
        items.sort(key=object_key)
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
        "metrics.k8s.io": "v1beta1", "custom.metrics.k8s.io": "v1beta2", "policy": "v1", KUEUE_GROUP: KUEUE_VERSION,
    }
    kueue = KueueStore(lambda: iso_time(state.now))

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
        elif g == KUEUE_GROUP:
            return respond(kueue.discovery())
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
                               "creationTimestamp": iso_time(state.world.start),
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
    def mlist(kind: str, items: list[dict], group: str, version: str) -> dict:
        return {"kind": kind, "apiVersion": f"{group}/{version}", "metadata": {}, "items": items}

    @guarded
    async def nodes_metrics(request):
        g = gpu_now(state)["nodes"]
        return respond(mlist("NodeMetricsList", [node_metrics(state, n, v) for n, v in sorted(g.items())],
                             "metrics.k8s.io", "v1beta1"))

    @guarded
    async def node_metrics_one(request):
        name = request.path_params["name"]
        g = gpu_now(state)["nodes"]
        if name not in g:
            raise not_found("nodes", name, "metrics.k8s.io")
        return respond({"kind": "NodeMetrics", "apiVersion": "metrics.k8s.io/v1beta1", **node_metrics(state, name, g[name])})

    @guarded
    async def pods_metrics(request):
        ns = request.path_params.get("namespace")
        g = gpu_now(state)["pods"]
        items = [pod_metrics(state, n, v) for n, v in sorted(g.items()) if ns in (None, WORK_NAMESPACE)]
        return respond(mlist("PodMetricsList", items, "metrics.k8s.io", "v1beta1"))

    @guarded
    async def pod_metrics_one(request):
        ns, name = request.path_params["namespace"], request.path_params["name"]
        g = gpu_now(state)["pods"]
        if ns != WORK_NAMESPACE or name not in g:
            raise not_found("pods", name, "metrics.k8s.io")
        return respond({"kind": "PodMetrics", "apiVersion": "metrics.k8s.io/v1beta1", **pod_metrics(state, name, g[name])})

    # ---- custom.metrics.k8s.io
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
        g = gpu_now(state)
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
        items = [metric_value(state, "Node" if kind == "nodes" else "Pod", n, ns, metric, objects[n]) for n in names]
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
        *kueue.routes(read_body),
        Route("/apis/{group}/{version}", group_version, methods=["GET"]),
    ]
    return Starlette(routes=routes, exception_handlers={404: fallback, 405: method_not_allowed})
