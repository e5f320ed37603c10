"""Power as a node state: park a pool node, wake it, persisted in ``node_power`` with every
transition in ``power_transition`` and every command in ``action_audit``.

States::

    on -> parking -> parked -> waking -> on
            |   \\______________/  ^
            |    (a wake of a node  |
            +--> on (park given up: someone else's hold; the error says why)
                 still parking)

* ``on``: powered and in service (a node without a ``node_power`` row is on);
* ``parking``: the park's commands (hold, power-off) may have been sent — the state is written
  *before* the first command, so a run that dies in between is resumed, never forgotten. It
  stays here while the platform still has work on the node or is powering it off;
* ``parked``: the platform reports it powered off. It belongs to the platform in
  ``node_power.platform``, where it wakes;
* ``waking``: the wake's commands (power-on, then the hold lifted once the platform reports the
  node ready) may have been sent; ``on`` once the platform reports it ready and unheld.

Rules, as for handovers (:mod:`gpupool.actuation.handover`):

* one writer per node: :func:`park`, :func:`wake`, :func:`advance_all` and :func:`observe` hold
  the node's writer lock (:func:`gpupool.staging.handovers.node_lock`, the one handovers hold)
  from their read of the node's state until its commands are sent and its state written; a
  writer that finds the node busy does nothing (:class:`PowerConflict`, or ``busy`` in a report);
* a park is refused while the node has a handover in a blocking state, checked in the same
  transaction as the state change under the node's transaction lock; and a handover is refused
  while the node is not on (:func:`gpupool.staging.handovers.insert_handover`): a park and a
  handover of one node never both stand;
* each state change is a compare-and-set on the state read, and a command is audited (then
  sent) only while that state holds: a writer that loses stops, sending nothing;
* every command is written to ``action_audit`` (``pending``, with its transition's id) and
  committed before it is sent, then marked ``ok`` or ``failed``; commands are idempotent, and
  a means returns only what is still needed, so a pass simply asks again;
* someone else's hold or power-off is never overridden (:class:`ForeignHoldError`): a park is
  given up (back to ``on``, the error saying why), a wake stays ``waking`` with the error;
* a park or wake past its ``deadline`` is reported ``failed`` (the caller fails its task, so
  Airflow alerts) and still retried by the next pass;
* ``dry_run`` (or no actuator: ``actuation: false``, a dry-run configuration) sends nothing:
  the transition it would make is recorded with ``dry_run`` and the commands it would send are
  audited as ``dry_run``; ``node_power`` is left as it was. A backfill never parks or wakes:
  one ``dry_run`` audit row says so.

Nothing here reads the wall clock to decide: the caller passes ``at``. Audit rows carry the
wall-clock times at which commands really went out.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import asdict
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy.engine import Engine

from gpupool.actuation.power.base import POWERING_ON, ON as POWER_ON, Command, PowerActuator
from gpupool.actuation.actuators.base import ActuationError, ForeignHoldError
from gpupool.actuation.handover import BLOCKING_STATES
from gpupool.errors import UserError
from gpupool.staging import handovers as audit_store
from gpupool.staging import power as store
from gpupool.values import utc_datetime

ON, PARKING, PARKED, WAKING = "on", "parking", "parked", "waking"
STATES = (ON, PARKING, PARKED, WAKING)
#: states :func:`advance_all` moves forward
MOVING_STATES = (PARKING, WAKING)
#: how long a park or a wake may take before it is reported failed (``power.timeout_minutes``)
DEFAULT_TIMEOUT = timedelta(minutes=15)
#: rounds of "ask the means what is needed now, send it" in one pass (hold, then power-off)
MAX_ROUNDS = 3
#: a power command the platform accepted is sent again, while the platform still reports the
#: node as before, only this long after (of the machine's time) it went out: a platform takes
#: a moment to show what it accepted (Slurm's power-saving thread, a BMC's shutdown), and a
#: second POWER_UP would run Slurm's ResumeProgram twice
RESEND_AFTER = timedelta(minutes=5)
#: how a waking node's ``error`` begins when the wake was refused (someone else's hold or
#: power-off: left as it is) and when its last command failed (retried by the next pass); the
#: metrics count failing wakes by them
REFUSED_PREFIX = "left alone"
RETRY_PREFIX = "will retry"


class PowerError(UserError, ValueError):
    """A park or wake that cannot be honoured (unknown node, wrong platform)."""


class PowerConflict(PowerError):
    """Another writer holds the node or changed its state under this one, or the node is in a
    handover."""


class PowerFailed(RuntimeError):
    """Parks or wakes failed or are late in this pass; raised by the caller after every node
    was processed, so the task fails and Airflow alerts. ``report`` is :func:`advance_all`'s."""

    def __init__(self, report: dict[str, Any]):
        self.report = report
        items = "; ".join(f"{f['node']} ({f['platform']}): {f['state']}: {f['error']}" for f in report.get("failed", []))
        super().__init__(f"{len(report.get('failed', []))} park(s)/wake(s) failed: {items}")


