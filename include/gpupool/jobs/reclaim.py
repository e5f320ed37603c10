"""The reclaim in production: an owner short of GPUs takes its lent node back, first, on both paths.

The pure rule is :func:`gpupool.decisions.ownership.reclaim`; this module gives it what the what-if
gives it (:meth:`gpupool.sim.ownership.OwnershipTrack.tick`), from production's reads, and opens its
reclaims as audited handovers of kind ``reclaim``:

* **when.** The fast-path tick runs it under the move-budget lock after the power step and before
  :func:`~gpupool.decisions.fastpath.decide` (:func:`decide_reclaims`), which then sees the reclaimed
  nodes as open handovers (blocked, their GPUs on their way to the owner) and the reclaims inside the
  budget as moves that spent a slot; the hourly plan's actuation runs it on readings read for it
  before opening the plan's moves when the fast path does not run (:func:`plan_reclaims`). Without a
  platform promising ``reclaim_minutes`` it does nothing and reads nothing.
* **who holds a node.** The handover moving it (its target), else the platform that reports it open
  and idle now, else the only platform that reports it, else the target of its last live handover,
  else the inventory (:func:`gpupool.jobs.allocation.pool_nodes`). A node gpupool parked takes no
  part (a handover never opens on a node that is not on; the power step wakes it for its holder).
* **busy and for how long.** A lent node not in its holder's ``idle_nodes`` runs work: its GPUs
  are busy. How long that work ran is the youngest work unit's age from the holder actuator's
  ``work_started(node)``; an actuator without it, or one that cannot say, leaves it 0 (unknown), so
  borrowed work is never ended on a guess, and the owner's wait says so.
* **the need.** Each owner's ``need_since`` (when its shortage with a node of its own lent began)
  is kept in staging (``reclaim_need``) across ticks; an owner whose shortage the opened reclaims
  cover has its need closed (the handover carries its ``need_since``), as in the what-if. A
  reclaim rolled back in the last :data:`RESUMED_WITHIN` (its deadline passed) hands its need back
  to its owner, so the next reclaim of it is judged (and alerted) against the need's first start.
* **blocked.** A reclaim of a busy node whose borrower's disruption budgets allow no disruption
  (a Kubernetes PodDisruptionBudget: ``blocking_budgets`` as it opens, or its eviction refused
  since) is listed at once (:func:`blocked_reclaims`); it keeps asking through the Eviction API,
  never around the budget, and the tick raises
  :class:`~gpupool.actuation.handover_records.ReclaimBlocked` at the last tick before its deadline
  (:func:`blocked_due`), a tick before it would be late.
* **lateness.** :func:`late_reclaims` lists the live reclaims still open past ``need_since +
  reclaim_minutes`` and the owners still waiting past theirs; the tick raises
  :class:`~gpupool.actuation.handover_records.ReclaimLate` on them after the rest of its work.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from gpupool.config import Ownership, ownership_of
from gpupool.decisions.fastpath import FastMove, Judged, Skip
from gpupool.decisions.ownership import BUDGET_WINDOW, HeldNode, Reclaim, covered, need_since, reclaim
from gpupool.values import utc_datetime

#: a reclaim rolled back this recently hands its need's start back to its owner
RESUMED_WITHIN = timedelta(minutes=15)


@dataclass(frozen=True)
class ReclaimMove(FastMove):
    """A reclaim as a fast-path decision: recorded like a move, opened as a handover of kind reclaim."""

    outside_budget: bool = False
    need_since: datetime | None = None
    busy_gpus: float = 0.0


def promised(config) -> dict[str, Ownership]:
    """The platforms' promises where one promises a reclaim (``reclaim_minutes``); empty otherwise."""
    own = {p.name: ownership_of(p) for p in config.platforms}
    return own if any(o.reclaim_minutes is not None for o in own.values()) else {}


