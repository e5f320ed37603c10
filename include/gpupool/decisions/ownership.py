"""Ownership: who owns each pool node, what each platform lends and borrows, and the reclaim.

Each pool node may have an owner (its *home*): ``pool.nodes[].owner``, or the first ``owns`` of
what a platform holds when gpupool first sees it (:func:`first_sight_homes`). A node held by a
platform other than its home is *lent* by the home and *borrowed* by the holder; a node with no
owner is the pool's and counts as neither. Each platform's promises are an
:class:`~gpupool.config.Ownership` (``lend_limit``, ``borrow_limit``, ``reclaim_minutes``,
``min_runtime_minutes``; docs/stages/ownership.md):

* the plan (:mod:`gpupool.decisions.plan_model`) and the fast path
  (:func:`gpupool.decisions.fastpath.decide`) never lend a platform's owned nodes beyond its
  ``lend_limit`` nor let it borrow beyond its ``borrow_limit``;
* :func:`reclaim` runs before either: an owner with a ``reclaim_minutes`` promise whose work
  queues (pending GPUs it cannot place) and a node of its own lent out gets that node back before
  any other move. An idle lent node comes back at once; a busy one once the borrowed work on it
  has run the owner's ``min_runtime_minutes``. A reclaim takes a slot of the rolling move budget
  while one is free; where waiting for the next free slot would bring the node back after
  ``reclaim_minutes`` from the need, it goes outside the budget (and does not use a slot).

Pure: the caller says which platform holds each node, what it runs and for how long, when each
owner's need began (:func:`need_since`), and the moves started within the budget window.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from gpupool.config import Ownership
from gpupool.values import utc_datetime

#: the window of the move budget (the fast path's, issue 30: "at most N moves in any hour")
BUDGET_WINDOW = timedelta(hours=1)


@dataclass(frozen=True)
class HeldNode:
    """One pool node as the reclaim sees it: its owner, who holds it (a handover's target while
    it moves), its GPUs, the GPUs its work uses and how long that work has run without a break."""

    node: str
    home: str | None
    holder: str
    gpus: int
    busy_gpus: float = 0.0
    ran_minutes: float = 0.0
    moving: bool = False


@dataclass(frozen=True)
class Reclaim:
    """Hand ``node`` back from ``source`` (the borrower) to ``target`` (its owner) now.

    ``busy_gpus`` > 0: the borrower's work on it is ended (requeued or evicted), after running
    ``ran_minutes``; ``outside_budget``: it takes no slot of the move budget."""

    node: str
    source: str
    target: str
    gpus: int
    busy_gpus: float
    ran_minutes: float
    outside_budget: bool
    reason: str


def first_sight_homes(held: Mapping[str, Sequence[str]], owns: Mapping[str, int | None],
                      explicit: Mapping[str, str] | None = None) -> dict[str, str]:
    """Node -> owner: ``explicit`` (``pool.nodes[].owner``) first, then each platform's first
    ``owns`` (by node id) of the nodes it ``held`` at first sight that nobody owns explicitly;
    the rest belong to nobody. ``owns`` None: none (the caller passes what it holds for "all")."""
    out = dict(explicit or {})
    for platform, nodes in sorted(held.items()):
        n = owns.get(platform)
        if not n:
            continue
        free = [x for x in sorted(nodes) if x not in out]
        out.update({x: platform for x in free[:n]})
    return out


def lent_and_borrowed(nodes: Iterable[tuple[str | None, str]]) -> tuple[dict[str, int], dict[str, int]]:
    """Per platform, nodes of its own others hold and nodes of others it holds, from
    ``(home, holder)`` pairs (a node in a handover counts with its target)."""
    lent: dict[str, int] = {}
    borrowed: dict[str, int] = {}
    for home, holder in nodes:
        if home is not None and holder is not None and home != holder:
            lent[home] = lent.get(home, 0) + 1
            borrowed[holder] = borrowed.get(holder, 0) + 1
    return lent, borrowed


def may_move(node_home: str | None, source: str, target: str, lent: Mapping[str, int], borrowed: Mapping[str, int],
             ownership: Mapping[str, Ownership]) -> str | None:
    """Why moving a node owned by ``node_home`` from ``source`` to ``target`` would pass a limit, or None.

    Lending an owned node counts against its owner's ``lend_limit`` only when it leaves home;
    receiving it against the target's ``borrow_limit`` unless the target is its home."""
    if node_home is None or node_home == target:
        return None
    if node_home == source:
        limit = _limit(ownership, source, "lend_limit")
        if limit is not None and lent.get(source, 0) + 1 > limit:
            return f"{source} lends {lent.get(source, 0)} of its own nodes, lend_limit {limit}"
    limit = _limit(ownership, target, "borrow_limit")
    if limit is not None and borrowed.get(target, 0) + 1 > limit:
        return f"{target} borrows {borrowed.get(target, 0)} nodes of others, borrow_limit {limit}"
    return None


def _limit(ownership: Mapping[str, Ownership], platform: str, which: str) -> int | None:
    own = ownership.get(platform)
    return None if own is None else getattr(own, which)


def need_since(previous: Mapping[str, datetime], short: Mapping[str, float], nodes: Iterable[HeldNode],
               at: datetime, ownership: Mapping[str, Ownership]) -> dict[str, datetime]:
    """When each owner's need for its lent nodes began: kept while it is short with a node of its
    own lent out (or on its way back), from ``at`` where it begins now; dropped where it ended. An
    owner not read this tick (absent from ``short``) keeps what it had."""
    at = utc_datetime(at)
    away = {n.home for n in nodes if n.home is not None and (n.holder != n.home or n.moving)}
    out = {p: t for p, t in previous.items() if p not in short}
    for p, gap in short.items():
        own = ownership.get(p)
        if own is None or own.reclaim_minutes is None or gap <= 1e-9 or p not in away:
            continue
        out[p] = previous.get(p, at)
    return out


