"""The store of the ``handover`` and ``action_audit`` tables: every write and read of them.

It knows the tables and no stage: the states a caller counts as blocking are passed in, rows
come back as plain dicts, and a write that depends on what the caller read is a compare-and-set
whose answer (won or lost) the caller acts on.

Two kinds of lock serialise writers of one node:

* :func:`node_lock` — held by one writer for the whole of its read, decide, audit and send on a
  node (the handover DAG, ``gpupool rollback``, any fast path), so no other writer can act on
  the state it read while its command is in flight. It never waits: a second writer is told
  the node is busy. A session advisory lock on PostgreSQL (on a connection of its own, so the
  audit rows still commit before each send); an exclusive ``flock`` on a file beside an SQLite
  database (per open file, so it excludes threads and processes alike); a process lock
  otherwise.
* the transaction lock of :func:`insert_handover` / :func:`close_and_reverse` (an advisory
  transaction lock on PostgreSQL; SQLite's single writer) — the check "no blocking handover of
  this node" and the insert run as one.

And one pool-wide lock, :func:`moves_lock`, serialises the writers that spend the rolling hour's
move budget (a fast-path tick, a plan's actuation): each holds it from its read of the handovers
opened in the last hour to its last open. It waits, where the node lock does not.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
import zlib
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from gpupool.staging.schema import action_audit, handover, node_power


class Blocked(Exception):
    """The node already has a handover in one of the blocking states (``id``, ``state``);
    ``id`` is None when a concurrent writer's row showed up after the check."""

    def __init__(self, node: str, handover_id: int | None, state: str | None):
        self.node, self.id, self.state = node, handover_id, state
        super().__init__(f"node {node!r}: handover #{handover_id} in state {state!r}")


def audit_json(value: Any) -> Any:
    """What ``action_audit`` stores for a request or an answer: the value through JSON, with
    anything JSON does not know written as its ``str``."""
    return json.loads(json.dumps(value, default=str))


# ------------------------------------------------------------------------------------ locks


def _key(namespace: str, node: str) -> int:
    return zlib.crc32(f"{namespace}:{node}".encode())


#: an advisory lock's key on PostgreSQL: the lock's name within the staging schema the session
#: writes to. Advisory locks are database-wide, and two pools staged in two schemas of one
#: database must not hold each other's node or budget locks.
_PG_KEY = "hashtextextended(:ns || ':' || current_schema() || ':' || :name, 0)"


def lock_node_in(conn: sa.Connection, node: str) -> None:
    """The per-node transaction lock of ``conn``'s transaction (PostgreSQL; SQLite's single
    writer already serialises the transaction)."""
    if conn.dialect.name == "postgresql":
        conn.execute(sa.text(f"SELECT pg_advisory_xact_lock({_PG_KEY})"), {"ns": "gpupool-handover", "name": node})


_process_locks: dict[tuple[str, str], threading.Lock] = {}
_process_locks_guard = threading.Lock()


@contextlib.contextmanager
def node_lock(engine: Engine, node: str) -> Iterator[bool]:
    """Hold the writer lock of ``node`` for the ``with`` block; yields False (and holds nothing)
    when another writer has it. Released when the block ends, or when the process or its
    database session dies."""
    with _writer_lock(engine, "gpupool-handover-writer", node) as got:
        yield got


#: how long a writer waits for the move-budget lock before giving up with an error
MOVES_LOCK_WAIT_S = 300.0


class LockTimeout(RuntimeError):
    """A writer waited longer than :data:`MOVES_LOCK_WAIT_S` for the move-budget lock."""


@contextlib.contextmanager
def moves_lock(engine: Engine, wait_s: float = MOVES_LOCK_WAIT_S) -> Iterator[None]:
    """Hold the pool's move-budget lock for the ``with`` block, waiting for it.

    Every writer that reads the rolling hour's opened handovers and then opens more (a fast-path
    tick, the hourly plan's actuation, the CLI's of either) holds it from that read to its last
    open, so two of them at once cannot both spend the same remaining budget. Ticks are short,
    so a second writer waits rather than stands down; past ``wait_s`` it raises
    :class:`LockTimeout` naming the lock.
    """
    import time

    deadline = time.monotonic() + wait_s
    while True:
        with _writer_lock(engine, "gpupool-moves", "pool") as got:
            if got:
                yield
                return
        if time.monotonic() > deadline:
            raise LockTimeout(f"the pool's move-budget lock was held by another writer for more than "
                              f"{wait_s:g} s (a fast-path tick or a plan actuation that did not finish)")
        time.sleep(0.05)