def _wall() -> datetime:
    # Audit only: when a command really went out. No decision reads this.
    return datetime.now(timezone.utc)


def power_of(engine: Engine, node: str) -> str:
    """The node's recorded power state (``on`` when gpupool never parked it)."""
    row = store.get_power(engine, node)
    return ON if row is None else row["state"]


# ------------------------------------------------------------------------------------ audit


def send_audited(engine: Engine, node: str, transition_id: int | None, actuator: PowerActuator | None,
                 command: Command, dry_run: bool, expected_state: str | None = None) -> Any:
    """Write the command to ``action_audit`` and commit, then send it and record the answer.

    With ``dry_run`` (or no actuator) the row is written with status ``dry_run`` and nothing is
    sent. A failure is recorded on the row and re-raised as :class:`ActuationError`. With
    ``expected_state`` the row is written (and the command sent) only while the node is still
    in that power state; otherwise :class:`PowerConflict`, nothing written or sent.
    """
    dry = dry_run or actuator is None
    audit_id = store.insert_audit(engine, dict(
        power_transition_id=transition_id, platform=command.platform, node=node, action=command.action,
        request=command.request, status="dry_run" if dry else "pending", response=None, dry_run=dry,
        created_at=_wall(), finished_at=_wall() if dry else None,
    ), node_state=expected_state)
    if audit_id is None:
        raise PowerConflict(f"node {node!r} is {power_of(engine, node)} now, not {expected_state}: another writer "
                            f"changed it; {command.action} to {command.platform} not sent")
    if dry:
        return None
    try:
        answer = actuator.send(command)
    except Exception as exc:
        err = exc if isinstance(exc, ActuationError) else ActuationError(
            command.platform, node, command.action, f"{type(exc).__name__}: {exc}")
        audit_store.finish_audit(engine, audit_id, "failed", str(err), _wall())
        raise err from exc
    audit_store.finish_audit(engine, audit_id, "ok", json.dumps(audit_store.audit_json(answer), default=str), _wall())
    return answer


def _would_send(actuator: PowerActuator | None, platform: str, node: str, kind: str) -> list[Command]:
    """The commands a park or wake would send now, for a dry run; a read that fails or a refusal
    is described instead of raised (a dry run still says what it would have done)."""
    if actuator is None:
        return [Command(platform, node, kind, {"note": "no power actuator for this platform: described, not built"})]
    try:
        cmds = actuator.park_commands(node) if kind == "park" else actuator.wake_commands(node)
    except ForeignHoldError as exc:
        return [Command(platform, node, kind, {"refused": str(exc)})]
    except Exception as exc:
        return [Command(platform, node, kind, {"unknown": f"{type(exc).__name__}: {exc}"})]
    return cmds or [Command(platform, node, kind, {"note": "nothing to send now"})]


def _backfill(engine: Engine, node: str, platform: str, kind: str) -> dict[str, Any]:
    send_audited(engine, node, None, None, Command(platform, node, f"{kind}_backfill_skip", {
        "note": "backfill runs never park or wake; nothing was sent"}), dry_run=True)
    return {"node": node, "platform": platform, "action": "none", "backfill": True, "dry_run": True,
            "note": "backfill run: nothing sent"}


# ------------------------------------------------------------------------------------ park / wake



@contextlib.contextmanager
def _node_held(engine: Engine, node: str) -> Iterator[Mapping[str, Any] | None]:
    """Hold ``node``'s writer lock (the handovers' too) and yield its power row as it stands
    under the lock; :class:`PowerConflict` when another writer holds it."""
    with store.node_lock(engine, node) as held:
        if not held:
            raise PowerConflict(f"node {node!r} is being changed by another writer (a handover, a park or a wake); "
                                "nothing sent, try again")
        yield store.get_power(engine, node)