def promised_minutes(config) -> dict[str, float]:
    """Owner -> its ``reclaim_minutes``, for the platforms that promise one (a blocked reclaim's
    error says by when its deadline falls)."""
    return {p: o.reclaim_minutes for p, o in promised(config).items() if o.reclaim_minutes is not None}


def homes_of(ctx, at: datetime, held: Mapping[str, Iterable[str]]) -> dict[str, str]:
    """Pool node id -> its owner, as the plan reads it (:func:`gpupool.jobs.owners.homes_at`:
    ``pool.nodes[].owner`` and each platform's ``owns`` at its first sight, recorded in staging);
    ``held``: platform -> the pool nodes it holds now."""
    from gpupool.jobs.owners import homes_at

    return homes_at(ctx, at, held)


def tick_homes(ctx, at: datetime, pressures: Mapping[str, Any], open_h: Sequence[Mapping[str, Any]],
               powered_down: Iterable[str] = ()) -> tuple[dict[str, str], dict[str, tuple[str, bool]]]:
    """The owners (:func:`homes_of`, recording what is new) of the nodes the tick's readings and
    handovers place (:func:`holders`), and those holders: what the reclaim and the fast path's
    limits both read. Nothing read or written where no platform and no pool node names an owner."""
    from gpupool.jobs.owners import explicit_owners, ownership_settings

    if not ownership_settings(ctx.config) and not explicit_owners(ctx.config):
        return {}, {}
    held = holders(ctx, at, pressures, open_h, powered_down)
    by_platform: dict[str, list[str]] = {}
    for n, (p, _) in sorted(held.items()):
        by_platform.setdefault(p, []).append(n)
    return homes_of(ctx, at, by_platform), held


# ------------------------------------------------------------------------------------ inputs


def holders(ctx, at: datetime, readings: Mapping[str, Any], open_h: Sequence[Mapping[str, Any]],
            powered_down: Iterable[str] = ()) -> dict[str, tuple[str, bool]]:
    """Pool node id -> (the platform holding it, whether a handover moves it there now); see the
    module docstring. A node with a failed handover (blocked, going nowhere) or powered down is absent."""
    out: dict[str, tuple[str, bool]] = {}
    failed = {h["node"] for h in open_h if h.get("state") == "failed"}
    down = set(powered_down)
    for h in open_h:
        if h["node"] not in failed and h["node"] not in down and h.get("to_platform"):
            out[h["node"]] = (h["to_platform"], True)
    listed: dict[str, list[str]] = {}
    for p, r in sorted(readings.items()):
        for n in r.node_gpus:
            listed.setdefault(n, []).append(p)
        for n in r.idle_nodes:
            if n not in failed and n not in down:
                out.setdefault(n, (p, False))
    unsure = []
    for n, ps in sorted(listed.items()):
        if n in out or n in failed or n in down:
            continue
        if len(ps) == 1:
            out[n] = (ps[0], False)
        else:
            unsure.append(n)
    if unsure:
        from gpupool.actuation import handover as ho
        from gpupool.staging import reads

        last = reads.last_targets(ctx.engine, ho.DONE)
        inventory = None
        for n in unsure:
            if n in last:
                out[n] = (last[n], False)
                continue
            if inventory is None:
                from gpupool.jobs.pool import pool_nodes

                inventory = {r.name: r.owner for r in pool_nodes(ctx.engine, at, ctx.platforms(), ctx.config)[0]}
            if n in inventory:
                out[n] = (inventory[n], False)
    return out


