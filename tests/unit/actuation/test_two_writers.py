"""Two writers on one handover (issue 30): the handover DAG, ``gpupool rollback`` and a second
advancer interleaved deterministically on SQLite and PostgreSQL. The second writer runs inside
the first one's platform call (a read or a send), i.e. exactly between the first writer's read
of the handover and its write. Whatever the order, the node must end open on exactly one
platform, with at most one open handover, and the records must say where it is; the writer that
loses sees the conflict and sends nothing for a state it did not win.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from gpupool.actuation import handover as ho
from gpupool.staging.schema import handover
from memplatform import make

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=timezone.utc)


def _during(actuator, method: str, when, other) -> list:
    """Run ``other()`` once, inside the first call of ``actuator.method`` for which
    ``when(*args)`` holds, before the call itself goes through; returns what ``other``
    returned or raised (one item once it ran)."""
    real = getattr(actuator, method)
    ran: list = []

    def wrapped(*args, **kw):
        if not ran and when(*args):
            ran.append(None)
            try:
                ran[0] = other()
            except ho.HandoverError as exc:
                ran[0] = exc
        return real(*args, **kw)

    setattr(actuator, method, wrapped)
    return ran


def _records_match_platforms(engine, dc, node: str, first_owner: str) -> None:
    """No open handover left: the node is open on exactly one platform, the one the records say."""
    blocking = ho.list_handovers(engine, ho.BLOCKING_STATES, node=node)
    assert blocking == [], [(h.id, h.state) for h in blocking]
    done = [h for h in ho.list_handovers(engine, (ho.DONE,), node=node) if not h.dry_run]
    expected = max(done, key=lambda h: h.id).to_platform if done else first_owner
    assert dc.open_on(node) == [expected], ({h.id: (h.from_platform, h.to_platform, h.state, h.error)
                                             for h in ho.list_handovers(engine, node=node)})


def test_rollback_while_the_advancer_attaches(engine):
    """Issue 30, race 1: the advancer has read the handover and is about to attach at the target
    when a rollback runs to its end; the advancer's write must not overwrite the rollback."""
    dc, acts = make(("slurm", "kubernetes"), {"n1": "slurm"})
    hid = ho.open_handover(engine, "n1", "slurm", "kubernetes", T0, dry_run=False)
    ran = _during(acts["kubernetes"], "send", lambda cmd: cmd.action == "resume",
                  lambda: ho.rollback(engine, hid, acts, at=T0))
    ho.advance_all(engine, acts, T0, dry_run=False)
    assert len(ran) == 1
    assert len(dc.open_on("n1")) == 1, {p: dc.slots[(p, "n1")] for p in dc.platforms}
    if isinstance(ran[0], ho.HandoverConflict):  # the rollback lost: the handover went through
        assert ho.get_handover(engine, hid).state == ho.DONE
        out = ho.rollback(engine, hid, acts, at=T0 + timedelta(minutes=5))  # asked again, it wins
        assert ho.get_handover(engine, out["reverse_id"]).state == ho.DONE
    else:
        assert ho.get_handover(engine, hid).state == ho.ROLLED_BACK
    ho.advance_all(engine, acts, T0 + timedelta(minutes=10), dry_run=False)
    _records_match_platforms(engine, dc, "n1", "slurm")
    assert dc.open_on("n1") == ["slurm"]  # the rollback, then or asked again, brought it back


def test_late_advancer_while_another_attaches(engine):
    """Issue 30, race 1 with two advancers: one is past the handover's deadline (it would send
    the node back) while the other is attaching it."""
    dc, acts = make(("slurm", "kubernetes"), {"n1": "slurm"})
    hid = ho.open_handover(engine, "n1", "slurm", "kubernetes", T0, dry_run=False, timeout=timedelta(hours=1))
    late = T0 + timedelta(hours=2)
    ran = _during(acts["kubernetes"], "send", lambda cmd: cmd.action == "resume",
                  lambda: ho.advance_all(engine, acts, late, dry_run=False))
    ho.advance_all(engine, acts, T0, dry_run=False)
    assert len(ran) == 1
    assert len(dc.open_on("n1")) == 1, {p: dc.slots[(p, "n1")] for p in dc.platforms}
    ho.advance_all(engine, acts, late + timedelta(minutes=5), dry_run=False)
    _records_match_platforms(engine, dc, "n1", "slurm")
    if not isinstance(ran[0], ho.HandoverError):  # the late pass saw the node busy and left it
        assert hid in ran[0]["busy"] and ran[0]["failed"] == []