def park(engine: Engine, node: str, platform: str, actuator: PowerActuator | None, at: datetime, *,
         dry_run: bool = True, backfill: bool = False, reason: str | None = None, by: str = "operator",
         timeout: timedelta = DEFAULT_TIMEOUT) -> dict[str, Any]:
    """Park ``node`` (of ``platform``, where it will wake); returns ``{node, platform, state,
    action, dry_run, ...}``.

    A node already parking or parked is left as it is. :class:`PowerConflict` when another
    writer holds the node, the node is waking, or it has a handover in a blocking state. The
    first commands go out at once (:func:`advance_one`); a park that must wait (work still on
    the node, the platform powering it off) is carried on by :func:`advance_all`.
    """
    at = utc_datetime(at)
    if backfill:
        return _backfill(engine, node, platform, "park")
    with _node_held(engine, node) as row:
        state = ON if row is None else row["state"]
        if state in (PARKING, PARKED):
            return {"node": node, "platform": row["platform"], "state": state, "action": "none", "dry_run": dry_run,
                    "note": f"already {state}"}
        if state != ON:
            raise PowerConflict(f"node {node!r} is {state}: not parked")
        if dry_run or actuator is None:
            blocking = audit_store.handover_rows(engine, BLOCKING_STATES, node=node)
            if blocking:
                raise PowerConflict(f"node {node!r} has handover #{blocking[0]['id']} in state {blocking[0]['state']!r}: "
                                    "not parked")
            tid = store.record_dry(engine, node, platform, ON, PARKED, at, by=by, reason=reason)
            cmds = _would_send(actuator, platform, node, "park")
            for c in cmds:
                send_audited(engine, node, tid, None, c, dry_run=True)
            return {"node": node, "platform": platform, "state": ON, "action": "would park", "dry_run": True,
                    "would_send": [asdict(c) for c in cmds]}
        try:
            tid = store.transition(engine, node, platform, ON, PARKING, at, by=by, reason=reason,
                                   deadline=at + timeout, blocking=BLOCKING_STATES)
        except store.Blocked as exc:
            raise PowerConflict(f"node {node!r} has handover #{exc.id} in state {exc.state!r}: not parked") from None
        if tid is None:
            raise PowerConflict(f"node {node!r} is {power_of(engine, node)} now: another writer changed it; not parked")
        after = _advance_locked(engine, store.get_power(engine, node), actuator, at)
    return {**after, "action": "park"}


def wake(engine: Engine, node: str, actuator: PowerActuator | None, at: datetime, *, dry_run: bool = True,
         backfill: bool = False, reason: str | None = None, by: str = "operator",
         timeout: timedelta = DEFAULT_TIMEOUT) -> dict[str, Any]:
    """Wake ``node`` on the platform it was parked on; returns ``{node, platform, state, action,
    dry_run, ...}``.

    A node that is on or waking is left as it is; a node still parking is woken once it is
    powered off (Slurm cannot take a power-down back). :class:`PowerConflict` when another
    writer holds the node; :class:`PowerError` when ``actuator`` is another platform's.
    """
    at = utc_datetime(at)
    row = store.get_power(engine, node)
    platform = row["platform"] if row is not None else (actuator.platform if actuator is not None else "?")
    if backfill:
        return _backfill(engine, node, platform, "wake")
    with _node_held(engine, node) as row:
        state = ON if row is None else row["state"]
        if state in (ON, WAKING):
            return {"node": node, "platform": platform, "state": state, "action": "none", "dry_run": dry_run,
                    "note": f"already {state}"}
        platform = row["platform"]
        if actuator is not None and actuator.platform != platform:
            raise PowerError(f"node {node!r} was parked on {platform!r}, not {actuator.platform!r}: it wakes there")
        if dry_run or actuator is None:
            tid = store.record_dry(engine, node, platform, state, ON, at, by=by, reason=reason)
            cmds = _would_send(actuator, platform, node, "wake")
            for c in cmds:
                send_audited(engine, node, tid, None, c, dry_run=True)
            return {"node": node, "platform": platform, "state": state, "action": "would wake", "dry_run": True,
                    "would_send": [asdict(c) for c in cmds]}
        if state == PARKING and _power_off_sent(engine, row, actuator):
            # a power-off under way cannot be taken back (Slurm ignores POWER_UP then, a BMC
            # finishes its shutdown): the wake follows as soon as the node is parked
            if not store.request_wake(engine, node, at + timeout, at):
                raise PowerConflict(f"node {node!r} is {power_of(engine, node)} now: another writer changed it; "
                                    "not woken")
            after = _advance_locked(engine, store.get_power(engine, node), actuator, at)
            return {**after, "action": "wake after park",
                    "note": "powering off: woken as soon as it is parked"}
        tid = store.transition(engine, node, platform, state, WAKING, at, by=by, reason=reason, deadline=at + timeout)
        if tid is None:
            raise PowerConflict(f"node {node!r} is {power_of(engine, node)} now: another writer changed it; not woken")
        after = _advance_locked(engine, store.get_power(engine, node), actuator, at)
    return {**after, "action": "wake"}