def work_ran_minutes(actuator: Any, node: str, at: datetime) -> float | None:
    """Minutes the youngest work unit on ``node`` has run, from ``actuator.work_started`` (None:
    the actuator cannot say). No work listed: 0."""
    read = getattr(actuator, "work_started", None)
    if read is None and getattr(actuator, "inner", None) is not None:  # a pool-named wrapper
        inner = actuator.inner
        read = getattr(inner, "work_started", None)
        name = actuator.name_of(node) if hasattr(actuator, "name_of") else node
        if read is None:
            return None
        node = name
    if read is None:
        return None
    try:
        starts = read(node)
    except Exception:  # an API that fails to say is as good as one that cannot: unknown
        return None
    if starts is None:
        return None
    if not starts:
        return 0.0
    youngest = max(utc_datetime(t) for t in starts)
    return max(0.0, (utc_datetime(at) - youngest).total_seconds() / 60.0)


def _read_actuators(ctx, platforms: Iterable[str], given: Mapping[str, Any] | None, lookup) -> dict[str, Any]:
    """The actuators that say how long work ran: ``given`` ones, else built (read-only use); a
    platform whose actuator cannot be built is absent (its work's runtime unknown)."""
    from gpupool.actuation.actuators.base import with_pool_names

    out = dict(given or {})
    for p in sorted(set(platforms) - set(out)):
        try:
            out.update(ctx.build_actuators([p], lookup=lookup))
        except Exception:  # no connection: unknown, said in the wait
            continue
    return with_pool_names(ctx.config, out)


# ------------------------------------------------------------------------------------ the step


@dataclass
class ReclaimStep:
    """What one run of the reclaim decided: ``moves`` to open first, ``waits`` (owner, why), the
    owners' needs as stored after it, and the entries the decision must see (``moving`` as open
    handovers, ``spent`` as recent moves)."""

    moves: list[ReclaimMove]
    waits: list[tuple[str, str]]
    need: dict[str, datetime]
    moving: list[dict[str, Any]]
    spent: list[dict[str, Any]]
    #: the reclaims of busy nodes whose borrower's disruption budgets allow no disruption as they open
    blocked: list[dict[str, Any]] = field(default_factory=list)

    def skips(self) -> list[Skip]:
        return [Skip(owner, f"reclaim waits: {why}") for owner, why in self.waits]


