"""Which idle nodes park and which parked nodes wake: the parking rule, pure.

The hourly plan and the fast path's ticks call :func:`decide_parking` with the pool's nodes (their
power state, work, idle time, last wake or move) and each platform's pressure (demand now, its
recent readings, the plan's upper bound over the wake time, the same time a day ago). It answers
with the nodes to park and those to wake; it reads and writes nothing.

Two rules share the function:

* ``scope: pool`` (gpupool's): each platform needs the nodes its demand will need by the time a
  woken node serves (``wake_minutes`` ahead): the largest of demand now plus its recent rise
  carried over the wake time, the plan's upper bound for then (``forecast``) and demand a day ago
  over the same span (``daily``), and demand now plus a quantile of its rises over that span in
the last day (``rise_quantile``: the jumps a platform is prone to). A platform short of that wakes its own parked nodes at once (a
  wake is faster than a move). Beyond the needs, ONE warm buffer of ``buffer`` powered idle nodes
  is kept for the whole pool: spare nodes beyond it park, and when the spare falls under it parked
  nodes of the platforms with the least headroom wake.
* ``scope: platform`` (the baseline the users of Slurm know, ``SuspendTime`` with
  ``SuspendExcNodes=...:N``): each platform keeps ``buffer`` idle nodes of its own, parks the rest
  once idle ``idle_minutes``, and wakes only on a shortage (demand above its powered nodes).

Both never park a node with work, one in transit, one woken or moved within ``cooldown_minutes``,
or one that would leave its platform below ``min_nodes`` or below its need; never begin more parks
in a tick than ``park_per_minute`` allows (a pool that finds thousands of idle nodes parks them
over several ticks, as Slurm's ``SuspendRate`` paces its power saving); and never wake more than
the platforms' shortfall plus the buffer (wakes are not paced: a shortage is answered at once).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field

#: power states of a node (production's staging uses the same words)
ON, PARKING, PARKED, WAKING = "on", "parking", "parked", "waking"
#: readings of the rise the rule reads (the last ``TREND_TICKS`` ticks)
TREND_TICKS = 3
#: minutes a wake takes unless told (the what-if's ``parking.wake_minutes`` and production's
#: ``parking.wake_minutes``): the rule looks this far ahead
WAKE_MINUTES = 10.0


class ParkingRule(BaseModel):
    """The parking rule's knobs (the scenario's ``parking:`` mapping holds them)."""

    model_config = ConfigDict(extra="forbid")

    scope: Literal["pool", "platform"] = Field(
        "pool", description="pool: one warm buffer for the pool, wake ahead; platform: the Slurm-style rule per platform")
    buffer: int = Field(2, ge=0, description="warm idle nodes kept powered (pool-wide, or per platform)")
    idle_minutes: float = Field(30.0, ge=0, le=7 * 24 * 60, allow_inf_nan=False,
                                description="a node idle this long may park")
    cooldown_minutes: float = Field(60.0, ge=0, le=7 * 24 * 60, allow_inf_nan=False,
                                    description="a node woken or moved this recently does not park")
    trend: bool = Field(True, description="carry demand's rise over the last readings over the wake time")
    forecast: bool = Field(False, description="need at least the plan's upper bound for the hour a wake serves")
    daily: bool = Field(False, description="need at least demand a day ago over the wake time")
    rise_quantile: float = Field(0.95, ge=0, le=1, allow_inf_nan=False,
                                 description="need demand now plus this quantile of its rises over the wake "
                                             "time in the last day; 0: off")
    park_per_minute: float = Field(60.0, gt=0, le=1e6, allow_inf_nan=False,
                                   description="at most this many nodes begin to park per minute, pool-wide "
                                               "(Slurm's SuspendRate): a tick parks at most this times its minutes, "
                                               "the longest idle first")


class ParkingSettings(ParkingRule):
    """Production's ``parking:`` of platforms.yaml: the rule's knobs (their defaults are the
    what-if's, one model) and the time a wake takes, which the rule looks ahead by. It parks
    only the nodes of platforms with ``power:``."""

    wake_minutes: float = Field(WAKE_MINUTES, gt=0, le=24 * 60, allow_inf_nan=False,
                                description="minutes a wake takes (power on, boot, back in service): the rule "
                                            "wakes this far ahead of the demand it expects")


@dataclass(frozen=True)
class PowerNode:
    """A pool node as the rule sees it."""

    name: str
    platform: str  #: its owner (a node in transit: where it goes); a parked node wakes there
    gpus: int
    busy_gpus: float
    state: str = ON
    in_transit: bool = False
    idle_since: datetime | None = None  #: when it last ran work (None: not since anyone knows)
    changed_at: datetime | None = None  #: when it was last woken or moved (None: never)


@dataclass(frozen=True)
class PlatformPressure:
    """What a platform needs: GPUs wanted now (allocated plus pending), the readings before
    (oldest first, ``tick_minutes`` apart, the last one now), the plan's upper bound for the hour
    a wake started now serves, and demand a day ago over the wake time (None: not known)."""

    demand: float
    recent: tuple[float, ...] = ()
    forecast_upper: float | None = None
    daily: float | None = None
    rises: tuple[float, ...] = ()  #: demand's rises over the wake time and a tick, in the last day


@dataclass(frozen=True)
class ParkingDecision:
    """Nodes to park and to wake, and the powered nodes each platform was found to need."""

    parks: tuple[str, ...]
    wakes: tuple[str, ...]
    need: Mapping[str, int]


def wanted_gpus(pressure: PlatformPressure, rule: ParkingRule, wake_minutes: float, tick_minutes: float) -> float:
    """GPUs a platform will want when a node woken now serves (see the module docstring)."""
    want = pressure.demand
    if rule.scope == "platform":
        return max(0.0, want)
    if rule.trend and len(pressure.recent) >= 2 and tick_minutes > 0:
        slope = (pressure.recent[-1] - pressure.recent[0]) / ((len(pressure.recent) - 1) * tick_minutes)
        want = pressure.demand + max(0.0, slope) * (wake_minutes + tick_minutes)
    if rule.forecast and pressure.forecast_upper is not None:
        want = max(want, pressure.forecast_upper)
    if rule.daily and pressure.daily is not None:
        want = max(want, pressure.daily)
    if rule.rise_quantile > 0 and pressure.rises:
        ranked = sorted(pressure.rises)
        at = min(len(ranked) - 1, max(0, math.ceil(rule.rise_quantile * len(ranked)) - 1))
        want = max(want, pressure.demand + max(0.0, ranked[at]))
    return max(0.0, want)


def kept_readings(tick_minutes: float) -> int:
    """How many readings (one a tick, the newest now) :func:`pressure_from_readings` reads: a day
    of them and the one before."""
    return int(24 * 60 / max(tick_minutes, 1e-9)) + 1


def daily_window(at: datetime, wake_minutes: float, tick_minutes: float) -> tuple[datetime, datetime]:
    """The readings that say demand "a day ago over the wake time": those taken in ``(start, end]``."""
    start = at - timedelta(days=1)
    return start, start + timedelta(minutes=wake_minutes + tick_minutes)


def plan_upper(upper: Sequence[float], plan_at: datetime, at: datetime, wake_minutes: float) -> float | None:
    """The plan's upper bound (one per hour from ``plan_at``) for the hour a wake started at
    ``at`` serves; None without bounds."""
    if upper is None or len(upper) == 0:
        return None
    hour = int((at + timedelta(minutes=wake_minutes) - plan_at) / timedelta(hours=1))
    return float(upper[min(max(hour, 0), len(upper) - 1)])


def pressure_from_readings(readings: Sequence[float], rule: ParkingRule, *, wake_minutes: float,
                           tick_minutes: float, forecast_upper: float | None = None,
                           daily: float | None = None) -> PlatformPressure:
    """A platform's :class:`PlatformPressure` from its demand read at each tick (allocated plus
    pending GPUs, oldest first, the last one now; those beyond :func:`kept_readings` ignored): the
    last :data:`TREND_TICKS` readings as its rise, and the rises over the wake time and a tick
    across the day when ``rule.rise_quantile`` is on. The what-if and production both build it
    here, so they read a platform's pressure alike."""
    past = [float(v) for v in readings][-kept_readings(tick_minutes):]
    if not past:
        raise ValueError("no reading: a platform without one takes no part")
    lag = max(1, math.ceil((wake_minutes + tick_minutes) / max(tick_minutes, 1e-9) - 1e-9))
    rises: tuple[float, ...] = ()
    if rule.rise_quantile > 0 and len(past) > lag:
        rises = tuple(b - a for a, b in zip(past[:-lag], past[lag:]))
    return PlatformPressure(demand=past[-1], recent=tuple(past[-TREND_TICKS:]), forecast_upper=forecast_upper,
                            daily=daily, rises=rises)


