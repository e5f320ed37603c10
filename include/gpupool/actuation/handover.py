"""The two-phase handover of a pool node from one platform to another, persisted in ``handover``.

States::

    planned -> releasing -> released -> attaching -> done
        \\           \\           \\           \\
         +-----------+-----------+-----------+--> failed | rolled_back

* ``planned``: opened from a plan; nothing sent yet.
* ``releasing``: the release commands (drain / cordon / disable with a ``gpupool:`` reason) may
  have been sent — the state is written *before* the first command, so a run that dies in
  between is resumed, never forgotten. Stays here until the source reports the node empty.
* ``released``: held at the source and empty of work.
* ``attaching``: the attach commands (MIG layout first where asked, then resume / uncordon /
  enable) may have been sent to the target.
* ``done``; ``failed`` (needs a rollback, e.g. another tool took the node); ``rolled_back``.

Safety rules, enforced here and re-checked by every actuator:

* one blocking handover per node (``planned``..``attaching`` and ``failed``): a second is
  refused (:class:`HandoverConflict`), checked under a per-node lock on PostgreSQL;
* one writer per node: :func:`advance_all`, :func:`advance_one` and :func:`rollback` hold the
  node's lock (:func:`gpupool.staging.handovers.node_lock`) from their read of a handover until
  its commands are sent and its state written — the handover DAG, ``gpupool rollback`` and a
  fast path alike (the one-slot Airflow pool does not cover the CLI). A writer that finds the
  node busy does nothing: the advancer lists it under ``busy`` (next run retries), a rollback
  raises :class:`HandoverConflict`. Beneath the lock each state change is a compare-and-set on
  the state read, and a command is audited (then sent) only while that state holds: a writer
  that loses stops with :class:`HandoverConflict`, sending nothing;
* the target is attached only after the source reported the node released, and only while the
  source still holds it — a node is never open for work on two platforms at once;
* a handover whose node another handover put elsewhere after it was opened (a writer that read
  the node before it moved: a fast-path move and an owner's reclaim of one lent node) fails with
  nothing sent: it finds the node open on a platform its node's handovers name other than its
  source; no node open on such a platform is attached, and gpupool's hold at a source is lifted
  only while the node is open on none of them;
* every command is written to ``action_audit`` (``pending``) and committed before it is sent,
  then marked ``ok`` or ``failed`` with the answer; all commands are idempotent, so a command
  whose outcome is unknown is simply sent again by the next run;
* a platform API that fails leaves the handover in its state with the error recorded: the next
  run resumes it;
* the target must know the node (and not be held there by someone else) *before* the source
  is drained: otherwise the handover fails with nothing sent;
* a reclaim (``kind`` "reclaim", issue 42) ends the borrowed work on its node through the
  source's ``evict_commands`` where the source can evict, even without ``allow_evict``: the
  reclaim rule let that work run its ``min_runtime_minutes`` first. An eviction the platform
  refuses (a PodDisruptionBudget) keeps the handover waiting with the refusal as its error, and
  (the source's ``blocking_budgets``) the budgets that block and by when the reclaim's deadline
  falls; nothing is ever deleted around a budget, ``allow_evict`` or not. A
  reclaim keeps the handover's deadline: past it, it is rolled back like any handover (the node
  stays with, or goes back to, the borrower, never held by gpupool), its error says it was a
  reclaim and the run fails on it; the owner's need stays open and the next tick reclaims again;
* a handover that fails or passes its ``deadline`` never leaves the node held by gpupool:
  while nothing was sent to the target, gpupool's own hold at the source is lifted; once the
  target was touched, a reverse handover sends the node back the same safe way. Either way
  the handover ends ``rolled_back`` with its error saying what failed, the step is in
  ``action_audit``, and :func:`advance_all` reports it under ``failed`` so the caller fails
  the task (:class:`HandoverFailed`) and Airflow alerts. When lifting the hold itself fails the
  handover stays ``failed`` and the next run tries again (and fails the task again);
* deadlines of live handovers are checked even in a dry-run pass, and gpupool's own holds
  lifted there: lifting gpupool's hold only gives a node back to the platform it came from,
  the safe direction. A dry-run pass never drains nor attaches, so a handover whose target was
  touched is only flagged then;
* gpupool never lifts a hold it did not place (reasons start with ``gpupool:``): such a node
  fails the handover and is left exactly as found;
* a ``dry_run`` handover writes the audit rows of every command it would send (status
  ``dry_run``) in one pass, sends nothing and ends ``done``.

A pass takes as many steps as complete at once (up to :data:`MAX_STEPS`, the length of the
path ``planned`` -> ``done``): a node that drains at once is released and attached in the same
pass; a step that must wait (work still running, a MIG re-layout) ends the pass, and the next
one resumes there. Every table access goes through :mod:`gpupool.staging.handovers`.

The record, its opening and reading, the audited send and the compare-and-set every state
change goes through are :mod:`gpupool.actuation.handover_records` (re-exported here); this
module is the state machine on top: advancing, settling a failure, rolling back.

Nothing here reads the wall clock to decide: the caller passes ``at``. Audit rows carry the
wall-clock times at which commands really went out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.engine import Engine

from gpupool.actuation.actuators.base import ActuationError, Actuator, Command, ForeignHoldError, moving_reason
from gpupool.actuation.handover_records import (  # noqa: F401 - re-exported: callers name them here
    ATTACHING,
    BLOCKED_BY,
    BLOCKING_STATES,
    DEFAULT_TIMEOUT,
    RECLAIM,
    DONE,
    FAILED,
    MAX_STEPS,
    OPEN_STATES,
    PLANNED,
    RELEASED,
    RELEASING,
    ROLLED_BACK,
    SOURCE_SIDE,
    STATES,
    Handover,
    HandoverConflict,
    HandoverError,
    HandoverFailed,
    ReclaimBlocked,
    ReclaimLate,
    audit_rows,
    conflict_from,
    get_handover,
    list_handovers,
    lost_race,
    open_handover,
    send_audited,
    send_live,
    target_touched,
    update_handover,
    wall_clock,
)
from gpupool.actuation.quota import GROW as QUOTA_GROW, SHRINK as QUOTA_SHRINK
from gpupool.staging import handovers as store
from gpupool.staging import reads
from gpupool.values import utc_datetime


def _arrival_layout(engine: Engine, h: Handover) -> str | None:
    """The MIG layout the plan wants the node to arrive with (``None``: leave it)."""
    if h.plan_id is None:
        return None
    row = reads.plan_by_id(engine, h.plan_id)
    for m in (row.moves if row is not None else None) or []:
        if m.get("node") == h.node and m.get("to") == h.to_platform:
            layout = m.get("mig_layout")
            return layout or None
    return None


# ------------------------------------------------------------------------------------ advancing


def advance_all(
    engine: Engine,
    actuators: Mapping[str, Actuator],
    at: datetime,
    dry_run: bool = True,
    allow_evict: bool = False,
    max_steps: int = MAX_STEPS,
    reclaim_minutes: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """Move every open handover forward as far as it safely can now, and time out stuck ones.

    Each handover takes at most ``max_steps`` transitions and stops at the first wait (the
    source still busy, a MIG re-layout in progress) or failure. ``dry_run`` handovers are
    completed on paper. With ``dry_run=True`` nothing is drained or attached: live handovers
    are skipped (and reported so) — except that their deadlines are still checked and
    gpupool's own hold at the source lifted when one has passed or the handover failed (see
    the module's safety rules). ``allow_evict`` lets actuators that can evict (the Kubernetes
    Eviction API) ask running GPU work to leave; otherwise release waits for it.
    ``reclaim_minutes`` (owner -> its promise): a reclaim blocked by a disruption budget says
    in its error by when its deadline falls.

    Each handover is re-read under its node's lock; one whose node another writer holds is
    left alone and listed under ``busy`` (the next run retries it).

    Returns ``{"handovers": [{id, node, from, to, before, state, error}], "skipped": [ids],
    "busy": [ids], "failed": [...]}``; ``failed`` lists the handovers that failed or timed out
    in this pass or are still failed, for the caller to raise :class:`HandoverFailed` on. An
    entry whose state another writer changed under this pass carries ``conflict``.
    """
    at = utc_datetime(at)
    report: dict[str, Any] = {"at": at.isoformat(), "handovers": [], "skipped": [], "busy": [], "failed": []}
    for listed in sorted(list_handovers(engine, BLOCKING_STATES), key=lambda x: x.id):
        with store.node_lock(engine, listed.node) as held:
            if not held:
                report["busy"].append(listed.id)
                continue
            h = get_handover(engine, listed.id)
            if h.state not in BLOCKING_STATES:  # another writer ended it since the listing
                continue
            conflict = None
            try:
                after = _advance_locked(engine, h, actuators, at, dry_run, allow_evict, max_steps, reclaim_minutes)
            except HandoverConflict as exc:  # a writer that does not take the lock changed it
                conflict, after = str(exc), get_handover(engine, h.id)
            if after is None:
                report["skipped"].append(h.id)
                continue
        entry = {"id": h.id, "node": h.node, "from": h.from_platform, "to": h.to_platform,
                 "before": h.state, "state": after.state, "error": after.error}
        if conflict is not None:
            entry["conflict"] = conflict
        report["handovers"].append(entry)
        if (after.state == FAILED) if conflict is not None else _failed(h, after, at):
            report["failed"].append(entry)
    return report


def _advance_locked(engine: Engine, h: Handover, actuators: Mapping[str, Actuator], at: datetime, dry_run: bool,
                    allow_evict: bool, max_steps: int,
                    reclaim_minutes: Mapping[str, float] | None = None) -> Handover | None:
    """One handover's turn in :func:`advance_all`, its node's lock held; None: skipped."""
    if h.dry_run:
        if h.state == FAILED:
            return None
        return _complete_on_paper(engine, h, actuators, at)
    if dry_run:
        if h.state != FAILED and not _past_deadline(h, at):
            return None
        why = f"timed out in state {h.state}" if h.state != FAILED else None
        return _settle(engine, h, actuators, at, may_send_back=False, why=why)
    if h.state == FAILED:
        return _settle(engine, h, actuators, at, may_send_back=True)
    return _advance(engine, h, actuators, at, allow_evict=allow_evict, max_steps=max_steps,
                    reclaim_minutes=reclaim_minutes)


def _past_deadline(h: Handover, at: datetime) -> bool:
    return h.deadline is not None and at >= h.deadline


def _failed(before: Handover, after: Handover, at: datetime) -> bool:
    """Whether this pass left ``after`` failed, or ended it by a failure or a timeout."""
    if after.state == FAILED:
        return True
    if after.state == ROLLED_BACK and before.state != ROLLED_BACK:
        return True  # advance_all only rolls back on failure or deadline
    return after.state in OPEN_STATES and _past_deadline(after, at)  # nothing could be done


def advance_one(engine: Engine, h: Handover, actuators: Mapping[str, Actuator], at: datetime,
                allow_evict: bool = False, max_steps: int = MAX_STEPS,
                reclaim_minutes: Mapping[str, float] | None = None) -> Handover:
    """Advance one live handover (see :func:`advance_all`); returns it as it ends up.

    Takes the node's writer lock and re-reads the handover under it; :class:`HandoverConflict`
    when another writer holds the node, or changed the handover under this one.
    """
    at = utc_datetime(at)
    with store.node_lock(engine, h.node) as held:
        if not held:
            raise HandoverConflict(f"handover #{h.id}: node {h.node!r} is being changed by another writer")
        fresh = get_handover(engine, h.id)
        if fresh.state not in OPEN_STATES:
            return fresh
        return _advance(engine, fresh, actuators, at, allow_evict=allow_evict, max_steps=max_steps,
                        reclaim_minutes=reclaim_minutes)


def _advance(engine: Engine, h: Handover, actuators: Mapping[str, Actuator], at: datetime,
             allow_evict: bool = False, max_steps: int = MAX_STEPS,
             reclaim_minutes: Mapping[str, float] | None = None) -> Handover:
    """:func:`advance_one` with the node's lock held: step while each step completes at once."""
    src, dst = actuators.get(h.from_platform), actuators.get(h.to_platform)
    missing = [p for p, a in ((h.from_platform, src), (h.to_platform, dst)) if a is None]
    if missing:
        late = "; past its deadline" if _past_deadline(h, at) else ""
        return update_handover(engine, h, at, error=f"no actuator for platform(s) {missing}; waiting{late}")
    try:
        if _past_deadline(h, at) and h.state in OPEN_STATES:
            return _settle(engine, h, actuators, at, may_send_back=True,
                           why=f"timed out in state {h.state}")
        for _ in range(max_steps):
            nxt = _step(engine, h, actuators, at, allow_evict, reclaim_minutes)
            if nxt is None:
                break
            h = nxt
            if h.state not in OPEN_STATES:
                break
    except ForeignHoldError as exc:
        h = update_handover(engine, h, at, state=FAILED, error=f"left alone: {exc}")
    except ActuationError as exc:
        return update_handover(engine, h, at, error=f"will retry: {exc}")
    if h.state == FAILED:
        return _settle(engine, h, actuators, at, may_send_back=True)
    return h


