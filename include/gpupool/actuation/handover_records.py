"""A handover as ``handover`` stores it: its states and record, opening and reading, the audited
send of a command and the compare-and-set every state change goes through.

:mod:`gpupool.actuation.handover` (the state machine that advances, settles and rolls handovers
back) is built on these, and re-exports them: callers name them there. Every table access goes
through :mod:`gpupool.staging.handovers`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy.engine import Engine

from gpupool.actuation.actuators.base import ActuationError, Actuator, Command
from gpupool.errors import UserError
from gpupool.staging import handovers as store
from gpupool.values import utc_datetime

PLANNED, RELEASING, RELEASED, ATTACHING, DONE, FAILED, ROLLED_BACK = (
    "planned", "releasing", "released", "attaching", "done", "failed", "rolled_back",
)
STATES = (PLANNED, RELEASING, RELEASED, ATTACHING, DONE, FAILED, ROLLED_BACK)
#: states :func:`advance_all` moves forward
OPEN_STATES = (PLANNED, RELEASING, RELEASED, ATTACHING)
#: states that forbid another handover of the same node (a failed one needs a rollback first)
BLOCKING_STATES = OPEN_STATES + (FAILED,)
#: states in which nothing may have been sent to the target yet
SOURCE_SIDE = (PLANNED, RELEASING, RELEASED)
DEFAULT_TIMEOUT = timedelta(hours=2)
#: the kind of a handover that gives an owner its lent node back (issue 42)
RECLAIM = "reclaim"
MAX_STEPS = 4


class HandoverError(UserError, ValueError):
    """A handover request that cannot be honoured (unknown id, wrong state)."""


class HandoverConflict(HandoverError):
    """The node already has a handover that is open or failed, or another writer holds the
    node or changed the handover's state under this one."""


class HandoverFailed(RuntimeError):
    """Handovers failed or timed out in this run (their nodes' holds lifted or being sent back
    where gpupool could); raised after every other handover was processed, so the task fails
    and Airflow alerts. ``report`` is :func:`advance_all`'s report."""

    def __init__(self, report: dict[str, Any]):
        self.report = report
        items = "; ".join(f"#{f['id']} {f['node']} {f['from']} -> {f['to']}: {f['state']}: {f['error']}"
                          for f in report.get("failed", []))
        super().__init__(f"{len(report.get('failed', []))} handover(s) failed: {items}")


class ReclaimLate(RuntimeError):
    """Reclaims past their owner's deadline (``need_since + reclaim_minutes``): raised by a tick
    after the rest of its work, so the run fails and Airflow alerts; the reclaims stay open and the
    next ticks keep trying. ``late``: :func:`gpupool.jobs.reclaim.late_reclaims`'s entries."""

    def __init__(self, late: list[dict[str, Any]]):
        self.late = late
        items = "; ".join(
            (f"node {x['node']} of {x['owner']} still on {x['borrower']} (handover #{x['id']}, {x['state']})"
             if x.get("node") else f"{x['owner']} waits for its lent nodes")
            + f": {x['minutes_late']:g} min late; last error: {x.get('error') or 'none'}" for x in late)
        super().__init__(f"{len(late)} reclaim(s) late: {items}")


#: how a reclaim's error names the disruption budgets that refuse its eviction (read back by the tick)
BLOCKED_BY = "blocked by disruption budget(s) "


class ReclaimBlocked(RuntimeError):
    """Reclaims a disruption budget (a Kubernetes PodDisruptionBudget) keeps from ending the
    borrowed work, raised by a tick after the rest of its work at the last tick before their
    deadline (:func:`gpupool.jobs.reclaim.blocked_due`), so the run fails while the promise still
    holds; the reclaims stay open and keep asking through the Eviction API. ``blocked``:
    :func:`gpupool.jobs.reclaim.blocked_reclaims`' entries."""

    def __init__(self, blocked: list[dict[str, Any]]):
        self.blocked = blocked
        items = "; ".join(
            f"node {x['node']} of {x['owner']} on {x['borrower']}"
            + (f" (handover #{x['id']})" if x.get("id") is not None else "")
            + f": {', '.join(x['budgets'])} allow no disruption; deadline {x['deadline'] or 'unknown'}"
            + (f" ({x['minutes_left']:g} min left)" if x.get("minutes_left") is not None else "") for x in blocked)
        super().__init__(f"{len(blocked)} reclaim(s) blocked by disruption budgets, their deadline before the "
                         f"next tick: {items}")


