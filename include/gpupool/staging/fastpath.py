"""The fast path's tables: its pressure readings and its decisions (writes and reads).

This module owns `pressure_sample` and `fastpath_decision` and knows no stage. A reading is
upserted per (platform, metric, time), and a tick's decisions are written once per decision
time in one transaction, so a re-run of a tick changes nothing it already recorded.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Mapping, Sequence

import pandas as pd
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from gpupool.staging.schema import fastpath_decision, handover, pressure_sample
from gpupool.values import jsonable, utc_datetime

#: the columns of one decision row a caller passes to :func:`record_decisions`
DECISION_FIELDS = ("platform", "pressure", "node", "source", "target", "reason", "dry_run", "handover_id")


def record_pressure(engine: Engine, platform: str, at: datetime, values: Mapping[str, float]) -> int:
    """Upsert one reading of ``platform`` at ``at``: metric -> value. Returns the rows written."""
    at = utc_datetime(at)
    rows = [{"platform": platform, "metric": m, "at": at, "value": float(v)} for m, v in values.items()]
    if not rows:
        return 0
    with engine.begin() as conn:
        conn.execute(pressure_sample.delete().where(
            pressure_sample.c.platform == platform, pressure_sample.c.at == at,
            pressure_sample.c.metric.in_(list(values))))
        conn.execute(pressure_sample.insert(), rows)
    return len(rows)


def pressure_history(engine: Engine, platform: str, metric: str, start: datetime, end: datetime) -> pd.Series:
    """The platform's readings of ``metric`` in ``[start, end)``, indexed by time (UTC), oldest first."""
    return pressure_histories(engine, platform, [metric], start, end)[metric]


def pressure_histories(engine: Engine, platform: str, metrics: Sequence[str], start: datetime,
                       end: datetime) -> dict[str, pd.Series]:
    """:func:`pressure_history` of several metrics in one query: metric -> its readings."""
    c = pressure_sample.c
    q = (sa.select(c.metric, c.at, c.value)
         .where(c.platform == platform, c.metric.in_(list(metrics)), c.at >= utc_datetime(start),
                c.at < utc_datetime(end))
         .order_by(c.metric, c.at))
    with engine.connect() as conn:
        rows = conn.execute(q).all()
    out = {}
    for m in metrics:
        mine = [r for r in rows if r.metric == m]
        index = pd.DatetimeIndex(pd.to_datetime([r.at for r in mine], utc=True), name="ts")
        out[m] = pd.Series([float(r.value) for r in mine], index=index, dtype="float64")
    return out


def record_decisions(engine: Engine, at: datetime, decisions: Sequence[Mapping[str, Any]]) -> list[int]:
    """Write a tick's decisions (keys :data:`DECISION_FIELDS`) at ``at``; returns their ids.

    A tick is decided once: when decisions at ``at`` exist already nothing is written and
    their ids are returned (see :func:`decisions_at`)."""
    at = utc_datetime(at)
    with engine.begin() as conn:
        existing = conn.execute(sa.select(fastpath_decision.c.id).where(
            fastpath_decision.c.decided_at == at).order_by(fastpath_decision.c.id)).scalars().all()
        if existing:
            return list(existing)
        ids = []
        for d in decisions:
            unknown = set(d) - set(DECISION_FIELDS)
            if unknown:
                raise ValueError(f"fast-path decision at {at.isoformat()}: unknown fields {sorted(unknown)}")
            row = {k: d.get(k) for k in DECISION_FIELDS}
            row["pressure"] = None if row["pressure"] is None else jsonable(row["pressure"])
            row["dry_run"] = bool(row["dry_run"])
            if not row["reason"]:
                raise ValueError(f"fast-path decision at {at.isoformat()} for {row['platform']}: no reason")
            ids.append(int(conn.execute(fastpath_decision.insert().values(decided_at=at, **row))
                           .inserted_primary_key[0]))
    return ids