def _step(engine: Engine, h: Handover, actuators: Mapping[str, Actuator], at: datetime,
          allow_evict: bool, reclaim_minutes: Mapping[str, float] | None = None) -> Handover | None:
    """One transition, or None when the handover must wait (its error says why, if anything failed).

    The state a step's commands belong to is written first (``releasing`` before the drain,
    ``attaching`` before the attach), and each command is audited only while the handover is
    still in the state read. A handover whose node another writer's handover has put elsewhere
    since this one was opened (it is open on a platform other than the source) fails before
    anything is sent, and a node open on any platform but the target is never attached.
    """
    node = h.node
    src, dst = actuators[h.from_platform], actuators[h.to_platform]
    if h.state == PLANNED:
        st = src.owner_state(node)
        if not st.present:
            return update_handover(engine, h, at, state=FAILED, error=f"{h.from_platform} does not know node {node!r}")
        elsewhere = _open_elsewhere(engine, h, actuators, h.from_platform)
        if elsewhere:
            return update_handover(engine, h, at, state=FAILED, error=(
                f"node {node!r} is open on {', '.join(elsewhere)}, not held by {h.from_platform}: another "
                f"handover moved it since this one was opened; nothing sent"))
        # the target must be able to take the node before the source lets it go
        st_t = dst.owner_state(node)
        if not st_t.present and not dst.attach_brings_node:
            return update_handover(engine, h, at, state=FAILED,
                        error=f"{h.to_platform} does not know node {node!r}; nothing sent to {h.from_platform}")
        dst.refuse_foreign(st_t, "attach")
        src.refuse_foreign(st, "release")
        return update_handover(engine, h, at, state=RELEASING, error=None)
    if h.state == RELEASING:
        st = src.owner_state(node)
        src.refuse_foreign(st, "release")
        if not st.held_by_gpupool:
            for cmd in src.release_commands(node, moving_reason(h.to_platform)):
                send_live(engine, h, src, cmd)
        refused = None
        # a reclaim ends the borrowed work itself: the reclaim rule let it run min_runtime_minutes first
        if src.can_evict and (allow_evict or h.kind == RECLAIM):
            for cmd in src.evict_commands(node):
                try:
                    send_live(engine, h, src, cmd)
                except ForeignHoldError:
                    raise
                except ActuationError as exc:  # a PodDisruptionBudget says not now: keep waiting, say why
                    refused = f"eviction refused: {exc}"
                    if h.kind == RECLAIM:
                        refused += _blocked_said(h, src, reclaim_minutes)
                    break
        if src.is_released(node):
            return update_handover(engine, h, at, state=RELEASED, error=None)
        busy = src.owner_state(node).busy
        why = ([f"{busy} unit(s) of work still on {h.from_platform}"] if busy else []) + ([refused] if refused else [])
        update_handover(engine, h, at, error=("waiting: " + "; ".join(why)) if why else None)
        return None
    if h.state == RELEASED:
        st_t = dst.owner_state(node)
        if not st_t.present and not dst.attach_brings_node:
            return update_handover(engine, h, at, state=FAILED, error=f"{h.to_platform} does not know node {node!r}")
        dst.refuse_foreign(st_t, "attach")
        return update_handover(engine, h, at, state=ATTACHING, error=None)
    if h.state == ATTACHING:
        elsewhere = _open_elsewhere(engine, h, actuators, h.to_platform)
        if h.from_platform in elsewhere:
            return update_handover(engine, h, at, state=FAILED,
                        error=f"{h.from_platform} opened node {node!r} again (hold lifted outside gpupool); not attaching")
        if elsewhere:
            return update_handover(engine, h, at, state=FAILED,
                        error=f"node {node!r} is open on {', '.join(elsewhere)}; not attaching")
        layout = _arrival_layout(engine, h)
        for cmd in dst.prepare_commands(node, layout):
            send_live(engine, h, dst, cmd)
        if not dst.is_prepared(node, layout):
            update_handover(engine, h, at, error=f"waiting: MIG layout {layout} not applied yet")
            return None
        for cmd in dst.attach_commands(node):
            send_live(engine, h, dst, cmd)
        st_t = dst.owner_state(node)
        if st_t.present and st_t.schedulable:
            return update_handover(engine, h, at, state=DONE, error=None)
        update_handover(engine, h, at, error=f"waiting: {h.to_platform} does not report node {node!r} schedulable yet")
        return None
    return None