@dataclass(frozen=True)
class Handover:
    """One row of ``handover``."""

    id: int
    node: str
    from_platform: str
    to_platform: str
    state: str
    plan_id: int | None
    reason: str | None
    error: str | None
    dry_run: bool
    created_at: datetime
    updated_at: datetime
    deadline: datetime | None
    #: "reclaim" (an owner takes its lent node back, issue 42) or None (a move)
    kind: str | None = None
    #: a reclaim that took no slot of the move budget
    outside_budget: bool = False
    #: a reclaim's: when its owner's need began
    need_since: datetime | None = None
    #: the GPUs the node brings, where the opener knew them
    gpus: int | None = None

    @classmethod
    def from_row(cls, row) -> "Handover":
        """Build from a ``handover`` row (a mapping or a SQLAlchemy row), with times in UTC."""
        m = getattr(row, "_mapping", row)
        return cls(
            id=int(m["id"]), node=m["node"], from_platform=m["from_platform"], to_platform=m["to_platform"],
            state=m["state"], plan_id=m["plan_id"], reason=m["reason"], error=m["error"], dry_run=bool(m["dry_run"]),
            created_at=utc_datetime(m["created_at"]), updated_at=utc_datetime(m["updated_at"]),
            deadline=None if m["deadline"] is None else utc_datetime(m["deadline"]),
            kind=m.get("kind"), outside_budget=bool(m.get("outside_budget")),
            need_since=None if m.get("need_since") is None else utc_datetime(m["need_since"]),
            gpus=None if m.get("gpus") is None else int(m["gpus"]),
        )

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        out = asdict(self)
        for k in ("created_at", "updated_at", "deadline", "need_since"):
            out[k] = None if out[k] is None else out[k].isoformat()
        return out


# ------------------------------------------------------------------------------------ opening


def open_handover(
    engine: Engine,
    node: str,
    source: str,
    target: str,
    at: datetime,
    *,
    plan_id: int | None = None,
    reason: str | None = None,
    dry_run: bool = True,
    timeout: timedelta = DEFAULT_TIMEOUT,
    state: str = PLANNED,
    kind: str | None = None,
    outside_budget: bool = False,
    need_since: datetime | None = None,
    gpus: int | None = None,
) -> int:
    """Open a handover of ``node`` from ``source`` to ``target``; returns its id.

    ``kind`` "reclaim": the node's owner takes it back (issue 42; ``outside_budget``: it takes no
    slot of the move budget; ``need_since``: when the owner's need began); None: a move. ``gpus``:
    the GPUs the node brings (what the decisions count on its way while it moves), where known.

    Raises :class:`HandoverConflict` when the node already has a handover in
    :data:`BLOCKING_STATES`. The check and the insert run in one transaction, under a per-node
    advisory lock on PostgreSQL; on SQLite the database's single writer serialises them.
    """
    if source == target:
        raise HandoverError(f"node {node!r}: source and target are both {source!r}")
    if kind not in (None, RECLAIM):
        raise HandoverError(f"a handover's kind is {RECLAIM!r} or none, not {kind!r}")
    if state not in (PLANNED, RELEASING):
        raise HandoverError(f"a handover opens as planned or releasing, not {state!r}")
    at = utc_datetime(at)
    try:
        return store.insert_handover(engine, dict(
            node=node, from_platform=source, to_platform=target, state=state, plan_id=plan_id,
            reason=reason, error=None, dry_run=dry_run, created_at=at, updated_at=at, deadline=at + timeout,
            kind=kind, outside_budget=bool(outside_budget) if kind is not None else None,
            need_since=None if need_since is None else utc_datetime(need_since),
            gpus=None if gpus is None else int(gpus),
        ), BLOCKING_STATES)
    except store.Blocked as exc:
        raise conflict_from(exc) from None


def conflict_from(exc: store.Blocked) -> HandoverConflict:
    """The :class:`HandoverConflict` of a node that already has a blocking handover (or is not
    powered on)."""
    if exc.id is None and exc.state:
        return HandoverConflict(f"node {exc.node!r} is {exc.state} (power): wake it before it moves")
    if exc.id is None:
        return HandoverConflict(f"node {exc.node!r}: another handover was opened concurrently")
    return HandoverConflict(f"node {exc.node!r} already has handover #{exc.id} in state {exc.state!r}")


