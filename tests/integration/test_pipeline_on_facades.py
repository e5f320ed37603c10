"""The whole pipeline through the real client libraries against the virtual datacenter's
HTTP facades — configured exactly like a deployment (platforms.yaml + connections), so the
sources cannot tell the simulator from a real platform."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pandas as pd
import sqlalchemy as sa
import yaml

from gpupool import pipeline
from gpupool.config import load_config
from gpupool.emulator.serve import make_state, serve_in_thread
from gpupool.staging.schema import allocation_plan, clean_sample, extract_run, forecast, inventory_node, sample

T0 = datetime(2026, 6, 1, tzinfo=timezone.utc)
NOW = T0 + timedelta(days=3)


def _scenario(tmp_path):
    spec = {
        "step": "5min", "decision_every": "1h", "node_gpus": 8, "move_minutes": 30, "max_moves_per_decision": 4,
        "start": T0.isoformat(), "end": (T0 + timedelta(days=4)).isoformat(), "seed": 3,
        "platforms": {
            "openstack": {"synthetic": {"base": 30, "total_gpus": 48}, "nodes": 6},
            "slurm": {"synthetic": {"base": 50, "total_gpus": 64}, "nodes": 8},
            "kubernetes": {"synthetic": {"base": 35, "daily_amplitude": 0.4, "total_gpus": 48}, "nodes": 6,
                           "gpu_model": "NVIDIA H100 80GB HBM3"},
        },
    }
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_pipeline_through_real_clients_on_the_facades(tmp_path, pg_engine, monkeypatch):
    state = make_state(_scenario(tmp_path), speed=0, start_at=NOW.isoformat())
    with serve_in_thread(state) as servers:
        u = servers.urls
        monkeypatch.setenv("AIRFLOW_CONN_OPENSTACK_VDC", json.dumps(
            {"conn_type": "http", "host": u["keystone"], "login": "admin", "password": "gpupool-sim", "extra": {"project_name": "admin"}}))
        monkeypatch.setenv("AIRFLOW_CONN_PROMETHEUS_VDC", json.dumps(
            {"conn_type": "http", "host": u["prometheus"], "extra": {"restd_url": u["slurmrestd"], "live_tolerance_minutes": None}}))
        monkeypatch.setenv("AIRFLOW_CONN_KUBERNETES_VDC", json.dumps(
            {"conn_type": "http", "host": u["kubernetes"], "extra": {"prometheus_url": u["prometheus"]}}))
        cfg = load_config("config/compose/platforms.yaml")
        ctx = pipeline.Context(cfg, pg_engine)
        history = pipeline.Window(NOW - timedelta(days=1, hours=1), NOW - timedelta(hours=1))
        hour = pipeline.Window(NOW - timedelta(hours=1), NOW)
        for p in ctx.platforms():
            pipeline.extract(ctx, p, history)
            pipeline.detect(ctx, p, history)
        report = pipeline.run_window(ctx, hour, policy="predictive", dry_run=True)

    with pg_engine.connect() as conn:
        runs = conn.execute(sa.select(extract_run).where(extract_run.c.window_start == hour.start)).all()
        totals = pd.read_sql(sa.select(sample).where(sample.c.entity_kind == "platform", sample.c.ts >= history.start), conn)
        nodes = pd.read_sql(sa.select(inventory_node).where(inventory_node.c.snapshot_at == hour.end), conn)
        cleaned = conn.execute(sa.select(sa.func.count()).select_from(clean_sample)).scalar()
        fc = conn.execute(sa.select(sa.func.count()).select_from(forecast).where(forecast.c.issued_at == hour.end)).scalar()
        plans = conn.execute(sa.select(allocation_plan).where(allocation_plan.c.decided_at == hour.end)).all()
    assert {r.platform: r.status for r in runs} == {"openstack": "success", "slurm": "success", "kubernetes": "success"}
    for p in ("openstack", "slurm", "kubernetes"):
        demand = totals[(totals["platform"] == p) & (totals["metric"] == "gpu_allocated")]
        # a day of 5-minute totals (288), derived from per-node series where needed; a total is
        # left out where fewer nodes reported than usual (idle nodes have no busy-GPU series)
        assert len(demand) > 150, p
    assert sorted(nodes.groupby("platform")["node"].count().to_dict().items()) == [("kubernetes", 6), ("openstack", 6), ("slurm", 8)]
    assert cleaned > 0 and fc == 3 * cfg.limits.horizon_hours and len(plans) == 1
    assert report["plan"]["solver"] == "milp"  # a greedy fallback here would hide a solver failure