def _blocked_said(h: Handover, src: Actuator, reclaim_minutes: Mapping[str, float] | None) -> str:
    """What a reclaim whose eviction was refused adds to its error: the disruption budgets that
    allow no disruption on its node now (``src.blocking_budgets``) and by when its deadline
    (``need_since`` + the owner's ``reclaim_minutes``) falls; empty where no budget is named."""
    try:
        budgets = src.blocking_budgets(h.node)
    except Exception:  # the refusal is recorded either way; the names only say what blocks
        return ""
    if not budgets:
        return ""
    minutes = (reclaim_minutes or {}).get(h.to_platform)
    when = "unknown"
    if minutes is not None and h.need_since is not None:
        deadline = h.need_since + timedelta(minutes=minutes)
        when = f"{deadline.isoformat()} ({h.to_platform}'s reclaim_minutes {minutes:g})"
    return f"; {BLOCKED_BY}{', '.join(budgets)}; the reclaim's deadline falls at {when}"


def _settle(engine: Engine, h: Handover, actuators: Mapping[str, Actuator], at: datetime,
            may_send_back: bool, why: str | None = None) -> Handover:
    """A failed or timed-out live handover: never leave the node held by gpupool.

    Nothing sent to the target yet: lift gpupool's own hold at the source (only a hold whose
    reason is gpupool's) and end ``rolled_back``. Target touched: open a reverse handover that
    sends the node back (only when ``may_send_back``: a dry-run pass sends no drain), else stay
    ``failed``. A lift that fails keeps the handover ``failed``; the next run tries again.
    The node's writer lock is held by the caller.
    """
    why = why or (h.error or f"failed in state {h.state}")
    if h.kind == RECLAIM:  # never back with the borrower silently: said here, and the run fails on it
        why = (f"{why}; a reclaim for {h.to_platform}, so its node stays with {h.from_platform} for now: "
               f"{h.to_platform}'s need stays open and the next tick reclaims it again")
    src, dst = actuators.get(h.from_platform), actuators.get(h.to_platform)
    if not target_touched(engine, h):
        if src is None:
            return update_handover(engine, h, at, state=FAILED,
                        error=f"{why}; no actuator for {h.from_platform} to lift gpupool's hold")
        try:
            done, _ = _lift_source_hold(engine, h, actuators)
        except ActuationError as exc:
            return update_handover(engine, h, at, state=FAILED,
                        error=f"{why}; lifting gpupool's hold at {h.from_platform} failed, retried next run: {exc}")
        return update_handover(engine, h, at, state=ROLLED_BACK, error=f"{why}; {done}")
    if not may_send_back or (h.reason or "").startswith("rollback of handover"):
        note = "dry run: not sent back" if not may_send_back else "a rollback that failed"
        return update_handover(engine, h, at, state=FAILED, error=f"{why}; {note}; needs `gpupool rollback {h.id}`")
    rid = _open_reverse(engine, h, at, DEFAULT_TIMEOUT, f"{why}; sent back")
    if src is not None and dst is not None:
        _advance(engine, get_handover(engine, rid), actuators, at)
    return get_handover(engine, h.id)


