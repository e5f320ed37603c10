"""The fast path in the what-if: production's tick between the hourly plans, against the world.

Every ``scenario.fastpath`` (absent: :data:`gpupool.decisions.cadence.FASTPATH_EVERY`, the
``gpupool_fastpath`` DAG's cadence) the study runs what one tick of that DAG runs, on what it
would see:

1. **readings** — each platform's :class:`~gpupool.sources.base.Pressure` at the tick, built by
   the sources' own :func:`~gpupool.sources.base.pressure_from_records`: node states (open, idle
   whole nodes, capacity) from the world's inventory at that instant, GPUs allocated and pending
   as the exporter reported them for the step just ended — the same values the hourly chain
   reads, corrupted by the same ``faults:`` draws (:class:`~gpupool.sim.study.ChainDemand`
   keeps them). A step with no row (a ``gap``) is a platform not read this tick: it takes no part.
2. **judge** — each reading's pending and allocated GPUs are judged with the detect stage's
   streaming rules (:func:`gpupool.detect.stage.judge_series` on the series' look-back, the newest
   point only), with the model of its refit anchor kept in memory and shared with the hourly
   chain's cleaning (the same series, the same anchors, so the same models). A flagged reading is
   not acted on, as in production. A flag only takes its platform out of the tick, so only the
   readings of the platforms a decision would move a node between can change it: those are
   judged, and the tick decided again if one is flagged (the decision is the one judging every
   reading gives, at a fraction of the cost). ``clean=False`` (``--no-clean``) acts on raw
   readings: what the judge is worth.
3. **decide** — :func:`gpupool.decisions.fastpath.decide`, the production function, on
   :func:`~gpupool.decisions.fastpath.decide_inputs`: the latest hourly plan as staging stores it
   (who may lend, what each keeps), every move either path started within the budget window and
   the cool-down, and the nodes still in transit (open handovers).
4. a move starts at the tick (the handover opens and releases in that run) and the node serves
   nobody for ``move_minutes``, like a plan's move.

Where nodes have owners (:mod:`gpupool.sim.ownership`), the reclaim runs on the same readings
before the decision, and the decision reads the pool again after the reclaims it started.

``oracle`` decides on the true demand of the current step (no faults, no judge): the bound of
deciding at this cadence. ``static`` has no fast path.
"""

from __future__ import annotations

import dataclasses
import math
from datetime import timedelta

import numpy as np
import pandas as pd

from gpupool.decisions.fastpath import (JUDGED, FastMove, FastPathTuning, Judged, Settings, age_limit, decide,
                                        decide_inputs, recent_since)
from gpupool.decisions.policy import Policy
from gpupool.config import default_config
from gpupool.detect import stage as detect_stage
from gpupool.sources.base import pressure_from_records

#: Pressure field of each judged canonical metric
_FIELD = {"gpu_pending": "gpus_pending", "gpu_allocated": "gpus_allocated"}


def fastpath_settings(policy: Policy, max_moves: int, tuning: FastPathTuning | None = None) -> Settings:
    """The fast path's :class:`Settings` in a study: the policy's ``min_nodes`` and cool-down,
    ``max_moves`` per rolling hour (the scenario's ``max_moves_per_decision``), the plan's age
    limit of the default configuration (``limits.max_actuation_age_hours``) and ``tuning``
    (default :class:`FastPathTuning`'s, as production's)."""
    return Settings(min_nodes=dict(policy.min_nodes), max_moves_per_hour=int(max_moves),
                    cooldown=timedelta(hours=policy.cooldown_hours),
                    plan_max_age=age_limit(default_config().limits.max_actuation_age_hours),
                    tuning=tuning or FastPathTuning())


def plan_row(plan_id: int, at: pd.Timestamp, result, demand) -> dict:
    """An hourly :class:`~gpupool.decisions.planner.Plan` as ``allocation_plan`` stores it, the
    fields the fast path reads (``jobs.allocation.plan_from_staging``'s rounding)."""
    per = {p: {"demand_upper": [round(float(v), 1) for v in d.upper]} for p, d in demand.items()}
    return {"id": plan_id, "decided_at": at.to_pydatetime(), "summary": {"platforms": per},
            "moves": [{"node": m.node, "from": m.source, "to": m.target} for m in result.moves]}


