"""Ownership in the what-if: who owns each node, the reclaims, and what each platform lent and borrowed.

Where a scenario gives ownership keys (:meth:`gpupool.sim.scenario.Scenario.ownership`), each
platform owns the first ``owns`` (by name) of the nodes it holds at the start, all of them
without ``owns``. The study then:

* hands the plan each node's owner (``home``: its ``lend_limit`` and ``borrow_limit`` bind) and
  the fast path the owners and promises (:class:`~gpupool.decisions.fastpath.Settings`);
* before each fast-path tick (each hourly decision with ``fastpath: off``) runs the production
  reclaim (:func:`gpupool.decisions.ownership.reclaim`) on the same readings the fast path reads:
  an owner short (pending GPUs it cannot place, less those on their way) with a node of its own
  lent out takes it back; where the detect rules flag its reading, only if waiting for the next
  would make the reclaim late. The borrowed work on a node "has run" for as long as the node was busy
  on its borrower without a break (the world's fluid packing); a reclaim of a busy node ends it;
* reports per platform (:func:`report`): ``owned_gpus``, ``lent_gpu_hours`` and
  ``borrowed_gpu_hours`` (GPU-hours its own nodes served others, and others' nodes served it,
  moves aside), ``regret_gpu_hours`` (its unmet minus its unmet under ``static`` on the same
  scenario: what pooling cost it, negative where it gained), ``reclaims`` (``count``, ``late``:
  back later than ``reclaim_minutes`` after the need began (the first reading of a shortage no
  reclaim on its way covers), and the latency's ``p50_minutes``,
  ``p95_minutes``, ``max_minutes``; each counted for the owner) and ``preempted_gpu_hours`` (the
  borrowed work reclaims ended on its borrowed nodes: busy GPUs times the hours that work had run,
  all lost where the work does not checkpoint), ``served_less_gpu_hours`` (what it served less
  than its own nodes would have, step by step: its regret before what it gained elsewhere) and
  ``served_less_beyond_deadline_gpu_hours`` (the part of it outside every reclaim's promise, from
  the tick before the need was read to the node's arrival, at most ``reclaim_minutes``: what the
  promise "never worse off than keeping its own nodes, beyond the deadline's worth" bounds).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpupool.config import Ownership
from gpupool.decisions.layouts import units_per_gpu
from gpupool.decisions.ownership import HeldNode, covered, first_sight_homes, need_since, reclaim
from gpupool.sim.world import TRANSIT


def world_homes(world, ownership: dict[str, Ownership]) -> dict[str, str]:
    """Node -> owner: each platform's first ``owns`` of the nodes it holds at the start (all: None)."""
    held: dict[str, list[str]] = {}
    for node in world.nodes:
        held.setdefault(node.home, []).append(node.name)
    owns = {p: (len(held.get(p, [])) if own.owns is None else own.owns) for p, own in ownership.items()}
    return first_sight_homes(held, owns)