def _lift_source_hold(engine: Engine, h: Handover, actuators: Mapping[str, Actuator]) -> tuple[str, str | None]:
    """Re-open the node at its source, when (and only when) gpupool's hold is on it and the node
    is open nowhere else (another handover put it there: the hold at the source is that one's).
    Returns what was done, and where the node is open instead when the hold was kept."""
    src = actuators[h.from_platform]
    st = src.owner_state(h.node)
    if not st.held_by_gpupool:
        if st.present and st.schedulable and _quota_shrunk(engine, h):
            # the queue's quota went down before a hold that never came (a cordon that failed):
            # still open at the source, it is given back, or the queue stays short by the node
            for cmd in [c for c in src.attach_commands(h.node) if c.action == QUOTA_GROW]:
                send_live(engine, h, src, cmd)
            return f"nothing of gpupool's held at {h.from_platform}; its queue's quota given back", None
        return f"nothing of gpupool's held at {h.from_platform}", None
    elsewhere = _open_elsewhere(engine, h, actuators, h.from_platform)
    if elsewhere:
        where = ", ".join(elsewhere)
        return f"gpupool's hold at {h.from_platform} kept: the node is open on {where}", where
    for cmd in src.attach_commands(h.node):
        send_live(engine, h, src, cmd)
    return f"gpupool's hold at {h.from_platform} lifted", None