def decide_reclaims(ctx, at: datetime, readings: Mapping[str, Judged], open_h: Sequence[Mapping[str, Any]],
                    recent: Sequence[Mapping[str, Any]], *, tick: timedelta, actuators: Mapping[str, Any] | None = None,
                    lookup=None, powered_down: Iterable[str] = (),
                    owned: tuple[dict[str, str], dict[str, tuple[str, bool]]] | None = None) -> ReclaimStep | None:
    """The reclaims to start at ``at`` on ``readings`` (platform -> judged reading, node names pool
    ids), ``open_h`` (handovers not finished, with their GPUs) and ``recent`` (handovers opened in
    the budget window: ``created_at``, ``outside_budget``); ``tick``: when the next reading comes
    (a flagged owner waits for it where it can); ``owned``: :func:`tick_homes`' answer where the
    caller has it. Stores the owners' needs. None: no platform promises a reclaim (nothing read,
    nothing written)."""
    from gpupool.staging import owners as owner_store

    config, engine = ctx.config, ctx.engine
    ownership = promised(config)
    if not ownership:
        return None
    at = utc_datetime(at)
    pressures = {p: j.pressure for p, j in readings.items()}
    homes, held = owned if owned is not None else tick_homes(ctx, at, pressures, open_h, powered_down)
    held = dict(held)
    gpus = {n: int(g) for r in pressures.values() for n, g in r.node_gpus.items()}
    gpus.update({h["node"]: int(h["gpus"]) for h in open_h if h.get("gpus") is not None})
    on_way: dict[str, float] = {}
    for h in open_h:
        if h.get("state") != "failed":
            g = h.get("gpus") or gpus.get(h["node"], 0)
            on_way[h["to_platform"]] = on_way.get(h["to_platform"], 0.0) + float(g)
    for m in recent:  # a dry run's reclaim moved its node on paper only: on its way until the cool-down ends
        if m.get("kind") == "reclaim" and m.get("dry_run") and m["node"] not in {h["node"] for h in open_h}:
            held[m["node"]] = (m["to_platform"], True)
            on_way[m["to_platform"]] = on_way.get(m["to_platform"], 0.0) + float(gpus.get(m["node"], 0))
    short = {p: float(r.gpus_pending) - r.gpus_free - on_way.get(p, 0.0) for p, r in pressures.items()}
    idle = {p: set(r.idle_nodes) for p, r in pressures.items()}
    nodes = []
    for n, (p, moving) in sorted(held.items()):
        if homes.get(n) is None:
            continue
        busy = 0.0 if moving or n in idle.get(p, ()) or p not in pressures else float(gpus.get(n, 0))
        nodes.append(HeldNode(n, homes[n], p, gpus.get(n, 0), busy_gpus=busy, moving=moving))
    before = owner_store.needs(engine)
    need = need_since(before, short, nodes, at, ownership)
    if need:
        need = _resumed(engine, at, need, held)
    moves: list[Reclaim] = []
    waits: list[tuple[str, str]] = []
    unknown: set[str] = set()
    acts: dict[str, Any] = {}
    if need:
        wanted = [n for n in nodes if n.home in need and n.home != n.holder and not n.moving and n.busy_gpus > 0]
        acts = _read_actuators(ctx, {n.holder for n in wanted}, actuators, lookup) if wanted else {}
        ran: dict[str, float] = {}
        for n in wanted:
            minutes = work_ran_minutes(acts.get(n.holder), n.node, at)
            if minutes is None:
                unknown.add(n.node)
            ran[n.node] = minutes or 0.0
        nodes = [replace(n, ran_minutes=ran.get(n.node, 0.0)) for n in nodes]
        flagged = {p: tick / timedelta(minutes=1) for p, j in readings.items() if j.anomalous}
        counted = [m for m in recent if utc_datetime(m["created_at"]) > at - BUDGET_WINDOW]
        moves, waits = reclaim(short, nodes, ownership, {p: t for p, t in need.items() if p in short}, counted, at,
                               config.limits.max_moves_per_decision, float(config.limits.move_minutes), flagged)
        waits = [(owner, _unknown_said(why, unknown, held)) for owner, why in waits]
    opened_need = dict(need)
    for p in covered(short, moves):  # met once they arrive: a later shortage is a new need
        need.pop(p, None)
    if need != before:
        owner_store.set_needs(engine, need, at)
    out = [ReclaimMove(m.node, m.source, m.target, m.gpus, m.reason, outside_budget=m.outside_budget,
                       need_since=opened_need.get(m.target), busy_gpus=m.busy_gpus) for m in moves]
    blocked = _blocked_at_opening(out, acts, ownership, at)
    moving = [{"node": m.node, "to_platform": m.target, "state": "planned", "gpus": m.gpus} for m in out]
    spent = [{"node": m.node, "from_platform": m.source, "to_platform": m.target, "created_at": at,
              "outside_budget": m.outside_budget, "kind": "reclaim"} for m in out]
    return ReclaimStep(out, waits, need, moving, spent, blocked)


def _blocked_at_opening(moves: Sequence[ReclaimMove], acts: Mapping[str, Any], ownership: Mapping[str, Ownership],
                        at: datetime) -> list[dict[str, Any]]:
    """The reclaims of busy nodes whose borrower reports disruption budgets that allow no
    disruption now (``blocking_budgets``), as :func:`blocked_reclaims` lists them; a borrower
    whose budgets cannot be read is not named (the eviction's refusal says it then)."""
    out = []
    for m in moves:
        act = acts.get(m.source)
        if m.busy_gpus <= 0 or act is None:
            continue
        try:
            budgets = act.blocking_budgets(m.node)
        except Exception:  # unread: the handover's eviction finds out and says so
            continue
        if budgets:
            out.append(_blocked_entry(None, m.node, m.target, m.source, list(budgets), m.need_since,
                                      ownership.get(m.target), at, "opening"))
    return out


