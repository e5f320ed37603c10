"""One fast-path tick on both staging backends: readings staged and judged, decisions recorded,
the move's handover opened and advanced through the audited handover, a re-run idempotent."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import numpy as np
import pytest
import sqlalchemy as sa

from gpupool.actuation import handover as ho
from gpupool.jobs.fastpath import FastPathReadError, run_fastpath
from gpupool.config import parse_config
from gpupool.pipeline import Context
from gpupool.sources.base import Pressure, SourceError
from gpupool.staging import fastpath as store
from gpupool.staging.schema import allocation_plan, pressure_sample

AT = datetime(2026, 6, 3, 12, 5, tzinfo=timezone.utc)
CFG = parse_config({"platforms": [{"name": n, "kind": "simulator", "min_nodes": 1} for n in ("slurm", "k8s")]})


class FakeSource:
    def __init__(self, platform, alloc, pending, idle, nodes):
        self.platform, self.alloc, self.pending, self.idle, self.nodes = platform, alloc, pending, idle, nodes

    def pressure(self, at):
        return Pressure(self.platform, at, self.alloc, self.pending, 8.0 * len(self.nodes), tuple(self.idle),
                        {n: 8 for n in self.nodes}, len(self.nodes), {"gpus_pending": "fake"})


def _sources(pending=20.0):
    return {"slurm": FakeSource("slurm", 56, pending, [], [f"s{i}" for i in range(8)]),
            "k8s": FakeSource("k8s", 8, 0, ["k3", "k4"], [f"k{i}" for i in range(6)])}


def _plan(engine, at):
    with engine.begin() as conn:
        conn.execute(allocation_plan.insert().values(
            decided_at=at, policy="predictive", solver="milp", dry_run=True, moves=[],
            summary={"platforms": {"slurm": {"demand_upper": [60.0]}, "k8s": {"demand_upper": [8.0]}}}))


def test_a_tick_moves_an_idle_node_once(engine):
    ctx = Context(CFG, engine)
    _plan(engine, AT - timedelta(minutes=5))
    out = run_fastpath(ctx, AT, dry_run=True, sources=_sources())
    (opened,) = out["opened"]
    assert (opened["node"], opened["from"], opened["to"], opened["dry_run"]) == ("k3", "k8s", "slurm", True)
    h = ho.get_handover(engine, opened["id"])
    assert h.state == ho.DONE and h.dry_run  # audited on paper, nothing sent
    assert ho.audit_rows(engine, h.id) and all(r["status"] == "dry_run" for r in ho.audit_rows(engine, h.id))
    rows = store.decisions_at(engine, AT)
    move = next(r for r in rows if r["node"])
    assert move["handover_id"] == h.id and move["target"] == "slurm" and move["pressure"]["slurm"]["gpus_pending"] == 20
    assert any(r["platform"] == "k8s" and "no shortage" in r["reason"] for r in rows)
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(pressure_sample)).scalar() == 6
    again = run_fastpath(ctx, AT, dry_run=True, sources=_sources())
    assert again["repeat"] and len(ho.list_handovers(engine)) == 1
    assert [r["id"] for r in again["decisions"]] == [r["id"] for r in rows]


def test_a_spike_on_steady_readings_is_not_acted_on(engine):
    ctx = Context(CFG, engine)
    _plan(engine, AT - timedelta(minutes=5))
    rng = np.random.default_rng(1)
    rows = []
    for i in range(1, 2 * 288):
        t = AT - timedelta(minutes=5 * i)
        for p, (alloc, pend) in {"slurm": (56, 2), "k8s": (8, 0)}.items():
            rows += [{"platform": p, "metric": "gpu_pending_now", "at": t, "value": float(max(0, pend + rng.integers(-1, 2)))},
                     {"platform": p, "metric": "gpu_allocated_now", "at": t, "value": float(alloc)}]
    with engine.begin() as conn:
        conn.execute(pressure_sample.insert(), rows)
    out = run_fastpath(ctx, AT, dry_run=True, sources=_sources(pending=40.0))
    assert out["opened"] == []
    (slurm,) = [r for r in store.decisions_at(engine, AT) if r["platform"] == "slurm"]
    assert "anomalous" in slurm["reason"] and slurm["pressure"]["anomalous"]


def test_backfill_and_an_unreadable_platform(engine):
    ctx = Context(CFG, engine)
    out = run_fastpath(ctx, AT, backfill=True, sources=_sources())
    assert out["opened"] == [] and "backfill" in out["decisions"][0]["reason"]

    class Down(FakeSource):
        def pressure(self, at):
            raise SourceError("k8s", "https://api:6443 GET /api/v1/nodes", "now", "connection refused")

    _plan(engine, AT)
    later = AT + timedelta(minutes=5)
    with pytest.raises(FastPathReadError, match="k8s.*GET /api/v1/nodes"):
        run_fastpath(ctx, later, sources={**_sources(), "k8s": Down("k8s", 0, 0, [], [])})
    assert any(r["platform"] == "k8s" and "pressure not read" in r["reason"] for r in store.decisions_at(engine, later))
