"""Two writers on one parked node, in threads, on SQLite and the real PostgreSQL: the power
step's wake racing the plan's (or the fast path's) handover of the same node, or its owner's
reclaim (issue 42: a ``reclaim`` handover of a lent node, borrower -> owner). Each round leaves
the node in exactly one state: woken (waking or on) with no handover standing while it is not
on, or on with its handover; never a handover of a node that is powered down."""

from __future__ import annotations

import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from gpupool.actuation import handover as ho
from gpupool.actuation.power import machine as pm

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "actuation"))
from memplatform import make  # noqa: E402
from mempower import MemPower, race  # noqa: E402

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=timezone.utc)
ROUNDS = 8


def test_a_wake_racing_a_handover_leaves_one_state(engine):
    power = MemPower("slurm", [f"n{r}" for r in range(ROUNDS)], lag=True)
    outcomes = set()
    for r in range(ROUNDS):
        node = f"n{r}"
        pm.park(engine, node, "slurm", power, T0, dry_run=False, by="fastpath")
        power.settle()
        pm.advance_all(engine, {"slurm": power}, T0, dry_run=False)
        assert pm.power_of(engine, node) == pm.PARKED
        at = T0 + timedelta(minutes=10)

        def work(i: int, node=node):
            if i == 0:
                return pm.wake(engine, node, power, at, dry_run=False, by="fastpath")
            return ho.open_handover(engine, node, "slurm", "kubernetes", at, dry_run=False)

        woke, opened = race(2, work)
        # the wake always stands (a handover never holds a parked node); the handover is refused
        # while the node is not on, and a writer that found the node's lock taken sends nothing
        assert isinstance(opened, ho.HandoverConflict), (r, woke, opened)
        assert isinstance(woke, dict) or isinstance(woke, pm.PowerConflict), (r, woke)
        state = pm.power_of(engine, node)
        blocking = ho.list_handovers(engine, ho.BLOCKING_STATES, node=node)
        assert blocking == [] and state in (pm.WAKING, pm.PARKED), (r, state, blocking)
        outcomes.add(state)
        if state == pm.PARKED:  # the handover held the lock at that instant: the wake is retried
            pm.wake(engine, node, power, at, dry_run=False, by="fastpath")
        power.settle()
        pm.advance_all(engine, {"slurm": power}, at + timedelta(minutes=5), dry_run=False)
        assert pm.power_of(engine, node) == pm.ON
        # once on, the node may move: the handover opens and the node stays on
        ho.open_handover(engine, node, "slurm", "kubernetes", at + timedelta(minutes=6), dry_run=False)
        assert len(ho.list_handovers(engine, ho.BLOCKING_STATES, node=node)) == 1
        assert pm.power_of(engine, node) == pm.ON
    assert outcomes <= {pm.WAKING, pm.PARKED}


def test_a_park_racing_a_handover_of_a_woken_node_leaves_one_state(engine):
    """The power step parks a node while the plan opens a handover of it: one of them stands."""
    power = MemPower("slurm", [f"m{r}" for r in range(ROUNDS)])
    for r in range(ROUNDS):
        node = f"m{r}"

        def work(i: int, node=node):
            if i == 0:
                return pm.park(engine, node, "slurm", power, T0, dry_run=False, by="fastpath")
            return ho.open_handover(engine, node, "slurm", "kubernetes", T0, dry_run=False)

        parked, opened = race(2, work)
        state = pm.power_of(engine, node)
        blocking = ho.list_handovers(engine, ho.BLOCKING_STATES, node=node)
        if blocking:
            assert state == pm.ON and isinstance(parked, pm.PowerConflict), (r, parked, opened)
        else:
            assert isinstance(opened, ho.HandoverConflict) and state in (pm.PARKING, pm.PARKED), (r, parked, opened)


# ------------------------------------------------------------------------------------ the reclaim
# The node's owner is slurm; it is lent to kubernetes, which parks and wakes it (a parked node
# wakes where it was parked). The owner's reclaim is a handover kubernetes -> slurm.


