"""The fast path's decision: every few minutes, answer a burst at once within what the hourly plan allows.

The hourly plan is the strategy (where nodes wait, who may lend, what each platform keeps);
this is the tactic. Each tick reads every platform's pressure through its own source
(`Source.pressure`: GPUs allocated, pending and open, idle whole nodes), judges each reading
with the detect stage's streaming rules before trusting it, and where pending demand exceeds
free capacity moves one idle whole node from the platform with the largest surplus to the one
with the largest shortage (the greedy rule of issue 30), through the same audited handover as
the plan (:func:`gpupool.actuation.handover.open_handover` + ``advance_all``).

* :func:`decide` is pure: readings, the plan's bounds, recent moves, open handovers, the time
  and :class:`Settings` in; a list of :class:`FastMove` and :class:`Skip` out, each with its reason.
  :func:`decide_inputs` builds its arguments one way for the tick and the what-if.
* :func:`gpupool.jobs.fastpath.run_fastpath` is one tick: read, stage the readings, judge, decide,
  record every decision in staging (``fastpath_decision``), open the moves' handovers and advance
  them; :mod:`gpupool.sim.fastpath` runs the same decision against the what-if's world.

Rules :func:`decide` keeps, each a named reason when it says no:

* a reading the detect rules flag (pending or allocated GPUs) is not acted on: an exporter
  glitch gone at the next scrape must not move a node; the next accepted reading decides;
* within the plan decided at most ``limits.max_actuation_age_hours`` ago: a platform the plan
  moves nodes to does not lend, and a lender keeps the GPUs the plan reserves for it (its upper
  demand for the first hour); without such a plan (none yet, or too old) on the rules below
  alone (:func:`current_bounds`), so a fresh install or a failing hourly DAG still answers a burst;
* a lender keeps ``min_nodes``;
* a lender keeps what its own pending work needs (it never lends itself into a shortage);
* GPUs already on their way to a platform (open handovers) count against its shortage;
* the move budget: at most ``limits.max_moves_per_decision`` handovers opened in any rolling hour,
  both paths together; one move per tick;
* cool-downs: a node moved within ``limits.cooldown_hours`` does not move again, and a platform
  does not reverse direction within it (one that lent does not borrow, one that borrowed does
  not lend), so two bursts in turn cannot swap a node back and forth;
* never a node with an open handover; only pool members; backfill runs never actuate;
* ownership (where ``Settings.homes`` names owners): no lend past a platform's ``lend_limit`` nor
  borrow past its ``borrow_limit``; a lender gives a node back to its owner first, then one nobody
  or a third platform owns, its own last; and of two platforms short, the one holding the least
  of what it owns (its nominal share) is served first. The reclaim runs before this decision
  (:func:`gpupool.decisions.ownership.reclaim`); its moves outside the budget take no slot.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Iterable, Mapping, Protocol, Sequence

from gpupool.config import LimitsConfig, Ownership, ownership_of
from gpupool.decisions.ownership import lent_and_borrowed, may_move
from gpupool.values import utc_datetime

#: the window of the move budget (issue 30: "at most N moves in any hour", both paths)
BUDGET_WINDOW = timedelta(hours=1)
#: the operator's limits as shipped: the fast path's settings default to them (defined once there)
_LIMITS = LimitsConfig()
#: Pressure field -> the metric its readings are staged (and judged) as
READING_METRICS = {"gpus_allocated": "gpu_allocated_now", "gpus_pending": "gpu_pending_now",
                   "gpus_capacity": "gpu_capacity_now"}
#: the readings judged before acting, with the canonical metric whose router settings judge them.
#: Capacity is not judged: it changes by whole nodes on purpose whenever the pool moves one.
JUDGED = {"gpu_pending_now": "gpu_pending", "gpu_allocated_now": "gpu_allocated"}


class Reading(Protocol):
    """What :func:`decide` reads of one platform's pressure (a
    :class:`gpupool.sources.base.Pressure`: the sources' instant read, or the what-if's)."""

    gpus_allocated: float
    gpus_pending: float
    gpus_capacity: float
    idle_nodes: tuple[str, ...]
    node_gpus: Mapping[str, int]
    nodes_open: int

    @property
    def gpus_free(self) -> float: ...


@dataclass(frozen=True)
class Judged:
    """A pressure reading and the judged metrics the detect rules flagged in it."""

    pressure: Reading
    anomalous: tuple[str, ...] = ()


@dataclass(frozen=True)
class PlanBounds:
    """What the latest hourly plan allows the fast path: who may lend and what each keeps."""

    plan_id: int | None
    decided_at: datetime | None
    keep_gpus: Mapping[str, float] = field(default_factory=dict)
    no_lend: Mapping[str, str] = field(default_factory=dict)  # platform -> why it may not lend


@dataclass(frozen=True)
class FastPathTuning:
    """The fast path's constants chosen on benchmarks, one object: the tick and the what-if decide
    with it, and ``bench/fastpath_tune.py`` passes other values in
    (:func:`gpupool.sim.study.simulate`'s ``fastpath_tuning``)."""

    #: the greedy rule's h: a platform needs (1 + h) x its demand (allocated + pending GPUs), so a
    #: burst still rising is met before its queue forms; a lender keeps as much. Chosen by
    #: ``bench/fastpath_tune.py`` on the tune groupings (docs/decisions/0019-fastpath-headroom.md)
    headroom: float = 0.0


def age_limit(max_actuation_age_hours: float) -> timedelta | None:
    """``limits.max_actuation_age_hours`` as the age past which a plan no longer binds (0: never)."""
    return timedelta(hours=max_actuation_age_hours) if max_actuation_age_hours > 0 else None


@dataclass(frozen=True)
class Settings:
    """The fast path's limits (from ``platforms[]`` and ``limits`` of the configuration, whose
    defaults are theirs: :class:`gpupool.config.LimitsConfig`) and its tuning."""

    min_nodes: Mapping[str, int] = field(default_factory=dict)
    max_moves_per_hour: int = _LIMITS.max_moves_per_decision
    cooldown: timedelta = timedelta(hours=_LIMITS.cooldown_hours)
    plan_max_age: timedelta | None = age_limit(_LIMITS.max_actuation_age_hours)
    max_moves_per_tick: int = 1
    tuning: FastPathTuning = FastPathTuning()
    members: frozenset[str] | None = None  # pool node ids that may move (None: any)
    backfill: bool = False
    ownership: Mapping[str, Ownership] = field(default_factory=dict)  # platform -> its promises
    homes: Mapping[str, str] = field(default_factory=dict)  # pool node id -> its owner (absent: nobody's)


@dataclass(frozen=True)
class FastMove:
    """Start a handover of ``node`` (a pool node id) from ``source`` to ``target``."""

    node: str
    source: str
    target: str
    gpus: int
    reason: str


@dataclass(frozen=True)
class Skip:
    """No move for ``platform`` ("*": the whole tick) this tick, and why."""

    platform: str
    reason: str


# ------------------------------------------------------------------------------ plan bounds


def plan_bounds(plan_row: Any, platforms: Iterable[str]) -> PlanBounds:
    """The bounds a stored ``allocation_plan`` row sets (None: no plan).

    Each platform keeps the GPUs the plan reserves for it, its upper demand for the first
    planned hour (``summary.platforms[p].demand_upper[0]``); a platform the plan moves nodes
    to does not lend until the next plan.
    """
    if plan_row is None:
        return PlanBounds(None, None)
    m = plan_row._mapping if hasattr(plan_row, "_mapping") else plan_row
    per = ((m["summary"] or {}).get("platforms") or {})
    keep, no_lend = {}, {}
    for p in platforms:
        upper = (per.get(p) or {}).get("demand_upper") or []
        keep[p] = float(upper[0]) if upper and upper[0] is not None else 0.0
    for move in m["moves"] or []:
        no_lend.setdefault(move["to"], f"the plan #{m['id']} moves nodes to it")
    return PlanBounds(int(m["id"]), utc_datetime(m["decided_at"]), keep, no_lend)


def settings_from_config(config, backfill: bool = False, tuning: FastPathTuning | None = None) -> Settings:
    """:class:`Settings` from the configuration's platforms, limits and pool (and ``tuning``,
    default :class:`FastPathTuning`'s). ``homes`` are ``pool.nodes[].owner``'s; the tick adds the
    owners ``owns`` took at first sight (:func:`gpupool.jobs.reclaim.tick_homes`)."""
    lim = config.limits
    members = None
    if config.pool.nodes and not config.pool.all_nodes:
        members = frozenset(n.node for n in config.pool.nodes)
    return Settings(
        ownership={p.name: ownership_of(p) for p in config.platforms},
        homes={n.node: n.owner for n in config.pool.nodes if n.owner is not None},
        min_nodes={p.name: p.min_nodes for p in config.platforms},
        max_moves_per_hour=lim.max_moves_per_decision,
        cooldown=timedelta(hours=lim.cooldown_hours),
        plan_max_age=age_limit(lim.max_actuation_age_hours),
        members=members, backfill=backfill, tuning=tuning or FastPathTuning(),
    )


# ------------------------------------------------------------------------------ the decision's inputs


def recent_since(at: datetime, settings: Settings) -> datetime:
    """The oldest creation time :func:`decide` looks at: the budget window or the cool-down."""
    return utc_datetime(at) - max(BUDGET_WINDOW, settings.cooldown)


def decide_inputs(judged: Mapping[str, Judged], plan_row: Any, platforms: Iterable[str],
                  opened: Sequence[Mapping[str, Any]], open_handovers: Sequence[Mapping[str, Any]],
                  at: datetime, settings: Settings) -> dict[str, Any]:
    """:func:`decide`'s keyword arguments, built one way for the fast-path tick and the what-if.

    ``judged``: platform -> judged reading; ``plan_row``: the latest hourly plan as staging
    stores it (``id``, ``decided_at``, ``summary``, ``moves``; None: none yet); ``opened``: the
    handovers either path opened (``node``, ``from_platform``, ``to_platform``, ``created_at``),
    of which those in ``[recent_since(at), at]`` count; ``open_handovers``: those not finished.
    """
    at = utc_datetime(at)
    since = recent_since(at, settings)
    recent = [h for h in opened if since <= utc_datetime(h["created_at"]) <= at]
    return {"pressures": judged, "plan_bounds": plan_bounds(plan_row, platforms), "recent_moves": recent,
            "open_handovers": list(open_handovers), "at": at, "settings": settings}


def with_power(pressures: Mapping[str, Judged], power: Mapping[str, tuple[str, str]],
               gpus: Mapping[str, int]) -> tuple[dict[str, Judged], list[dict[str, Any]]]:
    """The readings as the decision must take them where nodes are powered down, and the nodes
    waking as capacity on its way (entries for ``open_handovers``).

    ``power``: node -> (power state, platform) of the nodes not ``on``; ``gpus``: node -> GPUs.
    As in the what-if (:mod:`gpupool.sim.power`): a ``parked`` node is its platform's capacity
    (open, counted free: the parking rule decided it is not needed, and wakes it when it is), a
    ``parking`` one is nobody's, a ``waking`` one is on its way to its platform. None of them is
    an idle node to lend: a handover opens only on a node that is on (the what-if lends a parked
    node and wakes it on the way; production does not). Pure.
    """
    from dataclasses import replace

    out: dict[str, Judged] = {}
    for p, judged in pressures.items():
        r = judged.pressure
        capacity, open_ = float(r.gpus_capacity), int(r.nodes_open)
        idle = []
        for n in r.idle_nodes:
            if n in power:  # reported open and idle, yet powered down or on its way: not lent
                state, _ = power[n]
                if state != "parked" or power[n][1] != p:
                    capacity -= float(r.node_gpus.get(n, gpus.get(n, 0)))
                    open_ -= 1
            else:
                idle.append(n)
        listed = set(r.idle_nodes)
        for n, (state, platform) in power.items():  # parked and not reported open: its platform's
            if state == "parked" and platform == p and n not in listed:
                capacity += float(gpus.get(n, r.node_gpus.get(n, 0)))
                open_ += 1
        if (capacity, open_, len(idle)) != (float(r.gpus_capacity), int(r.nodes_open), len(r.idle_nodes)):
            r = replace(r, gpus_capacity=max(0.0, capacity), nodes_open=max(0, open_), idle_nodes=tuple(idle))
        out[p] = Judged(r, judged.anomalous)
    waking = [{"node": n, "to_platform": platform, "state": "waking", "gpus": gpus.get(n)}
              for n, (state, platform) in sorted(power.items()) if state == "waking"]
    return out, waking


# ------------------------------------------------------------------------------ the decision


def current_bounds(bounds: PlanBounds, at: datetime, settings: Settings) -> tuple[PlanBounds, str]:
    """The bounds that bind at ``at``, and what a move's reason says of them.

    A plan decided within ``settings.plan_max_age`` binds. Without one (none yet: a fresh
    install, a study's first hour; or the latest too old: the hourly DAG has not planned since)
    a burst is still answered, on the fast path's own rules alone: each lender keeps its own
    pending work and ``min_nodes``, the move budget and the cool-downs hold, and no plan's
    reserve or feeding binds.
    """
    if bounds.plan_id is None:
        return PlanBounds(None, None), "no hourly plan yet, so on the fast path's own rules"
    age = at - utc_datetime(bounds.decided_at)
    if settings.plan_max_age is not None and age > settings.plan_max_age:
        return PlanBounds(None, None), (f"the latest plan #{bounds.plan_id} is {age} old, more than "
                                        f"{settings.plan_max_age}, so on the fast path's own rules")
    return bounds, f"within plan #{bounds.plan_id}"


def decide(pressures: Mapping[str, Judged], plan_bounds: PlanBounds, recent_moves: Sequence[Mapping[str, Any]],
           open_handovers: Sequence[Mapping[str, Any]], at: datetime, settings: Settings) -> list[FastMove | Skip]:
    """The fast path's decisions at ``at``: moves to start and, for every platform not helped, why.

    ``pressures``: platform -> :class:`Judged` reading, node names already pool node ids;
    ``recent_moves``: handovers opened (either path) within the budget window and the
    cool-down before ``at`` (``node``, ``from_platform``, ``to_platform``, ``created_at``);
    ``open_handovers``: handovers not finished (``node``, ``to_platform``). Pure.
    """
    at = utc_datetime(at)
    if settings.backfill:
        return [Skip("*", "backfill run: the fast path never actuates a backfill; nothing read, nothing sent")]
    out: list[FastMove | Skip] = []
    plan_bounds, within = current_bounds(plan_bounds, at, settings)
    usable: dict[str, Reading] = {}
    for p, judged in sorted(pressures.items()):
        if judged.anomalous:
            out.append(Skip(p, f"reading judged anomalous by the detect rules ({', '.join(judged.anomalous)}): "
                               "not acted on; the next accepted reading decides"))
        else:
            usable[p] = judged.pressure
    node_gpus = {n: g for pr in pressures.values() for n, g in pr.pressure.node_gpus.items()}
    blocked = {h["node"] for h in open_handovers}
    transit: dict[str, float] = {}
    for h in open_handovers:
        if h.get("state") == "failed":  # blocks its node, but nothing is on its way
            continue
        # a node in transit is reported by neither platform: its handover carries its GPUs
        gpus = h.get("gpus") if h.get("gpus") is not None else node_gpus.get(h["node"], 0)
        transit[h["to_platform"]] = transit.get(h["to_platform"], 0.0) + float(gpus)
    hour_ago, cool_since = at - BUDGET_WINDOW, at - settings.cooldown
    budget = settings.max_moves_per_hour - sum(1 for m in recent_moves if utc_datetime(m["created_at"]) > hour_ago
                                               and not m.get("outside_budget"))
    cooling = [m for m in recent_moves if utc_datetime(m["created_at"]) > cool_since]
    moved_nodes = {m["node"] for m in cooling}
    lent = {m["from_platform"] for m in cooling}
    borrowed = {m["to_platform"] for m in cooling}
    free = {p: pr.gpus_free for p, pr in usable.items()}
    pending = {p: float(pr.gpus_pending) for p, pr in usable.items()}
    capacity = {p: float(pr.gpus_capacity) for p, pr in usable.items()}
    open_nodes = {p: int(pr.nodes_open) for p, pr in usable.items()}
    idle = {p: [n for n in pr.idle_nodes] for p, pr in usable.items()}
    h = settings.tuning.headroom
    demand = {p: float(pr.gpus_allocated) + pending[p] for p, pr in usable.items()}
    short = {p: pending[p] + h * demand[p] - free[p] - transit.get(p, 0.0) for p in usable}
    for p in sorted(usable):
        if short[p] <= 0:
            on_way = f" + {transit[p]:g} on their way" if transit.get(p) else ""
            out.append(Skip(p, f"no shortage: {pending[p]:g} GPUs pending, {free[p]:g} free{on_way}"))
    wanting = sorted((p for p in usable if short[p] > 0), key=lambda p: (-short[p], p))
    homes = settings.homes
    if homes:  # ownership: who lent and borrowed what; the platform furthest below its nominal share first
        holder = {n: p for p, pr in pressures.items() for n in pr.pressure.node_gpus}
        holder.update({h["node"]: h["to_platform"] for h in open_handovers if h.get("state") != "failed"})
        lent_n, borrowed_n = lent_and_borrowed((homes.get(n), p) for n, p in holder.items())
        owned = {p: sum(node_gpus.get(n, 0) for n, o in homes.items() if o == p) for p in usable}
        share = {p: (capacity[p] + transit.get(p, 0.0)) / owned[p] if owned[p] else float("inf") for p in usable}
        wanting.sort(key=lambda p: (share[p], -short[p], p))
    started = 0
    for q in wanting:
        if started >= settings.max_moves_per_tick or budget <= 0:
            why = (f"move budget spent: {settings.max_moves_per_hour} handovers opened in the last hour, both paths"
                   if budget <= 0 else f"this tick already started {started} move(s)")
            out.append(Skip(q, f"short {short[q]:g} GPUs but {why}"))
            continue
        if q in lent:
            out.append(Skip(q, f"short {short[q]:g} GPUs but it lent a node within the cool-down ({settings.cooldown})"))
            continue
        offers, refusals = [], []
        for p in sorted(usable):
            if p == q:
                continue
            why = _cannot_lend(p, plan_bounds, settings, borrowed, open_nodes, idle, blocked, moved_nodes)
            if why:
                refusals.append(f"{p}: {why}")
                continue
            fits = [n for n in idle[p] if n not in blocked and n not in moved_nodes
                    and (settings.members is None or n in settings.members)
                    and free[p] - node_gpus[n] >= pending[p] + h * demand[p]
                    and capacity[p] - node_gpus[n] >= plan_bounds.keep_gpus.get(p, 0.0)]
            if homes and fits:
                limited = [may_move(homes.get(n), p, q, lent_n, borrowed_n, settings.ownership) for n in fits]
                if all(limited):
                    refusals.append(f"{p}: {limited[0]}")
                    continue
                fits = sorted((n for n, why in zip(fits, limited) if not why),
                              key=lambda n: (homes.get(n) != q, homes.get(n) == p, n))
            if not fits:
                refusals.append(f"{p}: lending a node would leave less than its pending work "
                                f"({pending[p]:g} GPUs) or the plan's reserve ({plan_bounds.keep_gpus.get(p, 0.0):g})")
                continue
            offers.append((free[p] - pending[p] - h * demand[p], p, fits[0]))
        if not offers:
            out.append(Skip(q, f"short {short[q]:g} GPUs; no platform may lend an idle node: " + "; ".join(refusals)))
            continue
        surplus, p, node = max(offers, key=lambda o: (o[0], o[1]))
        gpus = int(node_gpus[node])
        reason = (f"fast path: {q} short {short[q]:g} GPUs ({pending[q]:g} pending, {free[q]:g} free); "
                  f"{p} has the largest surplus ({surplus:g} GPUs) and idle node {node} ({gpus} GPUs); "
                  f"{within}")
        out.append(FastMove(node, p, q, gpus, reason))
        started += 1
        budget -= 1
        free[p] -= gpus
        capacity[p] -= gpus
        open_nodes[p] -= 1
        idle[p].remove(node)
        blocked.add(node)
        lent.add(p)
        borrowed.add(q)
        if homes:
            holder[node] = q
            lent_n, borrowed_n = lent_and_borrowed((homes.get(n), t) for n, t in holder.items())
    return out


def _cannot_lend(p: str, bounds: PlanBounds, settings: Settings, borrowed: set, open_nodes: Mapping[str, int],
                 idle: Mapping[str, list], blocked: set, moved: set) -> str | None:
    """Why platform ``p`` may not lend now, or None."""
    if p in bounds.no_lend:
        return bounds.no_lend[p]
    if p in borrowed:
        return f"it received a node within the cool-down ({settings.cooldown})"
    if open_nodes[p] - 1 < settings.min_nodes.get(p, 0):
        return f"it holds {open_nodes[p]} open node(s), min_nodes {settings.min_nodes.get(p, 0)}"
    free_idle = [n for n in idle[p] if n not in blocked and n not in moved
                 and (settings.members is None or n in settings.members)]
    if not free_idle:
        return "no idle whole node it may give (none idle, in a handover, moved within the cool-down or not a pool member)"
    return None
