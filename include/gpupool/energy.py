"""Parking as the operator reads it: each node's power state at an instant, its wakes (when
asked, when on, late or not) and parked node-hours, rebuilt from the live ``power_transition``
rows (:func:`gpupool.staging.power.live_transitions`), and the energy parking saved.

A pure module: it reads nothing and imports nothing of gpupool but :mod:`gpupool.values`, so
the metrics, the pool page, the report and the configuration share one reading.

* A node's state at an instant is the ``to_state`` of its newest live transition by then; a
  node with none is ``on``.
* A wake is a transition out of ``parked`` (to ``waking`` by gpupool or the platform, or
  straight to ``on`` when the platform woke the node itself and it was ready when seen). It is
  done at the node's next transition to ``on``; its latency runs from the transition out of
  ``parked`` to that one (none for a wake first seen already ``on``). A wake asked while the
  node was still powering off starts once it is parked; its deadline still counts from the ask.
* A wake is late when it reached ``on`` after its deadline, or is not ``on`` at an instant at
  or past it (as the state machine reports it failed).
* Parked time runs from a transition into ``parked`` to the node's next transition; it counts
  for the platform it was parked on.
* Energy saved: parked node-hours times (idle watts - parked watts): each parked hour is an
  hour the node would otherwise have stood powered and idle.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpupool.values import utc_datetime

ON, PARKING, PARKED, WAKING = "on", "parking", "parked", "waking"
STATES = (ON, PARKING, PARKED, WAKING)

# the watts a parked hour saves, defined beside the `power:` keys that override them
from gpupool.config import IDLE_WATTS, PARKED_WATTS  # noqa: E402


@dataclass(frozen=True)
class Wake:
    """One wake of one node (see the module docstring)."""

    node: str
    platform: str
    started: datetime
    on_at: datetime | None
    deadline: datetime | None
    by: str
    #: whether the node went through ``waking`` (False: first seen already on)
    waking: bool

    @property
    def latency_s(self) -> float | None:
        """Seconds from the start of the wake to ``on``; None while not on, or first seen on."""
        if self.on_at is None or not self.waking:
            return None
        return max(0.0, (self.on_at - self.started).total_seconds())

    def late(self, at: datetime) -> bool:
        """Whether, seen at ``at``, the wake missed its deadline."""
        if self.deadline is None:
            return False
        if self.on_at is not None and self.on_at <= at:
            return self.on_at > self.deadline
        return at >= self.deadline


def _t(value: Any) -> datetime | None:
    return None if value is None else utc_datetime(value)


def _by_node(rows: Iterable[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    out: dict[str, list[Mapping[str, Any]]] = {}
    for r in sorted(rows, key=lambda r: r["id"]):
        out.setdefault(str(r["node"]), []).append(r)
    return out


def states_at(rows: Iterable[Mapping[str, Any]], at: datetime) -> dict[str, dict[str, Any]]:
    """Per node with a transition by ``at``: ``{state, platform, since, deadline, transition_id,
    error}`` of its newest one (nodes absent here are on)."""
    at = utc_datetime(at)
    out = {}
    for node, mine in _by_node(rows).items():
        seen = [r for r in mine if _t(r["at"]) <= at]
        if seen:
            r = seen[-1]
            out[node] = {"state": r["to_state"], "platform": r["platform"], "since": _t(r["at"]),
                         "deadline": _t(r.get("deadline")), "transition_id": r["id"], "error": r.get("error")}
    return out


def wakes(rows: Iterable[Mapping[str, Any]]) -> list[Wake]:
    """Every wake in the rows, in the order they started."""
    out = []
    for node, mine in _by_node(rows).items():
        for i, r in enumerate(mine):
            if r["from_state"] != PARKED or r["to_state"] not in (WAKING, ON):
                continue
            started = _t(r["at"])
            if r["to_state"] == ON:
                on_at = started
            else:
                on_at = next((_t(x["at"]) for x in mine[i + 1:] if x["to_state"] == ON), None)
            out.append(Wake(node, str(r["platform"]), started, on_at, _t(r.get("deadline")), str(r["by"]),
                            r["to_state"] == WAKING))
    return sorted(out, key=lambda w: (w.started, w.node))


def parked_seconds(rows: Iterable[Mapping[str, Any]], start: datetime | None, end: datetime) -> dict[str, float]:
    """Per platform, the node-seconds its nodes spent parked within [start, end) (``start``
    None: since the first transition)."""
    end = utc_datetime(end)
    start = None if start is None else utc_datetime(start)
    out: dict[str, float] = {}

    def add(platform: str, t0: datetime, t1: datetime) -> None:
        lo = t0 if start is None else max(t0, start)
        hi = min(t1, end)
        if hi > lo:
            out[platform] = out.get(platform, 0.0) + (hi - lo).total_seconds()

    for mine in _by_node(rows).values():
        open_: tuple[str, datetime] | None = None
        for r in mine:
            t = _t(r["at"])
            if open_ is not None:
                add(open_[0], open_[1], t)
                open_ = None
            if r["to_state"] == PARKED:
                open_ = (str(r["platform"]), t)
        if open_ is not None:
            add(open_[0], open_[1], end)
    return out


def saved_kwh(parked_s: float, idle_watts: float = IDLE_WATTS, parked_watts: float = PARKED_WATTS) -> float:
    """The energy (kWh) ``parked_s`` node-seconds parked saved against standing powered and idle."""
    return max(0.0, parked_s) / 3600.0 * max(0.0, idle_watts - parked_watts) / 1000.0


def watts_of(config: Any, platform: str) -> tuple[float, float]:
    """(idle, parked) watts of ``platform``'s nodes: its ``power:`` settings where it has them,
    else :data:`IDLE_WATTS` and :data:`PARKED_WATTS` (also without a config, or for a platform
    it does not name)."""
    try:
        power = config.platform(platform).power if config is not None else None
    except (KeyError, LookupError, ValueError):
        power = None
    if power is None:
        return IDLE_WATTS, PARKED_WATTS
    return float(power.idle_watts), float(power.parked_watts)


def summary(rows: Iterable[Mapping[str, Any]], start: datetime, end: datetime, config: Any = None,
            platforms: Iterable[str] = ()) -> dict[str, dict[str, float | int]]:
    """Per platform (those given, and every one the rows name) over [start, end):
    ``parked_node_hours``, ``wakes`` (started in the window), ``late_wakes`` (of those, late as
    seen at ``end``) and ``saved_kwh`` (:func:`saved_kwh` at the platform's watts)."""
    rows = list(rows)
    start, end = utc_datetime(start), utc_datetime(end)
    parked = parked_seconds(rows, start, end)
    woke = [w for w in wakes(rows) if start <= w.started < end]
    names = list(dict.fromkeys([*platforms, *sorted({str(r["platform"]) for r in rows})]))
    out = {}
    for p in names:
        idle_w, parked_w = watts_of(config, p)
        mine = [w for w in woke if w.platform == p]
        out[p] = {"parked_node_hours": parked.get(p, 0.0) / 3600.0, "wakes": len(mine),
                  "late_wakes": sum(w.late(end) for w in mine),
                  "saved_kwh": saved_kwh(parked.get(p, 0.0), idle_w, parked_w)}
    return out


__all__ = ["ON", "PARKING", "PARKED", "WAKING", "STATES", "IDLE_WATTS", "PARKED_WATTS", "Wake", "states_at", "wakes",
           "parked_seconds", "saved_kwh", "watts_of", "summary"]