def _reclaim(engine, node: str, at):
    return ho.open_handover(engine, node, "kubernetes", "slurm", at, dry_run=False, kind=ho.RECLAIM,
                            need_since=at - timedelta(minutes=5), reason="reclaim: slurm short")


def _reclaim_done(engine, node: str, hid: int, at) -> None:
    """Advance the reclaim on in-memory platforms: it ends done, the node open on slurm alone."""
    dc, acts = make(("slurm", "kubernetes"), {node: "kubernetes"})
    h = ho.advance_one(engine, ho.get_handover(engine, hid), acts, at)
    assert (h.state, h.kind) == (ho.DONE, ho.RECLAIM), h
    assert dc.open_on(node) == ["slurm"]
    assert [(r["platform"], r["action"], r["status"]) for r in ho.audit_rows(engine, hid)] == [
        ("kubernetes", "drain", "ok"), ("slurm", "resume", "ok")]


def test_a_wake_racing_a_reclaim_leaves_one_state(engine):
    power = MemPower("kubernetes", [f"r{r}" for r in range(ROUNDS)], lag=True)
    outcomes = set()
    for r in range(ROUNDS):
        node = f"r{r}"
        pm.park(engine, node, "kubernetes", power, T0, dry_run=False, by="fastpath")
        power.settle()
        pm.advance_all(engine, {"kubernetes": power}, T0, dry_run=False)
        assert pm.power_of(engine, node) == pm.PARKED
        at = T0 + timedelta(minutes=10)

        def work(i: int, node=node):
            if i == 0:
                return pm.wake(engine, node, power, at, dry_run=False, by="fastpath")
            return _reclaim(engine, node, at)

        woke, reclaimed = race(2, work)
        # the reclaim is refused while the node is not on (it never holds a powered-down node)
        assert isinstance(reclaimed, ho.HandoverConflict) and "(power)" in str(reclaimed), (r, woke, reclaimed)
        assert isinstance(woke, (dict, pm.PowerConflict)), (r, woke)
        state = pm.power_of(engine, node)
        assert ho.list_handovers(engine, ho.BLOCKING_STATES, node=node) == [] and state in (pm.WAKING, pm.PARKED)
        outcomes.add(state)
        if state == pm.PARKED:
            pm.wake(engine, node, power, at, dry_run=False, by="fastpath")
        power.settle()
        pm.advance_all(engine, {"kubernetes": power}, at + timedelta(minutes=5), dry_run=False)
        assert pm.power_of(engine, node) == pm.ON
        # once on, the owner takes it back: one reclaim, done, and the node stays on
        hid = _reclaim(engine, node, at + timedelta(minutes=6))
        assert [h.id for h in ho.list_handovers(engine, ho.BLOCKING_STATES, node=node)] == [hid]
        _reclaim_done(engine, node, hid, at + timedelta(minutes=7))
        assert pm.power_of(engine, node) == pm.ON
    assert outcomes <= {pm.WAKING, pm.PARKED}


def test_a_park_racing_a_reclaim_leaves_one_state(engine):
    """The borrower's power step parks the lent node while its owner's reclaim opens and
    advances: either the reclaim stands (the node on, brought home) or the park (no handover)."""
    power = MemPower("kubernetes", [f"q{r}" for r in range(ROUNDS)])
    for r in range(ROUNDS):
        node = f"q{r}"
        dc, acts = make(("slurm", "kubernetes"), {node: "kubernetes"})

        def work(i: int, node=node):
            if i == 0:
                return pm.park(engine, node, "kubernetes", power, T0, dry_run=False, by="fastpath")
            hid = _reclaim(engine, node, T0)
            try:
                ho.advance_one(engine, ho.get_handover(engine, hid), acts, T0)
            except ho.HandoverConflict:  # the park held the node's lock at that instant
                pass
            return hid

        parked, reclaimed = race(2, work)
        state = pm.power_of(engine, node)
        if isinstance(reclaimed, int):  # the reclaim stood: the park was refused, the node stays on
            assert isinstance(parked, pm.PowerConflict) and state == pm.ON, (r, parked, reclaimed)
            h = ho.advance_one(engine, ho.get_handover(engine, reclaimed), acts, T0 + timedelta(minutes=1))
            assert h.state == ho.DONE and dc.open_on(node) == ["slurm"], h
            assert pm.power_of(engine, node) == pm.ON
        else:
            assert isinstance(reclaimed, ho.HandoverConflict), (r, parked, reclaimed)
            assert state in (pm.PARKING, pm.PARKED) and ho.list_handovers(engine, node=node) == []
            assert dc.open_on(node) == ["kubernetes"] and acts["kubernetes"].sent == []


