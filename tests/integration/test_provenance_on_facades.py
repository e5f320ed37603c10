"""Faults by provenance on the virtual datacenter: the scenario's `faults:` show in the Prometheus
facade as a real exporter's would, the real Slurm source stages each demand metric's health
series, and the detect stage catches every fault the health series reveal, and nothing else."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import numpy as np
import pandas as pd
import sqlalchemy as sa
import yaml

from gpupool import pipeline
from gpupool.canonical import HEALTH_ENTITY_KIND
from gpupool.config import load_config
from gpupool.detect.provenance import health_rows, provenance_faults
from gpupool.emulator.prometheus import SeriesStore
from gpupool.emulator.serve import make_state, serve_in_thread
from gpupool.staging import reads
from gpupool.staging.schema import clean_sample

T0 = datetime(2026, 6, 1, tzinfo=timezone.utc)
NOW = T0 + timedelta(days=3)
STEP = pd.Timedelta("5min")


def _scenario(tmp_path):
    spec = {
        "step": "5min", "decision_every": "1h", "node_gpus": 8, "move_minutes": 30, "max_moves_per_decision": 4,
        "start": T0.isoformat(), "end": (T0 + timedelta(days=4)).isoformat(), "seed": 3,
        "faults": {"seed": 11, "drop": 3, "spike": 2, "gap": 3, "reset": 2, "stuck": 3},
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


def _known_from_source(plan: dict, silent: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """The steps whose reading a real exporter's health shows as no measurement: down (drop,
    reset, gap, the world's silent exporter) or stuck (every repeat after the run's first step)."""
    down = plan["gap"] | ((plan["scale"] != 1.0) & (plan["add"] == 0.0)) | silent
    stuck = (plan["hold"] >= 0) & (plan["hold"] != np.arange(len(plan["hold"])))
    return (down | stuck)[steps]


def test_every_fault_on_a_target_with_health_is_caught_by_provenance_and_none_else(tmp_path, pg_engine, monkeypatch):
    state = make_state(_scenario(tmp_path), speed=0, start_at=NOW.isoformat())
    history = pipeline.Window(NOW - timedelta(days=2), NOW - timedelta(hours=1))
    with serve_in_thread(state) as servers:
        u = servers.urls
        monkeypatch.setenv("AIRFLOW_CONN_OPENSTACK_VDC", json.dumps(
            {"conn_type": "http", "host": u["keystone"], "login": "admin", "password": "gpupool-sim", "extra": {"project_name": "admin"}}))
        monkeypatch.setenv("AIRFLOW_CONN_PROMETHEUS_VDC", json.dumps(
            {"conn_type": "http", "host": u["prometheus"], "extra": {"restd_url": u["slurmrestd"], "live_tolerance_minutes": None}}))
        monkeypatch.setenv("AIRFLOW_CONN_KUBERNETES_VDC", json.dumps(
            {"conn_type": "http", "host": u["kubernetes"], "extra": {"prometheus_url": u["prometheus"]}}))
        ctx = pipeline.Context(load_config("config/compose/platforms.yaml"), pg_engine)
        results = {}
        for p in ctx.platforms():
            pipeline.extract(ctx, p, history)
            results[p] = pipeline.detect(ctx, p, history)
    plans = SeriesStore(state).plans()
    silent = state.world.exporter_distortion("slurm")[1]
    staged = reads.read_samples(pg_engine, history.start, history.end, None)
    with pg_engine.connect() as conn:
        judged = pd.read_sql(sa.select(clean_sample).where(clean_sample.c.entity_kind == "platform"), conn)

    # the Slurm demand gauges' targets and the Gnocchi meters say how their readings were made
    health = staged[staged["entity_kind"] == HEALTH_ENTITY_KIND]
    meters = {("openstack", m) for m in ("gpu_capacity", "gpu_allocated", "gpu_util", "gpu_pending")}
    assert set(zip(health["platform"], health["entity_id"])) == {("slurm", "gpu_allocated"), ("slurm", "gpu_pending")} | meters
    assert results["kubernetes"]["provenance_faults"] == 0
    # Gnocchi's gaps are the steps the world's OpenStack exporter was silent, and only those
    grid_os = pd.date_range(history.start, history.end, freq=STEP, inclusive="left")
    down = health[(health["platform"] == "openstack") & (health["metric"] == "health_up") & (health["value"] == 0)]
    os_silent = state.world.exporter_distortion("openstack")[1][[state.step_of(t) for t in grid_os]]
    assert set(down["ts"]) == set(grid_os[os_silent])

    grid = pd.date_range(history.start, history.end, freq=STEP, inclusive="left")
    steps = np.array([state.step_of(t) for t in grid])
    caught_total = 0
    for metric in ("gpu_allocated", "gpu_pending"):
        key = ("slurm", "", "platform", "", metric)
        known = provenance_faults(grid, health_rows(health, key), STEP)
        truth = _known_from_source(plans[metric], silent, steps)
        assert truth.sum() > 10, metric  # the scenario injects faults of every kind in the window
        missed, extra = np.flatnonzero(truth & ~known), np.flatnonzero(known & ~truth)
        assert not len(missed), f"{metric}: faults the health series did not show at {grid[missed][:5].tolist()}"
        assert not len(extra), f"{metric}: no fault injected at {grid[extra][:5].tolist()}"
        # the detect stage cleaned every reading at those points as a fault, and raised no alarm there
        rows = judged[(judged["platform"] == "slurm") & (judged["metric"] == metric)].set_index("ts").sort_index()
        at = rows.index.isin(grid[known]) & rows["value"].notna().to_numpy()
        assert at.sum() > 0
        assert rows.loc[at, "cleaned"].all() and not rows.loc[at, "is_anomaly"].any(), metric
        caught_total += int(at.sum())
        # a spike leaves no trace in the health series: the value rules judge it
        plan = plans[metric]
        spikes = (plan["add"] > 0)[steps]
        assert not (known & spikes & ~truth).any()
    assert results["slurm"]["provenance_faults"] >= caught_total