class FastPath:
    """The fast path of one study: ticks, the moves both paths started, the latest plan."""

    def __init__(self, policy: Policy, world, source, every: timedelta, judge: bool = True,
                 tuning: FastPathTuning | None = None, log: list | None = None):
        self.world = world
        self.source = source  # a ChainDemand (its telemetry and models), or None for the oracle
        self.every = pd.Timedelta(every)
        self.judge = judge and source is not None
        self.settings = fastpath_settings(policy, world.scenario.max_moves_per_decision, tuning)
        self.log = log  # when a list: receives each tick's decisions, as the tick records them
        self.router = default_config().detect.router_config()
        self.lookback = int(detect_stage.detect_lookback(self.router) / world.step)
        self.plan: dict | None = None
        self.moves: list[dict] = []  # every move started, both paths: node, from/to_platform, created_at, path
        self.judged = 0  # readings judged (the cost of the judge)
        self.power = None  # a PowerTrack when the study parks: waking nodes count as on their way
        self.owners = None  # an OwnershipTrack where nodes have owners: the reclaim runs first

    def own(self, owners) -> None:
        """Nodes have owners (an :class:`~gpupool.sim.ownership.OwnershipTrack`): the decision keeps
        the limits and the reclaim runs before it."""
        self.owners = owners
        self.settings = dataclasses.replace(self.settings, ownership=dict(owners.ownership), homes=dict(owners.homes))

    # --- what both paths started
    def record(self, at: pd.Timestamp, node: str, source: str, target: str, path: str,
               outside_budget: bool = False) -> None:
        """A move started at ``at`` by ``path`` ("plan", "fast" or "reclaim"; a reclaim
        ``outside_budget`` takes no slot of the budget)."""
        self.moves.append({"node": node, "from_platform": source, "to_platform": target,
                           "created_at": at.to_pydatetime(), "path": path, "outside_budget": outside_budget})

    def start(self, at: pd.Timestamp, node: str, source: str, target: str, path: str,
              outside_budget: bool = False) -> pd.Timestamp:
        """Start a move in the world now and record it; the time the node arrives."""
        arrive = self.world.move(node, target)
        if self.power is not None:
            self.power.moved(node, target, at, arrive)
        self.record(at, node, source, target, path, outside_budget)
        return arrive

    def recent(self, at: pd.Timestamp) -> list[dict]:
        """The moves either path started within the budget window and the cool-down before ``at``."""
        since = recent_since(at.to_pydatetime(), self.settings)
        return [m for m in self.moves if m["created_at"] >= since]

    def budget_left(self, at: pd.Timestamp) -> int:
        """Moves either path may still start at ``at`` within the rolling hour."""
        hour_ago = (at - pd.Timedelta("1h")).to_pydatetime()
        used = sum(1 for m in self.moves if m["created_at"] > hour_ago and not m["outside_budget"])
        return max(0, self.settings.max_moves_per_hour - used)

    def planned(self, plan_id: int, at: pd.Timestamp, result, demand) -> None:
        """The hourly plan decided at ``at``: the fast path's bounds from now on."""
        self.plan = plan_row(plan_id, at, result, demand)

    def fast_moves(self) -> dict[str, int]:
        """Nodes each platform received from the fast path."""
        out = {p: 0 for p in self.world.platforms}
        for m in self.moves:
            if m["path"] == "fast":
                out[m["to_platform"]] += 1
        return out

    # --- one tick
    def tick(self, at: pd.Timestamp) -> list[FastMove]:
        """One tick at ``at`` (the world's clock): read, judge, decide, start the moves."""
        world = self.world
        i = world.clock_index
        if i == 0:  # nothing read yet
            return []
        pool, readings, transit = self.observe(at)
        if self.owners is not None and self.owners.tick(at, readings, transit, pool, self):
            pool, readings, transit = self.observe(at)  # the reclaims' nodes are on their way
        opened = self.recent(at)
        flags: dict[str, tuple[str, ...]] = {}
        while True:
            judged = {p: Judged(r, flags.get(p, ())) for p, r in readings.items()}
            decisions = decide(**decide_inputs(judged, self.plan, world.platforms, opened, transit,
                                               at.to_pydatetime(), self.settings))
            moves = [d for d in decisions if isinstance(d, FastMove)]
            # a flag only takes a platform out (it neither wants nor lends), so the readings that
            # can change this decision are those of the platforms it moves a node between: judged
            # clean, the decision stands whatever the others' judgement; flagged, decide again
            unjudged = {p for mv in moves for p in (mv.source, mv.target)} - set(flags) if self.judge else set()
            if not unjudged:
                break
            for p in sorted(unjudged):
                flags[p] = self._flags(p, i, readings[p])
            self.judged += len(unjudged)
        if self.log is not None:
            self.log.append({"at": at, "decisions": decisions})
        for mv in moves:
            self.start(at, mv.node, mv.source, mv.target, "fast")
        return moves

    def trusted(self, p: str, reading) -> bool:
        """Whether ``p``'s reading of this tick passes the detect stage's streaming rules (always,
        unjudged): a reclaim, like a move, is not started on a flagged reading."""
        if not self.judge:
            return True
        self.judged += 1
        return not self._flags(p, self.world.clock_index, reading)

    def observe(self, at: pd.Timestamp) -> tuple[list[dict], dict, list[dict]]:
        """The pool at ``at``, each platform's reading and the nodes on their way (handovers)."""
        pool = self.world.pool(at)
        if self.power is not None:  # a parked node is its platform's idle node: lent, it wakes on the way
            pool = self.power.records(pool)
        readings = self._readings(at, self.world.clock_index, pool)
        transit = [{"node": n["name"], "to_platform": n["platform"], "state": "releasing", "gpus": n["gpus"]}
                   for n in pool if n["in_transit"]]
        if self.power is not None:
            transit += self.power.waking(at)
        return pool, readings, transit

    def _readings(self, at: pd.Timestamp, i: int, pool: list[dict]) -> dict:
        """Each platform's pressure at ``at``: inventory now, allocated/pending of step ``i - 1``."""
        world = self.world
        out = {}
        for p in world.platforms:
            # a node in transit is reported by its target, not open to work yet (its handover is open)
            records = [{"node": n["name"], "schedulable": n["schedulable"] and not n["in_transit"], "gpus": n["gpus"],
                        "busy_gpus": int(math.ceil(n["busy_gpus"] - 1e-6))}
                       for n in pool if n["platform"] == p]
            if self.source is None:  # the oracle: the true demand of the current step
                cap = float(sum(r["gpus"] for r in records if r["schedulable"]))
                demand = float(world.demand_[world.platforms.index(p), min(i, len(world.index) - 1)])
                allocated, pending = min(demand, cap), max(0.0, demand - cap)
            else:
                self.source.read(i)
                allocated = self.source.seen[(p, "gpu_allocated")][i - 1]
                pending = self.source.seen[(p, "gpu_pending")][i - 1]
                if not (np.isfinite(allocated) and np.isfinite(pending)):
                    continue  # no row from the exporter: this platform is not read this tick
            out[p] = pressure_from_records(p, at.to_pydatetime(), records, pending=float(pending),
                                           allocated=float(allocated), provenance={"what-if": "world"})
        return out

    def _flags(self, p: str, i: int, reading) -> tuple[str, ...]:
        """The judged metrics of ``reading`` (step ``i - 1``) the detect stage's streaming rules flag."""
        world = self.world
        h0 = max(0, i - 1 - self.lookback)
        at = world.index[i - 1]
        flagged = []
        for metric in JUDGED.values():
            key = (p, metric)
            series = pd.Series(self.source.seen[key][h0:i], index=world.index[h0:i])
            scored = detect_stage.judge_series(series, self.router, metric, at, at + world.step,
                                               self.source.model_for(key))
            if len(scored) and bool(scored["is_anomaly"].iloc[-1]):
                flagged.append(f"{_FIELD[metric]} {float(getattr(reading, _FIELD[metric])):g}")
        return tuple(flagged)
