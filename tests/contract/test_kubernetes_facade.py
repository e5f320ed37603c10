"""The simulated Kubernetes API against the official python client, unchanged."""

from __future__ import annotations

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpupool.k8s_keys import HOLD_ANNOTATION


def apis(sim):
    cfg = client.Configuration()
    cfg.host = sim.urls["kubernetes"]
    api = client.ApiClient(cfg)
    return client.CoreV1Api(api), client.CustomObjectsApi(api), api


def test_discovery_and_paginated_node_list(sim):
    core, _, api = apis(sim)
    assert client.VersionApi(api).get_code().git_version.startswith("v1.")
    assert "v1" in client.CoreApi(api).get_api_versions().versions
    groups = {g.name for g in client.ApisApi(api).get_api_versions().groups}
    assert {"metrics.k8s.io", "custom.metrics.k8s.io", "policy"} <= groups
    names, token = [], None
    while True:
        page = core.list_node(limit=4, _continue=token) if token else core.list_node(limit=4)
        names += [n.metadata.name for n in page.items]
        token = page.metadata._continue
        if not token:
            break
    assert names == [n["name"] for n in sim.state.nodes("kubernetes")]
    node = core.read_node(names[0])
    assert node.status.capacity["nvidia.com/gpu"] == "8" and node.metadata.resource_version


def test_pods_running_and_pending_with_gpu_requests(sim):
    core, _, _ = apis(sim)
    pods = core.list_pod_for_all_namespaces().items
    running = [p for p in pods if p.status.phase == "Running"]
    assert len(running) == sum(n["busy_gpus"] for n in sim.state.nodes("kubernetes"))
    assert all(p.spec.containers[0].resources.requests["nvidia.com/gpu"] == "1" for p in pods)
    with sim.state.lock:  # squeeze the platform so demand waits
        for n in sim.state.nodes("kubernetes")[:6]:
            sim.state.cordon("kubernetes", n["name"], "gpupool: test", via="kubernetes")
        sim.state.advance("2h")
    pending = core.list_namespaced_pod("ml-jobs", field_selector="status.phase=Pending").items
    assert pending and all(p.status.conditions[0].reason == "Unschedulable" for p in pending)
    assert all(p.spec.node_name is None for p in pending)


def test_cordon_drain_evict_then_move(sim):
    core, _, _ = apis(sim)
    name = "k8s-gpu001"
    node = core.patch_node(name, {"spec": {"unschedulable": True},
                                  "metadata": {"annotations": {HOLD_ANNOTATION: "gpupool: to slurm"}}})
    assert node.spec.unschedulable and any(t.key == "node.kubernetes.io/unschedulable" for t in node.spec.taints)
    assert sim.state.node("kubernetes", name)["drain_reason"] == "gpupool: to slurm"
    on_node = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={name}").items
    assert on_node  # running work stays until it ends or is evicted
    with sim.state.lock:
        with pytest.raises(Exception, match="still runs"):
            sim.state.move(name, "slurm")
    for pod in on_node:
        core.create_namespaced_pod_eviction(pod.metadata.name, "ml-jobs", client.V1Eviction(
            metadata=client.V1ObjectMeta(name=pod.metadata.name, namespace="ml-jobs")))
    assert core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={name}").items == []
    with sim.state.lock:
        sim.state.advance("5min")
    assert core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={name}").items == []
    with sim.state.lock:
        arrive = sim.state.move(name, "slurm")
        sim.state.advance(arrive - sim.state.now)
    with pytest.raises(ApiException) as err:
        core.read_node(name)
    assert err.value.status == 404
    assert name in [n["name"] for n in sim.state.nodes("slurm")]


def test_conflict_not_found_and_invalid_are_status_objects(sim):
    import json

    core, _, _ = apis(sim)
    node = core.read_node("k8s-gpu002")
    with pytest.raises(ApiException) as err:
        core.patch_node("k8s-gpu002", {"metadata": {"resourceVersion": str(int(node.metadata.resource_version) - 1),
                                                    "labels": {"a": "b"}}})
    assert err.value.status == 409
    body = json.loads(err.value.body)
    assert body["kind"] == "Status" and body["reason"] == "Conflict" and body["code"] == 409
    with pytest.raises(ApiException) as err:
        core.read_node("no-such-node")
    body = json.loads(err.value.body)
    assert err.value.status == 404 and body["reason"] == "NotFound" and body["details"]["kind"] == "nodes"
    with pytest.raises(ApiException) as err:
        core.patch_node("k8s-gpu002", {"spec": {"taints": [{"key": "x", "effect": "Sometimes"}]}})
    body = json.loads(err.value.body)
    assert err.value.status == 422 and body["reason"] == "Invalid" and body["details"]["causes"]
    with pytest.raises(ApiException) as err:
        core.read_namespaced_pod("gpu-job-1", "ml-jobs")
    assert err.value.status == 404
    merged = core.patch_node("k8s-gpu002", [{"op": "add", "path": "/metadata/labels/pool", "value": "gpupool"}])
    assert merged.metadata.labels["pool"] == "gpupool"


