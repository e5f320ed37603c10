"""A platform extracted in parts (node ranges + its platform-wide series) through the real
clients against the virtual datacenter's facades: the parts together stage exactly what one
whole extraction stages, and a failing part loses nothing and says which part failed."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import numpy as np
import pandas as pd
import pytest
import sqlalchemy as sa
import yaml

from gpupool import pipeline
from gpupool.canonical import SERIES_KEY
from gpupool.config import load_config
from gpupool.emulator.serve import make_state, serve_in_thread
from gpupool.staging import reads
from gpupool.staging.schema import extract_run, inventory_node, part_sample, sample

T0 = datetime(2026, 6, 1, tzinfo=timezone.utc)
NOW = T0 + timedelta(hours=12)
HOUR = pipeline.Window(NOW - timedelta(hours=1), NOW)


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    spec = {
        "step": "5min", "decision_every": "1h", "node_gpus": 4, "move_minutes": 30, "max_moves_per_decision": 4,
        "start": T0.isoformat(), "end": (T0 + timedelta(days=1)).isoformat(), "seed": 5,
        "platforms": {
            "openstack": {"synthetic": {"base": 6, "total_gpus": 12}, "nodes": 3},
            "slurm": {"synthetic": {"base": 26, "total_gpus": 36, "bursts_per_day": 4}, "nodes": 9},
            "kubernetes": {"synthetic": {"base": 18, "total_gpus": 28}, "nodes": 7},
        },
    }
    path = tmp_path_factory.mktemp("shards") / "scenario.yaml"
    path.write_text(yaml.safe_dump(spec))
    state = make_state(path, speed=0, start_at=NOW.isoformat())
    with serve_in_thread(state) as s:
        yield s


@pytest.fixture
def config(servers, monkeypatch, tmp_path):
    u = servers.urls
    monkeypatch.setenv("AIRFLOW_CONN_OPENSTACK_VDC", json.dumps(
        {"conn_type": "http", "host": u["keystone"], "login": "admin", "password": "gpupool-sim",
         "extra": {"project_name": "admin"}}))
    monkeypatch.setenv("AIRFLOW_CONN_PROMETHEUS_VDC", json.dumps(
        {"conn_type": "http", "host": u["prometheus"], "extra": {"restd_url": u["slurmrestd"], "live_tolerance_minutes": None}}))
    monkeypatch.setenv("AIRFLOW_CONN_KUBERNETES_VDC", json.dumps(
        {"conn_type": "http", "host": u["kubernetes"], "extra": {"prometheus_url": u["prometheus"]}}))

    def load(shard_nodes: int | None):
        raw = yaml.safe_load(open("config/compose/platforms.yaml"))
        for p in raw["platforms"]:
            if p["name"] != "openstack":  # its history comes from Gnocchi: one part
                p["shard_nodes"] = shard_nodes
        path = tmp_path / f"platforms-{shard_nodes}.yaml"
        path.write_text(yaml.safe_dump(raw))
        return load_config(path)

    return load


def _samples(engine) -> pd.DataFrame:
    with engine.connect() as conn:
        frame = pd.read_sql(sa.select(sample).where(sample.c.ts >= HOUR.start, sample.c.ts < HOUR.end), conn)
    frame["ts"] = pd.to_datetime(frame["ts"], utc=True)
    return frame.sort_values(SERIES_KEY + ["ts"]).reset_index(drop=True)


def _plan(ctx, platform, window=HOUR) -> list:
    """The staged plan of the platform's window: rows (part, position, parts, nodes)."""
    return reads.extract_plan(ctx.engine, platform, window.start, window.end)


def _extract_sharded(ctx, window=HOUR, fail=None) -> list[dict]:
    parts = pipeline.plan_extract(ctx, window)
    for part in parts:
        pipeline.extract_part(ctx, part, window)
    for name in ctx.platforms():
        pipeline.finish_extract(ctx, name, window, parts)
    return parts


