"""The Slurm source's usage history against a real, backfilled Prometheus."""

from __future__ import annotations

import logging
from datetime import timedelta

import numpy as np
import pandas as pd
import pytest
from faultproxy import Fault, FaultProxy
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException

from gpupool.canonical import SAMPLE_COLUMNS, normalize_samples
from gpupool.sources.base import RetryPolicy, SourceError
from gpupool.sources.prometheus import MetricQuery
from gpupool.sources.slurm import DEFAULT_SLURM_QUERIES, SlurmSource

FAST_RETRY = RetryPolicy(attempts=3, base_delay=0.01, max_delay=0.02)


@pytest.fixture
def prom(prometheus_history):
    server, truth = prometheus_history
    return server, truth


def _source(url, **kw):
    kw.setdefault("retry", FAST_RETRY)
    return SlurmSource("slurm-hpc", prometheus_url=url, cluster="hpc1", **kw)


def test_usage_reads_back_the_backfilled_history(prom):
    server, truth = prom
    start = truth.start + timedelta(hours=6)
    end = start + timedelta(hours=6)
    df = _source(server.url).usage(start, end, "5min")

    assert list(df.columns) == SAMPLE_COLUMNS
    pd.testing.assert_frame_equal(df, normalize_samples(df, where="test"))
    assert set(df["platform"]) == {"slurm-hpc"} and set(df["cluster"]) == {"hpc1"}
    grid = pd.date_range(start, end, freq="5min", inclusive="left")
    assert set(df["ts"]) == set(grid)  # aligned, end excluded

    shape, a = truth.shape, truth.arrays
    idx = [truth.index_of(t) for t in grid]
    for metric, key in (("gpu_capacity", "total"), ("gpu_allocated", "alloc")):
        got = df[df.metric == metric].pivot(index="ts", columns="entity_id", values="value")
        assert list(got.columns) == [shape.node_name(i) for i in range(shape.nodes)]
        np.testing.assert_array_equal(got.to_numpy(), a[key][:, idx].T)
    pending = df[df.metric == "gpu_pending"]
    assert set(pending["entity_kind"]) == {"partition"} and set(pending["entity_id"]) == {"gpu"}
    np.testing.assert_array_equal(pending.sort_values("ts")["value"].to_numpy(), a["pending"][idx])


def test_per_gpu_series_merge_the_jobs_on_each_gpu(prom):
    """DCGM starts a new series per hpc_job; the default query folds them into one per GPU.

    Backfilled series have no staleness markers, so at instant t a job's series that ended
    within the 5-minute lookback still shows; max over them lies between the value at t and
    the largest value of the last 5 minutes.
    """
    server, truth = prom
    start = truth.start + timedelta(hours=1)
    end = start + timedelta(hours=2)
    df = _source(server.url).usage(start, end, "10min")
    shape, a = truth.shape, truth.arrays
    util = df[(df.metric == "gpu_util") & (df.entity_kind == "gpu")]
    mem = df[df.metric == "gpu_mem_used"]
    assert len(util) == len(mem) == shape.nodes * shape.gpus_per_node * 12
    assert set(mem["unit"]) == {"bytes"} and set(util["unit"]) == {"percent"}
    for frame, key, scale in ((util, "util", 1.0), (mem, "fb_mib", 1048576.0)):
        for row in frame.itertuples():
            node, gpu = row.entity_id.split("/")
            i, j, t = int(node[len(shape.node_prefix):]), int(gpu), truth.index_of(row.ts)
            lo = a[key][i, j, t] * scale
            hi = a[key][i, j, t - 5 : t + 1].max() * scale
            assert lo <= row.value <= hi, (row, lo, hi)
    jobs = df[df.entity_kind == "job"]
    assert len(jobs) > 0 and jobs["value"].between(0, 100).all()
    assert jobs["entity_id"].str.fullmatch(r"\d+").all()


