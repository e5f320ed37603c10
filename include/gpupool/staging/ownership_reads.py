"""The reads of ownership that the metrics and the pool page make (issue 42): each pool node's
owner as staging records it, the live reclaims (handovers of kind ``reclaim``) as they stood at
an instant, and those a disruption budget blocks. Like :mod:`gpupool.staging.reads` this module knows tables, not stages.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from gpupool.staging.owners import CONFIG, FIRST_SIGHT, owner_rows
from gpupool.staging.schema import handover
from gpupool.values import utc_datetime

#: ``handover.kind`` of a reclaim (:data:`gpupool.actuation.handover_records.RECLAIM`)
RECLAIM = "reclaim"


def node_owners(engine: Engine, explicit: dict[str, str] | None = None) -> dict[str, str]:
    """Node -> owner: ``node_owner`` as recorded, with ``explicit`` (``pool.nodes[].owner``) for
    the nodes it names that staging records no owner for or only a ``first_sight`` one: what
    :func:`gpupool.staging.owners.record_owners` would leave there, so a scrape before the first
    recording already shows the operator's word and one after it shows the same."""
    out: dict[str, str] = {}
    source: dict[str, str] = {}
    for r in owner_rows(engine):
        out[r["node"]] = r["owner"]
        source[r["node"]] = r["source"]
    for node, owner in (explicit or {}).items():
        if source.get(node, FIRST_SIGHT) == FIRST_SIGHT:
            out[node], source[node] = owner, CONFIG
    return out


def reclaims(engine: Engine, at: datetime, open_states: Iterable[str], done_state: str) -> list[dict]:
    """The live reclaims opened at or before ``at``, by id: ``{id, node, source, target, open,
    done_at, need_since}``. ``open``: still in ``open_states``, or ``done_state`` only after
    ``at``; ``done_at``: when it reached ``done_state`` at or before ``at`` (its ``updated_at``),
    else None; ``need_since``: when its owner's need began (its opening where staging holds none)."""
    at = utc_datetime(at)
    states = tuple(open_states)
    h = handover.c
    q = (sa.select(h.id, h.node, h.from_platform, h.to_platform, h.state, h.created_at, h.updated_at, h.need_since)
         .where(h.kind == RECLAIM, h.dry_run.is_(False), h.created_at <= at,
                h.state.in_(states + (done_state,)))
         .order_by(h.id))
    out = []
    with engine.connect() as conn:
        for r in conn.execute(q):
            updated = utc_datetime(r.updated_at)
            done = r.state == done_state and updated <= at
            out.append({"id": r.id, "node": r.node, "source": r.from_platform, "target": r.to_platform,
                        "open": not done, "done_at": updated if done else None,
                        "need_since": utc_datetime(r.need_since if r.need_since is not None else r.created_at)})
    return out


def blocked_reclaims(engine: Engine, at: datetime, open_states: Iterable[str], marker: str) -> list[dict]:
    """The live reclaims opened at or before ``at``, still in ``open_states``, whose error says
    a disruption budget refused their eviction (it holds ``marker``:
    :data:`gpupool.actuation.handover_records.BLOCKED_BY`, as the handover writes it at each
    refusal and replaces at its next step), by id: ``{id, node, source, target}``. The error
    is the handover's last: an earlier ``at`` sees which reclaims were open then, blocked as now."""
    at = utc_datetime(at)
    h = handover.c
    q = (sa.select(h.id, h.node, h.from_platform, h.to_platform)
         .where(h.kind == RECLAIM, h.dry_run.is_(False), h.created_at <= at, h.state.in_(tuple(open_states)),
                h.error.contains(marker, autoescape=True))
         .order_by(h.id))
    with engine.connect() as conn:
        return [{"id": r.id, "node": r.node, "source": r.from_platform, "target": r.to_platform}
                for r in conn.execute(q)]
