"""The Kubernetes source against kmock's emulated API server (an independent implementation)."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone

import pytest
from faultproxy import Fault, FaultProxy
from kubeemu import KubeEmulator
from kubernetes import client

from gpupool.canonical import SAMPLE_COLUMNS
from gpupool.sources.base import INVENTORY_KEYS, RetryPolicy, SourceError
from gpupool.k8s_keys import HOLD_ANNOTATION
from gpupool.sources.kubernetes import KubernetesSource
from gpupool.sources.prometheus import MetricQuery

FAST_RETRY = RetryPolicy(attempts=2, base_delay=0.01, max_delay=0.02)
TOKEN = "k8s-s3cret-bearer-token"
CUSTOM_PATH = "/apis/custom.metrics.k8s.io/v1beta2/namespaces/*/pods/*/DCGM_FI_DEV_GPU_UTIL"


def _node(name, alloc, labels=None, unschedulable=False, taints=None, annotations=None, ready="True"):
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels or {}, "annotations": annotations or {}},
        "spec": {"unschedulable": unschedulable, "taints": taints or []},
        "status": {"allocatable": alloc, "capacity": alloc,
                   "conditions": [{"type": "Ready", "status": ready, "reason": "KubeletReady"}]},
    }


def _pod(name, gpus, node=None, phase="Running", unschedulable=False, ns="ml", init_gpus=0):
    containers = [{"name": "main", "image": "trainer", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]
    spec = {"containers": containers}
    if init_gpus:
        spec["initContainers"] = [{"name": "warm", "image": "x",
                                   "resources": {"requests": {"nvidia.com/gpu": str(init_gpus)}}}]
    if node:
        spec["nodeName"] = node
    status = {"phase": phase}
    if unschedulable:
        status["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns}, "spec": spec,
            "status": status}


@pytest.fixture(scope="module")
def kube():
    """An emulated cluster: GPU nodes (whole, MIG, cordoned, tainted, not ready), a CPU node, pods."""
    emu = KubeEmulator()
    emu.extra[CUSTOM_PATH] = {
        "kind": "MetricValueList", "apiVersion": "custom.metrics.k8s.io/v1beta2", "metadata": {},
        "items": [
            {"describedObject": {"kind": "Pod", "namespace": "ml", "name": "train-a", "apiVersion": "v1"},
             "metric": {"name": "DCGM_FI_DEV_GPU_UTIL"}, "timestamp": "2026-11-29T10:00:00Z", "value": "87"},
            {"describedObject": {"kind": "Pod", "namespace": "ml", "name": "train-b", "apiVersion": "v1"},
             "metric": {"name": "DCGM_FI_DEV_GPU_UTIL"}, "timestamp": "2026-11-29T10:00:00Z", "value": "42500m"},
        ],
    }
    with emu:
        cfg = client.Configuration()
        cfg.host = emu.url
        api = client.CoreV1Api(client.ApiClient(cfg))
        product = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
        api.create_node(_node("gpu-a", {"nvidia.com/gpu": "8", "cpu": "64"}, product))
        api.create_node(_node("gpu-b", {"nvidia.com/gpu": "8"}, product, unschedulable=True,
                              annotations={HOLD_ANNOTATION: "gpupool: handover to slurm"}))
        api.create_node(_node("gpu-c", {"nvidia.com/gpu": "4"}, taints=[
            {"key": "nvidia.com/gpu", "value": "maintenance", "effect": "NoSchedule"}]))
        api.create_node(_node("gpu-mig", {"nvidia.com/gpu": "0", "nvidia.com/mig-1g.10gb": "14",
                                          "nvidia.com/mig-3g.40gb": "0"},
                              {"nvidia.com/gpu.count": "2", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}))
        api.create_node(_node("gpu-d", {"nvidia.com/gpu": "2"}, ready="False"))
        api.create_node(_node("cpu-1", {"cpu": "64"}))
        for i in range(6):  # more pods than one page
            api.create_namespaced_pod("ml", _pod(f"small-{i}", 1, node="gpu-a"))
        api.create_namespaced_pod("ml", _pod("train-a", 2, node="gpu-b"))
        api.create_namespaced_pod("ml", _pod("train-b", 1, node="gpu-c", init_gpus=3))
        api.create_namespaced_pod("ml", _pod("done", 4, node="gpu-c", phase="Succeeded"))
        api.create_namespaced_pod("ml", _pod("wait-1", 4, phase="Pending", unschedulable=True))
        api.create_namespaced_pod("ml", _pod("wait-2", 2, phase="Pending", unschedulable=True))
        api.create_namespaced_pod("ml", _pod("just-created", 8, phase="Pending"))
        yield emu


def _source(url, **kw):
    kw.setdefault("retry", FAST_RETRY)
    kw.setdefault("page_size", 4)
    return KubernetesSource("k8s-ai", host=url, token=TOKEN, cluster="ai1", **kw)


def test_inventory_pages_through_nodes_and_pods(kube):
    before = len(kube.list_calls)
    recs = _source(kube.url).inventory(datetime.now(timezone.utc))
    assert all(tuple(r) == INVENTORY_KEYS for r in recs)
    by = {r["node"]: r for r in recs}
    assert sorted(by) == ["gpu-a", "gpu-b", "gpu-c", "gpu-d", "gpu-mig"]
    assert by["gpu-a"] == {"node": "gpu-a", "platform": "k8s-ai", "gpus": 8, "gpu_model": "NVIDIA-H100-80GB-HBM3",
                           "mig_layout": None, "schedulable": True, "drain_reason": None, "busy_gpus": 6}
    assert (by["gpu-b"]["schedulable"], by["gpu-b"]["drain_reason"], by["gpu-b"]["busy_gpus"]) == \
        (False, "gpupool: handover to slurm", 2)
    assert by["gpu-c"]["drain_reason"] == "taint nvidia.com/gpu=maintenance:NoSchedule"
    assert by["gpu-c"]["busy_gpus"] == 3  # the init container's 3 GPUs, not the finished pod's 4
    assert by["gpu-d"]["drain_reason"] == "not ready (KubeletReady)"
    assert (by["gpu-mig"]["gpus"], by["gpu-mig"]["mig_layout"]) == (2, {"1g.10gb": 14})
    calls = kube.list_calls[before:]
    # 6 nodes in pages of 4, 12 pods in pages of 4: 2 + 3 list calls, each with limit
    assert len(calls) == 5 and all(c["limit"] == "4" for c in calls)
    assert [c.get("continue") for c in calls] == [None, "4", None, "4", "8"]


def test_snapshot_counts_only_unschedulable_pods_as_pending(kube):
    at = datetime(2026, 11, 29, 10, tzinfo=timezone.utc)
    snap = _source(kube.url).snapshot(at)
    assert list(snap.columns) == SAMPLE_COLUMNS and set(snap["ts"]) == {at}
    v = {(r.entity_kind, r.entity_id, r.metric): r.value for r in snap.itertuples()}
    assert v[("platform", "", "gpu_pending")] == 6  # wait-1 + wait-2; just-created is not (yet) unschedulable
    assert v[("node", "gpu-a", "gpu_capacity")] == 8 and v[("node", "gpu-a", "gpu_allocated")] == 6
    assert v[("pod", "ml/train-a", "gpu_util")] == 87 and v[("pod", "ml/train-b", "gpu_util")] == 42.5


def test_past_window_without_prometheus_cannot_be_recovered(kube):
    start = datetime(2026, 1, 5, tzinfo=timezone.utc)
    with pytest.raises(SourceError, match="cannot be recovered") as err:
        _source(kube.url).usage(start, start + timedelta(hours=1))
    assert err.value.window == "2026-01-05T00:00:00Z/2026-01-05T01:00:00Z" and not err.value.retryable


def test_past_window_from_prometheus(kube, prometheus_history):
    """With Prometheus configured, history is read from it (DCGM series here)."""
    server, truth = prometheus_history
    queries = {"gpu_util": MetricQuery("max by (Hostname, gpu) (DCGM_FI_DEV_GPU_UTIL)", "gpu", "{Hostname}/{gpu}")}
    src = _source(kube.url, prometheus_url=server.url, queries=queries)
    df = src.usage(truth.start, truth.start + timedelta(hours=1), "5min")
    shape = truth.shape
    assert len(df) == shape.nodes * shape.gpus_per_node * 12
    assert set(df["platform"]) == {"k8s-ai"} and set(df["cluster"]) == {"ai1"}


def test_auth_failure_names_no_token(kube, caplog):
    caplog.set_level(logging.DEBUG)
    with FaultProxy(kube.url) as proxy:
        proxy.faults.append(Fault(status=401, body=b'{"kind":"Status","code":401,"reason":"Unauthorized"}'))
        with pytest.raises(SourceError) as err:
            _source(proxy.url).inventory(datetime.now(timezone.utc))
        assert proxy.requests[0][2]["authorization"] == f"Bearer {TOKEN}"
    assert "authentication refused (HTTP 401)" in str(err.value) and "/api/v1/nodes" in err.value.endpoint
    assert TOKEN not in str(err.value) and TOKEN not in caplog.text
    assert len(proxy.requests) == 1


def test_5xx_mid_pagination_is_retried(kube):
    with FaultProxy(kube.url) as proxy:
        proxy.faults.append(Fault(status=500, path="/api/v1/pods?"))
        recs = _source(proxy.url).inventory(datetime.now(timezone.utc))
    assert {r["node"]: r["busy_gpus"] for r in recs}["gpu-a"] == 6


def test_persistent_errors_and_garbage_are_clear(kube):
    now = datetime.now(timezone.utc)
    with FaultProxy(kube.url) as proxy:
        proxy.faults.extend([Fault(status=503)] * 2)
        with pytest.raises(SourceError, match="HTTP 503") as err:
            _source(proxy.url).inventory(now)
        assert err.value.retryable
        proxy.faults.append(Fault(status=404, body=b"{}"))
        with pytest.raises(SourceError, match="HTTP 404") as err:
            _source(proxy.url).inventory(now)
        assert not err.value.retryable
        proxy.faults.append(Fault(replace_body=True, body=b"<html>oops</html>"))
        with pytest.raises(SourceError, match="malformed payload"):
            _source(proxy.url).inventory(now)
        proxy.faults.append(Fault(delay=1.5))
        with pytest.raises(SourceError, match="no answer within 0.5s") as err:
            _source(proxy.url, timeout=0.5, retry=RetryPolicy(attempts=1)).inventory(now)
        assert err.value.retryable


def test_api_server_down_is_retryable():
    with pytest.raises(SourceError, match="connection failed") as err:
        _source("http://127.0.0.1:9", timeout=2).inventory(datetime.now(timezone.utc))
    assert err.value.retryable


RECORDED = __import__("pathlib").Path(__file__).resolve().parents[1] / "fixtures" / "recorded"


def _recorded(name):
    import json

    return json.loads((RECORDED / f"{name}.json").read_text())["body"]


def test_usage_from_the_metrics_apis_on_recorded_answers():
    """A cluster with metrics-server and a custom-metrics adapter but no Prometheus: the
    window's last step comes from the present, each node with how its reading was made.
    The answers are the published API's (tests/fixtures/recorded/kubernetes_*.json); the
    facade test runs the same reading against the emulator."""
    emu = KubeEmulator()
    emu.extra["/apis/metrics.k8s.io/v1beta1/nodes"] = _recorded("kubernetes_node_metrics")
    emu.extra["/apis/custom.metrics.k8s.io/v1beta2/nodes/*/DCGM_FI_DEV_GPU_UTIL"] = \
        _recorded("kubernetes_custom_metrics_nodes")
    with emu:
        cfg = client.Configuration()
        cfg.host = emu.url
        api = client.CoreV1Api(client.ApiClient(cfg))
        for name, gpus in (("gpu-a", "8"), ("gpu-b", "8"), ("gpu-c", "4")):
            api.create_node(_node(name, {"nvidia.com/gpu": gpus}))
        api.create_namespaced_pod("ml", _pod("train", 2, node="gpu-a"))
        api.create_namespaced_pod("ml", _pod("wait", 3, phase="Pending", unschedulable=True))
        src = _source(emu.url)
        end = datetime(2026, 11, 29, 10, tzinfo=timezone.utc)
        df = src.usage(end - timedelta(hours=1), end, "5min")
        with pytest.raises(SourceError, match="cannot be recovered"):  # a day-old window: not the present
            src.usage(end - timedelta(days=1, hours=1), end - timedelta(days=1), "5min")
    assert list(df.columns) == SAMPLE_COLUMNS and set(df["ts"]) == {end - timedelta(minutes=5)}
    v = {(r.entity_id, r.metric): r.value for r in df.itertuples()}
    assert v[("", "gpu_pending")] == 3
    assert (v[("gpu-a", "gpu_capacity")], v[("gpu-a", "gpu_allocated")], v[("gpu-c", "gpu_capacity")]) == (8, 2, 4)
    assert (v[("gpu-a", "gpu_util")], v[("gpu-b", "gpu_util")]) == (87.5, 42)
    # gpu-c is in neither answer: read by no metrics API
    assert [v[(n, "health_up")] for n in ("gpu-a", "gpu-b", "gpu-c")] == [1, 1, 0]
    assert (v[("gpu-a", "health_sample_age_seconds")], v[("gpu-b", "health_sample_age_seconds")]) == (0, 82)
    assert (v[("gpu-a", "health_sample_window_seconds")], v[("gpu-b", "health_sample_window_seconds")]) == (20.05, 60)
    assert ("gpu-c", "health_sample_age_seconds") not in v and ("gpu-a", "gpu_mem_used") not in v
