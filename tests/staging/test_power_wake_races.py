"""Two writers on one parked node, in threads, on SQLite and the real PostgreSQL: the power
step's wake racing the plan's (or the fast path's) handover of the same node. Each round leaves
the node in exactly one state: woken (waking or on) with no handover standing while it is not
on, or on with its handover; never a handover of a node that is powered down."""

from __future__ import annotations

import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

from gpupool.actuation import handover as ho
from gpupool.actuation.power import machine as pm

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "actuation"))
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