def _unknown_said(why: str, unknown: set[str], held: Mapping[str, tuple[str, bool]]) -> str:
    """A wait's reason, saying where the borrowed work's runtime is unknown (it counts as just begun)."""
    named = [n for n in sorted(unknown) if f"node {n} " in why]
    if not named:
        return why
    return why + "; " + ", ".join(f"how long the work on {n} ran is unknown ({held[n][0]}'s actuator does not say), "
                                  "so it counts as just started and is never ended on a guess" for n in named)


def _resumed(engine, at: datetime, need: dict[str, datetime],
             held: Mapping[str, tuple[str, bool]]) -> dict[str, datetime]:
    """``need`` with the start of each owner's need that a live reclaim rolled back within
    :data:`RESUMED_WITHIN` carried (its node back with the borrower): the promise runs from there."""
    from gpupool.actuation import handover as ho

    out = dict(need)
    for h in ho.list_handovers(engine, (ho.ROLLED_BACK,), limit=50):
        if (h.kind != ho.RECLAIM or h.dry_run or h.need_since is None or h.to_platform not in out
                or h.updated_at < at - RESUMED_WITHIN or held.get(h.node, (None, False))[1]):
            continue
        out[h.to_platform] = min(out[h.to_platform], h.need_since)
    return out


def reading_without(readings: Mapping[str, Judged], moves: Sequence[ReclaimMove]) -> dict[str, Judged]:
    """The readings as the decision must take them once ``moves`` started: each reclaimed node
    leaves its borrower's capacity (and its idle nodes, or its allocated GPUs where busy), as the
    what-if's decision reads the pool again after the reclaims."""
    out = dict(readings)
    for m in moves:
        j = out.get(m.source)
        if j is None or m.node not in j.pressure.node_gpus:
            continue
        r = j.pressure
        open_node = m.node in r.idle_nodes or m.busy_gpus > 0
        if not open_node:
            continue
        out[m.source] = Judged(replace(
            r, gpus_capacity=max(0.0, float(r.gpus_capacity) - m.gpus),
            gpus_allocated=max(0.0, float(r.gpus_allocated) - m.busy_gpus),
            idle_nodes=tuple(n for n in r.idle_nodes if n != m.node), nodes_open=max(0, int(r.nodes_open) - 1)),
            j.anomalous)
    return out


def open_kwargs(d: Any) -> dict[str, Any]:
    """The extra keywords :func:`~gpupool.actuation.handover.open_handover` takes for a decision:
    a reclaim's kind, budget slot and need; nothing for a move."""
    from gpupool.actuation.handover import RECLAIM

    if isinstance(d, ReclaimMove):
        return {"kind": RECLAIM, "outside_budget": d.outside_budget, "need_since": d.need_since}
    return {}


# ------------------------------------------------------------------------------------ lateness


def late_reclaims(ctx, at: datetime, waits: Sequence[tuple[str, str]] = ()) -> list[dict[str, Any]]:
    """The reclaims late at ``at``: each live reclaim handover still open past its owner's
    ``need_since + reclaim_minutes`` (node, owner, borrower, minutes late, its last error) and each
    owner whose stored need is past its deadline with no reclaim open (node and borrower None, the
    error its last wait). Empty, reading nothing, where no platform promises a reclaim."""
    from gpupool.actuation import handover as ho
    from gpupool.staging import owners as owner_store

    ownership = promised(ctx.config)
    if not ownership:
        return []
    at = utc_datetime(at)
    out, reclaiming = [], set()
    for h in sorted(ho.list_handovers(ctx.engine, ho.BLOCKING_STATES), key=lambda x: x.id):
        if h.kind != ho.RECLAIM or h.dry_run or h.need_since is None:
            continue
        reclaiming.add(h.to_platform)
        promise = ownership.get(h.to_platform)
        if promise is None or promise.reclaim_minutes is None:
            continue
        late = (at - h.need_since).total_seconds() / 60.0 - promise.reclaim_minutes
        if late > 1e-9:
            out.append({"id": h.id, "node": h.node, "owner": h.to_platform, "borrower": h.from_platform,
                        "minutes_late": round(late, 1), "state": h.state, "error": h.error})
    why = dict(waits)
    for owner, since in sorted(owner_store.needs(ctx.engine).items()):
        promise = ownership.get(owner)
        if owner in reclaiming or promise is None or promise.reclaim_minutes is None:
            continue
        late = (at - since).total_seconds() / 60.0 - promise.reclaim_minutes
        if late > 1e-9:
            out.append({"id": None, "node": None, "owner": owner, "borrower": None, "minutes_late": round(late, 1),
                        "state": "waiting", "error": why.get(owner, "no reclaim opened")})
    return out