def test_chunked_reads_equal_one_read(prom):
    server, truth = prom
    start, end = truth.start + timedelta(hours=3), truth.start + timedelta(hours=5)
    whole = _source(server.url).usage(start, end, "1min")
    chunked = _source(server.url, chunk_points=7).usage(start, end, "1min")
    pd.testing.assert_frame_equal(
        whole.sort_values(["metric", "entity_kind", "entity_id", "ts"]).reset_index(drop=True),
        chunked.sort_values(["metric", "entity_kind", "entity_id", "ts"]).reset_index(drop=True),
    )


def test_window_over_11000_points_is_split(prom):
    """Nine days at one minute is 12,960 points: Prometheus refuses it in one query."""
    server, truth = prom
    start = truth.start - timedelta(days=3)
    end = start + timedelta(days=9)
    client = PrometheusConnect(server.url)
    with pytest.raises(PrometheusApiClientException, match="11,000|11000"):
        client.custom_query_range("slurm_gpus_total", start_time=start, end_time=end - timedelta(minutes=1), step="60")
    queries = {"gpu_capacity": DEFAULT_SLURM_QUERIES["gpu_capacity"]}
    df = _source(server.url, queries=queries).usage(start, end, "1min")
    # Backfilled series carry no staleness marker: the last sample stays visible for the
    # 5-minute lookback after it, i.e. 5 more points per node.
    minutes = int((truth.end - truth.start).total_seconds() // 60) + 5
    assert len(df) == truth.shape.nodes * minutes
    assert df["ts"].min() == truth.start and df["ts"].max() == truth.end + timedelta(minutes=4)
    assert df["ts"].is_unique is False and not df.duplicated(["entity_id", "ts"]).any()


def test_step_is_aligned_to_the_epoch_not_to_the_window(prom):
    server, truth = prom
    queries = {"gpu_pending": DEFAULT_SLURM_QUERIES["gpu_pending"]}
    src = _source(server.url, queries=queries)
    a = src.usage(truth.start + timedelta(minutes=2, seconds=30), truth.start + timedelta(minutes=60), "5min")
    b = src.usage(truth.start, truth.start + timedelta(minutes=30), "5min")
    a, b = (df[df["entity_kind"] != "target"] for df in (a, b))  # the readings, not their health series
    assert a["ts"].min() == truth.start + timedelta(minutes=5)
    assert len(a) == 11 and len(b) == 6
    both = a.merge(b, on=["entity_id", "ts"])
    assert len(both) == 5 and (both["value_x"] == both["value_y"]).all()


def test_window_before_any_history_is_empty_not_an_error(prom):
    server, truth = prom
    df = _source(server.url).usage(truth.start - timedelta(days=30), truth.start - timedelta(days=29), "1h")
    assert df.empty and list(df.columns) == SAMPLE_COLUMNS


def test_bad_promql_is_one_clear_error_without_retry(prom):
    server, truth = prom
    with FaultProxy(server.url) as proxy:
        src = _source(proxy.url, queries={"gpu_util": MetricQuery("sum by (node (oops", "node", "{node}")})
        with pytest.raises(SourceError) as err:
            src.usage(truth.start, truth.start + timedelta(hours=1))
    e = err.value
    assert e.platform == "slurm-hpc" and "/api/v1/query_range" in e.endpoint
    assert e.window == "2026-01-05T00:00:00Z/2026-01-05T01:00:00Z"
    assert "HTTP 400" in str(e) and "parse error" in str(e) and not e.retryable
    assert len(proxy.requests) == 1


def test_series_without_the_entity_label_is_a_clear_error(prom):
    server, truth = prom
    src = _source(server.url, queries={"gpu_capacity": MetricQuery("sum(slurm_gpus_total)", "node", "{node}")})
    with pytest.raises(SourceError, match=r"lacks label\(s\) \['node'\]"):
        src.usage(truth.start, truth.start + timedelta(hours=1))


def test_two_series_for_one_entity_are_reported_not_dropped(prom):
    server, truth = prom
    src = _source(server.url, queries={"gpu_util": MetricQuery("DCGM_FI_DEV_GPU_UTIL", "gpu", "{Hostname}/{gpu}")})
    with pytest.raises(SourceError, match="share a \\(series, ts\\) key"):
        src.usage(truth.start, truth.start + timedelta(hours=6), "1min")


def test_transient_5xx_is_retried_then_succeeds(prom):
    server, truth = prom
    queries = {"gpu_capacity": DEFAULT_SLURM_QUERIES["gpu_capacity"]}
    with FaultProxy(server.url) as proxy:
        proxy.faults.extend([Fault(status=503, body=b'{"status":"error"}'), Fault(status=502)])
        df = _source(proxy.url, queries=queries).usage(truth.start, truth.start + timedelta(hours=1), "5min")
    assert len(df) == truth.shape.nodes * 12
    assert len(proxy.requests) == 3


def test_persistent_5xx_ends_in_one_retryable_error(prom, caplog):
    server, truth = prom
    with FaultProxy(server.url) as proxy:
        proxy.faults.extend([Fault(status=500)] * 3)
        with pytest.raises(SourceError) as err:
            _source(proxy.url).usage(truth.start, truth.start + timedelta(hours=1))
    assert err.value.retryable and "HTTP 500" in str(err.value)
    assert len(proxy.requests) == 3  # attempts bounded by the policy


def test_auth_failure_names_no_credential(prom, caplog):
    server, truth = prom
    token = "s3cr3t-t0ken-value"
    caplog.set_level(logging.DEBUG)
    with FaultProxy(server.url) as proxy:
        proxy.faults.append(Fault(status=401, body=b'{"status":"error","error":"unauthorized"}'))
        with pytest.raises(SourceError) as err:
            _source(proxy.url, prometheus_token=token).usage(truth.start, truth.start + timedelta(hours=1))
        assert proxy.requests[0][2]["authorization"] == f"Bearer {token}"
    assert "authentication refused (HTTP 401)" in str(err.value) and not err.value.retryable
    assert token not in str(err.value) and token not in caplog.text
    assert len(proxy.requests) == 1


def test_basic_auth_in_url_is_redacted(prom):
    server, truth = prom
    with FaultProxy(server.url) as proxy:
        proxy.faults.append(Fault(status=403))
        url = proxy.url.replace("http://", "http://reader:hunter2@")
        with pytest.raises(SourceError) as err:
            _source(url).usage(truth.start, truth.start + timedelta(hours=1))
    assert "hunter2" not in str(err.value) and "reader" not in err.value.endpoint


def test_timeout_is_retried_and_bounded(prom):
    server, truth = prom
    with FaultProxy(server.url) as proxy:
        proxy.faults.extend([Fault(delay=1.0)] * 2)
        src = _source(proxy.url, timeout=0.3, retry=RetryPolicy(attempts=2, base_delay=0.01))
        with pytest.raises(SourceError) as err:
            src.usage(truth.start, truth.start + timedelta(hours=1))
    assert err.value.retryable and "0.3s" in str(err.value)


@pytest.mark.parametrize(
    "body",
    [b"<html>proxy error</html>", b'{"status":"success","data":{"result":', b'{"status":"success"}',
     b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{"node":"a"},"values":[[1,"x"]]}]}}',
     b'{"status":"success","data":{"resultType":"matrix","result":[{"values":[]}]}}'],
    ids=["html", "truncated", "no-data", "non-numeric", "no-metric"],
)
def test_malformed_payload_is_one_clear_error(prom, body):
    server, truth = prom
    with FaultProxy(server.url) as proxy:
        proxy.faults.append(Fault(replace_body=True, body=body))
        with pytest.raises(SourceError, match="malformed payload") as err:
            _source(proxy.url).usage(truth.start, truth.start + timedelta(hours=1))
    assert not err.value.retryable and len(proxy.requests) == 1


def test_prometheus_down_is_a_retryable_error():
    src = _source("http://127.0.0.1:9", retry=RetryPolicy(attempts=2, base_delay=0.01))
    start = pd.Timestamp("2026-01-05", tz="UTC")
    with pytest.raises(SourceError, match="connection refused or unreachable") as err:  # not "no answer in 30 s"
        src.usage(start, start + timedelta(hours=1))
    assert err.value.retryable and "127.0.0.1:9" in err.value.endpoint
