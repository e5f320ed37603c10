"""Power as a node state, on SQLite and the real PostgreSQL: park and wake recorded in
``node_power`` with every transition in ``power_transition`` and every command audited before it
is sent; dry runs, backfills and someone else's holds; and two writers interleaved — a park
racing a handover, a wake racing a handover, a wake racing a park — leave each node in exactly
one state: either parked (or parking / waking) with no open handover, or on with its handover.

The platform is an in-memory power means (holds, work, power changes that lag behind the
command); the real means are exercised in tests/integration_actuation/test_power_*.py.
"""

from __future__ import annotations

import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from gpupool.actuation.power import machine as pm
from gpupool.actuation.power.base import PARK_REASON, ActuationError, Command, ForeignHoldError, PowerActuator, PowerReading
from gpupool.actuation import handover as ho
from gpupool.staging import handovers as hstore
from gpupool.staging import power as store

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "actuation"))
from memplatform import make  # noqa: E402
from mempower import MemPower, race  # noqa: E402

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=timezone.utc)


def _state(engine, node):
    return pm.power_of(engine, node)


def _one_state(engine, dc, node: str, owner: str) -> None:
    """Exactly one state: not on => no blocking handover; a blocking handover => on."""
    blocking = ho.list_handovers(engine, ho.BLOCKING_STATES, node=node)
    power = _state(engine, node)
    assert not (blocking and power != pm.ON), (power, [(h.id, h.state) for h in blocking])
    if power != pm.ON:
        assert dc.open_on(node) == [owner] or dc.open_on(node) == [], dc.open_on(node)


# ------------------------------------------------------------------------------------ one writer


def test_park_and_wake_record_each_transition_and_audit_before_sending(engine):
    act = MemPower("slurm", ["n1"], lag=True)
    seen = []
    act.on_send = lambda c: seen.append([(a["action"], a["status"]) for a in store.audit_rows(engine, node="n1")])
    out = pm.park(engine, "n1", "slurm", act, T0, dry_run=False, by="plan", reason="idle 40 min")
    assert seen == [[("hold", "pending")]]  # the row was committed before the command went out
    assert out["state"] == pm.PARKING and "powering_off" in out["error"]
    assert [c.action for c in act.sent] == ["hold", "power_off"]
    act.settle()
    report = pm.advance_all(engine, {"slurm": act}, T0 + timedelta(minutes=1), dry_run=False)
    assert [(n["node"], n["before"], n["state"]) for n in report["nodes"]] == [("n1", "parking", "parked")]
    assert report["failed"] == []
    out = pm.wake(engine, "n1", act, T0 + timedelta(hours=1), dry_run=False, by="fastpath")
    assert out["state"] == pm.WAKING
    act.settle()
    pm.advance_all(engine, {"slurm": act}, T0 + timedelta(hours=1, minutes=5), dry_run=False)
    assert _state(engine, "n1") == pm.ON and act.nodes["n1"]["held"] is False
    rows = store.transitions(engine, "n1")
    assert [(r["from_state"], r["to_state"], r["by"]) for r in rows] == [
        ("on", "parking", "plan"), ("parking", "parked", "platform"),
        ("parked", "waking", "fastpath"), ("waking", "on", "platform")]
    audits = store.audit_rows(engine, node="n1")
    assert [(a["action"], a["status"]) for a in audits] == [("hold", "ok"), ("power_off", "ok"), ("power_on", "ok"),
                                                            ("unhold", "ok")]
    assert [a["power_transition_id"] for a in audits] == [rows[0]["id"], rows[0]["id"], rows[2]["id"], rows[2]["id"]]
    assert all(a["handover_id"] is None and not a["dry_run"] for a in audits)


@pytest.mark.parametrize("how", ["dry_run", "actuation_off"])
def test_a_dry_run_sends_nothing_and_leaves_the_state(engine, how):
    act = MemPower("slurm", ["n1"])
    out = pm.park(engine, "n1", "slurm", act if how == "dry_run" else None, T0, dry_run=how == "dry_run")
    assert out["dry_run"] and out["action"] == "would park" and act.sent == []
    assert store.get_power(engine, "n1") is None and _state(engine, "n1") == pm.ON
    [t] = store.transitions(engine, "n1")
    assert (t["from_state"], t["to_state"], t["dry_run"]) == ("on", "parked", True)
    audits = store.audit_rows(engine, node="n1")
    assert audits and all(a["status"] == "dry_run" and a["dry_run"] for a in audits)
    if how == "dry_run":
        assert [a["action"] for a in audits] == ["hold"]