def test_rollback_of_a_planned_handover_the_advancer_starts_meanwhile(engine, monkeypatch):
    """Issue 30, race 2: a rollback reads the handover while it is ``planned``; the advancer then
    writes ``releasing`` and sends the drain; the rollback must not close it as "rolled back
    before anything was sent" and leave the node drained with no open handover."""
    dc, acts = make(("slurm", "kubernetes"), {"n1": "slurm"})
    dc.slots[("slurm", "n1")].jobs = 1  # the release waits for this work: the node stays drained
    hid = ho.open_handover(engine, "n1", "slurm", "kubernetes", T0, dry_run=False)
    real_get = ho.get_handover
    reports: list = []
    inside: list = []

    def get_then_advance(eng, handover_id):
        h = real_get(eng, handover_id)
        if not inside:  # after each read of the rollback (not the advancer's own), the advancer runs
            inside.append(True)
            try:
                reports.append(ho.advance_all(engine, acts, T0, dry_run=False))
            finally:
                inside.pop()
        return h

    monkeypatch.setattr(ho, "get_handover", get_then_advance)
    try:
        out = ho.rollback(engine, hid, acts, at=T0)
    except ho.HandoverConflict:
        out = None
    monkeypatch.setattr(ho, "get_handover", real_get)
    assert reports
    h = ho.get_handover(engine, hid)
    if h.state in ho.BLOCKING_STATES:  # the rollback lost and said so: the handover goes on
        assert out is None
        assert h.state == ho.RELEASING and dc.open_on("n1") == []
        out = ho.rollback(engine, hid, acts, at=T0 + timedelta(minutes=1))  # asked again, it wins
    assert out["state"] == ho.ROLLED_BACK
    _records_match_platforms(engine, dc, "n1", "slurm")
    assert ho.get_handover(engine, hid).state == ho.ROLLED_BACK


def test_a_state_changed_under_the_lock_stops_the_writer_before_it_sends(engine):
    """Beneath the lock every write is a compare-and-set: a writer that does not take the lock
    (here, a direct update while the drain is out) makes the advancer stop, report the conflict
    and send nothing for a state it did not win."""
    dc, acts = make(("slurm", "kubernetes"), {"n1": "slurm"})
    hid = ho.open_handover(engine, "n1", "slurm", "kubernetes", T0, dry_run=False)

    def failed_meanwhile():
        with engine.begin() as conn:
            conn.execute(handover.update().where(handover.c.id == hid).values(state=ho.FAILED, error="elsewhere"))

    _during(acts["slurm"], "send", lambda cmd: cmd.action == "drain", failed_meanwhile)
    rep = ho.advance_all(engine, acts, T0, dry_run=False)
    (entry,) = rep["handovers"]
    assert entry["state"] == ho.FAILED and "another writer changed it" in entry["conflict"]
    assert [f["id"] for f in rep["failed"]] == [hid]  # still failed: the task fails and alerts
    assert acts["kubernetes"].sent == []  # never attached
    assert [(r["action"], r["status"]) for r in ho.audit_rows(engine, hid)] == [("drain", "ok")]
    # the next pass settles it the usual way: gpupool's hold lifted, node back at its source
    ho.advance_all(engine, acts, T0 + timedelta(minutes=5), dry_run=False)
    assert ho.get_handover(engine, hid).state == ho.ROLLED_BACK and dc.open_on("n1") == ["slurm"]


