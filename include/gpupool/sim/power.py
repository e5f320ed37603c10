"""Power in the what-if: each node's power state on the world's step grid, the parking rule's
ticks, and the energy every study reports.

A node is ``on``, ``parking`` (``park_minutes``: neither serving nor saving), ``parked`` or
``waking`` (``wake_minutes``: neither serving nor saving); only an ``on`` node gives capacity
(:attr:`World.off_` marks the others). The study calls :meth:`PowerTrack.step` at every tick (the
fast path's cadence, or the plan's when the fast path is off), after the hourly plan and before
the fast path's decision, with the plan's demand: :func:`gpupool.decisions.parking.decide_parking`
decides, and the track carries the parks and wakes out. A parked node the plan moves wakes on the
way (the move's transit covers the wake; it counts as a wake).

:func:`energy` counts, per platform and in total, in every study (parking or not): ``idle_kwh``
(powered nodes with no GPU busy: idle, parking, waking and moving nodes, at ``idle_watts``),
``parked_kwh`` (at ``parked_watts``), ``energy_kwh`` (every node: idle watts plus the busy share
of ``busy_watts - idle_watts``, or parked watts), ``parked_node_hours``, ``wakes`` and
``late_wakes``: a wake is late when the platform it wakes on is short (unmet demand above zero)
at any step from the one before the wake starts until the node serves, i.e. the shortage it
answers began before the node was back.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
from pydantic import Field

from gpupool.config import IDLE_WATTS, PARKED_WATTS
from gpupool.decisions.parking import (
    ON, PARKED, PARKING, WAKE_MINUTES, WAKING, ParkingRule, PlatformPressure, PowerNode, decide_parking,
    kept_readings, plan_upper, pressure_from_readings)

#: codes of the power states on the step grid
_CODE = {ON: 0, PARKING: 1, PARKED: 2, WAKING: 3}
_STATE = {v: k for k, v in _CODE.items()}


class ParkingSpec(ParkingRule):
    """The scenario's ``parking:`` mapping: the rule's knobs, the times to park and wake, and
    each node's draw at the wall (pool-wide; idle and parked: production's defaults in
    :mod:`gpupool.config`, an 8-GPU A100 server, docs/stages/whatif.md)."""

    wake_minutes: float = Field(WAKE_MINUTES, ge=0, le=24 * 60, allow_inf_nan=False)
    park_minutes: float = Field(5.0, ge=0, le=24 * 60, allow_inf_nan=False)
    idle_watts: float = Field(IDLE_WATTS, ge=0, le=1e6, allow_inf_nan=False)
    busy_watts: float = Field(6500.0, ge=0, le=1e6, allow_inf_nan=False)
    parked_watts: float = Field(PARKED_WATTS, ge=0, le=1e6, allow_inf_nan=False)


def parking_value(value: Any) -> Any:
    """The scenario's ``parking`` as given: ``off``/false/absent is None, ``on``/true the defaults."""
    if value is None or value is False or (isinstance(value, str) and value.strip().lower() == "off"):
        return None
    if value is True or (isinstance(value, str) and value.strip().lower() == "on"):
        return {}
    if isinstance(value, str):
        raise ValueError("give 'off', 'on' or a mapping of the parking settings")
    return value