def _quota_shrunk(engine: Engine, h: Handover) -> bool:
    """Whether ``h`` shrank its source's queue quota (an audited ``quota_shrink`` that went out)."""
    return any(r["action"] == QUOTA_SHRINK and r["platform"] == h.from_platform and r["status"] in ("ok", "pending")
               for r in audit_rows(engine, h.id))


def _open_elsewhere(engine: Engine, h: Handover, actuators: Mapping[str, Actuator], here: str) -> list[str]:
    """The platforms other than ``here`` on which ``h``'s node is open for work now, among its
    source and target and the platforms the node's other live handovers name (where another
    writer may have put it since ``h`` was opened); a platform with no actuator is not read."""
    named = {h.from_platform, h.to_platform}
    named |= {p for x in list_handovers(engine, node=h.node) if x.id != h.id and not x.dry_run
              for p in (x.from_platform, x.to_platform)}
    out = []
    for p in sorted(named - {here}):
        act = actuators.get(p)
        if act is not None:
            st = act.owner_state(h.node)
            if st.present and st.schedulable:
                out.append(p)
    return out


def _open_reverse(engine: Engine, h: Handover, at: datetime, timeout: timedelta, error: str) -> int:
    """Close ``h`` as rolled back (if still in the state read) and open its reverse target ->
    source, atomically; :class:`HandoverConflict` when either cannot be done (nothing written)."""
    try:
        rid = store.close_and_reverse(
            engine, h.id, h.state, dict(state=ROLLED_BACK, error=f"{error}: reverse handover opened", updated_at=at),
            dict(node=h.node, from_platform=h.to_platform, to_platform=h.from_platform, state=PLANNED,
                 plan_id=None, reason=f"rollback of handover #{h.id}", error=None, dry_run=False,
                 created_at=at, updated_at=at, deadline=at + timeout, gpus=h.gpus),
            BLOCKING_STATES)
    except store.Blocked as exc:
        raise conflict_from(exc) from None
    if rid is None:
        raise lost_race(engine, h.id, h.state, "no reverse handover opened")
    return rid