@contextlib.contextmanager
def _writer_lock(engine: Engine, namespace: str, name: str) -> Iterator[bool]:
    """One writer lock, ``namespace:name``: a session advisory lock on PostgreSQL, an ``flock``
    beside an SQLite file, a process lock otherwise; yields whether it is held."""
    if engine.dialect.name == "postgresql":
        names = {"ns": namespace, "name": name}
        with engine.connect() as conn:
            got = bool(conn.execute(sa.text(f"SELECT pg_try_advisory_lock({_PG_KEY})"), names).scalar())
            conn.commit()
            try:
                yield got
            finally:
                if got:
                    conn.execute(sa.text(f"SELECT pg_advisory_unlock({_PG_KEY})"), names)
                    conn.commit()
        return
    key = _key(namespace, name)
    path = _sqlite_lock_file(engine, key)
    if path is None:
        with _process_lock(engine, f"{namespace}:{name}") as got:
            yield got
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _sqlite_lock_file(engine: Engine, key: int) -> Path | None:
    database = engine.url.database
    if engine.dialect.name != "sqlite" or not database or database == ":memory:" or database.startswith("file:"):
        return None
    folder = Path(f"{database}.handover-locks")
    folder.mkdir(exist_ok=True)
    return folder / f"{key:08x}.lock"


@contextlib.contextmanager
def _process_lock(engine: Engine, name: str) -> Iterator[bool]:
    with _process_locks_guard:
        lock = _process_locks.setdefault((str(engine.url), name), threading.Lock())
    got = lock.acquire(blocking=False)
    try:
        yield got
    finally:
        if got:
            lock.release()


# ------------------------------------------------------------------------------------ handover rows


def _blocking_row(conn: sa.Connection, node: str, blocking: tuple[str, ...]):
    return conn.execute(sa.select(handover.c.id, handover.c.state).where(
        handover.c.node == node, handover.c.state.in_(blocking)).order_by(handover.c.id).limit(1)).first()


def _insert(conn: sa.Connection, values: dict[str, Any]) -> int:
    return int(conn.execute(handover.insert().values(**values)).inserted_primary_key[0])


def _powered_off(conn: sa.Connection, node: str) -> str | None:
    """The node's power state when it is not on (parking, parked, waking), else None."""
    state = conn.execute(sa.select(node_power.c.state).where(node_power.c.node == node)).scalar()
    return None if state in (None, "on") else state


def insert_handover(engine: Engine, values: dict[str, Any], blocking: tuple[str, ...]) -> int:
    """Insert a ``handover`` row (``values``: its columns) unless its node has a row in a
    ``blocking`` state or is not powered on (:class:`Blocked`, nothing written; for a node
    being parked, parked or woken its ``id`` is None and its ``state`` the power state);
    returns the new id."""
    node = values["node"]
    with engine.begin() as conn:
        lock_node_in(conn, node)
        row = _blocking_row(conn, node, blocking)
        if row is not None:
            raise Blocked(node, int(row.id), row.state)
        power = _powered_off(conn, node)
        if power is not None:
            raise Blocked(node, None, power)
        new_id = _insert(conn, values)
        # a concurrent writer that slipped past the check shows up here: undo ours
        n = conn.execute(sa.select(sa.func.count()).select_from(handover).where(
            handover.c.node == node, handover.c.state.in_(blocking))).scalar_one()
        if n > 1:
            raise Blocked(node, None, None)
        power = _powered_off(conn, node)  # a park that began concurrently (SQLite checks after writing)
        if power is not None:
            raise Blocked(node, None, power)
    return new_id


def close_and_reverse(engine: Engine, handover_id: int, expected: str, closing: dict[str, Any],
                      reverse: dict[str, Any], blocking: tuple[str, ...]) -> int | None:
    """In one transaction: set ``closing`` on handover ``handover_id`` if it is still in state
    ``expected``, then insert the ``reverse`` row unless another row of the node blocks
    (:class:`Blocked`, nothing written). Returns the new id, or None when the handover was no
    longer in ``expected`` (nothing written)."""
    node = reverse["node"]
    with engine.begin() as conn:
        lock_node_in(conn, node)
        res = conn.execute(handover.update().where(
            handover.c.id == handover_id, handover.c.state == expected).values(**closing))
        if res.rowcount != 1:
            return None
        row = _blocking_row(conn, node, blocking)
        if row is not None:
            raise Blocked(node, int(row.id), row.state)
        return _insert(conn, reverse)