def _power_off_sent(engine: Engine, row: dict[str, Any], actuator: PowerActuator) -> bool:
    """Whether the park of ``row`` sent (or may have sent) the means' power-off."""
    return any(a["action"] in actuator.actions and a["status"] in ("ok", "pending") and not a["dry_run"]
               for a in store.audit_rows(engine, transition_id=row["transition_id"]))


# ------------------------------------------------------------------------------------ advancing


def _entry(row: dict[str, Any]) -> dict[str, Any]:
    out = {"node": row["node"], "platform": row["platform"], "state": row["state"], "error": row["error"],
           "deadline": None if row["deadline"] is None else utc_datetime(row["deadline"]).isoformat()}
    if row.get("wake_deadline") is not None:
        out["wake_deadline"] = utc_datetime(row["wake_deadline"]).isoformat()
    return out


def _advance_locked(engine: Engine, row: dict[str, Any], actuator: PowerActuator, at: datetime) -> dict[str, Any]:
    """One pass over a parking or waking node, its lock held: send what is still needed, round
    by round (a hold, then the power-off), and record the end state the platform reports."""
    node, platform, state, tid = row["node"], row["platform"], row["state"], row["transition_id"]
    parking = state == PARKING
    final = PARKED if parking else ON

    def done(r) -> bool:
        return r.parked if parking else r.woken

    sent_now: set[str] = set()  # a command goes out at most once per pass
    try:
        for _ in range(MAX_ROUNDS):
            r = actuator.state(node)
            if not r.present:
                store.set_error(engine, node, state, f"{platform} does not know node {node!r}", at)
                return _entry(store.get_power(engine, node))
            if done(r):
                break
            cmds = [c for c in (actuator.park_commands(node) if parking else actuator.wake_commands(node))
                    if _key(c) not in sent_now and not _sent_lately(engine, tid, actuator, c, row, at)]
            if not cmds:
                break
            for c in cmds:
                sent_now.add(_key(c))
                send_audited(engine, node, tid, actuator, c, dry_run=False, expected_state=state)
        r = actuator.state(node)
    except ForeignHoldError as exc:
        if parking:  # given up: the node stays in its platform's service, as someone else holds it
            store.transition(engine, node, platform, PARKING, ON, at, by="platform", error=f"park given up: {exc}")
        else:
            store.set_error(engine, node, WAKING, f"{REFUSED_PREFIX}: {exc}", at)
        return _entry(store.get_power(engine, node))
    except ActuationError as exc:
        store.set_error(engine, node, state, f"{RETRY_PREFIX}: {exc}", at)
        return _entry(store.get_power(engine, node))
    if done(r):
        store.transition(engine, node, platform, state, final, at, by="platform", reason=row["reason"])
        if parking and row["wake_deadline"] is not None:  # a wake asked while it powered off
            tid = store.transition(engine, node, platform, PARKED, WAKING, at, by="deferred wake",
                                   reason="woken as asked while it was powering off",
                                   deadline=utc_datetime(row["wake_deadline"]))
            if tid is not None:
                return _advance_locked(engine, store.get_power(engine, node), actuator, at)
    else:
        store.set_error(engine, node, state, _waiting(r, parking), at)
    return _entry(store.get_power(engine, node))


def _key(command: Command) -> str:
    return json.dumps([command.action, audit_store.audit_json(command.request)], sort_keys=True)


