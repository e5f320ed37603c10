"""Property-based tests of the handover state machine: whatever the interleaving of plans,
runs, work, operator rollbacks and platform API faults (before or after a change is applied),

* no node ever has two open (or failed) handovers,
* no node is ever open for work on two platforms at once,
* once the faults stop, later runs (and rollbacks of failed handovers) bring every handover to
  ``done`` or ``rolled_back`` with every node open on exactly one platform.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpupool.allocate import handover as ho
from gpupool.allocate.actuators.base import ActuationError
from gpupool.staging.schema import action_audit, handover
from memplatform import make

PLATFORMS = ("openstack", "slurm", "kubernetes")
NODES = ("n1", "n2", "n3")
T0 = datetime(2026, 3, 2, 12, 0, tzinfo=timezone.utc)

ops = st.one_of(
    st.tuples(st.just("open"), st.sampled_from(NODES), st.sampled_from(PLATFORMS)),
    st.tuples(st.just("advance"), st.sampled_from([5, 20, 70])),
    st.tuples(st.just("job"), st.sampled_from(NODES)),
    st.tuples(st.just("finish")),
    st.tuples(st.just("fault"), st.sampled_from(PLATFORMS),
              st.sampled_from([("drain", "before"), ("drain", "after"), ("resume", "before"),
                               ("resume", "after"), ("read", "before")])),
    st.tuples(st.just("rollback"), st.integers(0, 5)),
)


def _blocking_per_node(engine) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(sa.select(handover.c.node, sa.func.count()).where(
            handover.c.state.in_(ho.BLOCKING_STATES)).group_by(handover.c.node)).all()
    return {n: int(c) for n, c in rows}


def _check(engine, dc) -> None:
    assert all(c <= 1 for c in _blocking_per_node(engine).values())
    for node in NODES:  # open for work, or still running work, on at most one platform
        on = [p for p in PLATFORMS if dc.slots[(p, node)].schedulable or dc.slots[(p, node)].jobs]
        assert len(on) <= 1, (node, on)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(program=st.lists(ops, min_size=1, max_size=25))
def test_no_interleaving_breaks_the_safety_rules(sqlite_engine, program):
    engine = sqlite_engine
    with engine.begin() as conn:
        conn.execute(action_audit.delete())
        conn.execute(handover.delete())
    dc, acts = make(PLATFORMS, {"n1": "slurm", "n2": "kubernetes", "n3": "openstack"})
    now = T0
    for op in program:
        kind = op[0]
        if kind == "open":
            _, node, target = op
            owner = next((p for p in PLATFORMS if dc.slots[(p, node)].schedulable), None)
            source = owner or "slurm"
            if source == target:
                continue
            had = _blocking_per_node(engine).get(node, 0)
            try:
                ho.open_handover(engine, node, source, target, now, dry_run=False, timeout=timedelta(hours=1))
                assert had == 0
            except ho.HandoverConflict:
                assert had == 1
        elif kind == "advance":
            now += timedelta(minutes=op[1])
            ho.advance_all(engine, acts, now, dry_run=False)
        elif kind == "job":  # work lands wherever the node is open (nowhere while it moves)
            for p in dc.open_on(op[1]):
                dc.start_job(p, op[1])
        elif kind == "finish":
            dc.finish_jobs()
        elif kind == "fault":
            acts[op[1]].fail.append(op[2])
        elif kind == "rollback":
            hs = sorted(ho.list_handovers(engine), key=lambda h: h.id)
            if hs:
                h = hs[op[1] % len(hs)]
                try:
                    ho.rollback(engine, h.id, acts, at=now)
                except (ho.HandoverError, ActuationError):
                    pass
        _check(engine, dc)

    # the faults stop and the work ends: later runs settle everything
    for a in acts.values():
        a.fail.clear()
    dc.finish_jobs()
    for _ in range(6):
        now += timedelta(minutes=30)
        ho.advance_all(engine, acts, now, dry_run=False)
        for h in ho.list_handovers(engine, (ho.FAILED,)):
            ho.rollback(engine, h.id, acts, at=now)
        _check(engine, dc)
    states = {h.state for h in ho.list_handovers(engine)}
    assert states <= {ho.DONE, ho.ROLLED_BACK}, states
    for node in NODES:
        assert len(dc.open_on(node)) == 1, (node, {p: dc.slots[(p, node)] for p in PLATFORMS})


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(nodes=st.lists(st.sampled_from(NODES), min_size=1, max_size=8),
       targets=st.lists(st.sampled_from(PLATFORMS), min_size=8, max_size=8))
def test_one_open_handover_per_node_whatever_is_asked(sqlite_engine, nodes, targets):
    engine = sqlite_engine
    with engine.begin() as conn:
        conn.execute(handover.delete())
    opened: dict[str, int] = {}
    for node, target in zip(nodes, targets):
        src = "slurm" if target != "slurm" else "openstack"
        try:
            hid = ho.open_handover(engine, node, src, target, T0, dry_run=False)
        except ho.HandoverConflict:
            assert node in opened
            continue
        assert node not in opened
        opened[node] = hid
    assert _blocking_per_node(engine) == {n: 1 for n in opened}


def test_concurrent_opens_on_postgresql_leave_one(pg_engine):
    """Two writers racing for one node on PostgreSQL: the advisory lock lets one through."""
    import threading

    results: list[str] = []
    barrier = threading.Barrier(4)

    def worker(i: int) -> None:
        barrier.wait()
        try:
            ho.open_handover(pg_engine, "n-race", "slurm", "kubernetes", T0, dry_run=False)
            results.append("ok")
        except ho.HandoverConflict:
            results.append("conflict")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == ["conflict"] * 3 + ["ok"]
    assert _blocking_per_node(pg_engine) == {"n-race": 1}
