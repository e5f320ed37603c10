"""Gnocchi's measures missing at the archive policy's granularity, read from the facade as a
deployment reads them, become the meter's health series; the pipeline stages them and the
detect stage takes those steps as faults by provenance: filled or cleaned, never alarmed."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import numpy as np
import openstack
import pandas as pd
import sqlalchemy as sa
import yaml

from gpupool import pipeline
from gpupool.canonical import HEALTH_ENTITY_KIND, normalize_samples
from gpupool.config import load_config
from gpupool.emulator.serve import DEFAULT_PASSWORD, make_state, serve_in_thread
from gpupool.sources.openstack import GnocchiMeter, OpenStackSource
from gpupool.staging.schema import clean_sample

T0 = datetime(2026, 6, 1, tzinfo=timezone.utc)
NOW = T0 + timedelta(days=3)
STEP = pd.Timedelta("5min")
METERS = {
    "gpu_allocated": GnocchiMeter("gpu.allocated"),
    "gpu_pending": GnocchiMeter("gpu.pending", entity_kind="partition", resource_type="generic",
                                group_by="original_resource_id"),
}


def _state(tmp_path):
    """A world whose OpenStack exporter goes silent now and then (no moves: nodes stay put)."""
    spec = {
        "step": "5min", "decision_every": "1h", "node_gpus": 8, "start": T0.isoformat(),
        "end": (T0 + timedelta(days=4)).isoformat(), "seed": 5,
        "platforms": {"openstack": {"synthetic": {"base": 20, "total_gpus": 32, "anomalies": {
            "gap": 8, "drop": 0, "spike": 0, "point": 0, "counter_reset": 0}}, "nodes": 4}},
    }
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(spec))
    return make_state(path, speed=0, start_at=NOW.isoformat())


def _silent(state, grid: pd.DatetimeIndex) -> np.ndarray:
    """The world's truth: the steps of ``grid`` at which the OpenStack exporter reported nothing."""
    gap = state.world.exporter_distortion("openstack")[1]
    return gap[[state.step_of(t) for t in grid]]


def test_missing_measures_are_the_meters_health_gaps(tmp_path):
    state = _state(tmp_path)
    start, end = NOW - timedelta(days=2), NOW - timedelta(hours=1)
    grid = pd.date_range(start, end, freq=STEP, inclusive="left")
    truth = _silent(state, grid)
    assert 5 < truth.sum() < len(grid) // 2  # the scenario's gaps fall in the window
    with serve_in_thread(state) as servers:
        conn = openstack.connect(
            auth_url=servers.urls["keystone"], username="gpupool", password=DEFAULT_PASSWORD,
            project_name="gpupool", user_domain_name="Default", project_domain_name="Default",
            region_name="RegionOne", load_envvars=False, load_yaml_config=False, api_timeout=30)
        frame = OpenStackSource("openstack", connection=conn, with_nova=False, gnocchi_meters=METERS).usage(
            start, end, "5min")
    assert normalize_samples(frame, where="gnocchi usage").equals(frame)
    health = frame[frame["entity_kind"] == HEALTH_ENTITY_KIND]
    assert set(health["entity_id"]) == set(METERS)
    for metric in METERS:
        rows = health[health["entity_id"] == metric]
        up = rows[rows["metric"] == "health_up"].set_index("ts")["value"].reindex(grid)
        assert up.notna().all(), metric  # one health row per granularity step of the window
        assert np.array_equal(up.to_numpy() == 0, truth), metric
        # and no measure of the meter at a gap: the value is absent, the health says why
        values = frame[(frame["metric"] == metric) & (frame["entity_kind"] != HEALTH_ENTITY_KIND)]
        assert not values["ts"].isin(grid[truth]).any()
        age = rows[rows["metric"] == "health_sample_age_seconds"].set_index("ts")["value"].reindex(grid)
        assert (age[~truth] == 0).all() and (age[truth].dropna() >= STEP.total_seconds()).all()


def test_extract_stages_the_gaps_and_detect_takes_them_by_provenance(tmp_path, pg_engine, monkeypatch):
    state = _state(tmp_path)
    history = pipeline.Window(NOW - timedelta(days=2), NOW - timedelta(hours=1))
    with serve_in_thread(state) as servers:
        monkeypatch.setenv("AIRFLOW_CONN_OPENSTACK_VDC", json.dumps(
            {"conn_type": "http", "host": servers.urls["keystone"], "login": "admin", "password": "gpupool-sim",
             "extra": {"project_name": "admin"}}))
        cfg = load_config("config/compose/platforms.yaml")
        ctx = pipeline.Context(cfg, pg_engine)
        pipeline.extract(ctx, "openstack", history)
        result = pipeline.detect(ctx, "openstack", history)
    grid = pd.date_range(history.start, history.end, freq=STEP, inclusive="left")
    truth = _silent(state, grid)
    with pg_engine.connect() as conn:
        judged = pd.read_sql(sa.select(clean_sample).where(clean_sample.c.platform == "openstack",
                                                           clean_sample.c.entity_kind == "platform"), conn)
    judged["ts"] = pd.to_datetime(judged["ts"], utc=True)
    assert result["provenance_faults"] > 0
    for metric in ("gpu_allocated", "gpu_pending"):
        rows = judged[judged["metric"] == metric].set_index("ts").sort_index()
        at = rows.index.isin(grid[truth])
        assert at.sum() == truth.sum(), metric  # every silent step is judged, and is known as a fault
        assert not rows.loc[at, "is_anomaly"].any(), metric
        assert (rows.loc[at, "filled"] | rows.loc[at, "cleaned"]).all(), metric