def _blocked_entry(hid: int | None, node: str, owner: str, borrower: str, budgets: list[str],
                   since: datetime | None, promise: Ownership | None, at: datetime, state: str,
                   error: str | None = None) -> dict[str, Any]:
    deadline = None
    if since is not None and promise is not None and promise.reclaim_minutes is not None:
        deadline = utc_datetime(since) + timedelta(minutes=promise.reclaim_minutes)
    return {"id": hid, "node": node, "owner": owner, "borrower": borrower, "budgets": budgets,
            "deadline": deadline.isoformat() if deadline is not None else None,
            "minutes_left": round((deadline - at).total_seconds() / 60.0, 1) if deadline is not None else None,
            "state": state, "error": error}


def blocked_reclaims(ctx, at: datetime, opening: Sequence[Mapping[str, Any]] = ()) -> list[dict[str, Any]]:
    """The reclaims a disruption budget blocks at ``at``: each live reclaim handover still open
    whose last eviction was refused with budgets named (the handover's error, ``BLOCKED_BY``), and
    the ``opening`` ones (:attr:`ReclaimStep.blocked`: the budgets read as the reclaim opened, a
    dry run's too) not listed already. Each: id (None: at opening), node, owner, borrower, budgets
    ("ns/name"), deadline (``need_since + reclaim_minutes``, ISO), minutes_left, state, error."""
    from gpupool.actuation import handover as ho

    ownership = promised(ctx.config)
    if not ownership:
        return []
    at = utc_datetime(at)
    out = []
    for h in sorted(ho.list_handovers(ctx.engine, ho.BLOCKING_STATES), key=lambda x: x.id):
        if h.kind != ho.RECLAIM or h.dry_run or ho.BLOCKED_BY not in (h.error or ""):
            continue
        named = h.error.split(ho.BLOCKED_BY, 1)[1].split(";", 1)[0]
        out.append(_blocked_entry(h.id, h.node, h.to_platform, h.from_platform,
                                  [b.strip() for b in named.split(",") if b.strip()], h.need_since,
                                  ownership.get(h.to_platform), at, h.state, h.error))
    listed = {x["node"] for x in out}
    return out + [dict(x) for x in opening if x["node"] not in listed]


def blocked_due(blocked: Sequence[Mapping[str, Any]], at: datetime, tick: timedelta) -> list[dict[str, Any]]:
    """The blocked reclaims that fail the run now: those whose deadline falls before the next
    tick (``deadline <= at + tick``), so waiting on the budget one more tick would break the
    promise, and not yet passed (past it :class:`~gpupool.actuation.handover_records.ReclaimLate`
    says it, the refusal in its error). A reclaim whose deadline is unknown never fails here."""
    at = utc_datetime(at)
    out = []
    for x in blocked:
        if x.get("deadline") is None:
            continue
        deadline = utc_datetime(datetime.fromisoformat(x["deadline"]))
        if at < deadline <= at + tick:
            out.append(dict(x))
    return out


