"""Payload parsing of the sources, on documented payload shapes."""

from __future__ import annotations

import io
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest

from gpupool.sources.base import PermanentError, SourceError
from gpupool.sources.openmetrics import ClusterShape, Family, Series, exporter_history, write_openmetrics
from gpupool.sources.openstack import GnocchiMeter, gnocchi_groups_to_frame
from gpupool.sources.prometheus import MetricQuery, _result_to_frame
from gpupool.sources.slurm import job_gpus, parse_gres

T0 = datetime(2026, 1, 5, tzinfo=timezone.utc)


@pytest.mark.parametrize("text,expected", [
    ("gpu:4", (4, None)), ("gpu:a100:4(S:0-1)", (4, "a100")), ("gpu:tesla:3(IDX:0-2)", (3, "tesla")),
    ("gpu:a100:2(IDX:0,2),gpu:v100:1(IDX:3)", (3, "a100")), ("shard:8", (0, None)), ("(null)", (0, None)),
    ("", (0, None)), ("gpu", (1, None)),
])
def test_parse_gres(text, expected):
    assert parse_gres(text) == expected


@pytest.mark.parametrize("job,gpus", [
    ({"tres_per_node": "gres:gpu:3"}, 3), ({"tres_per_job": "gres:gpu:a100:2"}, 2),
    ({"tres_per_node": "gres:gpu:2", "node_count": 3}, 6), ({"tres_per_task": "gres/gpu=1", "tasks": 4}, 4),
    ({"tres_per_node": "gres:shard:2"}, 0), ({}, 0),
])
def test_job_gpus(job, gpus):
    assert job_gpus(job) == gpus


def test_prometheus_matrix_to_rows_drops_nan_and_keeps_labels():
    result = [
        {"metric": {"Hostname": "n1", "gpu": "0"}, "values": [[1767571200, "50"], [1767571260, "NaN"]]},
        {"metric": {"Hostname": "n1", "gpu": "1"}, "values": [[1767571200.5, "+Inf"], [1767571260, "7"]]},
    ]
    q = MetricQuery("x", "gpu", "{Hostname}/{gpu}")
    df = _result_to_frame(result, "p", "c", "gpu_util", q)
    assert list(df["entity_id"]) == ["n1/0", "n1/1"] and list(df["value"]) == [50.0, 7.0]
    assert str(df["ts"].iloc[0]) == "2026-01-05 00:00:00+00:00" and set(df["unit"]) == {"percent"}
    with pytest.raises(PermanentError, match="lacks label"):
        _result_to_frame(result, "p", "c", "gpu_util", MetricQuery("x", "node", "{node}"))
    with pytest.raises(PermanentError, match="malformed"):
        _result_to_frame({"oops": 1}, "p", "c", "gpu_util", q)


def test_gnocchi_grouped_aggregates():
    payload = [
        {"group": {"host_name": "cn1"}, "measures": {"measures": {"aggregated": [
            ["2026-01-05T00:00:00+00:00", 300.0, 41.5], ["2026-01-05T00:05:00+00:00", 300.0, None]]}}},
        {"group": {"host_name": "cn2"}, "measures": {"measures": {"aggregated": [
            ["2026-01-05T00:00:00+00:00", 300.0, 2.0]]}}},
    ]
    meter = GnocchiMeter("gpu.memory.used", scale=1048576)
    df = gnocchi_groups_to_frame(payload, "os", "r1", "gpu_mem_used", meter, "w")
    assert list(df["entity_id"]) == ["cn1", "cn2"] and list(df["value"]) == [41.5 * 1048576, 2 * 1048576]
    assert set(df["unit"]) == {"bytes"} and df["ts"].iloc[0] == T0
    with pytest.raises(SourceError, match="malformed payload for gpu.memory.used"):
        gnocchi_groups_to_frame([{"group": {}}], "os", "r1", "gpu_mem_used", meter, "w")


def test_openmetrics_text_is_what_promtool_reads():
    fam = Family("slurm_gpus_total", "Total GPUs",
                 [Series({"node": 'a"b'}, np.array([20, 10]), np.array([2.0, 1.0]))])
    buf = io.StringIO()
    assert write_openmetrics(buf, [fam]) == 2
    assert buf.getvalue() == ('# HELP slurm_gpus_total Total GPUs\n# TYPE slurm_gpus_total gauge\n'
                              'slurm_gpus_total{node="a\\"b"} 1 10\nslurm_gpus_total{node="a\\"b"} 2 20\n# EOF\n')


def test_exporter_history_is_consistent():
    shape = ClusterShape(nodes=3, gpus_per_node=4, job_steps=5)
    families, truth = exporter_history(shape, T0, T0 + timedelta(hours=2), "1min", seed=1)
    assert truth["alloc"].shape == (3, 120) and truth["alloc"].min() >= 0 and truth["alloc"].max() <= 4
    busy = truth["util"] > 0
    assert (busy.sum(axis=1) <= truth["alloc"]).all()  # utilisation only on allocated GPUs
    util = next(f for f in families if f.name == "DCGM_FI_DEV_GPU_UTIL")
    jobs = {s.labels["hpc_job"] for s in util.series} - {""}
    assert jobs and all(len(s.ts) <= shape.job_steps for s in util.series if s.labels["hpc_job"])