def decide_parking(nodes: Sequence[PowerNode], pressures: Mapping[str, PlatformPressure], rule: ParkingRule,
                   at: datetime, *, wake_minutes: float, tick_minutes: float,
                   min_nodes: Mapping[str, int] | None = None) -> ParkingDecision:
    """The nodes to park and to wake at ``at`` (see the module docstring).

    A platform with no pressure reading this tick takes no part: none of its nodes parks or wakes.
    """
    min_nodes = dict(min_nodes or {})
    by: dict[str, list[PowerNode]] = {}
    for n in nodes:
        by.setdefault(n.platform, []).append(n)
    need: dict[str, int] = {}
    powered: dict[str, int] = {}
    parked: dict[str, list[PowerNode]] = {}
    for p, members in by.items():
        if p not in pressures:
            continue
        gpus = max(1, max(n.gpus for n in members))
        want = wanted_gpus(pressures[p], rule, wake_minutes, tick_minutes)
        need[p] = max(int(min_nodes.get(p, 0)), math.ceil(want / gpus - 1e-9))
        powered[p] = sum(1 for n in members if n.in_transit or n.state in (ON, WAKING))
        parked[p] = sorted((n for n in members if n.state == PARKED and not n.in_transit), key=lambda n: n.name)
    wakes: list[str] = []
    # 1. a platform short of its need wakes its own parked nodes at once
    for p in sorted(need):
        k = min(max(0, need[p] - powered[p]), len(parked[p]))
        wakes += [n.name for n in parked[p][:k]]
        parked[p] = parked[p][k:]
        powered[p] += k
    cutoff_idle = at - timedelta(minutes=rule.idle_minutes)
    cutoff_change = at - timedelta(minutes=rule.cooldown_minutes)

    def parkable(p: str) -> list[PowerNode]:
        out = [n for n in by[p] if n.state == ON and not n.in_transit and n.busy_gpus <= 0
               and n.name not in wakes and (n.idle_since is None or n.idle_since <= cutoff_idle)
               and (n.changed_at is None or n.changed_at <= cutoff_change)]
        # the longest idle first; the last by name among equals (work packs onto the first)
        return sorted(out, key=lambda n: (n.idle_since or datetime.min.replace(tzinfo=at.tzinfo), _neg(n.name)))

    parks: list[str] = []
    cap = max(1, math.floor(rule.park_per_minute * tick_minutes + 1e-9))  # parks this tick, at most
    if rule.scope == "platform":
        for p in sorted(need):
            idle = sum(1 for n in by[p] if n.state == ON and not n.in_transit and n.busy_gpus <= 0)
            room = min(idle - rule.buffer, powered[p] - need[p], powered[p] - int(min_nodes.get(p, 0)))
            parks += [n.name for n in parkable(p)[:max(0, room)]]
        return ParkingDecision(tuple(parks[:cap]), tuple(wakes), need)
    # 2. one warm buffer for the pool: spare powered nodes beyond the needs
    spare = {p: powered[p] - need[p] for p in need}
    total = sum(max(0, s) for s in spare.values())
    if total < rule.buffer:
        # wake where headroom is least (the most wanted per powered node), one at a time
        for _ in range(rule.buffer - total):
            open_ = [p for p in need if parked[p]]
            if not open_:
                break
            p = min(open_, key=lambda q: (spare[q], -need[q], q))
            wakes.append(parked[p].pop(0).name)
            spare[p] += 1
    elif total > rule.buffer:
        excess = total - rule.buffer
        candidates = {p: parkable(p) for p in need}
        while excess > 0 and len(parks) < cap:
            open_ = [p for p in need if candidates[p] and spare[p] > 0
                     and powered[p] - 1 >= int(min_nodes.get(p, 0))]
            if not open_:
                break
            p = max(open_, key=lambda q: (spare[q], q))
            parks.append(candidates[p].pop(0).name)
            spare[p] -= 1
            powered[p] -= 1
            excess -= 1
    return ParkingDecision(tuple(parks), tuple(wakes), need)


def _neg(name: str) -> tuple[int, ...]:
    """A key that sorts names in reverse order."""
    return tuple(-ord(c) for c in name) + (1,)


__all__ = ["ON", "PARKING", "PARKED", "WAKING", "TREND_TICKS", "WAKE_MINUTES", "ParkingRule", "ParkingSettings", "PowerNode",
           "PlatformPressure", "ParkingDecision", "decide_parking", "wanted_gpus", "pressure_from_readings",
           "kept_readings", "daily_window", "plan_upper"]