def test_a_command_is_audited_and_sent_only_in_the_state_it_was_read_in(engine):
    dc, acts = make(("slurm", "kubernetes"), {"n1": "slurm"})
    hid = ho.open_handover(engine, "n1", "slurm", "kubernetes", T0, dry_run=False)
    cmd = acts["slurm"].release_commands("n1", "gpupool: moving to kubernetes")[0]
    with pytest.raises(ho.HandoverConflict, match=f"#{hid} is planned now, not releasing"):
        ho.send_audited(engine, hid, acts["slurm"], cmd, dry_run=False, expected_state=ho.RELEASING)
    assert ho.audit_rows(engine, hid) == [] and acts["slurm"].sent == []
    ho.send_audited(engine, hid, acts["slurm"], cmd, dry_run=False, expected_state=ho.PLANNED)
    assert [r["status"] for r in ho.audit_rows(engine, hid)] == ["ok"] and len(acts["slurm"].sent) == 1


def test_a_rollback_waits_for_no_one(engine):
    """The node lock never blocks: while the handover DAG holds the node, ``gpupool rollback``
    answers at once that the node is busy, on another thread too."""
    import threading

    from gpupool.staging import handovers as store

    dc, acts = make(("slurm", "kubernetes"), {"n1": "slurm"})
    hid = ho.open_handover(engine, "n1", "slurm", "kubernetes", T0, dry_run=False)
    answers: list = []

    def operator():
        try:
            answers.append(ho.rollback(engine, hid, acts, at=T0))
        except ho.HandoverConflict as exc:
            answers.append(exc)

    with store.node_lock(engine, "n1") as held:
        assert held
        t = threading.Thread(target=operator)
        t.start()
        t.join(timeout=30)
        assert not t.is_alive()
    assert isinstance(answers[0], ho.HandoverConflict) and "being changed by another writer" in str(answers[0])
    assert ho.get_handover(engine, hid).state == ho.PLANNED
    assert ho.rollback(engine, hid, acts, at=T0)["state"] == ho.ROLLED_BACK  # once free, it goes through


def test_two_pools_staged_in_two_schemas_of_one_database_do_not_share_locks(pg_schema_engines):
    """Advisory locks are database-wide on PostgreSQL: the node and budget locks are keyed on the
    staging schema, so a node of one pool held does not stand aside the same name in another."""
    from gpupool.staging import handovers as store

    with pg_schema_engines() as one, pg_schema_engines() as other:
        with store.node_lock(one, "n1") as held:
            assert held
            with store.node_lock(other, "n1") as also:
                assert also
            with store.node_lock(one, "n1") as again:
                assert not again  # the same pool's lock is still exclusive
        with store.moves_lock(one), store.moves_lock(other, wait_s=1):
            pass
        with store.moves_lock(one):
            with pytest.raises(store.LockTimeout):
                with store.moves_lock(one, wait_s=0.2):
                    pass


def test_a_handover_opened_on_a_stale_view_fails_before_it_sends(engine):
    """Issue 42: a fast path read node n1 on kubernetes (lent there by its owner slurm) and opens
    its move to openstack just after the owner's reclaim brought it home. The move's source no
    longer holds the node: it fails with nothing sent, and settling it keeps the hold at
    kubernetes (the reclaim's), so the node stays open on slurm alone."""
    dc, acts = make(("openstack", "slurm", "kubernetes"), {"n1": "kubernetes"})
    rid = ho.open_handover(engine, "n1", "kubernetes", "slurm", T0, dry_run=False, kind=ho.RECLAIM)
    assert ho.advance_one(engine, ho.get_handover(engine, rid), acts, T0).state == ho.DONE
    mid = ho.open_handover(engine, "n1", "kubernetes", "openstack", T0, dry_run=False)  # the stale view
    out = ho.advance_one(engine, ho.get_handover(engine, mid), acts, T0 + timedelta(minutes=1))
    assert out.state == ho.ROLLED_BACK, out
    assert "open on slurm" in out.error and "another handover moved it" in out.error
    assert "hold at kubernetes kept" in out.error
    assert ho.audit_rows(engine, mid) == [] and acts["openstack"].sent == []
    assert dc.open_on("n1") == ["slurm"]
