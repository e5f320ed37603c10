"""The store of ``node_owner``, ``owner_sight`` and ``reclaim_need``: who owns each pool node, which
platforms were seen, and each owner's open need for its lent nodes (issue 42).

It knows the tables and no stage. Owners are written once: :func:`record_owners` inserts the rows
of nodes that have none and leaves the rest as they are, in one transaction whose inserts a second
writer cannot duplicate (the primary key refuses the second row, and the loser reads the winner's),
so two processes seeing a platform at once record one answer and a restart reshuffles nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from gpupool.staging.schema import node_owner, owner_sight, reclaim_need
from gpupool.values import utc_datetime

#: ``node_owner.source``: named by ``pool.nodes[].owner``; taken by a platform's ``owns`` at first sight
CONFIG, FIRST_SIGHT = "config", "first_sight"


def owners(engine: Engine) -> dict[str, str]:
    """Node -> its recorded owner."""
    with engine.connect() as conn:
        return {r.node: r.owner for r in conn.execute(sa.select(node_owner.c.node, node_owner.c.owner))}


def owner_rows(engine: Engine) -> list[dict]:
    """Every ``node_owner`` row, by node."""
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(sa.select(node_owner).order_by(node_owner.c.node))]


def seen_platforms(engine: Engine) -> set[str]:
    """The platforms whose first sight is recorded."""
    with engine.connect() as conn:
        return set(conn.execute(sa.select(owner_sight.c.platform)).scalars())


def record_owners(engine: Engine, rows: Mapping[str, tuple[str, str]], at: datetime,
                  sights: Mapping[str, int | None] | None = None) -> dict[str, str]:
    """Record ``rows`` (node -> (owner, source)) for the nodes without a row, and ``sights``
    (platform -> its ``owns``) for the platforms not seen yet; returns every recorded owner.

    A row already there wins (a restart, or a writer that got there first): what was recorded
    is never reshuffled. A ``first_sight`` row of a platform whose sight is recorded already is
    dropped: a writer that read the pool before another recorded that platform's first sight
    adds nothing to it (the sight and its rows go in one transaction, so the loser of a race
    either sees the winner's sight or fails on it and retries). An explicit ``config`` owner
    replaces a ``first_sight`` one, or a ``config`` one the configuration changed since (the
    operator's word), never the other way round."""
    at = utc_datetime(at)
    for attempt in range(3):
        try:
            with engine.begin() as conn:
                have = {r.node: (r.owner, r.source)
                        for r in conn.execute(sa.select(node_owner.c.node, node_owner.c.owner, node_owner.c.source))}
                seen = set(conn.execute(sa.select(owner_sight.c.platform)).scalars())
                wanted = {n: (o, s) for n, (o, s) in rows.items() if not (s == FIRST_SIGHT and o in seen)}
                new = [{"node": n, "owner": o, "source": s, "recorded_at": at}
                       for n, (o, s) in sorted(wanted.items()) if n not in have]
                if new:
                    conn.execute(node_owner.insert(), new)
                for n, (o, s) in sorted(wanted.items()):
                    if s == CONFIG and n in have and have[n] != (o, CONFIG):
                        conn.execute(node_owner.update().where(node_owner.c.node == n, node_owner.c.source == have[n][1],
                                                               node_owner.c.owner == have[n][0])
                                     .values(owner=o, source=CONFIG, recorded_at=at))
                fresh = [{"platform": p, "owns": n, "at": at} for p, n in sorted((sights or {}).items()) if p not in seen]
                if fresh:
                    conn.execute(owner_sight.insert(), fresh)
            break
        except sa.exc.IntegrityError:  # another writer recorded some of them first: read theirs, retry the rest
            if attempt == 2:
                raise
    return owners(engine)


def needs(engine: Engine) -> dict[str, datetime]:
    """Owner -> since when its need for its lent nodes has been open."""
    with engine.connect() as conn:
        return {r.platform: utc_datetime(r.since) for r in conn.execute(sa.select(reclaim_need))}


def set_needs(engine: Engine, since: Mapping[str, datetime], at: datetime, platforms: Iterable[str] | None = None) -> None:
    """Make ``reclaim_need`` say ``since`` for ``platforms`` (all: None): rows of those platforms
    absent from ``since`` are dropped, the rest written (a need's start is kept where it is)."""
    at = utc_datetime(at)
    with engine.begin() as conn:
        current = {r.platform: r.since for r in conn.execute(sa.select(reclaim_need))}
        scope = set(current) | set(since) if platforms is None else set(platforms)
        for p in sorted(scope):
            if p not in since and p in current:
                conn.execute(reclaim_need.delete().where(reclaim_need.c.platform == p))
            elif p in since and p not in current:
                conn.execute(reclaim_need.insert().values(platform=p, since=utc_datetime(since[p]), updated_at=at))
            elif p in since:
                conn.execute(reclaim_need.update().where(reclaim_need.c.platform == p)
                             .values(since=utc_datetime(since[p]), updated_at=at))