def test_sharded_extract_stages_what_a_whole_one_stages(config, pg_engine, sqlite_engine):
    whole = pipeline.Context(config(None), sqlite_engine)
    for name in whole.platforms():
        pipeline.extract(whole, name, HOUR)
    sharded = pipeline.Context(config(3), pg_engine)
    parts = _extract_sharded(sharded)

    # node ranges of at most 3 (as even as possible), in name order, each node in exactly one,
    # then a platform-wide part; openstack (Gnocchi) is not sharded. The facade is one
    # Prometheus for both clusters: each platform lists only its own nodes (prometheus_match).
    assert [p for p in parts if p["platform"] == "openstack"] == [{"platform": "openstack"}]
    assert _plan(sharded, "openstack") == []
    for name, at_least in (("slurm", 9), ("kubernetes", 7)):
        mine = [p for p in parts if p["platform"] == name]
        assert all(p["count"] == len(mine) for p in mine) and [p["index"] for p in mine] == list(range(len(mine)))
        plan = _plan(sharded, name)
        assert [r.position for r in plan] == list(range(len(mine))) and all(r.parts == len(mine) for r in plan)
        ranges = [r.nodes for r in plan[:-1]]
        assert plan[-1].nodes is None and "platform-wide" in plan[-1].part
        sizes = [len(r) for r in ranges]
        assert max(sizes) <= 3 and max(sizes) - min(sizes) <= 1 and len(ranges) >= 3
        flat = [n for r in ranges for n in r]
        assert flat == sorted(set(flat)) and len(flat) == at_least
    a, b = _samples(sqlite_engine), _samples(pg_engine)
    assert len(a) > 1000
    pd.testing.assert_frame_equal(a.drop(columns="value"), b.drop(columns="value"))
    # platform totals are sums: in another order they may differ in the last bit
    assert np.allclose(a["value"], b["value"], rtol=1e-12, atol=0)
    assert set(b.loc[b["entity_kind"] == "platform", "platform"]) == {"openstack", "slurm", "kubernetes"}
    with pg_engine.connect() as conn:
        left = conn.execute(sa.select(sa.func.count()).select_from(part_sample)).scalar()
        runs = conn.execute(sa.select(extract_run.c.platform, extract_run.c.part, extract_run.c.status)).all()
        inv = conn.execute(sa.select(sa.func.count()).select_from(inventory_node)).scalar()
    assert left == 0  # the parts are cleared once promoted
    assert all(r.status == "success" for r in runs)
    assert len([r for r in runs if r.part is None]) == 3
    assert sorted(r.part for r in runs if r.part) == sorted(r.part for n in ("slurm", "kubernetes") for r in _plan(sharded, n))
    assert inv == 3 + 9 + 7
    assert pipeline.summary(sharded, HOUR)["extract"]["slurm"]["status"] == "success"
    # the platform's row counts every row it now has in the window, parts and totals alike
    got = {p: e["rows"] for p, e in pipeline.summary(sharded, HOUR)["extract"].items()}
    assert got == b.groupby("platform").size().to_dict()


def test_a_failing_part_loses_nothing_and_is_named(config, pg_engine, monkeypatch):
    from gpupool.sources.base import SourceError
    from gpupool.sources.slurm import SlurmSource

    ctx = pipeline.Context(config(3), pg_engine)
    _extract_sharded(ctx)
    before = _samples(pg_engine)

    # the same window again, and the second node range of slurm cannot be read this time
    parts = pipeline.plan_extract(ctx, HOUR)
    broken = [p for p in parts if p["platform"] == "slurm"][1]
    planned = _plan(ctx, "slurm")[1]
    real_usage = SlurmSource.usage

    def usage(self, start, end, step="5min", shard=None):
        if shard is not None and shard.nodes == tuple(planned.nodes):
            raise SourceError("slurm", "http://prometheus/api/v1/query_range", "window", "HTTP 503: overloaded")
        return real_usage(self, start, end, step, shard=shard)

    monkeypatch.setattr(SlurmSource, "usage", usage)
    failed = []
    for part in parts:
        try:
            pipeline.extract_part(ctx, part, HOUR)
        except SourceError:
            failed.append(part)
    assert failed == [broken]
    with pytest.raises(pipeline.ExtractPartsError) as err:
        pipeline.finish_extract(ctx, "slurm", HOUR, parts)
    message = str(err.value)
    slurm_parts = [p for p in parts if p["platform"] == "slurm"]
    assert planned.part in message and "HTTP 503: overloaded" in message
    assert f"1 of {len(slurm_parts)} parts did not succeed" in message
    for name in ("openstack", "kubernetes"):
        pipeline.finish_extract(ctx, name, HOUR, parts)

    # slurm keeps its previous rows; the parts that succeeded wait in part_sample
    pd.testing.assert_frame_equal(_samples(pg_engine), before)
    with pg_engine.connect() as conn:
        waiting = conn.execute(sa.select(part_sample.c.part).distinct().where(part_sample.c.platform == "slurm")).scalars().all()
        row = conn.execute(sa.select(extract_run).where(extract_run.c.platform == "slurm", extract_run.c.part.is_(None))
                           .order_by(extract_run.c.id.desc()).limit(1)).first()
    assert sorted(waiting) == sorted(r.part for r in _plan(ctx, "slurm") if r.part != planned.part)
    assert row.status == "failed" and planned.part in row.error
    assert pipeline.summary(ctx, HOUR)["extract"]["slurm"]["status"] == "failed"

    # the failed part alone is rerun, then the platform is finished: the same rows as before
    monkeypatch.setattr(SlurmSource, "usage", real_usage)
    pipeline.extract_part(ctx, broken, HOUR)
    out = pipeline.finish_extract(ctx, "slurm", HOUR, parts)
    assert out["parts"] == len(slurm_parts)
    pd.testing.assert_frame_equal(_samples(pg_engine), before)
    assert pipeline.summary(ctx, HOUR)["extract"]["slurm"]["status"] == "success"