def _complete_on_paper(engine: Engine, h: Handover, actuators: Mapping[str, Actuator], at: datetime) -> Handover:
    """A dry-run handover: audit every command it would send, send none, end ``done``."""
    src, dst = actuators.get(h.from_platform), actuators.get(h.to_platform)
    reason = moving_reason(h.to_platform)
    layout = _arrival_layout(engine, h)
    rows = []
    rows += _would_send(src, h.from_platform, h.node, "release", lambda a: a.release_commands(h.node, reason), {"reason": reason})
    if h.kind == RECLAIM and src is not None and src.can_evict:  # a reclaim ends the borrowed work
        rows += _would_send(src, h.from_platform, h.node, "evict", lambda a: a.evict_commands(h.node), {},
                            skip_empty=True)
    rows += _would_send(dst, h.to_platform, h.node, "prepare", lambda a: a.prepare_commands(h.node, layout),
                        {"mig_layout": layout}, skip_empty=True)
    rows += _would_send(dst, h.to_platform, h.node, "attach", lambda a: a.attach_commands(h.node), {})
    notes = []
    for cmd, note in rows:
        send_audited(engine, h.id, None, cmd, dry_run=True, expected_state=h.state)
        if note:
            notes.append(note)
    return update_handover(engine, h, at, state=DONE, error="; ".join(notes) or None)