def covered(short: Mapping[str, float], reclaims: Sequence[Reclaim]) -> set[str]:
    """The owners whose shortage ``reclaims`` cover: their need is met once those nodes arrive,
    and a shortage read later (net of the GPUs on their way) is a new need with its own start."""
    back: dict[str, float] = {}
    for r in reclaims:
        back[r.target] = back.get(r.target, 0.0) + r.gpus
    return {p for p, g in back.items() if g >= short.get(p, 0.0) - 1e-9}


def reclaim(short: Mapping[str, float], nodes: Sequence[HeldNode], ownership: Mapping[str, Ownership],
            since: Mapping[str, datetime], recent_moves: Sequence[Mapping[str, Any]], at: datetime,
            max_moves_per_hour: int, move_minutes: float, flagged: Mapping[str, float] | None = None,
            ) -> tuple[list[Reclaim], list[tuple[str, str]]]:
    """The reclaims to start at ``at``, and ``(owner, why)`` for each owner still waiting.

    ``short``: platform -> GPUs of its pending work it cannot place (pending - free - on their
    way), for the platforms whose reading is trusted; ``since``: :func:`need_since`;
    ``recent_moves``: moves started within the budget window (``created_at``, and
    ``outside_budget`` true for a reclaim that took no slot). Owners most short go first; each
    takes back enough GPUs to cover its shortage: idle nodes first, then busy ones whose borrowed
    work has run ``min_runtime_minutes``, the least work ended first. ``flagged``: owner -> minutes
    to its next reading, for the owners whose reading the detect rules flag (the first reading of a
    burst is an alarm): such an owner waits for that reading unless waiting would bring its node
    back after ``reclaim_minutes``, as it waits for the move budget.
    """
    at = utc_datetime(at)
    counted = sorted(utc_datetime(m["created_at"]) for m in recent_moves
                     if utc_datetime(m["created_at"]) > at - BUDGET_WINDOW and not m.get("outside_budget"))
    budget = max_moves_per_hour - len(counted)
    out: list[Reclaim] = []
    waits: list[tuple[str, str]] = []
    taken: set[str] = set()
    for owner in sorted(since, key=lambda p: (-short.get(p, 0.0), p)):
        promise = ownership[owner]
        need = short.get(owner, 0.0)
        lent = [n for n in nodes if n.home == owner and n.holder != owner and not n.moving and n.node not in taken]
        ready = [n for n in lent if n.busy_gpus <= 1e-9 or n.ran_minutes >= promise.min_runtime_minutes]
        ready.sort(key=lambda n: (n.busy_gpus > 1e-9, n.busy_gpus * n.ran_minutes, n.node))
        deadline = utc_datetime(since[owner]) + timedelta(minutes=float(promise.reclaim_minutes))
        if ready and owner in (flagged or {}):
            back = at + timedelta(minutes=flagged[owner] + move_minutes)
            if back <= deadline:
                waits.append((owner, f"short {need:g} GPUs by a reading the detect rules flag; the next reading "
                                     f"decides, in time for reclaim_minutes {promise.reclaim_minutes:g}"))
                continue
        for n in ready:
            if need <= 1e-9:
                break
            outside = budget <= 0
            if outside and max_moves_per_hour > 0:
                # the slot that frees first: the oldest counted move leaves the window
                frees = counted[len(counted) - max_moves_per_hour] + BUDGET_WINDOW
                back = max(frees, at) + timedelta(minutes=move_minutes)
                if back <= deadline:
                    waits.append((owner, f"short {need:g} GPUs; node {n.node} waits for the move budget, a slot "
                                         f"frees at {frees:%H:%M} and it is back by {back:%H:%M}, within "
                                         f"reclaim_minutes {promise.reclaim_minutes:g}"))
                    break
            else:
                budget -= 1
                counted.append(at)
                counted.sort()
            work = (f"ending {n.busy_gpus:g} GPUs of {n.holder}'s work that ran {n.ran_minutes:g} min "
                    f"(min_runtime_minutes {promise.min_runtime_minutes:g})" if n.busy_gpus > 1e-9 else "idle")
            waited = (at - utc_datetime(since[owner])).total_seconds() / 60.0
            seen = " (a reading the detect rules flag: the next one is too late)" if owner in (flagged or {}) else ""
            out.append(Reclaim(n.node, n.holder, owner, n.gpus, n.busy_gpus, n.ran_minutes, outside,
                               f"reclaim: {owner} short {need:g} GPUs{seen} for {waited:g} min; its node {n.node} "
                               f"comes back from {n.holder}, {work}"
                               + ("; outside the move budget, which would bring it back after "
                                  f"reclaim_minutes {promise.reclaim_minutes:g}" if outside else "")))
            taken.add(n.node)
            need -= n.gpus
        if need > 1e-9 and not any(w[0] == owner for w in waits):
            young = [n for n in lent if n not in ready]
            if young:
                first = min(young, key=lambda n: promise.min_runtime_minutes - n.ran_minutes)
                left = math.ceil(promise.min_runtime_minutes - first.ran_minutes)
                waits.append((owner, f"short {need:g} GPUs; its node {first.node} on {first.holder} runs borrowed "
                                     f"work for {left} more min before min_runtime_minutes "
                                     f"{promise.min_runtime_minutes:g} lets a reclaim end it"))
    return out, waits
