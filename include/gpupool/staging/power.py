"""The store of ``node_power`` and ``power_transition``, and of the ``action_audit`` rows of
park and wake commands: every write and read of them.

It knows the tables and no stage: the caller passes the states it expects and the handover
states it counts as blocking, rows come back as plain dicts, and each write that depends on
what the caller read is a compare-and-set whose answer (won or lost) the caller acts on.

A node without a ``node_power`` row is ``on``. Power and handovers share the node's locks of
:mod:`gpupool.staging.handovers`: the writer lock (:func:`node_lock`, held by a park or wake from
its read to its last command) and the transaction lock under which :func:`transition` checks "no
blocking handover of this node" and writes the new state in one transaction. Opening a handover
checks the other way round (:func:`gpupool.staging.handovers.insert_handover` refuses a node
that is not on), so a park and a handover of one node never both stand.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from gpupool.staging.handovers import Blocked, audit_json, lock_node_in, node_lock
from gpupool.staging.schema import action_audit, handover, node_power, power_transition

__all__ = ["Blocked", "node_lock", "ON", "transition", "record_dry", "set_error", "request_wake", "get_power", "power_rows",
           "transitions", "live_transitions", "woken_since", "dry_recorded_since", "insert_audit", "audit_rows"]

#: the state of a node that has no row
ON = "on"


def _row(conn: sa.Connection, node: str):
    return conn.execute(sa.select(node_power).where(node_power.c.node == node)).first()


def _blocking_handover(conn: sa.Connection, node: str, blocking: tuple[str, ...]):
    if not blocking:
        return None
    return conn.execute(sa.select(handover.c.id, handover.c.state).where(
        handover.c.node == node, handover.c.state.in_(blocking)).order_by(handover.c.id).limit(1)).first()


def transition(engine: Engine, node: str, platform: str, expected: str, to: str, at: datetime, *,
               by: str, reason: str | None = None, error: str | None = None, deadline: datetime | None = None,
               blocking: tuple[str, ...] = (), keep_since: bool = False) -> int | None:
    """Move ``node`` from ``expected`` to ``to`` and record the transition, in one transaction;
    returns the ``power_transition`` id, or None when the node was no longer ``expected``
    (another writer won; nothing written).

    With ``blocking`` (handover states) the node must have no handover in one of them, checked
    in the same transaction under the node's transaction lock (:class:`Blocked`, nothing
    written). ``platform`` is where the node wakes from now on.
    """
    try:
        return _transition(engine, node, platform, expected, to, at, by=by, reason=reason, error=error,
                           deadline=deadline, blocking=blocking, keep_since=keep_since)
    except (_Lost, sa.exc.IntegrityError):  # IntegrityError: two first rows of the node at once
        return None


def _refuse_moved(conn: sa.Connection, node: str, platform: str) -> None:
    """:class:`Blocked` when the node's last handover left it on another platform than the one a
    park names (a park decided on a reading taken before a move or reclaim of the node finished
    would power off a node another platform now runs)."""
    last = conn.execute(sa.select(handover.c.id, handover.c.state, handover.c.from_platform, handover.c.to_platform)
                        .where(handover.c.node == node, handover.c.dry_run.is_(False))
                        .order_by(handover.c.id.desc()).limit(1)).first()
    if last is None or last.state not in ("done", "rolled_back"):
        return
    holder = last.to_platform if last.state == "done" else last.from_platform
    if holder != platform:
        raise Blocked(node, int(last.id), f"{last.state}: the node is on {holder} now, not {platform}")


class _Lost(Exception):
    """The node left the expected state between the read and the write: roll back."""


def _transition(engine: Engine, node: str, platform: str, expected: str, to: str, at: datetime, *, by: str,
                reason: str | None, error: str | None, deadline: datetime | None, blocking: tuple[str, ...],
                keep_since: bool) -> int:
    with engine.begin() as conn:
        lock_node_in(conn, node)
        hit = _blocking_handover(conn, node, blocking)
        if hit is not None:
            raise Blocked(node, int(hit.id), hit.state)
        if expected == ON and to == "parking":
            _refuse_moved(conn, node, platform)
        row = _row(conn, node)
        current = row.state if row is not None else ON
        if current != expected:
            raise _Lost
        tid = int(conn.execute(power_transition.insert().values(
            node=node, platform=platform, from_state=expected, to_state=to, at=at, by=by, reason=reason,
            error=error, dry_run=False, deadline=deadline)).inserted_primary_key[0])
        values = dict(platform=platform, state=to, reason=reason, error=error, updated_at=at, deadline=deadline,
                      transition_id=tid, wake_deadline=None)
        if not keep_since:
            values["since"] = at
        if row is None:
            values.setdefault("since", at)
            conn.execute(node_power.insert().values(node=node, **values))
        else:
            res = conn.execute(node_power.update().where(
                node_power.c.node == node, node_power.c.state == expected).values(**values))
            if res.rowcount != 1:  # changed between the read and the write (SQLite: no row lock)
                raise _Lost
        # a handover opened concurrently shows up here (SQLite's writers check after they write)
        hit = _blocking_handover(conn, node, blocking)
        if hit is not None:
            raise Blocked(node, int(hit.id), hit.state)
    return tid


def record_dry(engine: Engine, node: str, platform: str, from_state: str, to: str, at: datetime, *,
               by: str, reason: str | None = None, error: str | None = None) -> int:
    """Record a transition a dry run would have made; ``node_power`` stays as it was."""
    with engine.begin() as conn:
        return int(conn.execute(power_transition.insert().values(
            node=node, platform=platform, from_state=from_state, to_state=to, at=at, by=by, reason=reason,
            error=error, dry_run=True)).inserted_primary_key[0])


def set_error(engine: Engine, node: str, expected: str, error: str | None, at: datetime) -> bool:
    """Set the node's ``error`` while it is still in ``expected``; whether it was."""
    with engine.begin() as conn:
        res = conn.execute(node_power.update().where(
            node_power.c.node == node, node_power.c.state == expected).values(error=error, updated_at=at))
    return res.rowcount == 1