def _would_send(act: Actuator | None, platform: str, node: str, kind: str, build, generic: dict,
                skip_empty: bool = False) -> list[tuple[Command, str | None]]:
    if act is None:
        if skip_empty and not any(generic.values()):
            return []
        return [(Command(platform, node, kind, {**generic, "note": "no actuator for this platform: described, not built"}), None)]
    try:
        return [(c, None) for c in build(act)]
    except ForeignHoldError as exc:
        return [(Command(platform, node, kind, {**generic, "refused": str(exc)}), f"would refuse: {exc}")]
    except Exception as exc:  # a read failed: a dry run still says what it would have done
        return [(Command(platform, node, kind, {**generic, "unknown": f"{type(exc).__name__}: {exc}"}),
                 f"could not read {platform}: {exc}")]

# ------------------------------------------------------------------------------------ rollback


def rollback(
    engine: Engine,
    handover_id: int,
    actuators: Mapping[str, Actuator],
    at: datetime | None = None,
    dry_run: bool = False,
    timeout: timedelta = DEFAULT_TIMEOUT,
) -> dict[str, Any]:
    """Undo a handover safely; returns ``{"id", "state", "action", "reverse_id"?}``.

    * nothing sent to the target yet (``planned``, ``releasing``, ``released``, or ``failed``
      before attaching): gpupool's hold at the source is lifted and the handover ends
      ``rolled_back``;
    * the target was (maybe) attached (``attaching``, ``done``, a ``failed`` attach): the handover
      ends ``rolled_back`` and a reverse handover target -> source is opened in its place, so the
      node leaves the target the same safe way it came (drain, wait until empty, attach).

    ``at`` defaults to now (an operator's command). A dry-run handover is just closed.

    The rollback holds the node's writer lock and reads the handover under it:
    :class:`HandoverConflict` when another writer (the handover DAG, another rollback) holds
    the node or changed the handover under it — nothing is then sent; try again.

    With ``dry_run`` nothing is sent and no state changes: the commands the rollback would send
    are written to ``action_audit`` with status ``dry_run`` and returned under ``would_send``.
    """
    at = utc_datetime(at) if at is not None else wall_clock()
    if dry_run:
        return _rollback_on_paper(engine, get_handover(engine, handover_id), actuators)
    node = get_handover(engine, handover_id).node
    with store.node_lock(engine, node) as held:
        if not held:
            raise HandoverConflict(f"handover #{handover_id}: node {node!r} is being changed by another writer "
                                   f"(the handover DAG or another rollback); nothing sent, try again")
        return _rollback_locked(engine, get_handover(engine, handover_id), actuators, at, timeout)