class PowerTrack:
    """The power states of one study's world, and the rule's ticks."""

    def __init__(self, world, spec: ParkingSpec, min_nodes: dict[str, int] | None = None, source=None):
        self.world = world
        self.spec = spec
        self.min_nodes = dict(min_nodes or {})
        self.source = source  # a ChainDemand (the telemetry production reads), or None: true demand
        n_nodes, n_steps = len(world.nodes), len(world.index)
        self.state_ = np.zeros((n_nodes, n_steps), dtype=np.int8)
        world.off_ = np.zeros((n_nodes, n_steps), dtype=bool)
        self.changed: dict[str, pd.Timestamp] = {}
        self.last_busy = np.full(n_nodes, -1, dtype=np.int64)  # the last step each node ran work
        self.seen_until = 0
        self.history: dict[str, list[float]] = {p: [] for p in world.platforms}  # a day of readings
        self.wakes: list[tuple[int, int, int, int]] = []  # (node, platform, first step, first step serving)
        self.plan: tuple[pd.Timestamp, dict] | None = None

    def _steps(self, minutes: float) -> int:
        return int(math.ceil(pd.Timedelta(minutes=minutes) / self.world.step - 1e-9))

    def state(self, j: int, i: int) -> str:
        """Node ``j``'s power state at step ``i``."""
        return _STATE[int(self.state_[j, min(i, self.state_.shape[1] - 1)])]

    # --- what the plan and the fast path see
    def records(self, pool: list[dict]) -> list[dict]:
        """The pool as the plan reads it: a parked node is its platform's idle node, schedulable
        (the plan may count it, and move it: it wakes on the way)."""
        i = self.world.clock_index
        return [{**n, "schedulable": True} if not n["in_transit"] and self.state(j, i) == PARKED else n
                for j, n in enumerate(pool)]

    def waking(self, at: pd.Timestamp) -> list[dict]:
        """Nodes waking at ``at``, as the fast path counts nodes on their way to a platform."""
        i = self.world.clock_index
        out = []
        for j in np.nonzero(self.state_[:, min(i, self.state_.shape[1] - 1)] == _CODE[WAKING])[0]:
            node = self.world.nodes[j]
            owner = int(self.world.owner_[j, i])
            out.append({"node": node.name, "to_platform": self.world.platforms[owner], "state": "waking",
                        "gpus": node.gpus})
        return out

    def planned(self, at: pd.Timestamp, demand: dict) -> None:
        """The hourly plan's demand (its upper bound is the rule's forecast)."""
        self.plan = (at, demand)

    def moved(self, node: str, target: str, at: pd.Timestamp, arrive: pd.Timestamp) -> None:
        """A node the plan or the fast path moved to ``target``: a parked one wakes on the way."""
        w = self.world
        j, i = w._node(node), w.clock_index
        if self.state_[j, i] != _CODE[ON]:
            w.off_[j, i:] = False
            self.state_[j, i:] = _CODE[ON]
            w._cap_cache = None
            self.wakes.append((j, w.platforms.index(target), i, w._index_of(arrive, True)))
        self.changed[node] = at

    # --- one tick of the rule
    def step(self, at: pd.Timestamp, tick_minutes: float) -> None:
        """Read, decide, park and wake at ``at`` (the world's clock)."""
        w = self.world
        i = w.clock_index
        if i == 0 or i >= len(w.index):
            return
        if i > self.seen_until:
            busy = w._busy_by_node(self.seen_until, i) > 1e-9
            ran = busy.any(axis=1)
            last = busy.shape[1] - 1 - np.argmax(busy[:, ::-1], axis=1)
            self.last_busy = np.where(ran, self.seen_until + last, self.last_busy)
            self.seen_until = i
        pressures = {p: self._pressure(p, k, at, i, tick_minutes) for k, p in enumerate(w.platforms)}
        pressures = {p: v for p, v in pressures.items() if v is not None}
        now = w._busy_by_node(i - 1, i)[:, 0]
        nodes = []
        for j, node in enumerate(w.nodes):
            owner = int(w.owner_[j, i])
            transit = owner < 0
            if transit:
                ahead = np.nonzero(w.owner_[j, i:] >= 0)[0]
                owner = int(w.owner_[j, i + ahead[0]]) if len(ahead) else int(w.owner_[j, i - 1])
            serving = self.state_[j, i] == _CODE[ON] and not transit
            busy = float(now[j]) if serving else 0.0
            idle_since = w.start if self.last_busy[j] < 0 else w.index[self.last_busy[j]] + w.step
            nodes.append(PowerNode(node.name, w.platforms[owner], node.gpus, busy, self.state(j, i), transit,
                                   idle_since.to_pydatetime(), self._changed(node.name)))
        decision = decide_parking(nodes, pressures, self.spec, at.to_pydatetime(), wake_minutes=self.spec.wake_minutes,
                                  tick_minutes=tick_minutes, min_nodes=self.min_nodes)
        kp, kw = self._steps(self.spec.park_minutes), self._steps(self.spec.wake_minutes)
        for name in decision.parks:
            j = w._node(name)
            w.off_[j, i:] = True
            self.state_[j, i:] = _CODE[PARKED]
            self.state_[j, i:i + kp] = _CODE[PARKING]
        for name in decision.wakes:
            j = w._node(name)
            self.state_[j, i:] = _CODE[ON]
            self.state_[j, i:i + kw] = _CODE[WAKING]
            w.off_[j, i:] = False
            w.off_[j, i:i + kw] = True
            self.changed[name] = at
            self.wakes.append((j, int(w.owner_[j, i]), i, min(i + kw, len(w.index))))
        if decision.parks or decision.wakes:
            w._cap_cache = None

    def _changed(self, name: str):
        t = self.changed.get(name)
        return None if t is None else t.to_pydatetime()

    def _pressure(self, p: str, k: int, at: pd.Timestamp, i: int, tick_minutes: float) -> PlatformPressure | None:
        """Platform ``p``'s pressure at step ``i``: demand of the step just ended as its exporter
        reported it (the true demand without a chain), the rise, the plan's bound, a day ago."""
        w = self.world
        if self.source is not None:
            self.source.read(i)
            allocated = self.source.seen[(p, "gpu_allocated")][i - 1]
            pending = self.source.seen[(p, "gpu_pending")][i - 1]
            if not (np.isfinite(allocated) and np.isfinite(pending)):
                return None  # no row this tick: the platform takes no part
            demand = float(allocated + pending)
        else:
            demand = float(w.demand_[k, i - 1])
        past = self.history[p]
        past.append(demand)
        del past[:-kept_readings(tick_minutes)]
        upper = None
        if self.plan is not None:
            plan_at, plan_demand = self.plan
            upper = plan_upper(plan_demand[p].upper if p in plan_demand else (), plan_at.to_pydatetime(),
                               at.to_pydatetime(), self.spec.wake_minutes)
        daily = None
        day = int(pd.Timedelta("1D") / w.step)
        if i - day >= 0:
            lo, hi = i - day, min(i - day + max(1, self._steps(self.spec.wake_minutes)) + 1, len(w.index))
            if self.source is not None:
                then = self.source.seen[(p, "gpu_allocated")][lo:hi] + self.source.seen[(p, "gpu_pending")][lo:hi]
                then = then[np.isfinite(then)]
            else:
                then = w.demand_[k, lo:hi]
            daily = float(then.max()) if len(then) else None
        return pressure_from_readings(past, self.spec, wake_minutes=self.spec.wake_minutes, tick_minutes=tick_minutes,
                                      forecast_upper=upper, daily=daily)


