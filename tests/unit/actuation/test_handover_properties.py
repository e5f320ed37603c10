"""Property-based tests of the handover state machine: whatever the interleaving of plans,
runs, work, operator rollbacks and platform API faults (before or after a change is applied),

* no node ever has two open (or failed) handovers,
* no node is ever open for work on two platforms at once,
* once the faults stop, later runs (and rollbacks of failed handovers) bring every handover to
  ``done`` or ``rolled_back`` with every node open on exactly one platform.

With two writers (issue 30: the handover DAG, ``gpupool rollback``, a second advancer past the
deadline, a new handover opened), the second one runs inside any platform call (a read or a
send) of the first, on SQLite and PostgreSQL. Then also: a node is never left held by gpupool
with no open handover, and in the end it is open where its records say.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpupool.actuation import handover as ho
from gpupool.actuation.actuators.base import ActuationError
from gpupool.staging.schema import action_audit, handover
from memplatform import Interleave, make

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

#: one writer runs inside the ``at``-th platform call (read or send) of another
writers = st.one_of(
    st.tuples(st.just("advance")),
    st.tuples(st.just("late")),  # an advancer past every deadline of the handovers open now
    st.tuples(st.just("rollback"), st.integers(0, 5)),
    st.tuples(st.just("open"), st.sampled_from(NODES), st.sampled_from(PLATFORMS)),
)
races = st.tuples(st.just("race"), writers, writers, st.integers(0, 6))


def _blocking_per_node(engine) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(sa.select(handover.c.node, sa.func.count()).where(
            handover.c.state.in_(ho.BLOCKING_STATES)).group_by(handover.c.node)).all()
    return {n: int(c) for n, c in rows}


def _check(engine, dc, held_needs_handover: bool = False) -> None:
    blocking = _blocking_per_node(engine)
    assert all(c <= 1 for c in blocking.values())
    for node in NODES:  # open for work, or still running work, on at most one platform
        on = [p for p in PLATFORMS if dc.slots[(p, node)].schedulable or dc.slots[(p, node)].jobs]
        assert len(on) <= 1, (node, on)
        if held_needs_handover and not blocking.get(node):  # held by gpupool only while moving
            assert len(dc.open_on(node)) == 1, (node, _history(engine, node), dc.open_on(node))


def _final_states_hold(engine, finals: dict[int, str]) -> None:
    """A handover seen ``rolled_back`` (or reported so by a rollback) stays so, and one seen
    ``done`` can only be rolled back: no writer overwrites another's finished work."""
    now = {h.id: h.state for h in ho.list_handovers(engine)}
    moved = {i: (s, now[i]) for i, s in finals.items() if now[i] != s}
    assert all(was == ho.DONE and is_ == ho.ROLLED_BACK for was, is_ in moved.values()), moved
    finals.update({i: s for i, s in now.items() if s in (ho.DONE, ho.ROLLED_BACK)})


def _history(engine, node) -> dict:
    return {h.id: (h.from_platform, h.to_platform, h.state, h.error) for h in ho.list_handovers(engine, node=node)}


def _where_records_say(engine, dc, owners: dict[str, str]) -> None:
    """Every node is open where its live handovers, replayed in order, put it: a ``done`` one
    at its target; one that was sent back (a reverse handover names it) at its target, from
    where the reverse moved it on; any other at its source (its hold lifted)."""
    reversed_ids = {int(h.reason.rsplit("#", 1)[1]) for h in ho.list_handovers(engine)
                    if (h.reason or "").startswith("rollback of handover #")}
    for node in NODES:
        at = owners[node]
        for h in sorted(ho.list_handovers(engine, node=node), key=lambda x: x.id):
            if not h.dry_run and (h.state == ho.DONE or h.id in reversed_ids):
                at = h.to_platform
        assert dc.open_on(node) == [at], (node, _history(engine, node))


def _owner(dc, node) -> str:
    return next((p for p in PLATFORMS if dc.slots[(p, node)].schedulable), "slurm")