def format_blocked(blocked: Sequence[Mapping[str, Any]]) -> str:
    """The blocked reclaims as ``gpupool fastpath`` prints them, one line each."""
    return "\n".join(
        [f"{len(blocked)} reclaim(s) blocked by disruption budgets (the Eviction API keeps asking):"]
        + [f"  node {x['node']} of {x['owner']} on {x['borrower']}"
           + (f" (handover #{x['id']})" if x.get("id") is not None else " (opening)")
           + f": {', '.join(x['budgets'])}; deadline {x['deadline'] or 'unknown'}"
           + (f", {x['minutes_left']:g} min left" if x.get("minutes_left") is not None else "") for x in blocked]
    ) if blocked else ""


# ------------------------------------------------------------------------------------ opening


def open_reclaims(ctx, at: datetime, moves: Sequence[ReclaimMove], live, timeout: timedelta) -> tuple[list, list]:
    """Open a handover of kind reclaim per move (``live(move)``: sent for real, else a dry run);
    the opened ones and those refused (with why)."""
    from gpupool.actuation import handover as ho

    opened, refused = [], []
    for m in moves:
        try:
            hid = ho.open_handover(ctx.engine, m.node, m.source, m.target, at, reason=m.reason, dry_run=not live(m),
                                   timeout=timeout, gpus=m.gpus, **open_kwargs(m))
        except ho.HandoverConflict as exc:
            refused.append({"node": m.node, "why": str(exc)})
            continue
        opened.append({"id": hid, "node": m.node, "from": m.source, "to": m.target, "dry_run": not live(m),
                       "kind": ho.RECLAIM, "outside_budget": m.outside_budget})
    return opened, refused


def plan_reclaims(ctx, at: datetime, *, live, timeout: timedelta, actuators: Mapping[str, Any] | None = None,
                  lookup=None, sources: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """The reclaim of the hourly plan's actuation, before it opens the plan's moves: run when the
    fast path does not (:func:`gpupool.jobs.pressure.fastpath_running`), on each platform's pressure
    read now and staged as the fast path stages its own (the plan's inventory is an hour old). Not
    judged: the detect rules judge readings at the fast path's cadence, and the next reading of
    the plan's cadence is too late to wait for. None: no platform promises a reclaim."""
    from gpupool.actuation import handover as ho
    from gpupool.decisions.fastpath import READING_METRICS
    from gpupool.jobs.pressure import PLAN_EVERY, _pool_ids, fastpath_running, power_states, read_pressures
    from gpupool.staging import fastpath as store

    if not promised(ctx.config):
        return None
    at = utc_datetime(at)
    if fastpath_running(ctx.engine, at):
        return {"note": "the fast path runs the reclaim (it ticked recently); the plan leaves it to it",
                "opened": [], "refused": [], "waits": []}
    read, unread, _ = read_pressures(ctx, at, sources, lookup)
    judged = {}
    for p, pr in read.items():
        store.record_pressure(ctx.engine, p, at, {m: getattr(pr, f) for f, m in READING_METRICS.items()})
        judged[p] = Judged(_pool_ids(ctx.config, pr))
    gpus = {n: g for j in judged.values() for n, g in j.pressure.node_gpus.items()}
    open_h = [{**h.as_dict(), "gpus": gpus.get(h.node)} for h in ho.list_handovers(ctx.engine, ho.BLOCKING_STATES)]
    recent = [h for h in store.handovers_opened_between(ctx.engine, at - BUDGET_WINDOW, at)
              if ctx.config.dry_run or not h["dry_run"]]
    step = decide_reclaims(ctx, at, judged, open_h, recent, tick=PLAN_EVERY, actuators=actuators, lookup=lookup,
                           powered_down=power_states(ctx.engine))
    opened, refused = open_reclaims(ctx, at, step.moves, live, timeout)
    return {"opened": opened, "refused": refused, "waits": step.waits, "unread": unread, "blocked": step.blocked}