def energy(world, spec: ParkingSpec | None, track: PowerTrack | None) -> dict[str, dict]:
    """Each platform's (and the total's) energy counts over ``[start, clock)`` (module docstring);
    ``spec`` None: the default watts, every node on."""
    spec = spec or ParkingSpec()
    i1 = world.clock_index
    h = world.step_hours
    n_plat = len(world.platforms)
    busy = world._busy_by_node(0, i1) if i1 else np.zeros((len(world.nodes), 0))
    state = track.state_[:, :i1] if track is not None else np.zeros(busy.shape, dtype=np.int8)
    owner = _attributed(world.owner_[:, :i1])
    gpus = np.array([n.gpus for n in world.nodes], dtype=float)[:, None]
    parked = state == _CODE[PARKED]
    powered = ~parked
    idle = powered & (busy <= 1e-9)
    draw = np.where(parked, spec.parked_watts,
                    spec.idle_watts + (spec.busy_watts - spec.idle_watts) * np.clip(busy / np.maximum(gpus, 1), 0, 1))
    cap = world.capacity()[:, :i1]
    short = world.demand_[:, :i1] - np.minimum(world.demand_[:, :i1], cap) > 1e-9
    wakes = np.zeros(n_plat, dtype=int)
    late = np.zeros(n_plat, dtype=int)
    for j, p, s, f in (track.wakes if track is not None else ()):
        wakes[p] += 1
        late[p] += bool(short[p, max(s - 1, 0):max(f, s)].any()) if s < i1 else 0
    out = {}
    for k, p in enumerate(world.platforms):
        mine = owner == k
        out[p] = {
            "idle_kwh": round(float((idle & mine).sum()) * spec.idle_watts * h / 1000.0, 3),
            "parked_kwh": round(float((parked & mine).sum()) * spec.parked_watts * h / 1000.0, 3),
            "energy_kwh": round(float((draw * mine).sum()) * h / 1000.0, 3),
            "parked_node_hours": round(float((parked & mine).sum()) * h, 3),
            "wakes": int(wakes[k]),
            "late_wakes": int(late[k]),
        }
    keys = next(iter(out.values())).keys()
    out["total"] = {key: (round(sum(b[key] for b in out.values()), 3) if key.endswith(("kwh", "hours"))
                          else int(sum(b[key] for b in out.values()))) for key in keys}
    return out


def _attributed(owner: np.ndarray) -> np.ndarray:
    """Each node-step's platform: its owner, a node in transit its destination (its source when
    it arrives after the window)."""
    out = owner.astype(np.int64)
    n = out.shape[1]
    if not (out < 0).any():
        return out
    for i in range(n - 2, -1, -1):  # backfill transit from where the node arrives
        col = out[:, i]
        fix = col < 0
        if fix.any():
            col[fix] = out[fix, i + 1]
    for i in range(1, n):  # still in transit at the end: its source
        col = out[:, i]
        fix = col < 0
        if fix.any():
            col[fix] = out[fix, i - 1]
    return out
