"""Two writers spending one rolling-hour move budget at once: a fast-path tick from the CLI beside
the DAG's, and a plan's actuation beside a tick. Each reads the handovers opened in the last hour,
then opens its own; the read is slowed so that, without the pool's move-budget lock, both read
before either opens and the hour gets more moves than ``limits.max_moves_per_decision``."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest

from gpupool.actuation import handover as ho
from gpupool.jobs import allocation as service
from gpupool.jobs.fastpath import run_fastpath
from gpupool.config import parse_config
from gpupool.pipeline import Context
from gpupool.staging import fastpath as store
from gpupool.staging.schema import allocation_plan

from tests.staging.test_fastpath_tick import AT, FakeSource

CFG = parse_config({"platforms": [{"name": n, "kind": "simulator", "min_nodes": 1} for n in ("slurm", "k8s")],
                    "limits": {"max_moves_per_decision": 1}})


def _sources(idle):
    return {"slurm": FakeSource("slurm", 56, 20.0, [], [f"s{i}" for i in range(8)]),
            "k8s": FakeSource("k8s", 8, 0, [idle], [f"k{i}" for i in range(6)])}


def _plan(engine, at, moves=()):
    with engine.begin() as conn:
        return conn.execute(allocation_plan.insert().values(
            decided_at=at, policy="predictive", solver="milp", dry_run=True, moves=list(moves),
            summary={"platforms": {"slurm": {"demand_upper": [60.0]}, "k8s": {"demand_upper": [8.0]}}})
        ).inserted_primary_key[0]


@pytest.fixture
def slow_budget_read(monkeypatch):
    """The budget read of every writer takes a while after it has read: the window two writers race in."""
    real = store.handovers_opened_between

    def slow(*a, **kw):
        rows = real(*a, **kw)
        time.sleep(0.6)
        return rows

    monkeypatch.setattr(store, "handovers_opened_between", slow)


def _both(*calls):
    errors = []

    def run(call):
        try:
            call()
        except Exception as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(c,)) for c in calls]
    for t in threads:
        t.start()
        time.sleep(0.1)  # the second starts while the first sits in its budget read
    for t in threads:
        t.join(30)
    assert not errors, errors


def test_two_fastpath_ticks_share_one_budget(engine, slow_budget_read):
    ctx = Context(CFG, engine)
    _plan(engine, AT - timedelta(minutes=5))
    _both(lambda: run_fastpath(ctx, AT, sources=_sources("k3")),
          lambda: run_fastpath(ctx, AT + timedelta(minutes=1), sources=_sources("k4")))
    assert len(ho.list_handovers(engine)) == 1
    later = store.decisions_at(engine, AT + timedelta(minutes=1)) or store.decisions_at(engine, AT)
    assert any("move budget spent" in r["reason"] for r in later)


def test_a_plan_actuation_and_a_tick_share_one_budget(engine, slow_budget_read):
    ctx = Context(CFG, engine)
    plan_id = _plan(engine, AT - timedelta(minutes=5), [{"node": "k4", "from": "k8s", "to": "slurm", "gpus": 8}])
    out = {}
    _both(lambda: out.setdefault("plan", service.actuate_plan(ctx, plan_id, at=AT)),
          lambda: run_fastpath(ctx, AT + timedelta(seconds=30), sources=_sources("k3")))
    assert len(ho.list_handovers(engine)) == 1
    ticked = store.decisions_at(engine, AT + timedelta(seconds=30))
    assert out["plan"]["opened"] or any("move budget spent" in r["reason"] for r in ticked)
    assert out["plan"]["opened"] or "move budget spent" in out["plan"]["skipped"][0]["why"]