def test_a_backfill_never_parks_or_wakes(engine):
    act = MemPower("slurm", ["n1"])
    out = pm.park(engine, "n1", "slurm", act, T0, dry_run=False, backfill=True)
    assert out["backfill"] and act.sent == [] and store.get_power(engine, "n1") is None
    assert pm.wake(engine, "n1", act, T0, dry_run=False, backfill=True)["backfill"]
    rows = [a for a in hstore.audit_rows(engine) if a["node"] == "n1"]
    assert [(a["action"], a["status"]) for a in rows] == [("park_backfill_skip", "dry_run"),
                                                          ("wake_backfill_skip", "dry_run")]
    act.nodes["n1"]["held"] = True  # a backfill pass leaves even a parking node alone
    store.transition(engine, "n1", "slurm", "on", "parking", T0, by="plan")
    assert pm.advance_all(engine, {"slurm": act}, T0, dry_run=False, backfill=True)["skipped"] == ["n1"]
    assert act.sent == []


def test_someone_elses_hold_gives_the_park_up(engine):
    act = MemPower("slurm", ["n1"])
    act.nodes["n1"]["foreign"] = "ops: GPU 3 Xid 79"
    out = pm.park(engine, "n1", "slurm", act, T0, dry_run=False)
    assert out["state"] == pm.ON and "park given up" in out["error"] and "Xid 79" in out["error"]
    assert act.sent == []


def test_a_late_wake_is_reported_failed_and_retried(engine):
    act = MemPower("slurm", ["n1"], lag=True)
    pm.park(engine, "n1", "slurm", act, T0, dry_run=False)
    act.settle()
    pm.advance_all(engine, {"slurm": act}, T0, dry_run=False)
    pm.wake(engine, "n1", act, T0, dry_run=False, timeout=timedelta(minutes=10))
    report = pm.advance_all(engine, {"slurm": act}, T0 + timedelta(minutes=11), dry_run=False)
    assert [f["node"] for f in report["failed"]] == ["n1"] and _state(engine, "n1") == pm.WAKING
    with pytest.raises(pm.PowerFailed, match="n1"):
        raise pm.PowerFailed(report)


def test_a_wake_while_powering_off_follows_the_park(engine):
    act = MemPower("slurm", ["n1"], lag=True)
    pm.park(engine, "n1", "slurm", act, T0, dry_run=False)
    out = pm.wake(engine, "n1", act, T0 + timedelta(minutes=1), dry_run=False)
    assert out["action"] == "wake after park" and out["state"] == pm.PARKING and out["wake_deadline"]
    act.settle()  # powered off: parked, then woken at once
    pm.advance_all(engine, {"slurm": act}, T0 + timedelta(minutes=2), dry_run=False)
    assert _state(engine, "n1") == pm.WAKING and act.sent[-1].action == "power_on"
    act.settle()
    pm.advance_all(engine, {"slurm": act}, T0 + timedelta(minutes=3), dry_run=False)
    assert _state(engine, "n1") == pm.ON
    assert [r["to_state"] for r in store.transitions(engine, "n1")] == ["parking", "parked", "waking", "on"]


def test_a_node_the_platform_woke_is_observed(engine):
    act = MemPower("slurm", ["n1"])
    pm.park(engine, "n1", "slurm", act, T0, dry_run=False)
    pm.advance_all(engine, {"slurm": act}, T0, dry_run=False)
    assert _state(engine, "n1") == pm.PARKED
    act.nodes["n1"].update(power="on", held=False)  # Slurm powered it up for a job
    assert pm.observe(engine, {"slurm": act}, T0 + timedelta(minutes=3)) == [
        {"node": "n1", "platform": "slurm", "from": "parked", "to": "on"}]
    assert store.transitions(engine, "n1")[-1]["by"] == "observed"


# ------------------------------------------------------------------------------------ two writers


def _handover_world(node="n1"):
    dc, acts = make(("slurm", "kubernetes"), {node: "slurm"})
    return dc, acts, MemPower("slurm", [node])


def test_a_handover_opened_while_the_park_sends_is_refused(engine):
    dc, acts, power = _handover_world()
    tried = []

    def handover(_cmd):
        try:
            tried.append(ho.open_handover(engine, "n1", "slurm", "kubernetes", T0, dry_run=False))
        except ho.HandoverConflict as exc:
            tried.append(exc)

    power.on_send = handover
    pm.park(engine, "n1", "slurm", power, T0, dry_run=False)
    assert isinstance(tried[0], ho.HandoverConflict) and "parking (power)" in str(tried[0])
    ho.advance_all(engine, acts, T0, dry_run=False)
    pm.advance_all(engine, {"slurm": power}, T0, dry_run=False)
    assert _state(engine, "n1") == pm.PARKED and ho.list_handovers(engine, node="n1") == []
    _one_state(engine, dc, "n1", "slurm")