class OwnershipTrack:
    """The owners of one study's world, the reclaims it started and the work they ended."""

    def __init__(self, world, ownership: dict[str, Ownership]):
        self.world = world
        self.ownership = ownership
        self.homes = world_homes(world, ownership)
        self.need: dict = {}  # owner -> when its need for its lent nodes began
        self.reclaims: list[dict] = []  # owner, node, borrower, minutes (need to arrival), late, preempted
        self.waits: list[tuple] = []  # (at, owner, why) of the last tick's waiting owners

    def records(self, pool: list[dict]) -> list[dict]:
        """The pool with each node's owner as the plan reads it (``home``; None: nobody's)."""
        return [{**n, "home": self.homes.get(n["name"])} for n in pool]

    def tick(self, at: pd.Timestamp, readings: dict, transit: list[dict], pool: list[dict], fast) -> list:
        """Run the reclaim at ``at`` on the fast path's ``readings`` and start its moves in the
        world; ``fast`` (the study's :class:`~gpupool.sim.fastpath.FastPath`) records them."""
        short = self.shortage(at, readings, transit)
        nodes = [self._held(n) for n in pool if n["platform"] is not None]
        self.need = need_since(self.need, short, nodes, at.to_pydatetime(), self.ownership)
        if not self.need:
            return []
        ready = [self._with_runtime(n) for n in nodes]
        checked: set[str] = set()
        flagged: dict[str, float] = {}
        tick = fast.every / pd.Timedelta("1min")
        while True:  # judge the readings of the owners that would reclaim; a flagged one waits if it can
            need = {p: t for p, t in self.need.items() if p in short}
            moves, self.waits = reclaim(short, ready, self.ownership, need, fast.recent(at), at.to_pydatetime(),
                                        fast.settings.max_moves_per_hour, float(self.world.scenario.move_minutes),
                                        flagged)
            unchecked = {mv.target for mv in moves} - checked
            if not unchecked:
                break
            for p in sorted(unchecked):
                checked.add(p)
                if not fast.trusted(p, readings[p]):
                    flagged[p] = tick
        for mv in moves:
            arrive = fast.start(at, mv.node, mv.source, mv.target, "reclaim", outside_budget=mv.outside_budget)
            since = pd.Timestamp(self.need[mv.target])
            minutes = (arrive - since) / pd.Timedelta("1min")
            promise = self.ownership[mv.target]
            ran = self._ran_minutes(self.world._node(mv.node), mv.source, None) if mv.busy_gpus > 0 else 0.0
            self.reclaims.append({"owner": mv.target, "node": mv.node, "borrower": mv.source, "minutes": minutes,
                                  "late": minutes > promise.reclaim_minutes + 1e-9,
                                  "preempted_gpu_hours": mv.busy_gpus * ran / 60.0,
                                  # the promise's span: from the tick before the need was read (the
                                  # shortage began within it) to the node's arrival, at most the deadline
                                  "promised_from": since - pd.Timedelta(minutes=tick),
                                  "promised_to": min(arrive, since + pd.Timedelta(minutes=promise.reclaim_minutes))})
        for p in covered(short, moves):  # met once they arrive: a later shortage is a new need
            self.need.pop(p, None)
        return moves

    def shortage(self, at: pd.Timestamp, readings: dict, transit: list[dict]) -> dict[str, float]:
        """Each platform's GPUs short at ``at`` as the tick reads them: pending less free less what
        is on its way (negative: to spare)."""
        on_way: dict[str, float] = {}
        for h in transit:
            on_way[h["to_platform"]] = on_way.get(h["to_platform"], 0.0) + float(h["gpus"])
        return {p: float(r.gpus_pending) - r.gpus_free - on_way.get(p, 0.0) for p, r in readings.items()}

    def _held(self, n: dict) -> HeldNode:
        return HeldNode(n["name"], self.homes.get(n["name"]), n["platform"], int(n["gpus"]),
                        busy_gpus=0.0 if n["in_transit"] else float(n["busy_gpus"]), moving=bool(n["in_transit"]))

    def _with_runtime(self, n: HeldNode) -> HeldNode:
        """``n`` with how long its borrowed work has run (up to its owner's min runtime: enough to judge)."""
        if n.home is None or n.home == n.holder or n.moving or n.busy_gpus <= 1e-9:
            return n
        need = self.ownership[n.home].min_runtime_minutes if n.home in self.ownership else 0.0
        ran = self._ran_minutes(self.world._node(n.node), n.holder, need)
        return HeldNode(n.node, n.home, n.holder, n.gpus, n.busy_gpus, ran, n.moving)

    def _ran_minutes(self, j: int, holder: str, cap: float | None) -> float:
        """Minutes node ``j`` has been busy on ``holder`` without a break, back from the clock
        (at most ``cap``; None: back to when it arrived there)."""
        w = self.world
        i = w.clock_index
        here = w.owner_[j, :i] == w.platforms.index(holder)
        away = np.nonzero(~here)[0]
        i0 = int(away[-1]) + 1 if len(away) else 0
        if cap is not None:
            i0 = max(i0, i - int(np.ceil(cap / (w.step_hours * 60.0))) - 1)
        if i0 >= i:
            return 0.0
        busy = w._busy_by_node(i0, i)[j] > 1e-9
        idle = np.nonzero(~busy)[0]
        steps = len(busy) - (int(idle[-1]) + 1 if len(idle) else 0)
        return steps * w.step_hours * 60.0