def set_handover(engine: Engine, decision_id: int, handover_id: int | None, note: str | None = None) -> None:
    """Record the handover a decision's move opened (only where none is recorded yet), or with
    ``note`` why none was (appended to the decision's reason)."""
    with engine.begin() as conn:
        if handover_id is not None:
            conn.execute(fastpath_decision.update().where(
                fastpath_decision.c.id == decision_id, fastpath_decision.c.handover_id.is_(None))
                .values(handover_id=handover_id))
        if note:
            conn.execute(fastpath_decision.update().where(fastpath_decision.c.id == decision_id)
                         .values(reason=fastpath_decision.c.reason + "; " + note))


def decisions_at(engine: Engine, at: datetime) -> list[dict[str, Any]]:
    """The decisions recorded at ``at``, in the order they were written."""
    q = (sa.select(fastpath_decision).where(fastpath_decision.c.decided_at == utc_datetime(at))
         .order_by(fastpath_decision.c.id))
    return _rows(engine, q)


def recent_decisions(engine: Engine, limit: int = 10, moves_only: bool = False,
                     until: datetime | None = None) -> list[dict[str, Any]]:
    """The newest decisions (at or before ``until`` when given), newest first."""
    q = sa.select(fastpath_decision).order_by(fastpath_decision.c.decided_at.desc(), fastpath_decision.c.id.desc())
    if moves_only:
        q = q.where(fastpath_decision.c.node.is_not(None))
    if until is not None:
        q = q.where(fastpath_decision.c.decided_at <= utc_datetime(until))
    return _rows(engine, q.limit(limit))


def readings_between(engine: Engine, platform: str, start: datetime, end: datetime) -> list[tuple[datetime, float]]:
    """The platform's demand read at each tick in ``(start, end]`` (GPUs allocated plus pending:
    the readings staged under ``gpu_allocated_now`` and ``gpu_pending_now``), oldest first; a
    tick with either missing is left out."""
    c = pressure_sample.c
    q = (sa.select(c.metric, c.at, c.value)
         .where(c.platform == platform, c.metric.in_(["gpu_allocated_now", "gpu_pending_now"]),
                c.at > utc_datetime(start), c.at <= utc_datetime(end)))
    seen: dict[datetime, dict[str, float]] = {}
    with engine.connect() as conn:
        for r in conn.execute(q):
            seen.setdefault(utc_datetime(r.at), {})[r.metric] = float(r.value)
    return [(t, v["gpu_allocated_now"] + v["gpu_pending_now"]) for t, v in sorted(seen.items()) if len(v) == 2]


def pressures_seen(engine: Engine, start: datetime, end: datetime) -> list[tuple[datetime, str, dict]]:
    """``(decided_at, platform, pressure)`` of every reading the fast path's decisions in
    ``(start, end]`` recorded (a move records both platforms'), oldest first."""
    c = fastpath_decision.c
    q = (sa.select(c.decided_at, c.platform, c.pressure)
         .where(c.decided_at > utc_datetime(start), c.decided_at <= utc_datetime(end), c.pressure.is_not(None))
         .order_by(c.decided_at, c.id))
    out = []
    with engine.connect() as conn:
        for r in conn.execute(q):
            p = r.pressure or {}
            for one in ([p] if "idle_nodes" in p else [v for v in p.values() if isinstance(v, dict)]):
                out.append((utc_datetime(r.decided_at), str(one.get("platform", r.platform)), one))
    return out


def handovers_opened_between(engine: Engine, start: datetime, end: datetime) -> list[dict[str, Any]]:
    """Handovers (either path's) created in ``[start, end]``: node, from/to platform, state,
    dry_run, created_at (UTC), plan_id, kind, outside_budget (a reclaim that took no slot of the
    move budget) and need_since, oldest first — the moves a rolling budget and cool-downs count."""
    c = handover.c
    q = (sa.select(c.id, c.node, c.from_platform, c.to_platform, c.state, c.dry_run, c.created_at, c.plan_id,
                   c.kind, c.outside_budget, c.need_since)
         .where(c.created_at >= utc_datetime(start), c.created_at <= utc_datetime(end))
         .order_by(c.created_at, c.id))
    return _rows(engine, q)


def _rows(engine: Engine, q) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        out = [dict(r._mapping) for r in conn.execute(q)]
    for r in out:
        for k in ("decided_at", "created_at", "need_since"):
            if r.get(k) is not None:
                r[k] = utc_datetime(r[k])
    return out
