"""The handover state machine on staging (SQLite and PostgreSQL): steps, audit, dry run,
timeouts, rollback, and the safety rules (one handover per node, foreign holds, never open on
two platforms)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy as sa

from gpupool.actuation import handover as ho
from gpupool.staging.schema import action_audit, allocation_plan, handover

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=timezone.utc)


def _open(engine, node="n1", src="slurm", dst="kubernetes", dry_run=False, **kw):
    return ho.open_handover(engine, node, src, dst, T0, dry_run=dry_run, **kw)


def test_full_handover_waits_for_work_then_attaches(engine, datacenter):
    dc, acts = datacenter
    dc.slots[("slurm", "n1")].jobs = 2
    hid = _open(engine)
    rep = ho.advance_all(engine, acts, T0, dry_run=False)
    h = ho.get_handover(engine, hid)
    assert h.state == ho.RELEASING and "2 unit(s) of work" in h.error
    assert rep["handovers"][0]["before"] == ho.PLANNED
    slot = dc.slots[("slurm", "n1")]
    assert not slot.schedulable and slot.reason == "gpupool: moving to kubernetes"
    assert dc.open_on("n1") == []
    # the drain went to the audit before it was sent, and is ok now
    rows = ho.audit_rows(engine, hid)
    assert [(r["platform"], r["action"], r["status"]) for r in rows] == [("slurm", "drain", "ok")]
    assert rows[0]["request"]["reason"] == "gpupool: moving to kubernetes"
    # still busy: nothing more is sent, the drain is not repeated
    ho.advance_all(engine, acts, T0 + timedelta(minutes=5), dry_run=False)
    assert len(ho.audit_rows(engine, hid)) == 1
    dc.finish_jobs()
    ho.advance_all(engine, acts, T0 + timedelta(minutes=10), dry_run=False)
    h = ho.get_handover(engine, hid)
    assert h.state == ho.DONE and h.error is None
    assert dc.open_on("n1") == ["kubernetes"]
    assert [(r["platform"], r["action"], r["status"]) for r in ho.audit_rows(engine, hid)] == [
        ("slurm", "drain", "ok"), ("kubernetes", "resume", "ok")]


def test_dry_run_handover_audits_everything_and_sends_nothing(engine, datacenter):
    dc, acts = datacenter
    before = {k: (v.schedulable, v.reason) for k, v in dc.slots.items()}
    hid = _open(engine, dry_run=True)
    ho.advance_all(engine, acts, T0, dry_run=True)
    assert ho.get_handover(engine, hid).state == ho.DONE
    rows = ho.audit_rows(engine, hid)
    assert [(r["platform"], r["action"], r["status"], r["dry_run"]) for r in rows] == [
        ("slurm", "drain", "dry_run", True), ("kubernetes", "resume", "dry_run", True)]
    assert all(a.sent == [] for a in acts.values())
    assert {k: (v.schedulable, v.reason) for k, v in dc.slots.items()} == before


def test_dry_run_pass_never_touches_live_handovers(sqlite_engine, datacenter):
    dc, acts = datacenter
    hid = _open(sqlite_engine)
    rep = ho.advance_all(sqlite_engine, acts, T0, dry_run=True)
    assert rep["skipped"] == [hid]
    assert ho.get_handover(sqlite_engine, hid).state == ho.PLANNED
    assert all(a.sent == [] for a in acts.values())


def test_second_open_handover_for_a_node_is_refused(engine, datacenter):
    first = _open(engine)
    with pytest.raises(ho.HandoverConflict, match=f"#{first}"):
        _open(engine, dst="openstack")
    # a failed handover blocks too, until it is rolled back
    ho.get_handover(engine, first)
    with engine.begin() as conn:
        conn.execute(handover.update().values(state=ho.FAILED))
    with pytest.raises(ho.HandoverConflict):
        _open(engine, dst="openstack")
    ho.rollback(engine, first, datacenter[1], at=T0)
    assert _open(engine, dst="openstack") > first


def test_foreign_drain_is_left_alone(sqlite_engine, datacenter):
    dc, acts = datacenter
    dc.slots[("slurm", "n1")].schedulable = False
    dc.slots[("slurm", "n1")].reason = "bad GPU, ticket 4711"
    hid = _open(sqlite_engine)
    rep = ho.advance_all(sqlite_engine, acts, T0, dry_run=False)
    h = ho.get_handover(sqlite_engine, hid)
    # failed and closed: nothing of gpupool's to lift, so the node is left exactly as found
    assert h.state == ho.ROLLED_BACK and "ticket 4711" in h.error and "nothing of gpupool's" in h.error
    assert [f["id"] for f in rep["failed"]] == [hid]
    assert ho.audit_rows(sqlite_engine, hid) == []
    with pytest.raises(ho.HandoverError, match="already rolled back"):
        ho.rollback(sqlite_engine, hid, acts, at=T0)
    assert dc.slots[("slurm", "n1")].reason == "bad GPU, ticket 4711"
    assert not dc.slots[("slurm", "n1")].schedulable
    assert all(a.sent == [] for a in acts.values())


def test_target_held_by_someone_else_is_checked_before_the_drain(sqlite_engine, datacenter):
    dc, acts = datacenter
    dc.slots[("kubernetes", "n1")].reason = "cordoned for kernel upgrade"
    hid = _open(sqlite_engine)
    rep = ho.advance_all(sqlite_engine, acts, T0, dry_run=False)
    h = ho.get_handover(sqlite_engine, hid)
    assert h.state == ho.ROLLED_BACK and "kernel upgrade" in h.error
    assert [f["id"] for f in rep["failed"]] == [hid]
    assert dc.open_on("n1") == ["slurm"]  # never drained
    assert all(a.sent == [] for a in acts.values())


def test_target_held_by_someone_else_after_the_drain_lifts_gpupools_hold(sqlite_engine, datacenter):
    dc, acts = datacenter
    dc.slots[("slurm", "n1")].jobs = 1
    hid = _open(sqlite_engine)
    ho.advance_all(sqlite_engine, acts, T0, dry_run=False)
    assert ho.get_handover(sqlite_engine, hid).state == ho.RELEASING and dc.open_on("n1") == []
    dc.slots[("kubernetes", "n1")].reason = "cordoned for kernel upgrade"  # meanwhile, on the target
    dc.finish_jobs()
    rep = ho.advance_all(sqlite_engine, acts, T0 + timedelta(minutes=5), dry_run=False)
    h = ho.get_handover(sqlite_engine, hid)
    assert h.state == ho.ROLLED_BACK and "kernel upgrade" in h.error and "lifted" in h.error
    assert [f["id"] for f in rep["failed"]] == [hid]
    assert dc.open_on("n1") == ["slurm"]
    assert [r["action"] for r in ho.audit_rows(sqlite_engine, hid)] == ["drain", "resume"]


def test_source_reopened_by_someone_else_stops_the_attach(sqlite_engine, datacenter):
    dc, acts = datacenter
    dc.slots[("slurm", "n1")].jobs = 1
    hid = _open(sqlite_engine)
    ho.advance_all(sqlite_engine, acts, T0, dry_run=False)
    dc.finish_jobs()
    ho.advance_all(sqlite_engine, acts, T0, dry_run=False, max_steps=1)  # -> released
    assert ho.get_handover(sqlite_engine, hid).state == ho.RELEASED
    ho.advance_all(sqlite_engine, acts, T0, dry_run=False, max_steps=1)  # -> attaching
    assert ho.get_handover(sqlite_engine, hid).state == ho.ATTACHING
    dc.slots[("slurm", "n1")].schedulable = True  # an operator resumed it meanwhile
    rep = ho.advance_all(sqlite_engine, acts, T0, dry_run=False)
    h = ho.get_handover(sqlite_engine, hid)
    assert h.state == ho.ROLLED_BACK and "opened node" in h.error
    assert [f["id"] for f in rep["failed"]] == [hid]
    assert dc.open_on("n1") == ["slurm"]


@pytest.mark.parametrize("when", ["before", "after"])
def test_api_failure_mid_release_is_resumed_next_run(engine, datacenter, when):
    dc, acts = datacenter
    acts["slurm"].fail.append(("drain", when))
    hid = _open(engine)
    ho.advance_all(engine, acts, T0, dry_run=False)
    h = ho.get_handover(engine, hid)
    assert h.state == ho.RELEASING and h.error.startswith("will retry")
    rows = ho.audit_rows(engine, hid)
    assert [r["status"] for r in rows] == ["failed"] and "injected" in rows[0]["response"]
    assert len(dc.open_on("n1")) <= 1
    ho.advance_all(engine, acts, T0 + timedelta(minutes=5), dry_run=False)
    assert ho.get_handover(engine, hid).state == ho.DONE
    assert dc.open_on("n1") == ["kubernetes"]


def test_api_failure_mid_attach_is_resumed_and_never_opens_two(sqlite_engine, datacenter):
    dc, acts = datacenter
    acts["kubernetes"].fail.append(("resume", "before"))
    hid = _open(sqlite_engine)
    ho.advance_all(sqlite_engine, acts, T0, dry_run=False)
    assert ho.get_handover(sqlite_engine, hid).state == ho.ATTACHING
    assert dc.open_on("n1") == []
    ho.advance_all(sqlite_engine, acts, T0 + timedelta(minutes=5), dry_run=False)
    assert ho.get_handover(sqlite_engine, hid).state == ho.DONE
    assert dc.open_on("n1") == ["kubernetes"]


def test_stuck_release_times_out_and_returns_the_node(engine, datacenter):
    dc, acts = datacenter
    dc.slots[("slurm", "n1")].jobs = 1
    hid = _open(engine, timeout=timedelta(hours=1))
    ho.advance_all(engine, acts, T0, dry_run=False)
    assert dc.open_on("n1") == []
    ho.advance_all(engine, acts, T0 + timedelta(hours=1), dry_run=False)
    h = ho.get_handover(engine, hid)
    assert h.state == ho.ROLLED_BACK and "timed out in state releasing" in h.error
    assert dc.open_on("n1") == ["slurm"]
    assert [r["action"] for r in ho.audit_rows(engine, hid)] == ["drain", "resume"]


def test_stuck_attach_times_out_and_sends_the_node_back(sqlite_engine, datacenter):
    dc, acts = datacenter
    acts["kubernetes"].fail += [("resume", "before")] * 3
    hid = _open(sqlite_engine, timeout=timedelta(hours=1))
    ho.advance_all(sqlite_engine, acts, T0, dry_run=False)
    assert ho.get_handover(sqlite_engine, hid).state == ho.ATTACHING and dc.open_on("n1") == []
    rep = ho.advance_all(sqlite_engine, acts, T0 + timedelta(hours=2), dry_run=False)
    h = ho.get_handover(sqlite_engine, hid)
    assert h.state == ho.ROLLED_BACK and "timed out in state attaching" in h.error
    assert [f["id"] for f in rep["failed"]] == [hid]
    rev = max(ho.list_handovers(sqlite_engine), key=lambda x: x.id)
    assert (rev.from_platform, rev.to_platform, rev.state) == ("kubernetes", "slurm", ho.DONE)
    assert rev.reason == f"rollback of handover #{hid}"
    assert dc.open_on("n1") == ["slurm"]
    assert dc.slots[("kubernetes", "n1")].reason.startswith("gpupool:")  # never opened there
    assert [(r["platform"], r["action"], r["status"]) for r in ho.audit_rows(sqlite_engine, rev.id)] == [
        ("slurm", "resume", "ok")]


def test_rollback_of_done_handover_drains_target_and_waits(sqlite_engine, datacenter):
    dc, acts = datacenter
    hid = _open(sqlite_engine)
    ho.advance_all(sqlite_engine, acts, T0, dry_run=False)
    assert dc.open_on("n1") == ["kubernetes"]
    assert dc.start_job("kubernetes", "n1")
    out = ho.rollback(sqlite_engine, hid, acts, at=T0 + timedelta(hours=1))
    rev = ho.get_handover(sqlite_engine, out["reverse_id"])
    assert rev.state == ho.RELEASING and dc.open_on("n1") == []
    dc.finish_jobs()
    ho.advance_all(sqlite_engine, acts, T0 + timedelta(hours=1, minutes=5), dry_run=False)
    assert ho.get_handover(sqlite_engine, rev.id).state == ho.DONE
    assert dc.open_on("n1") == ["slurm"]
    with pytest.raises(ho.HandoverError, match="already rolled back"):
        ho.rollback(sqlite_engine, hid, acts)


def test_rollback_of_planned_sends_nothing(sqlite_engine, datacenter):
    hid = _open(sqlite_engine)
    assert ho.rollback(sqlite_engine, hid, datacenter[1], at=T0)["action"] == "closed"
    assert ho.get_handover(sqlite_engine, hid).state == ho.ROLLED_BACK
    assert ho.audit_rows(sqlite_engine) == []


def test_eviction_only_when_allowed(sqlite_engine, datacenter):
    dc, acts = datacenter
    dc.slots[("slurm", "n1")].jobs = 3
    hid = _open(sqlite_engine)
    ho.advance_all(sqlite_engine, acts, T0, dry_run=False)
    assert ho.get_handover(sqlite_engine, hid).state == ho.RELEASING
    assert "evict" not in [c.action for c in acts["slurm"].sent]
    ho.advance_all(sqlite_engine, acts, T0, dry_run=False, allow_evict=True)
    assert ho.get_handover(sqlite_engine, hid).state == ho.DONE
    assert [r["action"] for r in ho.audit_rows(sqlite_engine, hid)] == ["drain", "evict", "resume"]


def test_missing_actuator_waits_without_sending(sqlite_engine, datacenter):
    dc, acts = datacenter
    hid = _open(sqlite_engine)
    ho.advance_all(sqlite_engine, {"slurm": acts["slurm"]}, T0, dry_run=False)
    h = ho.get_handover(sqlite_engine, hid)
    assert h.state == ho.PLANNED and "no actuator" in h.error
    assert acts["slurm"].sent == []


def test_audit_row_is_committed_before_the_command_is_sent(sqlite_engine, datacenter):
    dc, acts = datacenter
    seen = []
    real_send = acts["slurm"].send

    def spy(cmd):
        with sqlite_engine.connect() as conn:  # another connection: sees only committed rows
            seen.append(conn.execute(sa.select(action_audit.c.action, action_audit.c.status)).all())
        return real_send(cmd)

    acts["slurm"].send = spy
    _open(sqlite_engine)
    ho.advance_all(sqlite_engine, acts, T0, dry_run=False)
    assert seen == [[("drain", "pending")]]


def test_arrival_mig_layout_comes_from_the_plan(sqlite_engine, datacenter):
    dc, acts = datacenter
    asked = []
    acts["kubernetes"].prepare_commands = lambda node, layout: asked.append(layout) or []
    with sqlite_engine.begin() as conn:
        pid = conn.execute(allocation_plan.insert().values(
            decided_at=T0, policy="predictive", solver="milp", dry_run=False, summary={},
            moves=[{"node": "n1", "from": "slurm", "to": "kubernetes", "mig_layout": "all-1g.10gb"}],
        )).inserted_primary_key[0]
    _open(sqlite_engine, plan_id=pid)
    ho.advance_all(sqlite_engine, acts, T0, dry_run=False)
    assert asked == ["all-1g.10gb"]


def test_open_rejects_same_platform(sqlite_engine):
    with pytest.raises(ho.HandoverError, match="both"):
        ho.open_handover(sqlite_engine, "n1", "slurm", "slurm", T0)


def test_rollback_of_a_handover_a_later_one_moved_on_is_refused(engine, datacenter):
    """n1 went slurm -> kubernetes -> openstack: sending the first move back would open n1 on
    slurm while it is open on openstack."""
    dc, acts = datacenter
    first = _open(engine)
    ho.advance_all(engine, acts, T0, dry_run=False)
    second = ho.open_handover(engine, "n1", "kubernetes", "openstack", T0 + timedelta(minutes=5), dry_run=False)
    ho.advance_all(engine, acts, T0 + timedelta(minutes=5), dry_run=False)
    assert dc.open_on("n1") == ["openstack"]
    for dry_run in (True, False):
        with pytest.raises(ho.HandoverError, match=f"moved on by handover #{second}"):
            ho.rollback(engine, first, acts, at=T0 + timedelta(minutes=10), dry_run=dry_run)
    assert ho.get_handover(engine, first).state == ho.DONE and dc.open_on("n1") == ["openstack"]
    ho.rollback(engine, second, acts, at=T0 + timedelta(minutes=10))  # the latest one may go back
    assert dc.open_on("n1") == ["kubernetes"]


def test_an_idle_node_moves_in_one_pass_step_by_step(engine, datacenter):
    """Each step that completes at once is followed by the next in the same pass (the drain of an
    idle node leaves it released, so it is attached at once), at most ``max_steps`` of them;
    the state of each step is written before its commands go out."""
    dc, acts = datacenter
    seen = []
    for platform in ("slurm", "kubernetes", "openstack"):
        real = acts[platform].send
        acts[platform].send = lambda cmd, real=real: seen.append(
            (cmd.node, cmd.action, ho.list_handovers(engine, node=cmd.node)[0].state)) or real(cmd)
    hid = _open(engine)
    ho.advance_all(engine, acts, T0, dry_run=False, max_steps=2)
    assert ho.get_handover(engine, hid).state == ho.RELEASED and dc.open_on("n1") == []
    other = _open(engine, node="n2", src="kubernetes", dst="openstack")
    rep = ho.advance_all(engine, acts, T0, dry_run=False)
    assert [(e["id"], e["before"], e["state"]) for e in rep["handovers"]] == [
        (hid, ho.RELEASED, ho.DONE), (other, ho.PLANNED, ho.DONE)]
    assert dc.open_on("n1") == ["kubernetes"] and dc.open_on("n2") == ["openstack"]
    assert seen == [("n1", "drain", ho.RELEASING), ("n1", "resume", ho.ATTACHING),
                    ("n2", "drain", ho.RELEASING), ("n2", "resume", ho.ATTACHING)]