def test_mig_change_needs_an_empty_node_and_takes_time(sim):
    core, _, _ = apis(sim)
    busy = next(n["name"] for n in sim.state.nodes("kubernetes") if n["busy_gpus"] > 0)
    node = core.patch_node(busy, {"metadata": {"labels": {"nvidia.com/mig.config": "all-1g.10gb"}}})
    assert node.metadata.labels["nvidia.com/mig.config.state"] == "failed"
    with sim.state.lock:
        sim.state.cordon("kubernetes", busy, "gpupool: mig", via="kubernetes")
        sim.state.advance("2h")
    node = core.patch_node(busy, {"metadata": {"labels": {"nvidia.com/mig.config": "all-2g.20gb"}}})
    assert node.metadata.labels["nvidia.com/mig.config.state"] == "pending"
    assert sim.state.world.mig_layout_[busy] == "all-disabled"
    with sim.state.lock:
        sim.state.advance("15min")
    node = core.read_node(busy)
    assert node.metadata.labels["nvidia.com/mig.config.state"] == "success"
    assert sim.state.world.mig_layout_[busy] == "all-2g.20gb"


def test_resource_and_custom_metrics(sim):
    core, custom, _ = apis(sim)
    nodes = custom.list_cluster_custom_object("metrics.k8s.io", "v1beta1", "nodes")
    assert nodes["kind"] == "NodeMetricsList" and nodes["items"][0]["usage"]["cpu"].endswith("m")
    pods = custom.list_namespaced_custom_object("metrics.k8s.io", "v1beta1", "ml-jobs", "pods")
    assert pods["items"] and pods["items"][0]["containers"][0]["name"] == "main"
    util = custom.get_cluster_custom_object("custom.metrics.k8s.io", "v1beta2", "nodes",
                                            "*/DCGM_FI_DEV_GPU_UTIL")
    assert util["kind"] == "MetricValueList"
    assert {i["describedObject"]["name"] for i in util["items"]} == {n["name"] for n in sim.state.nodes("kubernetes")}
    assert all(i["value"].endswith("m") for i in util["items"])
    pod_util = custom.get_namespaced_custom_object("custom.metrics.k8s.io", "v1beta2", "ml-jobs", "pods",
                                                   "*/DCGM_FI_DEV_GPU_UTIL")
    assert pod_util["items"] and pod_util["items"][0]["describedObject"]["kind"] == "Pod"
    with pytest.raises(ApiException) as err:
        custom.get_cluster_custom_object("custom.metrics.k8s.io", "v1beta2", "nodes", "*/no_such_metric")
    assert err.value.status == 404


def test_a_node_moved_off_kubernetes_and_back_stays_a_pool_member(sim, sqlite_engine):
    """Source and actuator on one facade: the hold the actuator writes is the hold the source
    reads, so the planner sees gpupool's own cordon as gpupool's throughout the move.

    The machine is registered on Kubernetes and on Slurm (the production shape of a pool
    node: gpupool keeps it held where it is not owned); the Slurm side is staged as the
    Slurm source reports it, the Kubernetes side comes from the facade."""
    from datetime import timedelta

    from gpupool.jobs import allocation as service
    from gpupool.actuation.actuators.base import moving_reason
    from gpupool.actuation.actuators.kubernetes import KubernetesActuator
    from gpupool.sources.kubernetes import KubernetesSource
    from gpupool.staging.schema import inventory_node

    _, _, api = apis(sim)
    source = KubernetesSource("kubernetes", api_client=api)
    actuator = KubernetesActuator(api, platform="kubernetes")
    name = next(n["name"] for n in sim.state.nodes("kubernetes") if n["busy_gpus"] == 0)
    t0 = sim.state.now.to_pydatetime()

    def stage_and_read(step: int, slurm_open: bool) -> tuple[str, str | None]:
        at = t0 + timedelta(minutes=step)
        k8s = [r for r in source.inventory(at) if r["node"] == name]
        slurm = {"node": name, "platform": "slurm", "gpus": k8s[0]["gpus"], "gpu_model": k8s[0]["gpu_model"],
                 "mig_layout": None, "schedulable": slurm_open, "busy_gpus": 0.0,
                 "drain_reason": None if slurm_open else moving_reason("kubernetes")}
        rows = [{**r, "mig_layout": None, "snapshot_at": at} for r in k8s + [slurm]]
        with sqlite_engine.begin() as conn:
            conn.execute(inventory_node.insert(), rows)
        nodes, excluded = service.pool_nodes(sqlite_engine, at, ["kubernetes", "slurm"])
        owner = {n.name: n.owner for n in nodes}.get(name)
        return owner, next((e["why"] for e in excluded if e["node"] == name), None)

    assert stage_and_read(0, slurm_open=False) == ("kubernetes", None)
    actuator.release(name, moving_reason("slurm"))
    assert stage_and_read(1, slurm_open=True) == ("slurm", None)
    held = next(r for r in source.inventory(t0) if r["node"] == name)
    assert held["drain_reason"] == moving_reason("slurm")  # what the actuator wrote, read back
    assert sim.state.node("kubernetes", name)["drain_reason"] == moving_reason("slurm")
    assert actuator.is_released(name)
    # ... and back: Slurm holds it again, Kubernetes lifts gpupool's own hold
    actuator.attach(name)
    assert stage_and_read(2, slurm_open=False) == ("kubernetes", None)
    assert next(r for r in source.inventory(t0) if r["node"] == name)["schedulable"]


