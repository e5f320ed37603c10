"""The simulated Prometheus against prometheus-api-client, the project's reader, and real answers."""

from __future__ import annotations

from datetime import datetime, timezone

import numpy as np
import pytest
import requests
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException

from tests.contract.conftest import recorded
from tests.contract.shapes import shape_diff

T0 = datetime(2024, 1, 1, 20, tzinfo=timezone.utc)
NOW = datetime(2024, 1, 2, tzinfo=timezone.utc)
LABEL_MAPS = ("$.data.result[].metric", "$.data.result[].metric")


def get(sim, path, **params):
    return requests.get(sim.urls["prometheus"] + path, params=params, timeout=30)


def test_client_reads_selectors_and_ranges(sim):
    pc = PrometheusConnect(sim.urls["prometheus"], disable_ssl=True)
    assert pc.check_prometheus_connection()
    alloc = pc.custom_query('slurm_gpus_alloc{partition="gpu"}')
    assert {r["metric"]["node"] for r in alloc} == {n["name"] for n in sim.state.nodes("slurm")}
    busy = {n["name"]: n["busy_gpus"] for n in sim.state.nodes("slurm")}
    assert {r["metric"]["node"]: int(float(r["value"][1])) for r in alloc} == busy
    util = pc.custom_query_range('DCGM_FI_DEV_GPU_UTIL{Hostname=~"gpu-n00[12]", gpu!="7"}',
                                 start_time=T0, end_time=NOW, step="300")
    assert util and all(r["metric"]["Hostname"] in ("gpu-n001", "gpu-n002") for r in util)
    assert all(r["metric"]["gpu"] != "7" for r in util)
    labels = util[0]["metric"]
    assert {"gpu", "UUID", "Hostname", "modelName"} <= set(labels)
    assert "hpc_job" in {k for r in util for k in r["metric"]}
    assert set(pc.all_metrics()) >= {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "slurm_gpus_alloc",
                                     "slurm_gpus_idle", "slurm_gpus_total", "slurm_gpus_pending"}
    pending = pc.get_current_metric_value("slurm_gpus_pending")
    assert len(pending) == 1 and float(pending[0]["value"][1]) >= 0


def test_project_reader_gets_the_worlds_history(sim):
    from gpupool.sources.slurm import SlurmSource

    src = SlurmSource("slurm", prometheus_url=sim.urls["prometheus"], live_tolerance=None)
    frame = src.usage(T0, NOW, "5min")
    cap = frame[frame["metric"] == "gpu_capacity"]
    world = sim.state.world.samples("slurm", T0, NOW, per_gpu=False)
    want = world[(world["metric"] == "gpu_capacity") & (world["entity_kind"] == "node")]
    assert len(cap) == len(want) > 0
    assert cap["value"].sum() == pytest.approx(want["value"].sum())
    assert {"gpu_allocated", "gpu_pending", "gpu_util", "gpu_mem_used"} <= set(frame["metric"])


def test_promql_beyond_selectors_is_refused_like_prometheus(sim):
    for query in ("rate(DCGM_FI_DEV_GPU_UTIL[5m])", "slurm_gpus_alloc > 1", "sum("):
        resp = get(sim, "/api/v1/query", query=query)
        assert resp.status_code == 400
        body = resp.json()
        assert body["status"] == "error" and body["errorType"] == "bad_data"
        assert body["error"].startswith('invalid parameter "query": 1:')
        assert not shape_diff(recorded("prometheus_query_bad")["body"], body)
    with pytest.raises(PrometheusApiClientException, match="400"):
        PrometheusConnect(sim.urls["prometheus"]).custom_query("rate(x[5m])")


def test_point_limit_and_bad_step_match_the_real_errors(sim):
    t0 = NOW.timestamp() - 11001
    resp = get(sim, "/api/v1/query_range", query="slurm_gpus_alloc", start=t0, end=t0 + 11001, step=1)
    assert resp.status_code == 400
    assert resp.json() == recorded("prometheus_query_range_too_many_points")["body"]
    resp = get(sim, "/api/v1/query_range", query="slurm_gpus_alloc", start=t0, end=t0 + 60, step=0)
    assert resp.json() == recorded("prometheus_query_range_bad_step")["body"]
    assert get(sim, "/api/v1/series").json() == recorded("prometheus_series_no_match")["body"]
    resp = get(sim, "/api/v1/query_range", query="slurm_gpus_alloc", start=t0 + 1000, end=t0 + 11000, step=1)
    assert resp.status_code == 200  # 10,001 points is within the limit


@pytest.mark.parametrize("name,path,params", [
    ("prometheus_query_vector", "/api/v1/query", {"query": "DCGM_FI_DEV_GPU_UTIL"}),
    ("prometheus_query_aggregate", "/api/v1/query", {"query": "sum by (node) (slurm_gpus_alloc)"}),
    ("prometheus_query_scalar", "/api/v1/query", {"query": "1"}),
    ("prometheus_query_range_matrix", "/api/v1/query_range",
     {"query": 'slurm_gpus_alloc{node="gpu-n001"}', "start": T0.timestamp(), "end": NOW.timestamp(), "step": 300}),
    ("prometheus_series", "/api/v1/series", {"match[]": "slurm_gpus_alloc"}),
    ("prometheus_labels", "/api/v1/labels", {}),
    ("prometheus_label_values", "/api/v1/label/Hostname/values", {}),
    ("prometheus_buildinfo", "/api/v1/status/buildinfo", {}),
])
def test_success_shapes_match_recorded_prometheus(sim, name, path, params):
    real = recorded(name)
    resp = get(sim, path, **params)
    assert resp.status_code == real["status"]
    assert resp.headers["content-type"].startswith("application/json")
    assert not shape_diff(real["body"], resp.json(), open_maps=("$.data.result[].metric", "$.data[]"))


def test_series_labels_and_values_follow_the_world(sim):
    series = get(sim, "/api/v1/series", **{"match[]": 'DCGM_FI_DEV_FB_USED{Hostname="k8s-gpu001"}'}).json()["data"]
    assert series and all(s["cluster"] == "kubernetes" for s in series)
    assert any("pod" in s and s["namespace"] == "ml-jobs" for s in series)
    hosts = get(sim, "/api/v1/label/Hostname/values").json()["data"]
    assert "gpu-n001" in hosts and "k8s-gpu001" in hosts and not any(h.startswith("compute") for h in hosts)
    labels = get(sim, "/api/v1/labels").json()["data"]
    assert {"__name__", "gpu", "UUID", "Hostname", "modelName", "hpc_job", "node", "partition"} <= set(labels)


def test_drained_node_empties_in_the_exported_series(sim):
    name = "gpu-n001"
    assert sim.state.node("slurm", name)["busy_gpus"] > 0
    with sim.state.lock:
        sim.state.cordon("slurm", name, "gpupool: test", via="slurm")
        sim.state.advance("2h")
    now = sim.state.now.timestamp()
    rng = get(sim, "/api/v1/query_range", query=f'slurm_gpus_alloc{{node="{name}"}}', start=now - 7200,
              end=now, step=300).json()["data"]["result"][0]["values"]
    values = np.array([float(v) for _, v in rng])
    assert values[0] > 0 and values[-1] == 0
    assert np.all(np.diff(values) <= 0)  # no new work lands on it
    total = get(sim, "/api/v1/query", query=f'slurm_gpus_total{{node="{name}"}}').json()["data"]["result"]
    assert float(total[0]["value"][1]) == 0  # drained capacity is not exported as schedulable