# ------------------------------------------------------------------------------------ reading


def get_handover(engine: Engine, handover_id: int) -> Handover:
    """One handover by id; :class:`HandoverError` when there is none."""
    row = store.get_handover(engine, handover_id)
    if row is None:
        raise HandoverError(f"no handover #{handover_id}")
    return Handover.from_row(row)


def list_handovers(engine: Engine, states: tuple[str, ...] | None = None, node: str | None = None,
                   limit: int | None = None) -> list[Handover]:
    """Handovers, newest first, optionally only in ``states`` / of ``node``."""
    return [Handover.from_row(r) for r in store.handover_rows(engine, states, node=node, limit=limit)]


def audit_rows(engine: Engine, handover_id: int | None = None) -> list[dict[str, Any]]:
    """``action_audit`` rows in the order they were written (of one handover, or all)."""
    return store.audit_rows(engine, handover_id)


# ------------------------------------------------------------------------------------ audit


def wall_clock() -> datetime:
    """Now, in UTC: when a command really went out, for the audit and an operator's rollback."""
    # Audit only: when a command really went out. No decision reads this.
    return datetime.now(timezone.utc)


def send_audited(engine: Engine, handover_id: int | None, actuator: Actuator | None, command: Command,
                 dry_run: bool, expected_state: str | None = None) -> Any:
    """Write the command to ``action_audit`` and commit, then send it and record the answer.

    With ``dry_run`` (or no actuator) the row is written with status ``dry_run`` and nothing is
    sent. A failure is recorded on the row and re-raised as :class:`ActuationError`. With
    ``expected_state`` the row is written (and the command sent) only while the handover is
    still in that state; otherwise :class:`HandoverConflict` and nothing is written or sent.
    """
    dry = dry_run or actuator is None
    audit_id = store.insert_audit(engine, dict(
        handover_id=handover_id, platform=command.platform, node=command.node, action=command.action,
        request=command.request, status="dry_run" if dry else "pending", response=None,
        dry_run=dry, created_at=wall_clock(), finished_at=wall_clock() if dry else None,
    ), handover_state=expected_state)
    if audit_id is None:
        raise lost_race(engine, handover_id, expected_state, f"{command.action} to {command.platform} not sent")
    if dry:
        return None
    try:
        answer = actuator.send(command)
    except Exception as exc:
        err = exc if isinstance(exc, ActuationError) else ActuationError(
            command.platform, command.node, command.action, f"{type(exc).__name__}: {exc}")
        store.finish_audit(engine, audit_id, "failed", str(err), wall_clock())
        raise err from exc
    store.finish_audit(engine, audit_id, "ok", json.dumps(store.audit_json(answer), default=str), wall_clock())
    return answer


def send_live(engine: Engine, h: Handover, actuator: Actuator, command: Command) -> Any:
    """Send one real command of ``h``, audited, while ``h`` is still in the state it was read in."""
    return send_audited(engine, h.id, actuator, command, dry_run=False, expected_state=h.state)


def target_touched(engine: Engine, h: Handover) -> bool:
    """Whether any real command of this handover went (or may have gone) to the target."""
    return store.real_commands_to(engine, h.id, h.to_platform) > 0


# ------------------------------------------------------------------------------------ state


def lost_race(engine: Engine, handover_id: int | None, expected: str | None, what: str) -> HandoverConflict:
    """The :class:`HandoverConflict` of a writer that found the handover no longer ``expected``."""
    row = store.get_handover(engine, handover_id) if handover_id is not None else None
    now = "gone" if row is None else f"{row['state']} now"
    return HandoverConflict(f"handover #{handover_id} is {now}, not {expected}: another writer changed it; {what}")


def update_handover(engine: Engine, h: Handover, at: datetime, **values: Any) -> Handover:
    """Write ``values`` on ``h`` if it is still in the state it was read in (compare-and-set);
    :class:`HandoverConflict` when another writer changed it meanwhile (nothing written)."""
    values["updated_at"] = at
    if not store.compare_and_set(engine, h.id, h.state, values):
        raise lost_race(engine, h.id, h.state, "this writer stops")
    fields = {k: v for k, v in values.items() if k in Handover.__dataclass_fields__}
    return Handover(**{**asdict(h), **fields})