def _writer(engine, dc, acts, spec, now, finals: dict[int, str]):
    """The writer ``spec`` of :data:`writers` as a call (errors a writer may meet are its answer);
    a rollback that reports success is entered in ``finals``."""
    kind = spec[0]

    def call():
        try:
            if kind == "advance":
                ho.advance_all(engine, acts, now, dry_run=False)
            elif kind == "late":
                ho.advance_all(engine, acts, now + timedelta(hours=3), dry_run=False)
            elif kind == "rollback":
                hs = sorted(ho.list_handovers(engine), key=lambda h: h.id)
                if hs:
                    out = ho.rollback(engine, hs[spec[1] % len(hs)].id, acts, at=now)
                    finals[out["id"]] = out["state"]
            elif kind == "open":
                _, node, target = spec
                source = _owner(dc, node)
                if source != target:
                    ho.open_handover(engine, node, source, target, now, dry_run=False, timeout=timedelta(hours=1))
        except (ho.HandoverError, ActuationError):
            pass
    return call


def _reset(engine) -> None:
    with engine.begin() as conn:
        conn.execute(action_audit.delete())
        conn.execute(handover.delete())


def _run(engine, program, two_writers: bool = False) -> None:
    """Run ``program`` (items of :data:`ops`, and of :data:`races` with ``two_writers``),
    checking the safety rules after every item, then let the faults stop and settle."""
    _reset(engine)
    owners = {"n1": "slurm", "n2": "kubernetes", "n3": "openstack"}
    dc, acts = make(PLATFORMS, owners)
    interleave = Interleave(acts) if two_writers else None
    finals: dict[int, str] = {}
    now = T0
    if two_writers:  # give the writers something to race for from the start
        ho.open_handover(engine, "n1", "slurm", "kubernetes", now, dry_run=False, timeout=timedelta(hours=1))
        ho.open_handover(engine, "n2", "kubernetes", "openstack", now, dry_run=False, timeout=timedelta(hours=1))
    for op in program:
        kind = op[0]
        if kind == "open":
            _, node, target = op
            source = _owner(dc, node)
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
        elif kind == "race":
            _, outer, inner, at = op
            now += timedelta(minutes=5)
            interleave.run(_writer(engine, dc, acts, outer, now, finals), _writer(engine, dc, acts, inner, now, finals), at)
            if "late" in (outer[0], inner[0]):
                now += timedelta(hours=3)
        _check(engine, dc, held_needs_handover=two_writers)
        if two_writers:
            _final_states_hold(engine, finals)

    # the faults stop and the work ends: later runs settle everything
    for a in acts.values():
        a.fail.clear()
    dc.finish_jobs()
    for _ in range(6):
        now += timedelta(minutes=30)
        ho.advance_all(engine, acts, now, dry_run=False)
        for h in ho.list_handovers(engine, (ho.FAILED,)):
            ho.rollback(engine, h.id, acts, at=now)
        _check(engine, dc, held_needs_handover=two_writers)
        if two_writers:
            _final_states_hold(engine, finals)
    states = {h.state for h in ho.list_handovers(engine)}
    assert states <= {ho.DONE, ho.ROLLED_BACK}, states
    for node in NODES:
        assert len(dc.open_on(node)) == 1, (node, {p: dc.slots[(p, node)] for p in PLATFORMS})
    if two_writers:
        _where_records_say(engine, dc, owners)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(program=st.lists(ops, min_size=1, max_size=25))
def test_no_interleaving_breaks_the_safety_rules(sqlite_engine, program):
    _run(sqlite_engine, program)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(program=st.lists(st.one_of(ops, races, races), min_size=1, max_size=20))
def test_two_writers_never_break_the_safety_rules(sqlite_engine, program):
    _run(sqlite_engine, program, two_writers=True)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(program=st.lists(st.one_of(ops, races, races), min_size=1, max_size=15))
def test_two_writers_never_break_the_safety_rules_on_postgresql(pg_engine, program):
    _run(pg_engine, program, two_writers=True)


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