def test_metrics_apis_answer_in_the_published_shape(sim):
    """The facade's metrics APIs against the published API's answers (the recorded files the
    source's own test reads in tests/integration/test_kubernetes_source.py)."""
    import requests

    from tests.contract.conftest import recorded
    from tests.contract.shapes import shape_diff

    base = sim.urls["kubernetes"]
    for path, name in (("/apis/metrics.k8s.io/v1beta1/nodes", "kubernetes_node_metrics"),
                       ("/apis/custom.metrics.k8s.io/v1beta2/nodes/*/DCGM_FI_DEV_GPU_UTIL",
                        "kubernetes_custom_metrics_nodes"),
                       ("/apis/custom.metrics.k8s.io/v1beta2/nodes/*/DCGM_FI_DEV_FB_USED",
                        "kubernetes_custom_metrics_nodes")):
        body = requests.get(base + path, timeout=30).json()
        assert body["items"], path
        assert shape_diff(recorded(name)["body"], body, open_maps=("$.items[].metadata.labels",)) == [], path


def test_extract_reads_the_metrics_apis_without_prometheus(sim, sqlite_engine, monkeypatch):
    """`gpupool run`'s extract on a Kubernetes platform with no Prometheus: the window's last
    step and each node's health series come from metrics.k8s.io and custom.metrics.k8s.io."""
    import json
    from datetime import timedelta

    import pandas as pd
    import sqlalchemy as sa

    from gpupool import pipeline
    from gpupool.config import parse_config
    from gpupool.staging.schema import sample

    monkeypatch.setenv("AIRFLOW_CONN_KUBERNETES_AI", json.dumps({"conn_type": "http", "host": sim.urls["kubernetes"]}))
    cfg = parse_config({"step": "5min", "platforms": [
        {"name": "kubernetes", "kind": "kubernetes", "conn_id": "kubernetes_ai"}]})
    end = sim.state.now.to_pydatetime()
    window = pipeline.Window(end - timedelta(hours=1), end)
    out = pipeline.extract(pipeline.Context(cfg, sqlite_engine), "kubernetes", window)
    with sqlite_engine.connect() as conn:
        rows = pd.read_sql(sa.select(sample), conn)
    nodes = sim.state.nodes("kubernetes")
    assert out["nodes"] == len(nodes) and out["rows"] == len(rows)
    assert set(pd.to_datetime(rows["ts"], utc=True)) == {pd.Timestamp(end) - pd.Timedelta(minutes=5)}
    v = {(r.entity_kind, r.entity_id, r.metric): r.value for r in rows.itertuples()}
    for n in nodes:
        assert v[("node", n["name"], "gpu_capacity")] == n["gpus"]
        assert v[("node", n["name"], "gpu_allocated")] == n["busy_gpus"]
        assert v[("node", n["name"], "health_up")] == 1 and v[("node", n["name"], "health_sample_age_seconds")] == 0
        assert v[("node", n["name"], "health_sample_window_seconds")] == 20.05
        assert 0 <= v[("node", n["name"], "gpu_util")] <= 100
    assert v[("platform", "", "gpu_allocated")] == sum(n["busy_gpus"] for n in nodes)