def compare_and_set(engine: Engine, handover_id: int, expected: str, values: dict[str, Any]) -> bool:
    """Set ``values`` on handover ``handover_id`` only if its state is still ``expected``;
    whether it was."""
    with engine.begin() as conn:
        res = conn.execute(handover.update().where(
            handover.c.id == handover_id, handover.c.state == expected).values(**values))
    return res.rowcount == 1


def get_handover(engine: Engine, handover_id: int) -> dict[str, Any] | None:
    """The ``handover`` row of ``handover_id``, or None."""
    with engine.connect() as conn:
        row = conn.execute(sa.select(handover).where(handover.c.id == handover_id)).first()
    return None if row is None else dict(row._mapping)


def handover_rows(engine: Engine, states: tuple[str, ...] | None = None, node: str | None = None,
                  limit: int | None = None) -> list[dict[str, Any]]:
    """``handover`` rows newest first, optionally only in ``states`` / of ``node``."""
    q = sa.select(handover).order_by(handover.c.id.desc())
    if states:
        q = q.where(handover.c.state.in_(states))
    if node:
        q = q.where(handover.c.node == node)
    if limit:
        q = q.limit(limit)
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(q)]


def nodes_of_plan(engine: Engine, plan_id: int) -> set[str]:
    """The nodes that allocation plan ``plan_id`` opened a handover for."""
    with engine.connect() as conn:
        return {r.node for r in conn.execute(sa.select(handover.c.node).where(handover.c.plan_id == plan_id))}


# ------------------------------------------------------------------------------------ audit rows


def insert_audit(engine: Engine, values: dict[str, Any], handover_state: str | None = None) -> int | None:
    """Write an ``action_audit`` row and commit; returns its id.

    With ``handover_state`` the row is written only while its handover (``values["handover_id"]``)
    is still in that state, checked in the same transaction (None: it was not, nothing written).
    ``request`` is stored as :func:`audit_json` of it.
    """
    values = {**values, "request": audit_json(values["request"])}
    with engine.begin() as conn:
        if handover_state is not None:
            # a no-op update: it takes the row (PostgreSQL) and answers whether the state holds
            res = conn.execute(handover.update().where(
                handover.c.id == values["handover_id"], handover.c.state == handover_state
            ).values(state=handover_state))
            if res.rowcount != 1:
                return None
        return int(conn.execute(action_audit.insert().values(**values)).inserted_primary_key[0])


def finish_audit(engine: Engine, audit_id: int, status: str, response: str, finished_at: datetime) -> None:
    """Record the outcome of an audited command."""
    with engine.begin() as conn:
        conn.execute(action_audit.update().where(action_audit.c.id == audit_id).values(
            status=status, response=response, finished_at=finished_at))


def audit_rows(engine: Engine, handover_id: int | None = None) -> list[dict[str, Any]]:
    """``action_audit`` rows in the order they were written (of one handover, or all)."""
    q = sa.select(action_audit).order_by(action_audit.c.id)
    if handover_id is not None:
        q = q.where(action_audit.c.handover_id == handover_id)
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(q)]


def real_commands_to(engine: Engine, handover_id: int, platform: str) -> int:
    """How many commands of handover ``handover_id`` were (or may have been) really sent to
    ``platform`` (audit rows that are not dry runs)."""
    with engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(action_audit).where(
            action_audit.c.handover_id == handover_id, action_audit.c.platform == platform,
            action_audit.c.dry_run.is_(False))).scalar_one())


def audit_counts(engine: Engine, handover_ids: list[int]) -> dict[int, dict[str, int]]:
    """``{handover id: {status: number of audit rows}}`` of the given handovers."""
    counts: dict[int, dict[str, int]] = {}
    if not handover_ids:
        return counts
    with engine.connect() as conn:
        for hid, status, n in conn.execute(
                sa.select(action_audit.c.handover_id, action_audit.c.status, sa.func.count())
                .where(action_audit.c.handover_id.in_(handover_ids))
                .group_by(action_audit.c.handover_id, action_audit.c.status)):
            counts.setdefault(int(hid), {})[status] = int(n)
    return counts