def test_a_reclaim_opened_while_the_node_is_woken_or_parked_is_refused(engine):
    """Exactly between the power step's state change and its command (inside the send): a reclaim
    opened then is refused, and a park asked for while a reclaim sends its drain is refused too."""
    power = MemPower("kubernetes", ["w1", "p1"], lag=True)
    pm.park(engine, "w1", "kubernetes", power, T0, dry_run=False, by="fastpath")
    power.settle()
    pm.advance_all(engine, {"kubernetes": power}, T0, dry_run=False)
    seen: list = []

    def reclaim_now(node):
        def hook(command):
            try:
                seen.append((command.action, _reclaim(engine, node, T0)))
            except ho.HandoverConflict as exc:
                seen.append((command.action, exc))
        return hook

    power.on_send = reclaim_now("w1")  # the wake's power-on is in flight
    pm.wake(engine, "w1", power, T0 + timedelta(minutes=1), dry_run=False, by="fastpath")
    power.on_send = reclaim_now("p1")  # the park's hold is in flight
    pm.park(engine, "p1", "kubernetes", power, T0 + timedelta(minutes=1), dry_run=False, by="fastpath")
    assert [a for a, _ in seen] == ["power_on", "hold"]
    assert all(isinstance(x, ho.HandoverConflict) for _, x in seen), seen
    assert "waking (power)" in str(seen[0][1]) and "parking (power)" in str(seen[1][1])
    assert ho.list_handovers(engine, ho.BLOCKING_STATES) == []
    # woken, the node goes home; a park asked for while the reclaim's drain is out is refused
    power.settle()
    pm.advance_all(engine, {"kubernetes": power}, T0 + timedelta(minutes=5), dry_run=False)
    assert pm.power_of(engine, "w1") == pm.ON
    hid = _reclaim(engine, "w1", T0 + timedelta(minutes=6))
    dc, acts = make(("slurm", "kubernetes"), {"w1": "kubernetes"})
    parks: list = []
    real_send = acts["kubernetes"].send

    def drain_then_park(command):
        if command.action == "drain" and not parks:
            try:
                parks.append(pm.park(engine, "w1", "kubernetes", power, T0 + timedelta(minutes=7), dry_run=False,
                                     by="fastpath"))
            except pm.PowerConflict as exc:
                parks.append(exc)
        return real_send(command)

    acts["kubernetes"].send = drain_then_park
    h = ho.advance_one(engine, ho.get_handover(engine, hid), acts, T0 + timedelta(minutes=7))
    assert len(parks) == 1 and isinstance(parks[0], pm.PowerConflict), parks
    assert h.state == ho.DONE and dc.open_on("w1") == ["slurm"] and pm.power_of(engine, "w1") == pm.ON


def test_a_park_decided_before_a_reclaim_finished_is_refused_once_the_node_moved(engine):
    """The borrower's power step read the node idle, then its owner's reclaim brought it home: the
    park that follows names the borrower and would power off a node the owner now runs. Refused,
    naming where the node is; a park naming the owner goes on."""
    power = MemPower("kubernetes", ["m1"])
    hid = _reclaim(engine, "m1", T0)
    _reclaim_done(engine, "m1", hid, T0)
    with pytest.raises(pm.PowerConflict, match="on slurm now, not kubernetes"):
        pm.park(engine, "m1", "kubernetes", power, T0 + timedelta(minutes=1), dry_run=False, by="fastpath")
    assert pm.power_of(engine, "m1") == pm.ON and power.sent == []
    out = pm.park(engine, "m1", "slurm", MemPower("slurm", ["m1"]), T0 + timedelta(minutes=2), dry_run=False,
                  by="fastpath")
    assert out["action"] == "park"