def request_wake(engine: Engine, node: str, deadline: datetime, at: datetime) -> bool:
    """Ask for a wake of a node still ``parking`` (done once it is parked, due by ``deadline``);
    whether the node was still parking."""
    with engine.begin() as conn:
        res = conn.execute(node_power.update().where(
            node_power.c.node == node, node_power.c.state == "parking").values(wake_deadline=deadline, updated_at=at))
    return res.rowcount == 1


def get_power(engine: Engine, node: str) -> dict[str, Any] | None:
    """The ``node_power`` row of ``node``, or None (the node is on)."""
    with engine.connect() as conn:
        row = _row(conn, node)
    return None if row is None else dict(row._mapping)


def power_rows(engine: Engine, states: tuple[str, ...] | None = None, platform: str | None = None) -> list[dict[str, Any]]:
    """``node_power`` rows in node order, optionally only in ``states`` / of ``platform``."""
    q = sa.select(node_power).order_by(node_power.c.node)
    if states:
        q = q.where(node_power.c.state.in_(states))
    if platform:
        q = q.where(node_power.c.platform == platform)
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(q)]


def transitions(engine: Engine, node: str | None = None) -> list[dict[str, Any]]:
    """``power_transition`` rows in the order they were written (of one node, or all)."""
    q = sa.select(power_transition).order_by(power_transition.c.id)
    if node is not None:
        q = q.where(power_transition.c.node == node)
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(q)]


def live_transitions(engine: Engine, until: datetime) -> list[dict[str, Any]]:
    """The live ``power_transition`` rows (no dry run's) made at or before ``until``, in the
    order they were written: node, platform, from_state, to_state, at, by, deadline, id. What
    the metrics, the pool page and the report rebuild each node's power history from."""
    t = power_transition.c
    q = (sa.select(t.id, t.node, t.platform, t.from_state, t.to_state, t.at, t.by, t.deadline, t.error)
         .where(t.dry_run.is_(False), t.at <= until).order_by(t.id))
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(q)]


def woken_since(engine: Engine, start: datetime, until: datetime) -> dict[str, datetime]:
    """node -> the time of its last live wake (a transition to ``waking``, or ``parked`` to ``on``)
    in ``(start, until]``: what a cool-down after a wake reads."""
    t = power_transition.c
    q = (sa.select(t.node, sa.func.max(t.at)).where(
        t.dry_run.is_(False), t.at > start, t.at <= until,
        sa.or_(t.to_state == "waking", sa.and_(t.from_state == "parked", t.to_state == ON))).group_by(t.node))
    with engine.connect() as conn:
        return {r[0]: r[1] for r in conn.execute(q)}


def dry_recorded_since(engine: Engine, start: datetime, until: datetime) -> set[tuple[str, str]]:
    """``(node, to_state)`` of the dry-run transitions recorded in ``(start, until]``."""
    t = power_transition.c
    q = sa.select(t.node, t.to_state).where(t.dry_run.is_(True), t.at > start, t.at <= until).distinct()
    with engine.connect() as conn:
        return {(r[0], r[1]) for r in conn.execute(q)}


def insert_audit(engine: Engine, values: dict[str, Any], node_state: str | None = None) -> int | None:
    """Write the ``action_audit`` row of a park or wake command and commit; returns its id.

    With ``node_state`` the row is written only while the node (``values["node"]``) is still in
    that power state, checked in the same transaction (None: it was not, nothing written).
    ``request`` is stored as :func:`~gpupool.staging.handovers.audit_json` of it.
    """
    values = {**values, "request": audit_json(values["request"]), "handover_id": None}
    with engine.begin() as conn:
        if node_state is not None:
            # a no-op update: it takes the row (PostgreSQL) and answers whether the state holds
            res = conn.execute(node_power.update().where(
                node_power.c.node == values["node"], node_power.c.state == node_state).values(state=node_state))
            if res.rowcount != 1:
                return None
        return int(conn.execute(action_audit.insert().values(**values)).inserted_primary_key[0])


def audit_rows(engine: Engine, node: str | None = None, transition_id: int | None = None) -> list[dict[str, Any]]:
    """The ``action_audit`` rows of park and wake commands in the order they were written (of one
    node or one transition, or all)."""
    q = sa.select(action_audit).where(action_audit.c.power_transition_id.is_not(None)).order_by(action_audit.c.id)
    if node is not None:
        q = q.where(action_audit.c.node == node)
    if transition_id is not None:
        q = q.where(action_audit.c.power_transition_id == transition_id)
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(q)]
