"""The extract stage on the embedded virtual datacenter, on SQLite and on the real PostgreSQL:
all or nothing per platform and window, and runs that never finished are marked as such."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pandas as pd
import pytest
import sqlalchemy as sa

from gpupool import pipeline
from gpupool.config import default_config
from gpupool.platforms import EmbeddedWorldSource
from gpupool.staging import runs as run_store
from gpupool.staging.schema import extract_run, inventory_node, sample
from gpupool.summary import format_summary

END = datetime(2026, 11, 1, 1, tzinfo=timezone.utc)
WINDOW = pipeline.Window(END - timedelta(hours=1), END)


def _ctx(engine):
    return pipeline.Context(default_config(), engine)


def _staged(engine, platform):
    with engine.connect() as conn:
        s = pd.read_sql(sa.select(sample).where(sample.c.platform == platform), conn)
        inv = pd.read_sql(sa.select(inventory_node).where(inventory_node.c.platform == platform), conn)
    key = ["entity_kind", "entity_id", "metric", "ts"]
    return s.sort_values(key).reset_index(drop=True), inv.sort_values("node").reset_index(drop=True)


def _runs(engine):
    with engine.connect() as conn:
        return conn.execute(sa.select(extract_run).order_by(extract_run.c.id)).all()


def test_extract_stages_the_embedded_inventory_with_mig_layouts(engine):
    """The embedded world's nodes carry MIG layouts (JSON): PostgreSQL's COPY used to fail on them."""
    out = pipeline.extract(_ctx(engine), "kubernetes", WINDOW)
    samples, inv = _staged(engine, "kubernetes")
    assert out["rows"] == len(samples) > 0 and out["nodes"] == len(inv) > 0
    layouts = [v for v in inv["mig_layout"] if v is not None]
    assert layouts and all(isinstance(v, dict) and v.get("config") for v in layouts)
    (run,) = _runs(engine)
    assert (run.status, run.rows, run.error) == ("success", len(samples), None)


def test_a_failed_extract_keeps_the_previous_samples_and_inventory(engine, monkeypatch):
    ctx = _ctx(engine)
    pipeline.extract(ctx, "slurm", WINDOW)
    before = _staged(engine, "slurm")

    def broken(self, at):
        raise RuntimeError("inventory API answered 500")

    monkeypatch.setattr(EmbeddedWorldSource, "usage",
                        lambda self, s, e, step="5min", _orig=EmbeddedWorldSource.usage: _orig(self, s, e, step).assign(value=lambda f: f["value"] + 1))
    monkeypatch.setattr(EmbeddedWorldSource, "inventory", broken)
    with pytest.raises(RuntimeError, match="answered 500"):
        pipeline.extract(ctx, "slurm", WINDOW)
    after = _staged(engine, "slurm")
    pd.testing.assert_frame_equal(before[0], after[0])  # the new (shifted) samples were not committed
    pd.testing.assert_frame_equal(before[1], after[1])
    first, second = _runs(engine)
    assert first.status == "success"
    assert second.status == "failed" and second.rows is None and "answered 500" in second.error


def test_a_run_that_never_finished_is_marked_interrupted_by_the_next(engine):
    ctx = _ctx(engine)
    dead = run_store.start_extract_run(engine, "slurm", "usage", WINDOW.start, WINDOW.end)  # a worker killed mid-extract
    other = run_store.start_extract_run(engine, "slurm", "usage", END, END + timedelta(hours=1))
    assert pipeline.summary(ctx, WINDOW)["extract"]["slurm"]["status"] == "running"
    pipeline.extract(ctx, "slurm", WINDOW)
    runs = {r.id: r for r in _runs(engine)}
    assert runs[dead].status == "interrupted" and "superseded by extract run" in runs[dead].error
    assert runs[dead].finished_at is not None
    assert runs[other].status == "running"  # another window's run is not this one's business
    s = pipeline.summary(ctx, WINDOW)
    assert s["extract"]["slurm"]["status"] == "success" and s["extract"]["slurm"]["interrupted"] == 1
    assert "1 earlier run(s) interrupted" in format_summary(s)
