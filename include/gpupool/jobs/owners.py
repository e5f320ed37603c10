"""Production's owners (issue 42): who owns each pool node, recorded in staging once, and what
``gpupool owners`` shows of them.

* :func:`homes_at` — node -> owner as the plan (and the reclaim) read it at a time: the
  configuration's ``pool.nodes[].owner`` (source ``config``) and, for each platform with
  ``owns`` the first time it is seen holding a node, its first ``owns`` (by pool node id) of what
  it holds then that nobody owns (source ``first_sight``). Both are written to staging
  (:func:`gpupool.staging.owners.record_owners`), so a restart, or a later plan after nodes moved,
  reshuffles nothing.
* :func:`held_now` — platform -> the pool nodes it holds, from what
  :func:`gpupool.jobs.allocation.pool_nodes` read (a handover's target while it moves).
* :func:`owners_view` — ``gpupool owners``: per node its owner, where that came from and who
  holds it now; per platform owned, lent and borrowed.

A platform's ``owns`` is read at its first sight only: a platform holding fewer than ``owns``
nodes then owns what it holds (it does not take more on a later plan), and raising ``owns``
later takes nothing; ``pool.nodes[].owner`` names an owner at any time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from gpupool.config import Ownership, ownership_of
from gpupool.decisions.ownership import first_sight_homes, lent_and_borrowed
from gpupool.staging import owners as owner_store
from gpupool.staging.schema import owner_sight
from gpupool.values import printable, utc


def ownership_settings(config) -> dict[str, Ownership]:
    """Platform -> its :class:`~gpupool.config.Ownership`, for the platforms that set any key
    (none set: the pool is nobody's and every decision is as it was before ownership)."""
    out = {p.name: ownership_of(p) for p in config.platforms}
    return {p: own for p, own in out.items() if own != Ownership()}


def explicit_owners(config) -> dict[str, str]:
    """Node -> owner named by ``pool.nodes[].owner``."""
    return {n.node: n.owner for n in config.pool.nodes if n.owner is not None}


def homes_at(ctx, at: datetime, held: Mapping[str, Iterable[str]]) -> dict[str, str]:
    """Node (pool node id) -> its owner platform at ``at``, recording what is new in staging.

    ``held``: platform -> the pool node ids it holds now, as the caller read them. Records
    ``pool.nodes[].owner`` (source ``config``: it replaces a ``first_sight`` owner) and, for each
    platform with ``owns`` > 0 that holds a node in ``held`` and has no recorded first sight, its
    first ``owns`` by node id of what it holds that nobody owns (recorded or configured; source
    ``first_sight``), with its sight, in one call of
    :func:`~gpupool.staging.owners.record_owners`. A platform absent from ``held`` (not read this
    time) or holding nothing is not sighted: it is sighted at the first reading where it holds a
    node. ``owns`` larger than what the platform holds at its first sight: it owns what it holds
    then, and never takes more (``owns`` is read once; ``pool.nodes[].owner`` adds owners later).

    Returns every recorded owner merged with the configuration's explicit ones (which win). A
    configuration with no ``owns`` and no ``pool.nodes[].owner`` writes nothing and returns what
    staging recorded before (nothing on a fresh install).
    """
    config = ctx.config
    explicit = explicit_owners(config)
    owns = {p: own.owns for p, own in ownership_settings(config).items() if own.owns}
    if not explicit and not owns:
        return owner_store.owners(ctx.engine)
    recorded = {r["node"]: (r["owner"], r["source"]) for r in owner_store.owner_rows(ctx.engine)}
    seen = owner_store.seen_platforms(ctx.engine)
    unseen = {p: n for p, n in owns.items() if p not in seen}
    now = {p: sorted({str(n) for n in nodes}) for p, nodes in held.items() if p in unseen}
    holding = {p: nodes for p, nodes in now.items() if nodes}
    taken = {**{n: o for n, (o, _) in recorded.items()}, **explicit}
    sighted = {n: o for n, o in first_sight_homes(holding, unseen, taken).items() if n not in taken}
    rows = {n: (o, owner_store.CONFIG) for n, o in explicit.items() if recorded.get(n) != (o, owner_store.CONFIG)}
    rows.update({n: (o, owner_store.FIRST_SIGHT) for n, o in sighted.items()})
    sights = {p: unseen[p] for p in holding}
    if rows or sights:
        got = owner_store.record_owners(ctx.engine, rows, at, sights)
    else:
        got = {n: o for n, (o, _) in recorded.items()}
    return {**got, **explicit}


def held_now(config, nodes: Sequence, excluded: Sequence[Mapping[str, Any]]) -> dict[str, list[str]]:
    """Platform -> the pool node ids it holds, from :func:`~gpupool.jobs.allocation.pool_nodes`'s
    answer: each node at its holder (a handover's target while it moves, a parked node at its
    platform), a node drained there by someone else at that platform too (it is still its), and
    none outside an explicit ``pool.nodes`` list (fixed capacity: no platform owns it through
    ``owns``). A node open on several platforms at once is nobody's holding."""
    members = ({n.node for n in config.pool.nodes} if config.pool.nodes and not config.pool.all_nodes else None)
    out: dict[str, list[str]] = {}
    pairs = [(n.name, n.owner) for n in nodes] + [(e["node"], e["platform"]) for e in excluded if e.get("platform")]
    for name, platform in sorted(pairs):
        if members is None or name in members:
            out.setdefault(str(platform), []).append(str(name))
    return out


def owners_view(ctx, at: datetime, nodes: Sequence, excluded: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``gpupool owners``: ``{"at", "nodes": [{node, owner, source, holder, state}],
    "platforms": {name: {owns, sighted_at, owned, held, lent, borrowed}}}``.

    Reads, writes nothing: a node's owner is what staging recorded, or what the configuration
    names (source ``config, not recorded yet`` until the next plan records it); its holder what
    :func:`~gpupool.jobs.allocation.pool_nodes` read at ``at`` (``nodes``, ``excluded``: the
    latest inventory and the open handovers; None: in no inventory, or not held by one
    platform: open on several, or held by gpupool everywhere). ``state``: ``home`` or ``lent``."""
    platforms = ctx.platforms()
    rows = {r["node"]: r for r in owner_store.owner_rows(ctx.engine)}
    recorded = {n: (r["owner"], r["source"]) for n, r in rows.items()}
    for n, o in explicit_owners(ctx.config).items():
        if recorded.get(n) != (o, owner_store.CONFIG):
            recorded[n] = (o, "config, not recorded yet")
    holder = {n.name: n.owner for n in nodes}
    holder.update({e["node"]: e["platform"] for e in excluded if e.get("platform")})
    out_nodes = []
    for name in sorted(set(holder) | set(recorded)):
        owner, source = recorded.get(name, (None, None))
        h = holder.get(name)
        state = None if owner is None or h is None else ("home" if h == owner else "lent")
        out_nodes.append({"node": name, "owner": owner, "source": source, "holder": h, "state": state})
    lent, borrowed = lent_and_borrowed((r["owner"], r["holder"]) for r in out_nodes)
    with ctx.engine.connect() as conn:
        sights = {r.platform: r for r in conn.execute(sa.select(owner_sight))}
    own = ownership_settings(ctx.config)
    per = {}
    for p in platforms:
        s = sights.get(p)
        per[p] = {"owns": own[p].owns if p in own else None,
                  "sighted_at": None if s is None else s.at,
                  "owned": sum(1 for r in out_nodes if r["owner"] == p),
                  "held": sum(1 for r in out_nodes if r["holder"] == p),
                  "lent": lent.get(p, 0), "borrowed": borrowed.get(p, 0)}
    return {"at": at, "nodes": out_nodes, "platforms": per}


def format_owners(view: Mapping[str, Any]) -> str:
    """A table for ``gpupool owners``."""
    lines = []
    if not any(r["owner"] for r in view["nodes"]):
        lines.append("no node has an owner: set platforms[].owns or pool.nodes[].owner (docs/stages/ownership.md)")
    else:
        lines.append(f"{'NODE':<20} {'OWNER':<12} {'SOURCE':<26} {'HELD BY':<12} STATE")
        for r in view["nodes"]:
            lines.append(f"{printable(r['node']):<20} {printable(r['owner'] or '-'):<12} {r['source'] or '-':<26} "
                         f"{printable(r['holder'] or '-'):<12} {r['state'] or '-'}")
    lines.append("")
    lines.append(f"{'PLATFORM':<12} {'OWNS':>5} {'OWNED':>6} {'HELD':>5} {'LENT':>5} {'BORROWED':>9}  FIRST SIGHT")
    for p, r in view["platforms"].items():
        seen = "-" if r["sighted_at"] is None else utc(r["sighted_at"]).strftime("%Y-%m-%d %H:%M")
        owns = "-" if r["owns"] is None else str(r["owns"])
        lines.append(f"{printable(p):<12} {owns:>5} {r['owned']:>6} {r['held']:>5} {r['lent']:>5} {r['borrowed']:>9}  {seen}")
    return "\n".join(lines)


__all__ = ["homes_at", "held_now", "ownership_settings", "explicit_owners", "owners_view", "format_owners"]
