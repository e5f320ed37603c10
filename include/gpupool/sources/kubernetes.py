"""Kubernetes: GPU nodes and pods from the API server, usage from the metrics APIs and Prometheus.

Inventory comes from nodes (`nvidia.com/gpu` and `nvidia.com/mig-*` allocatable, GPU
product label, cordon and taints) and pods (GPU requests of pods bound to each node),
both listed page by page with `limit`/`continue`. `usage` for a window reads two things:

* the present, when the window holds it: nodes and pods (capacity, allocated, pending GPUs),
  the resource metrics API (`metrics.k8s.io`: which nodes metrics-server reads, each item's
  `timestamp` and `window`) and the custom metrics API (`custom.metrics.k8s.io`: GPU
  utilisation and framebuffer per node from the DCGM exporter through an adapter). The
  metrics APIs keep no history, so this reading stands for the window's last step when the
  APIs' own clock (the newest item `timestamp`) is inside the window or at most
  `live_tolerance` after it; each node also gets a health series (`health_up`,
  `health_sample_age_seconds`, `health_sample_window_seconds`) saying how its reading was made;
* history, from kube-state-metrics and DCGM exporter series in Prometheus when one is
  configured. Where both have a point, Prometheus's wins.

A window neither can cover raises (unrecoverable) instead of returning an empty frame.
`snapshot(at)` records what the API shows now, with GPU utilisation per pod.

Least privilege for the reading identity (the actuator needs `patch` on nodes separately):

    apiVersion: rbac.authorization.k8s.io/v1
    kind: ClusterRole
    metadata: {name: gpupool-reader}
    rules:
    - apiGroups: [""]
      resources: [nodes, pods]
      verbs: [list]
    - apiGroups: [metrics.k8s.io]
      resources: [nodes]
      verbs: [list]
    - apiGroups: [custom.metrics.k8s.io]
      resources: ["pods/*", "nodes/*"]   # <kind>/<metric>: a wildcard name is authorised as list
      verbs: [get, list]
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any, Callable, Iterator, Mapping, Sequence

import pandas as pd
import urllib3
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from gpupool import mig
from gpupool.canonical import SERIES_KEY, empty_samples, normalize_samples
from gpupool.k8s_keys import HOLD_ANNOTATION
from gpupool.sources.base import (
    NodeShard,
    PermanentError,
    Pressure,
    RetryPolicy,
    SourceError,
    TransientError,
    as_utc,
    call_with_retry,
    format_window,
    inventory_record,
    pressure_from_records,
    redact_url,
)
from gpupool.sources.prometheus import DEFAULT_CHUNK_POINTS, MetricQuery, PrometheusReader

_GPU_REQ = 'kube_pod_container_resource_requests{resource="nvidia_com_gpu"}'

#: PromQL per canonical metric for kube-state-metrics + the DCGM exporter (in-cluster
#: labels `Hostname`, `gpu`). Pending GPUs count only pods the scheduler could not place.
DEFAULT_K8S_QUERIES: dict[str, MetricQuery] = {
    "gpu_capacity": MetricQuery(
        'sum by (node) (kube_node_status_allocatable{resource="nvidia_com_gpu"})', "node", "{node}", node_label="node"
    ),
    "gpu_allocated": MetricQuery(
        f'sum by (node) ({_GPU_REQ} * on (namespace, pod) group_left () (kube_pod_status_phase{{phase="Running"}} == 1))',
        "node", "{node}",
    ),
    "gpu_pending": MetricQuery(
        f"sum({_GPU_REQ} * on (namespace, pod) group_left () (kube_pod_status_unschedulable == 1))", "platform", ""
    ),
    # (gpu_allocated is not read per shard: kube_pod_status_phase carries no node label)
    "gpu_util": MetricQuery("max by (Hostname, gpu) (DCGM_FI_DEV_GPU_UTIL)", "gpu", "{Hostname}/{gpu}",
                            node_label="Hostname"),
    "gpu_mem_used": MetricQuery("max by (Hostname, gpu) (DCGM_FI_DEV_FB_USED) * 1048576", "gpu", "{Hostname}/{gpu}",
                                node_label="Hostname"),
}
#: canonical metric -> (custom metrics API metric per node, unit, factor to the canonical unit);
#: the DCGM exporter reports framebuffer in MiB
DEFAULT_NODE_METRICS: dict[str, tuple[str, str, float]] = {
    "gpu_util": ("DCGM_FI_DEV_GPU_UTIL", "percent", 1.0),
    "gpu_mem_used": ("DCGM_FI_DEV_FB_USED", "bytes", 1048576.0),
}
RESOURCE_METRICS = "/apis/metrics.k8s.io/v1beta1"
CUSTOM_METRICS = "/apis/custom.metrics.k8s.io/v1beta2"


class KubernetesSource:
    """A Kubernetes cluster read with the official client and explicit connection parameters.

    Connection: `host` + `token` (+ `ca_cert`, `verify`), or `kubeconfig` (+ `context`),
    or `in_cluster=True`, or a ready `api_client`. Nothing is read from the environment
    unless asked for by one of these.

    gpu_resource: extended resource of whole GPUs; mig_prefix: prefix of MIG slice resources
    model_label: node label naming the GPU model (GPU feature discovery)
    count_label: node label with the physical GPU count (used when only MIG slices are allocatable)
    page_size: `limit` of every list call
    custom_metric: custom metrics API metric with per-pod GPU utilisation (None: skip)
    node_metrics: canonical metric -> (custom metrics API metric per node, unit, factor); {} skips
    metrics_api: read the present from the metrics APIs in `usage` (False: Prometheus only)
    live_tolerance: how long after a window's end the APIs' present still stands for its last step
    prometheus_*: where past windows are read; queries: canonical metric -> MetricQuery
    """

    def __init__(
        self,
        platform: str,
        *,
        host: str | None = None,
        token: str | None = None,
        ca_cert: str | None = None,
        verify: bool = True,
        kubeconfig: str | None = None,
        context: str | None = None,
        in_cluster: bool = False,
        api_client: k8s.ApiClient | None = None,
        cluster: str = "",
        gpu_resource: str = "nvidia.com/gpu",
        mig_prefix: str = mig.RESOURCE_PREFIX,
        model_label: str = "nvidia.com/gpu.product",
        count_label: str = "nvidia.com/gpu.count",
        page_size: int = 500,
        custom_metric: str | None = "DCGM_FI_DEV_GPU_UTIL",
        node_metrics: Mapping[str, tuple[str, str, float]] | None = None,
        metrics_api: bool = True,
        live_tolerance: timedelta = timedelta(minutes=15),
        prometheus_url: str | None = None,
        prometheus_token: str | None = None,
        queries: Mapping[str, MetricQuery | Sequence[MetricQuery]] | None = None,
        timeout: float = 30.0,
        retry: RetryPolicy = RetryPolicy(),
        chunk_points: int = DEFAULT_CHUNK_POINTS,
    ):
        self.platform = platform
        self.cluster = cluster
        self.gpu_resource = gpu_resource
        self.mig_prefix = mig_prefix
        self.model_label = model_label
        self.count_label = count_label
        self.page_size = page_size
        self.custom_metric = custom_metric
        self.node_metrics = dict(DEFAULT_NODE_METRICS if node_metrics is None else node_metrics)
        self.metrics_api = metrics_api
        self.live_tolerance = live_tolerance
        self.timeout = timeout
        self.retry = retry
        self.queries = dict(DEFAULT_K8S_QUERIES if queries is None else queries)
        if api_client is None:
            cfg = k8s.Configuration()
            if host:
                cfg.host = host
                if token:
                    cfg.api_key = {"authorization": token}
                    cfg.api_key_prefix = {"authorization": "Bearer"}
                cfg.ssl_ca_cert = ca_cert
                cfg.verify_ssl = verify
            elif kubeconfig:
                k8s_config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=cfg)
            elif in_cluster:
                k8s_config.load_incluster_config(client_configuration=cfg)
            else:
                raise ValueError(f"{platform}: pass host (+token), kubeconfig, in_cluster=True or api_client")
            cfg.retries = False  # our retry policy decides, not urllib3's
            api_client = k8s.ApiClient(cfg)
        self._api = api_client
        self._core = k8s.CoreV1Api(api_client)
        self.host = redact_url(api_client.configuration.host)
        self._prom = (
            PrometheusReader(prometheus_url, platform=platform, bearer_token=prometheus_token, timeout=timeout,
                             retry=retry, chunk_points=chunk_points)
            if prometheus_url else None
        )

    # ------------------------------------------------------------ plumbing
    def _call(self, what: str, window: str, fn: Callable[[], Any]) -> Any:
        endpoint = f"{self.host} {what}"

        def describe(exc: BaseException) -> SourceError:
            return SourceError(self.platform, endpoint, window, str(exc))

        return call_with_retry(lambda: _classified(fn, self.timeout), policy=self.retry, describe=describe)

    def _list_all(self, lister: Callable[..., Any], what: str, window: str) -> Iterator[Any]:
        """Every item of a list call, page by page (`limit`/`continue`)."""
        token = None
        seen_tokens = set()
        while True:
            kwargs = {"limit": self.page_size, "_request_timeout": self.timeout}
            if token:
                kwargs["_continue"] = token
            page = self._call(what, window, lambda: lister(**kwargs))
            try:
                items, token = page.items, page.metadata._continue
            except AttributeError as exc:
                raise SourceError(self.platform, f"{self.host} {what}", window, "malformed payload") from exc
            yield from items or []
            if not token:
                return
            if token in seen_tokens:
                raise SourceError(self.platform, f"{self.host} {what}", window, "the server repeats a continue token")
            seen_tokens.add(token)

    # ------------------------------------------------------------ inventory
    def inventory(self, at: datetime) -> list[dict[str, Any]]:
        """GPU nodes as the API server shows them when called (`at` names the snapshot)."""
        return self._listing(format_window(as_utc(at, "at")))[0]

    def _listing(self, window: str) -> tuple[list[dict[str, Any]], list[Any]]:
        """The inventory records and the pods they were counted from (one listing of each)."""
        nodes = list(self._list_all(self._core.list_node, "GET /api/v1/nodes", window))
        pods = list(self._list_all(self._core.list_pod_for_all_namespaces, "GET /api/v1/pods", window))
        busy: dict[str, float] = {}
        for pod in pods:
            node = pod.spec.node_name if pod.spec else None
            phase = pod.status.phase if pod.status else None
            if node and phase not in ("Succeeded", "Failed"):
                busy[node] = busy.get(node, 0) + self._pod_gpus(pod)
        return sorted(self._node_records(nodes, busy, window), key=lambda r: r["node"]), pods

    def _node_records(self, nodes, busy: dict[str, float], window) -> list[dict]:
        """One record per GPU node (``_node_record``), with the GPUs its pods hold; a malformed
        node object is an error naming the platform and the endpoint."""
        out = []
        for node in nodes:
            try:
                rec = self._node_record(node, busy.get(node.metadata.name, 0))
            except (AttributeError, TypeError, ValueError) as exc:
                raise SourceError(self.platform, f"{self.host} GET /api/v1/nodes", window,
                                  f"malformed node object ({type(exc).__name__})") from exc
            if rec:
                out.append(rec)
        return out

    def _node_record(self, node: Any, busy: float) -> dict[str, Any] | None:
        alloc = (node.status.allocatable if node.status else None) or {}
        labels = node.metadata.labels or {}
        whole = _quantity(alloc.get(self.gpu_resource, "0"))
        slices = {k[len(self.mig_prefix):]: int(_quantity(v)) for k, v in alloc.items()
                  if k.startswith(self.mig_prefix) and _quantity(v) > 0}
        gpus = int(whole)
        if slices and self.count_label in labels:
            gpus = int(labels[self.count_label])
        if gpus == 0 and not slices:
            return None
        reason = None
        if node.spec and node.spec.unschedulable:
            reason = (node.metadata.annotations or {}).get(HOLD_ANNOTATION) or "cordoned"
        else:
            for taint in (node.spec.taints if node.spec else None) or []:
                if taint.effect in ("NoSchedule", "NoExecute"):
                    reason = f"taint {taint.key}={taint.value or ''}:{taint.effect}"
                    break
        if reason is None:
            ready = next((c for c in (node.status.conditions or []) if c.type == "Ready"), None) if node.status else None
            if ready is not None and ready.status != "True":
                reason = f"not ready ({ready.reason or ready.status})"
        return inventory_record(
            node=node.metadata.name,
            platform=self.platform,
            gpus=gpus,
            gpu_model=labels.get(self.model_label),
            mig_layout=slices or None,
            schedulable=reason is None,
            drain_reason=reason,
            busy_gpus=min(int(busy), gpus) if gpus else int(busy),
        )

    def pressure(self, at: datetime) -> Pressure:
        """Pressure now from one listing of nodes and one of pods: allocated = GPUs requested
        by pods bound to an open node and not finished, pending = GPUs requested by Pending
        pods no node was given yet, capacity = allocatable GPUs of open nodes (not cordoned,
        tainted NoSchedule/NoExecute or NotReady); idle = open nodes with no GPU pod."""
        at = as_utc(at, "at")
        window = format_window(at)
        nodes = list(self._list_all(self._core.list_node, "GET /api/v1/nodes", window))
        pods = list(self._list_all(self._core.list_pod_for_all_namespaces, "GET /api/v1/pods", window))
        busy: dict[str, float] = {}
        pending = 0.0
        for pod in pods:
            node = pod.spec.node_name if pod.spec else None
            phase = pod.status.phase if pod.status else None
            if phase in ("Succeeded", "Failed"):
                continue
            if node:
                busy[node] = busy.get(node, 0) + self._pod_gpus(pod)
            elif phase == "Pending":
                pending += self._pod_gpus(pod)
        records = self._node_records(nodes, busy, window)
        prov = {"nodes": f"{self.host} GET /api/v1/nodes",
                "gpus_allocated": f"{self.host} GET /api/v1/pods ({self.gpu_resource} of bound pods)",
                "gpus_pending": f"{self.host} GET /api/v1/pods ({self.gpu_resource} of unbound Pending pods)",
                "gpus_capacity": f"{self.host} GET /api/v1/nodes (allocatable {self.gpu_resource} of open nodes)"}
        return pressure_from_records(self.platform, at, records, pending=pending, provenance=prov)

    def _pod_gpus(self, pod: Any) -> float:
        """GPUs a pod holds or wants: max(sum over containers, largest init container)."""
        def req(container: Any) -> float:
            res = container.resources
            if res is None:
                return 0.0
            value = (res.requests or {}).get(self.gpu_resource) or (res.limits or {}).get(self.gpu_resource)
            return _quantity(value or "0")

        spec = pod.spec
        if spec is None:
            return 0.0
        main = sum(req(c) for c in spec.containers or [])
        init = max((req(c) for c in spec.init_containers or []), default=0.0)
        return max(main, init)

    @staticmethod
    def _unschedulable(pod: Any) -> bool:
        if not pod.status or pod.status.phase != "Pending":
            return False
        return any(c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
                   for c in pod.status.conditions or [])

    # ------------------------------------------------------------- snapshot
    def snapshot(self, at: datetime) -> pd.DataFrame:
        """What the API shows now, stamped `at`: capacity/allocated per node, pending GPUs of
        unschedulable pods for the platform, and GPU utilisation per pod (custom metrics API).
        """
        at = as_utc(at, "at")
        window = format_window(at)
        rows = self._scheduler_rows(window)
        if self.custom_metric:
            path = f"{CUSTOM_METRICS}/namespaces/*/pods/*/{self.custom_metric}"
            for item in self._metric_values(path, window) or []:
                rows.append(("pod", item["id"], "gpu_util", item["value"], "percent"))
        return self._frame(rows, at, f"{self.platform} kubernetes snapshot [{window}]")

    def _scheduler_rows(self, window: str) -> list[tuple]:
        """(kind, entity, metric, value, unit): GPUs per node and the platform's unschedulable
        GPUs, from one listing of nodes and one of pods."""
        records, pods = self._listing(window)
        pending = sum(self._pod_gpus(p) for p in pods if self._unschedulable(p))
        rows = []
        for r in records:
            rows.append(("node", r["node"], "gpu_capacity", float(r["gpus"]), "gpus"))
            rows.append(("node", r["node"], "gpu_allocated", float(r["busy_gpus"]), "gpus"))
        rows.append(("platform", "", "gpu_pending", float(pending), "gpus"))
        return rows

    def _frame(self, rows: list[tuple], ts, where: str) -> pd.DataFrame:
        frame = pd.DataFrame(
            [(self.platform, self.cluster, k, e, m, ts, v, u) for k, e, m, v, u in rows],
            columns=["platform", "cluster", "entity_kind", "entity_id", "metric", "ts", "value", "unit"],
        )
        return normalize_samples(frame, where=where)

    # ------------------------------------------------------- metrics APIs
    def _get(self, path: str, window: str) -> Any:
        """One GET of an aggregated API's path as JSON; None when the cluster does not serve
        it (404: metrics-server or the adapter is not installed)."""
        def get() -> Any:
            # The generated client has no method for the metrics APIs: build the request the
            # way its generated methods do (auth header, timeout, JSON decode).
            params = self._api.param_serialize("GET", path, header_params={"Accept": "application/json"},
                                               auth_settings=["BearerToken"])
            try:
                resp = self._api.call_api(*params, _request_timeout=self.timeout)
                resp.read()
                return self._api.response_deserialize(resp, {"200": "object"}).data
            except ApiException as exc:
                if exc.status == 404:
                    return None
                raise

        return self._call(f"GET {path}", window, get)

    def _metric_values(self, path: str, window: str) -> list[dict] | None:
        """The items of a custom metrics `MetricValueList` (v1beta1 or v1beta2) as
        `{id, value, ts, window_s}`; `id` is `namespace/name` for namespaced objects."""
        payload = self._get(path, window)
        if payload is None:
            return None
        out = []
        try:
            for item in payload["items"]:
                ref = item["describedObject"]
                ident = f"{ref['namespace']}/{ref['name']}" if ref.get("namespace") else ref["name"]
                out.append({"id": ident, "value": float(_quantity(item["value"])),
                            "ts": _api_time(item["timestamp"]), "window_s": item.get("windowSeconds")})
        except (KeyError, TypeError, ValueError) as exc:
            raise SourceError(self.platform, f"{self.host} GET {path}", window,
                              f"malformed payload ({type(exc).__name__})") from exc
        return out

    def _node_usage(self, window: str) -> list[dict] | None:
        """metrics.k8s.io NodeMetrics as `{id, ts, window_s}`: the nodes metrics-server read."""
        path = f"{RESOURCE_METRICS}/nodes"
        payload = self._get(path, window)
        if payload is None:
            return None
        try:
            return [{"id": item["metadata"]["name"], "ts": _api_time(item["timestamp"]),
                     "window_s": _duration_seconds(item["window"])} for item in payload["items"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise SourceError(self.platform, f"{self.host} GET {path}", window,
                              f"malformed payload ({type(exc).__name__})") from exc

    def present_usage(self, start: datetime, end: datetime, step: str = "5min") -> pd.DataFrame | None:
        """The window's last step read from the present (nodes, pods and both metrics APIs),
        with a health series per GPU node; None when the metrics APIs are not served or their
        clock is not inside `[start, end + live_tolerance)`.

        health_up: 1 when every metrics API answered for the node, else 0;
        health_sample_age_seconds: how far the node's oldest item `timestamp` lags the
        newest of the answers (a frozen kubelet or exporter falls behind the others);
        health_sample_window_seconds: the resource metrics API's `window` for the node.
        """
        start, end = as_utc(start, "start"), as_utc(end, "end")
        window = format_window(start, end)
        nodes = self._node_usage(window)
        if nodes is None:
            return None
        custom = {}
        for metric, (name, unit, factor) in self.node_metrics.items():
            items = self._metric_values(f"{CUSTOM_METRICS}/nodes/*/{name}", window)
            if items is not None:
                custom[metric] = ({i["id"]: i for i in items}, unit, factor)
        stamps = [i["ts"] for i in nodes] + [i["ts"] for by, _, _ in custom.values() for i in by.values()]
        if not stamps:
            return None
        now = max(stamps)
        if not start <= now < end + self.live_tolerance:
            return None
        last = (pd.Timestamp(end) - pd.Timedelta(microseconds=1)).floor(step)
        ts = max(min(pd.Timestamp(now).floor(step), last), pd.Timestamp(start))
        rows = self._scheduler_rows(window)
        seen = {i["id"]: i for i in nodes}
        for node in [r[1] for r in rows if r[0] == "node" and r[2] == "gpu_capacity"]:
            read = [seen.get(node)] + [by.get(node) for by, _, _ in custom.values()]
            for metric, (by, unit, factor) in custom.items():
                if node in by:
                    rows.append(("node", node, metric, by[node]["value"] * factor, unit))
            got = [i for i in read if i is not None]
            rows.append(("node", node, "health_up", float(len(got) == len(read)), "bool"))
            if got:
                rows.append(("node", node, "health_sample_age_seconds",
                             (now - min(i["ts"] for i in got)).total_seconds(), "seconds"))
            if node in seen and seen[node]["window_s"] is not None:
                rows.append(("node", node, "health_sample_window_seconds", float(seen[node]["window_s"]), "seconds"))
        return self._frame(rows, ts, f"{self.platform} kubernetes metrics APIs [{window}]")

    # ---------------------------------------------------------------- usage
    def usage(self, start: datetime, end: datetime, step: str = "5min", shard: NodeShard | None = None) -> pd.DataFrame:
        """Canonical samples for `[start, end)`: Prometheus's history and the present from the
        metrics APIs where the window holds it (see `present_usage`); Prometheus wins a shared
        point. With `shard`, one part of both (see `PrometheusReader.read`).

        A window neither can cover raises (unrecoverable) instead of returning an empty frame.
        """
        window = format_window(start, end)
        present = self.present_usage(start, end, step) if self.metrics_api else None
        if present is not None and shard is not None:
            # a part takes the present's rows of its nodes; the platform-wide part the rest
            # (platform rows, and nodes Prometheus has no series of, which no part divides)
            of_node = present["entity_kind"] == "node"
            if shard.platform_wide:
                keep = ~of_node | ~present["entity_id"].isin(self.node_names(start, end, step))
            else:
                keep = of_node & present["entity_id"].isin(shard.nodes)
            present = present[keep].reset_index(drop=True)
        if self._prom is None:
            if present is None:
                raise SourceError(
                    self.platform, f"{self.host} metrics.k8s.io", window,
                    "the window cannot be recovered: the metrics APIs keep no history (or are not "
                    "served) and no Prometheus is configured for this cluster",
                    unrecoverable=True,
                )
            return present
        history = self._prom.read(self.queries, start, end, step, cluster=self.cluster, shard=shard) \
            if self.queries else empty_samples()
        if present is None or present.empty:
            return history
        both = pd.concat([history, present], ignore_index=True)
        return both.drop_duplicates(SERIES_KEY + ["ts"], keep="first").reset_index(drop=True)

    def node_names(self, start: datetime, end: datetime, step: str = "5min") -> list[str]:
        """The nodes with series in `[start, end)` in Prometheus (what a sharded extraction
        divides); none without a Prometheus."""
        if self._prom is None:
            return []
        return self._prom.node_names(self.queries, start, end, step)


def _api_time(text: str) -> pd.Timestamp:
    """An RFC 3339 time of a metrics API item as a UTC timestamp."""
    ts = pd.Timestamp(text)
    return ts.tz_convert("UTC") if ts.tzinfo else ts.tz_localize("UTC")


def _duration_seconds(text: str) -> float:
    """A Go duration as the resource metrics API writes a `window` ("20.05s", "1m0s")."""
    total, rest = 0.0, str(text).strip()
    for m in re.finditer(r"(\d+(?:\.\d+)?)(h|ms|m|s|us|µs|ns)", rest):
        total += float(m.group(1)) * {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}[m.group(2)]
    if not re.fullmatch(r"((\d+(?:\.\d+)?)(h|ms|m|s|us|µs|ns))+", rest):
        raise ValueError(f"not a duration: {rest[:40]!r}")
    return total


_SUFFIX = {"n": 1e-9, "u": 1e-6, "m": 1e-3, "": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
           "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def _quantity(value: Any) -> float:
    """A Kubernetes quantity ("2", "500m", "1Gi") as a float."""
    text = str(value).strip()
    for suffix in sorted(_SUFFIX, key=len, reverse=True):
        if suffix and text.endswith(suffix):
            return float(text[: -len(suffix)]) * _SUFFIX[suffix]
    return float(text)


def _classified(fn: Callable[[], Any], timeout: float) -> Any:
    """Run one client call, classifying failures without quoting the server's or client's text."""
    try:
        return fn()
    except ApiException as exc:
        status = exc.status or 0
        if status in (401, 403):
            raise PermanentError(f"authentication refused (HTTP {status})") from exc
        if status in (408, 429) or status >= 500:
            raise TransientError(f"HTTP {status}") from exc
        if status == 0:
            raise TransientError("no HTTP answer") from exc
        raise PermanentError(f"HTTP {status}") from exc
    except urllib3.exceptions.MaxRetryError as exc:
        if isinstance(exc.reason, urllib3.exceptions.NewConnectionError):
            raise TransientError("connection failed (refused or unreachable)") from exc
        raise TransientError(f"no answer within {timeout}s") from exc
    except urllib3.exceptions.NewConnectionError as exc:  # a ConnectTimeoutError subclass: test first
        raise TransientError("connection failed (refused or unreachable)") from exc
    except (urllib3.exceptions.TimeoutError, TimeoutError) as exc:
        raise TransientError(f"no answer within {timeout}s") from exc
    except (urllib3.exceptions.HTTPError, ConnectionError) as exc:
        raise TransientError(f"connection failed ({type(exc).__name__})") from exc
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise PermanentError(f"malformed payload ({type(exc).__name__})") from exc