def test_a_park_while_the_handover_drains_is_refused(engine):
    dc, acts, power = _handover_world()
    hid = ho.open_handover(engine, "n1", "slurm", "kubernetes", T0, dry_run=False)
    real = acts["slurm"].send
    tried = []

    def send(cmd):
        if cmd.action == "drain" and not tried:
            try:
                tried.append(pm.park(engine, "n1", "slurm", power, T0, dry_run=False))
            except pm.PowerConflict as exc:
                tried.append(exc)
        return real(cmd)

    acts["slurm"].send = send
    ho.advance_all(engine, acts, T0, dry_run=False)
    assert isinstance(tried[0], pm.PowerConflict) and power.sent == []
    assert ho.get_handover(engine, hid).state == ho.DONE and _state(engine, "n1") == pm.ON
    with pytest.raises(pm.PowerConflict, match="not parked"):  # a planned handover blocks a park too
        ho.open_handover(engine, "n1", "kubernetes", "slurm", T0, dry_run=False)
        pm.park(engine, "n1", "kubernetes", power, T0, dry_run=False)
    _one_state(engine, dc, "n1", "kubernetes")


def test_a_handover_opened_while_the_wake_sends_is_refused(engine):
    dc, acts, power = _handover_world()
    pm.park(engine, "n1", "slurm", power, T0, dry_run=False)
    pm.advance_all(engine, {"slurm": power}, T0, dry_run=False)
    tried = []
    power.on_send = lambda _c: tried.append(pytest.raises(ho.HandoverConflict, ho.open_handover, engine, "n1",
                                                          "slurm", "kubernetes", T0, dry_run=False))
    pm.wake(engine, "n1", power, T0 + timedelta(minutes=5), dry_run=False)
    pm.advance_all(engine, {"slurm": power}, T0 + timedelta(minutes=6), dry_run=False)
    assert "waking (power)" in str(tried[0].value)
    assert _state(engine, "n1") == pm.ON and ho.list_handovers(engine, node="n1") == []
    ho.open_handover(engine, "n1", "slurm", "kubernetes", T0 + timedelta(minutes=7), dry_run=False)  # now it may move
    _one_state(engine, dc, "n1", "slurm")


def test_a_wake_while_the_park_sends_finds_the_node_busy(engine):
    _, _, power = _handover_world()
    tried = []

    def wake(_cmd):
        try:
            tried.append(pm.wake(engine, "n1", power, T0, dry_run=False))
        except pm.PowerConflict as exc:
            tried.append(exc)

    power.on_send = wake
    pm.park(engine, "n1", "slurm", power, T0, dry_run=False)
    assert isinstance(tried[0], pm.PowerConflict) and "another writer" in str(tried[0])
    pm.advance_all(engine, {"slurm": power}, T0, dry_run=False)
    assert _state(engine, "n1") == pm.PARKED
    assert [r["to_state"] for r in store.transitions(engine, "n1")] == ["parking", "parked"]


ROUNDS = 8


def test_park_and_handover_at_once_leave_one_state(engine):
    """The two transactions race with nothing but the store between them (a handover is opened
    without the writer lock): each round exactly one of them stands."""
    for r in range(ROUNDS):
        node = f"r{r}"

        def work(i: int, node=node):
            if i == 0:
                return store.transition(engine, node, "slurm", "on", "parking", T0, by="plan",
                                        blocking=ho.BLOCKING_STATES)
            return ho.open_handover(engine, node, "slurm", "kubernetes", T0, dry_run=False)

        out = race(2, work)
        parked = isinstance(out[0], int)
        moved = isinstance(out[1], int)
        assert parked != moved, (r, out)
        assert isinstance(out[0 if moved else 1], (store.Blocked, ho.HandoverConflict)), out
        blocking = ho.list_handovers(engine, ho.BLOCKING_STATES, node=node)
        assert (_state(engine, node), len(blocking)) == ((pm.PARKING, 0) if parked else (pm.ON, 1))


def test_two_parks_and_a_wake_at_once_leave_one_state(engine):
    power = MemPower("slurm", [f"w{r}" for r in range(ROUNDS)])
    for r in range(ROUNDS):
        node = f"w{r}"

        def work(i: int, node=node):
            if i < 2:
                return pm.park(engine, node, "slurm", power, T0, dry_run=False)
            return pm.wake(engine, node, power, T0, dry_run=False)

        out = race(3, work)
        errors = [o for o in out if isinstance(o, Exception)]
        assert all(isinstance(e, pm.PowerConflict) for e in errors), errors
        rows = store.transitions(engine, node)
        # one park began from on; a wake found the node on, was told it is busy, or woke it after (and
        # the losing park may then park it again, from on): each transition starts where the last ended
        assert [x["to_state"] for x in rows][:1] in ([], ["parking"])
        chain = [(x["from_state"], x["to_state"]) for x in rows]
        assert all(a[1] == b[0] for a, b in zip(chain, chain[1:])), chain
        assert _state(engine, node) in pm.STATES