def _sent_lately(engine: Engine, tid: int | None, actuator: PowerActuator, command: Command,
                 row: dict[str, Any], at: datetime) -> bool:
    """Whether this power command of the transition went out and was accepted less than
    :data:`RESEND_AFTER` ago (the time of the pass that sent it: the transition's own time for
    the first, and the node's last update after it)."""
    if command.action not in actuator.actions:
        return False
    sent = [a for a in store.audit_rows(engine, transition_id=tid)
            if a["action"] == command.action and a["status"] == "ok" and a["request"] == audit_store.audit_json(command.request)]
    if not sent:
        return False
    return at - utc_datetime(row["since"]) < RESEND_AFTER


def _waiting(r, parking: bool) -> str | None:
    if parking and r.busy:
        return f"waiting: {r.busy} unit(s) of work still on the node"
    if parking:
        return f"waiting: {r.platform} reports power {r.power}"
    if r.power != POWER_ON:
        return f"waiting: {r.platform} reports power {r.power}"
    return f"waiting: {r.platform} does not report the node ready yet"


def advance_all(engine: Engine, actuators: Mapping[str, PowerActuator], at: datetime, *, dry_run: bool = True,
                backfill: bool = False) -> dict[str, Any]:
    """Carry every parking and waking node forward as far as it safely goes now.

    Each node is re-read under its writer lock; one another writer holds is listed under
    ``busy`` (the next pass retries). With ``dry_run`` (or in a backfill) nothing is sent and no
    state changes; nodes past their deadline are still reported. Returns ``{"nodes": [...],
    "busy": [...], "skipped": [...], "failed": [...]}``; ``failed`` lists parks given up, wakes
    refused, and parks or wakes past their deadline, for the caller to raise
    :class:`PowerFailed` on.
    """
    at = utc_datetime(at)
    report: dict[str, Any] = {"at": at.isoformat(), "nodes": [], "busy": [], "skipped": [], "failed": []}
    for listed in store.power_rows(engine, MOVING_STATES):
        node = listed["node"]
        with store.node_lock(engine, node) as held:
            if not held:
                report["busy"].append(node)
                continue
            row = store.get_power(engine, node)
            if row is None or row["state"] not in MOVING_STATES:
                continue
            actuator = actuators.get(row["platform"])
            if dry_run or backfill or actuator is None:
                report["skipped"].append(node)
                if actuator is None and not (dry_run or backfill):
                    store.set_error(engine, node, row["state"], f"no power actuator for platform {row['platform']!r}; "
                                                                "waiting", at)
                after = _entry(store.get_power(engine, node))
            else:
                after = _advance_locked(engine, row, actuator, at)
        entry = {**after, "before": row["state"]}
        report["nodes"].append(entry)
        late = after["state"] in MOVING_STATES and row["deadline"] is not None and at >= utc_datetime(row["deadline"])
        given_up = row["state"] == PARKING and after["state"] == ON
        refused = after["state"] == WAKING and str(after["error"] or "").startswith(REFUSED_PREFIX)
        if late or given_up or refused:
            report["failed"].append({**entry, "error": entry["error"] or f"late: still {after['state']} past its deadline"})
    return report


def observe(engine: Engine, actuators: Mapping[str, PowerActuator], at: datetime) -> list[dict[str, Any]]:
    """Record parked nodes that their platform woke by itself (Slurm powers a parked node up
    for a job sent to it; an operator powers one on): ``parked -> waking`` (or ``-> on`` when it
    is ready already), ``by="observed"``. Returns the changes."""
    at = utc_datetime(at)
    changes = []
    for listed in store.power_rows(engine, (PARKED,)):
        node = listed["node"]
        actuator = actuators.get(listed["platform"])
        if actuator is None:
            continue
        with store.node_lock(engine, node) as held:
            if not held:
                continue
            row = store.get_power(engine, node)
            if row is None or row["state"] != PARKED:
                continue
            try:
                r = actuator.state(node)
            except ActuationError:
                continue
            if not r.present or r.power not in (POWER_ON, POWERING_ON):
                continue
            to = ON if r.woken else WAKING
            if store.transition(engine, node, row["platform"], PARKED, to, at, by="observed",
                                reason=f"{row['platform']} powered it {r.power.replace('_', ' ')} itself") is not None:
                changes.append({"node": node, "platform": row["platform"], "from": PARKED, "to": to})
    return changes