def report(world, track: OwnershipTrack, platforms: dict, static: dict | None) -> dict:
    """Per platform and in total, the ownership figures of a study (module docstring); ``static``:
    the same scenario's ``static`` result (None: this study is it, its regret 0)."""
    h = world.step_hours
    pidx = {p: i for i, p in enumerate(world.platforms)}
    out = {p: {"owned_gpus": 0, "lent_gpu_hours": 0.0, "borrowed_gpu_hours": 0.0} for p in world.platforms}
    i1 = world.clock_index
    for j, node in enumerate(world.nodes):
        home = track.homes.get(node.name)
        if home is None:
            continue
        out[home]["owned_gpus"] += node.gpus
        held = world.owner_[j, :i1]
        away = (held != pidx[home]) & (held != TRANSIT)
        out[home]["lent_gpu_hours"] += float(away.sum()) * node.gpus * h
        for p, i in pidx.items():
            if p != home:
                out[p]["borrowed_gpu_hours"] += float((away & (held == i)).sum()) * node.gpus * h
    for p, block in out.items():
        served_less, beyond = _served_less(world, track, pidx[p], i1)
        block["served_less_gpu_hours"], block["served_less_beyond_deadline_gpu_hours"] = served_less, beyond
        unmet = platforms[p]["unmet_gpu_hours"]
        block["regret_gpu_hours"] = round(unmet - (unmet if static is None else static["platforms"][p]["unmet_gpu_hours"]), 3)
        block["reclaims"] = _latency([r for r in track.reclaims if r["owner"] == p])
        block["preempted_gpu_hours"] = sum(r["preempted_gpu_hours"] for r in track.reclaims if r["borrower"] == p)
    total = {"owned_gpus": sum(b["owned_gpus"] for b in out.values()), "reclaims": _latency(track.reclaims)}
    keys = ("lent_gpu_hours", "borrowed_gpu_hours", "regret_gpu_hours", "preempted_gpu_hours",
            "served_less_gpu_hours", "served_less_beyond_deadline_gpu_hours")
    for key in keys:
        total[key] = sum(b[key] for b in out.values())
    for block in (*out.values(), total):
        for key in keys:
            block[key] = round(float(block[key]), 3)
    return {"platforms": out, "total": total}


def _served_less(world, track: OwnershipTrack, ip: int, i1: int) -> tuple[float, float]:
    """What platform ``ip`` served less than its own nodes would have (its demand up to what they
    hold, less its demand up to what it held), summed over the steps in GPU-hours, and the
    part of it outside every reclaim's promise (:meth:`OwnershipTrack.tick`'s ``promised_from`` to
    ``promised_to``): the regret the promise does not cover."""
    p = world.platforms[ip]
    owned = np.array([track.homes.get(n.name) == p for n in world.nodes])
    if world.layouts_ is None:
        own = np.full(i1, float(sum(n.gpus for n, o in zip(world.nodes, owned) if o)))
    else:  # what its own nodes' layouts would serve it, held at home all along
        holder = np.where(owned[:, None], ip, TRANSIT) * np.ones((1, i1), dtype=int)
        own = world.layouts_.capacity(holder, np.zeros(holder.shape, dtype=bool), 0, i1).sum(axis=0)
    d, c = world.demand_[ip, :i1], world.capacity()[ip, :i1]
    less = np.clip(np.minimum(d, own) - np.minimum(d, c), 0.0, None)
    promised = np.zeros(i1, dtype=bool)
    idx = world.index[:i1]
    for r in track.reclaims:
        if r["owner"] == p:
            promised |= (idx >= r["promised_from"]) & (idx < r["promised_to"])
    h = world.step_hours / units_per_gpu(world.units[ip])  # a slice platform's requests, in GPUs
    return float(less.sum() * h), float(less[~promised].sum() * h)


def _latency(reclaims: list[dict]) -> dict:
    """``count``, ``late`` and the latency's p50, p95 and max (minutes; None without a reclaim)."""
    minutes = np.array([r["minutes"] for r in reclaims], dtype=float)
    if not len(minutes):
        return {"count": 0, "late": 0, "p50_minutes": None, "p95_minutes": None, "max_minutes": None}
    return {"count": int(len(minutes)), "late": int(sum(r["late"] for r in reclaims)),
            "p50_minutes": round(float(np.percentile(minutes, 50)), 1),
            "p95_minutes": round(float(np.percentile(minutes, 95)), 1),
            "max_minutes": round(float(minutes.max()), 1)}