def test_a_whole_platform_that_failed_stops_what_follows(config, sqlite_engine):
    ctx = pipeline.Context(config(None), sqlite_engine)
    with pytest.raises(pipeline.ExtractPartsError, match="platform slurm .* did not succeed: never ran"):
        pipeline.finish_extract(ctx, "slurm", HOUR, [{"platform": "slurm"}])


def test_parts_whose_rows_are_gone_are_not_promoted(config, pg_engine):
    ctx = pipeline.Context(config(3), pg_engine)
    _extract_sharded(ctx)
    before = _samples(pg_engine)
    parts = pipeline.plan_extract(ctx, HOUR)
    for part in parts:
        pipeline.extract_part(ctx, part, HOUR)
    first = _plan(ctx, "kubernetes")[0]
    with pg_engine.begin() as conn:  # the landing area lost a part's rows (e.g. cleared by hand)
        conn.execute(part_sample.delete().where(part_sample.c.part == first.part))
    with pytest.raises(Exception, match="the parts landed .* rows but .* are there: rerun the parts"):
        pipeline.finish_extract(ctx, "kubernetes", HOUR, parts)
    pd.testing.assert_frame_equal(_samples(pg_engine), before)


def test_xcom_carries_no_node_names(config, pg_engine):
    """What the DAG passes between tasks (the plan's parts, each mapped task's argument and
    what it returns) names no node and stays small however many nodes a range holds: the
    node ranges are in staging's plan."""
    ctx = pipeline.Context(config(3), pg_engine)
    parts = pipeline.plan_extract(ctx, HOUR)
    nodes = {n for name in ("slurm", "kubernetes") for r in _plan(ctx, name) for n in (r.nodes or [])}
    assert len(nodes) >= 16
    for part in parts:
        assert set(part) <= {"platform", "index", "count"}
        text = json.dumps(part)
        assert len(text) < 80 and not [n for n in nodes if n in text], text
        out = pipeline.extract_part(ctx, part, HOUR)
        text = json.dumps(out, default=str)
        assert len(text) < 400 and not [n for n in nodes if n in text], text
    for name in ctx.platforms():
        text = json.dumps(pipeline.finish_extract(ctx, name, HOUR, parts), default=str)
        assert not [n for n in nodes if n in text], text


def test_a_part_of_a_replaced_plan_is_refused(config, pg_engine):
    """A mapped part whose plan was replaced by a smaller one (e.g. extract_parts rerun after
    nodes left) is refused, naming itself, rather than reading another range."""
    ctx = pipeline.Context(config(3), pg_engine)
    stale = [p for p in pipeline.plan_extract(ctx, HOUR) if p["platform"] == "slurm"][-1]
    fewer = pipeline.Context(config(100), pg_engine)  # every platform now fits in one part
    assert [p for p in pipeline.plan_extract(fewer, HOUR) if p["platform"] == "slurm"] == [{"platform": "slurm"}]
    assert _plan(ctx, "slurm") == []
    label = f"part {stale['index'] + 1}/{stale['count']} is not in the extraction plan"
    with pytest.raises(pipeline.ExtractPartsError, match=f"platform slurm .*{label} in staging \\(it holds no plan\\)"):
        pipeline.extract_part(ctx, stale, HOUR)
    with pytest.raises(pipeline.ExtractPartsError, match=label):
        pipeline.finish_extract(ctx, "slurm", HOUR, [stale])
