"""The pipeline's extract stage, configured like a deployment (platforms.yaml + an
AIRFLOW_CONN_* connection), against the real Prometheus and Slurm, staged in the real
PostgreSQL."""

from __future__ import annotations

import json
from datetime import timedelta

import pandas as pd
import pytest
import sqlalchemy as sa

from gpupool import pipeline
from gpupool.config import parse_config
from gpupool.staging.schema import extract_run, inventory_node, sample


def _ctx(engine):
    cfg = parse_config({"platforms": [{"name": "hpc", "kind": "slurm", "conn_id": "prometheus_hpc"}]})
    return pipeline.Context(cfg, engine)


def test_past_window_from_real_prometheus_into_staging(prometheus_history, slurm_cluster, pg_engine, monkeypatch):
    server, truth = prometheus_history
    conf = slurm_cluster.env.get("SLURM_CONF")
    monkeypatch.setenv("AIRFLOW_CONN_PROMETHEUS_HPC", json.dumps(
        {"conn_type": "http", "host": server.url, "extra": {"slurm_conf": conf}}))
    ctx = _ctx(pg_engine)
    start = pd.Timestamp("2026-01-05T06:00Z").to_pydatetime()
    window = pipeline.Window(start, start + timedelta(hours=1))
    result = pipeline.extract(ctx, "hpc", window)
    with pg_engine.connect() as conn:
        rows = pd.read_sql(sa.select(sample).where(sample.c.platform == "hpc"), conn)
        run = conn.execute(sa.select(extract_run)).one()
        inv = conn.execute(sa.select(sa.func.count()).select_from(inventory_node)).scalar()
    assert run.status == "success" and run.rows == len(rows) == result["rows"] > 0
    totals = rows[rows["entity_kind"] == "platform"]
    assert {"gpu_capacity", "gpu_allocated"} <= set(totals["metric"])
    # node state is live-only: a past window keeps its usage and says so, with no snapshot
    assert inv == 0 and "cannot be recovered" in result["inventory"] and "cannot be recovered" in run.error
    # rerunning the window replaces it with identical rows
    pipeline.extract(ctx, "hpc", window)
    with pg_engine.connect() as conn:
        again = pd.read_sql(sa.select(sample).where(sample.c.platform == "hpc"), conn)
    key = ["entity_kind", "entity_id", "metric", "ts"]
    pd.testing.assert_frame_equal(rows.sort_values(key).reset_index(drop=True), again.sort_values(key).reset_index(drop=True))


def test_live_window_snapshots_the_real_slurm_inventory(prometheus_history, slurm_cluster, pg_engine, monkeypatch):
    from datetime import datetime, timezone

    server, _ = prometheus_history
    monkeypatch.setenv("AIRFLOW_CONN_PROMETHEUS_HPC", json.dumps(
        {"conn_type": "http", "host": server.url, "extra": {"slurm_conf": slurm_cluster.env.get("SLURM_CONF")}}))
    ctx = _ctx(pg_engine)
    end = datetime.now(timezone.utc).replace(second=0, microsecond=0)
    pipeline.extract(ctx, "hpc", pipeline.Window(end - timedelta(minutes=10), end))
    with pg_engine.connect() as conn:
        nodes = conn.execute(sa.select(inventory_node)).all()
    assert [n.node for n in nodes] == [slurm_cluster.node] and nodes[0].gpus == 4


def test_missing_connection_is_a_clear_error(pg_engine, monkeypatch):
    monkeypatch.delenv("AIRFLOW_CONN_PROMETHEUS_HPC", raising=False)
    ctx = _ctx(pg_engine)
    window = pipeline.Window(pd.Timestamp("2026-01-05T06:00Z").to_pydatetime(), pd.Timestamp("2026-01-05T07:00Z").to_pydatetime())
    with pytest.raises(ValueError, match="AIRFLOW_CONN_PROMETHEUS_HPC"):
        pipeline.extract(ctx, "hpc", window)
    with pg_engine.connect() as conn:
        run = conn.execute(sa.select(extract_run)).one()
    assert run.status == "failed" and "prometheus_hpc" in run.error