def _rollback_locked(engine: Engine, h: Handover, actuators: Mapping[str, Actuator], at: datetime,
                     timeout: timedelta) -> dict[str, Any]:
    if h.state == ROLLED_BACK:
        raise HandoverError(f"handover #{h.id} is already rolled back")
    if h.dry_run or h.state == PLANNED:
        update_handover(engine, h, at, state=ROLLED_BACK, error="rolled back before anything was sent")
        return {"id": h.id, "state": ROLLED_BACK, "action": "closed"}
    src, dst = actuators.get(h.from_platform), actuators.get(h.to_platform)
    if not target_touched(engine, h) and h.state in SOURCE_SIDE + (FAILED,):
        if src is None:
            raise HandoverError(f"handover #{h.id}: no actuator for {h.from_platform} to lift the hold")
        try:
            done, open_on = _lift_source_hold(engine, h, actuators)
        except ActuationError as exc:
            update_handover(engine, h, at, error=f"rollback failed, retry: {exc}")
            raise
        update_handover(engine, h, at, state=ROLLED_BACK, error=f"rolled back from {h.state}; {done}")
        return {"id": h.id, "state": ROLLED_BACK,
                "action": f"left open on {open_on}" if open_on else f"returned to {h.from_platform}"}
    _refuse_superseded(engine, h)
    rid = _open_reverse(engine, h, at, timeout, f"rolled back from {h.state}")
    if src is not None and dst is not None:
        _advance(engine, get_handover(engine, rid), actuators, at)
    return {"id": h.id, "state": ROLLED_BACK, "action": "reverse handover opened", "reverse_id": rid}


def _refuse_superseded(engine: Engine, h: Handover) -> None:
    """A handover that a later live one of the node followed is not sent back: the node is no
    longer where ``h`` put it, and a reverse would open it a second time elsewhere."""
    later = [x for x in list_handovers(engine, node=h.node)
             if x.id > h.id and not x.dry_run and x.state != ROLLED_BACK]
    if later:
        x = min(later, key=lambda y: y.id)
        raise HandoverError(f"handover #{h.id}: node {h.node!r} was moved on by handover #{x.id} "
                            f"({x.from_platform} -> {x.to_platform}, {x.state}); roll that one back instead")


def _rollback_on_paper(engine: Engine, h: Handover, actuators: Mapping[str, Actuator]) -> dict[str, Any]:
    """What :func:`rollback` would send, audited as ``dry_run``; nothing sent, no state changed."""
    if h.state == ROLLED_BACK:
        raise HandoverError(f"handover #{h.id} is already rolled back")
    if h.dry_run or h.state == PLANNED:
        return {"id": h.id, "state": h.state, "action": "would close it (nothing was sent)", "would_send": [],
                "dry_run": True}
    src, dst = actuators.get(h.from_platform), actuators.get(h.to_platform)
    if not target_touched(engine, h) and h.state in SOURCE_SIDE + (FAILED,):
        if src is None:
            cmds = [Command(h.from_platform, h.node, "attach",
                            {"note": "no actuator for this platform: described, not built; "
                                     "lifts gpupool's hold only if the reason is gpupool's"})]
        else:
            cmds = src.attach_commands(h.node) if src.owner_state(h.node).held_by_gpupool else []
        for cmd in cmds:
            send_audited(engine, h.id, None, cmd, dry_run=True)
        return {"id": h.id, "state": h.state, "action": "would return the node to its source",
                "would_send": [asdict(c) for c in cmds], "dry_run": True}
    _refuse_superseded(engine, h)
    reason = moving_reason(h.from_platform)
    if dst is None:
        cmds = [Command(h.to_platform, h.node, "release",
                        {"reason": reason, "note": "no actuator for this platform: described, not built"})]
    else:
        cmds = dst.release_commands(h.node, reason)
    for cmd in cmds:
        send_audited(engine, h.id, None, cmd, dry_run=True)
    return {"id": h.id, "state": h.state,
            "action": f"would open a reverse handover {h.to_platform} -> {h.from_platform}",
            "would_send": [asdict(c) for c in cmds], "dry_run": True}
