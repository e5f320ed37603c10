"""The world model of the virtual datacenter: pool nodes, their owners, demand, and history.

A :class:`World` is a grid of simulation steps over ``[start, end)``. Each platform has a true
demand per step (from a trace or the synthetic generator). Each pool node has, per step, an
owner (a platform index, or "in transit" while it moves) and a cordon flag; these arrays *are*
the history, so any past window can be read back (backfills) and a move only rewrites steps from
the simulated clock on.

The fluid model: a platform's capacity at a step is the GPUs of its nodes that are neither in
transit nor cordoned; ``served = min(demand, capacity)`` and ``unmet = demand - served``, with
nothing carried over. Served work is packed onto the platform's nodes in name order, which gives
each node (and GPU) a busy count; a platform's idle nodes are therefore its last ones by name.
A platform with a ``slice_profile`` counts demand, capacity and the rest in slice requests, and
each node serves it what its MIG layout of the step holds (:mod:`gpupool.sim.slices`).

Everything here is plain state and arithmetic — the planner lives in ``gpupool.decisions`` and
the closed loop in :mod:`gpupool.sim.study`; the HTTP facades read and change a World through
:meth:`World.inventory`, :meth:`World.samples`, :meth:`World.cordon` and :meth:`World.move`.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import numpy as np
import pandas as pd

from gpupool.errors import UserError, shown
from gpupool import mig
from gpupool.canonical import CANONICAL_METRICS, SAMPLE_COLUMNS, empty_samples
from gpupool.sim.scenario import Scenario, scenario_from_dict
from gpupool.sim.synthetic import glitch_factors, generate
from gpupool.sim.history import read_traces
from gpupool.sim.slices import GPU_UNIT, Layouts, units_of
from gpupool.sim.traces import check_span

TRANSIT = -1
MIG_MODELS = mig.MIG_MODELS

#: how the platforms name their nodes (a pool node keeps its name when it changes owner)
_NAME_PREFIX = {"openstack": "compute-gpu", "slurm": "gpu-n", "kubernetes": "k8s-gpu"}

#: the most nodes a world may hold (each is an object with its name, layout and index entries)
MAX_WORLD_NODES = 100_000
#: the most node-steps (nodes x steps) a world may hold: every node keeps its owner and cordon
#: flag per step (and its MIG layout where a platform asks for slices); 12,500 nodes over a
#: 31-day month of 5-minute steps. Checked before a node is made: a node count mistyped or
#: read from a trace (``total_gpu_num``) would otherwise take memory until the process dies
MAX_WORLD_NODE_STEPS = 12_500 * 31 * 24 * 12


class WorldError(UserError, ValueError):
    """A request the world cannot answer (unknown node or platform, window beyond the clock)."""


@dataclass(frozen=True)
class Node:
    """A pool node: fixed hardware facts. Ownership and state live in the World's arrays."""

    name: str
    gpus: int
    gpu_model: str
    mig_capable: bool
    home: str


#: whether a GPU model supports MIG partitioning (one definition: gpupool.mig)
mig_capable = mig.is_mig_capable


class World:
    """Nodes, owners, demand and the history of all of it on a step grid.

    Parameters
    ----------
    scenario:
        The scenario (demand sources, node size, move latency).
    clock:
        Simulated "now". History is final before it; moves and cordons act from it on.
        ``None`` (default) puts the clock at the end: the whole window has happened with the
        initial owners (what a replay without an allocator shows); ``"start"`` at the beginning.
    """

    def __init__(self, scenario: Scenario, clock: str | pd.Timestamp | None = None):
        self.scenario = scenario
        self.step = pd.Timedelta(scenario.step)
        self.step_hours = self.step.total_seconds() / 3600.0
        self.platforms: tuple[str, ...] = tuple(scenario.platforms)
        self._pidx = {p: i for i, p in enumerate(self.platforms)}
        self._load_demand()
        self._build_nodes()
        n_nodes, n_steps = len(self.nodes), len(self.index)
        self.owner_ = np.empty((n_nodes, n_steps), dtype=np.int16)
        for j, node in enumerate(self.nodes):
            self.owner_[j, :] = self._pidx[node.home]
        self.cordoned_ = np.zeros((n_nodes, n_steps), dtype=bool)
        self.off_: np.ndarray | None = None  # powered off (parking, parked, waking): sim.power sets it
        self.mig_layout_: dict[str, str | None] = {
            n.name: (mig.DISABLED if n.mig_capable else None) for n in self.nodes
        }
        self.units: tuple[str, ...] = units_of(scenario)  # each platform's unit, in platform order
        #: whether some platform asks for slices: only then do layouts decide what a node serves
        self.sliced = any(u != GPU_UNIT for u in self.units)
        self.layouts_ = Layouts(self.nodes, self.units, n_steps) if self.sliced else None
        self.events_: list[dict] = []  # moves, cordons and MIG changes, in clock order
        self._nidx = {n.name: j for j, n in enumerate(self.nodes)}
        self._name_order = sorted(range(len(self.nodes)), key=lambda j: self.nodes[j].name)
        self._cap_cache: np.ndarray | None = None
        if clock is None:
            self._clock_i = n_steps
        elif isinstance(clock, str) and clock == "start":
            self._clock_i = 0
        else:
            self._clock_i = self._index_of(clock, allow_end=True)

    # ------------------------------------------------------------------ construction
    def _load_demand(self) -> None:
        sc = self.scenario
        frames: dict[str, pd.DataFrame] = {}
        self.anomalies_: dict[str, pd.DataFrame] = {}
        start = None if sc.start is None else pd.Timestamp(sc.start)
        end = None if sc.end is None else pd.Timestamp(sc.end)
        for name, spec in sc.platforms.items():
            if spec.trace is not None:
                frame = read_traces(spec.trace, self.step, start, end)
                if start is not None:
                    frame = frame[frame.index >= start]
                if end is not None:
                    frame = frame[frame.index < end]
                frames[name] = frame
        if frames:
            first = next(iter(frames))
            index = frames[first].index
            for name, frame in frames.items():
                if not frame.index.equals(index):
                    raise WorldError(
                        f"platform {name!r}: trace covers {frame.index[0]}..{frame.index[-1]}, platform "
                        f"{first!r} covers {index[0]}..{index[-1]}; set start/end inside both"
                    )
        else:
            check_span(start, end, self.step, "the scenario's window")
            index = pd.date_range(start, end, freq=self.step, inclusive="left", name="ts").astype(
                "datetime64[us, UTC]"
            )
        if len(index) == 0:
            raise WorldError("the scenario's window holds no step")
        self._check_move_fits(index)
        for name, spec in sc.platforms.items():
            if spec.synthetic is not None:
                seed = (sc.seed * 1_000_003 + zlib.crc32(name.encode())) % (2**32)
                frame, anomalies = generate(spec.synthetic, index[0], index[-1] + self.step, self.step, seed)
                frames[name] = frame
                self.anomalies_[name] = anomalies
        self.index: pd.DatetimeIndex = index
        self.start, self.end = index[0], index[-1] + self.step
        self.demand_ = np.vstack([frames[p]["demand"].to_numpy(float) for p in self.platforms])
        self.util_ = np.vstack([frames[p]["util"].to_numpy(float) for p in self.platforms])
        self._traced_total = {p: float(frames[p]["total"].iloc[0]) for p in self.platforms}
        self._glitch = {}
        for p in self.platforms:
            if p in self.anomalies_:
                self._glitch[p] = glitch_factors(index, self.anomalies_[p])

    def _check_move_fits(self, index: pd.DatetimeIndex) -> None:
        """Refuse a ``move_minutes`` no move could finish inside the window: a node moved at the
        first step would still be in transit at the end, owned by nobody the planner can name."""
        sc = self.scenario
        window = len(index) * self.step
        if pd.Timedelta(minutes=sc.move_minutes) >= window:
            where = sc.source if sc.source is not None else "scenario"
            raise WorldError(
                f"{where}: move_minutes: {sc.move_minutes:g} minutes outlasts the simulated window "
                f"({window.total_seconds() / 60:g} minutes, {index[0]} .. {index[-1] + self.step}): a moved "
                "node would never arrive; shorten move_minutes or widen start/end"
            )

    def _check_size(self, counts: dict[str, int]) -> None:
        """Refuse (one line) more than :data:`MAX_WORLD_NODES` nodes or
        :data:`MAX_WORLD_NODE_STEPS` node-steps, naming the platform with the most nodes and
        where its count comes from."""
        total, steps = sum(counts.values()), len(self.index)
        if total <= MAX_WORLD_NODES and total * steps <= MAX_WORLD_NODE_STEPS:
            return
        sc = self.scenario
        where = sc.source if sc.source is not None else "scenario"
        big = max(counts, key=counts.get)
        spec = sc.platforms[big]
        if spec.nodes is not None:
            origin = "its nodes"
        else:
            given = "synthetic total_gpus" if spec.synthetic is not None else "traces' total_gpu_num"
            origin = f"its {given} of {self._traced_total[big]:,.0f} in {sc.node_gpus}-GPU nodes"
        raise WorldError(
            f"{where}: {total:,} nodes over {steps:,} steps of {self.step} ({total * steps:,} node-steps; "
            f"platform {shown(big)}: {counts[big]:,} nodes, {origin}); a world holds at most {MAX_WORLD_NODES:,} nodes "
            f"and {MAX_WORLD_NODE_STEPS:,} node-steps: give fewer nodes, a shorter window or a longer step"
        )

    def _build_nodes(self) -> None:
        sc = self.scenario
        counts = {p: spec.nodes if spec.nodes is not None else math.ceil(self._traced_total[p] / sc.node_gpus - 1e-9)
                  for p, spec in sc.platforms.items()}
        self._check_size(counts)
        nodes: list[Node] = []
        for p, spec in sc.platforms.items():
            count = counts[p]
            prefix = _NAME_PREFIX.get(p, f"{p}-gpu")
            capable = mig_capable(spec.gpu_model)
            for k in range(count):
                nodes.append(Node(f"{prefix}{k + 1:03d}", sc.node_gpus, spec.gpu_model, capable, p))
        names = [n.name for n in nodes]
        if len(set(names)) != len(names):
            raise WorldError("two platforms would name nodes alike; rename a platform")
        self.nodes: tuple[Node, ...] = tuple(nodes)

    # ------------------------------------------------------------------ clock and actions
    @property
    def clock(self) -> pd.Timestamp:
        """Simulated now (the first step not yet final)."""
        return self.end if self._clock_i >= len(self.index) else self.index[self._clock_i]

    def advance(self, to: str | pd.Timestamp) -> None:
        """Move the clock forward to ``to`` (a step boundary inside ``[clock, end]``)."""
        i = self._index_of(to, allow_end=True)
        if i < self._clock_i:
            raise WorldError(f"cannot move the clock back from {self.clock} to {to}")
        self._clock_i = i

    def move(self, node: str, to: str, minutes: float | None = None, layout: str | None = None) -> pd.Timestamp:
        """Hand ``node`` to platform ``to`` now; it serves nobody for ``minutes`` (scenario's move_minutes).

        ``layout`` (a plan's ``mig_layout``; None: unchanged) is the MIG layout it arrives with.
        Returns the time it arrives. Refuses a node already in transit or cordoned by someone
        else than gpupool, and an unknown target.
        """
        j = self._node(node)
        t = self._require_open("move")
        if to not in self._pidx:
            raise WorldError(f"unknown platform {to!r}; platforms are {list(self.platforms)}")
        here = int(self.owner_[j, t])
        if here == TRANSIT:
            raise WorldError(f"node {node!r} is already moving")
        if here == self._pidx[to]:
            raise WorldError(f"node {node!r} already belongs to {to!r}")
        minutes = self.scenario.move_minutes if minutes is None else minutes
        k = int(math.ceil(pd.Timedelta(minutes=minutes) / self.step - 1e-9))
        self.owner_[j, t:] = self._pidx[to]
        self.owner_[j, t : t + k] = TRANSIT
        self._cap_cache = None
        arrive = self.clock + k * self.step
        self.events_.append({"ts": self.clock, "kind": "move", "node": node, "source": self.platforms[here],
                             "target": to, "arrive": arrive})
        if layout is not None and layout != self.mig_layout_[node]:
            self._relayout(j, t + k, layout)
        return arrive

    def relayout(self, node: str, layout: str, minutes: float) -> pd.Timestamp:
        """Change ``node``'s MIG layout in place now; it serves nobody for ``minutes``.

        Returns the time it serves again. Refuses a node in transit.
        """
        j = self._node(node)
        t = self._require_open("re-layout")
        if int(self.owner_[j, t]) == TRANSIT:
            raise WorldError(f"node {node!r} is moving; its layout changes on arrival")
        k = int(math.ceil(pd.Timedelta(minutes=minutes) / self.step - 1e-9))
        self._relayout(j, t, layout, k)
        return self.clock + k * self.step

    def _relayout(self, j: int, i: int, layout: str, out_steps: int = 0) -> None:
        node = self.nodes[j]
        if not node.mig_capable and layout not in mig.WHOLE_LAYOUTS:
            raise WorldError(f"node {node.name!r} ({node.gpu_model}) is not MIG-capable")
        self.mig_layout_[node.name] = layout
        if self.layouts_ is not None:
            self.layouts_.set(j, i, layout, out_steps)
            self._cap_cache = None
        self.events_.append({"ts": self.clock, "kind": "mig", "node": node.name, "layout": layout})

    def cordon(self, node: str, reason: str) -> None:
        """Mark ``node`` unschedulable from now on (drain/cordon/disable) with ``reason``."""
        j = self._node(node)
        t = self._require_open("cordon")
        self.cordoned_[j, t:] = True
        self._cap_cache = None
        self.events_.append({"ts": self.clock, "kind": "cordon", "node": node, "reason": reason})

    def uncordon(self, node: str) -> None:
        """Make ``node`` schedulable again from now on."""
        j = self._node(node)
        t = self._require_open("uncordon")
        self.cordoned_[j, t:] = False
        self._cap_cache = None
        self.events_.append({"ts": self.clock, "kind": "uncordon", "node": node, "reason": ""})

    def set_mig_layout(self, node: str, layout: str | None) -> None:
        """Record a MIG layout change of ``node`` (MIG-capable nodes only)."""
        j = self._node(node)
        if not self.nodes[j].mig_capable and layout not in mig.WHOLE_LAYOUTS:
            raise WorldError(f"node {node!r} ({self.nodes[j].gpu_model}) is not MIG-capable")
        t = self._require_open("set a MIG layout")
        self.mig_layout_[node] = layout
        if self.layouts_ is not None:
            self.layouts_.set(j, t, layout)
            self._cap_cache = None
        self.events_.append({"ts": self.clock, "kind": "mig", "node": node, "layout": layout})

    # ------------------------------------------------------------------ derived state
    def node_capacity(self, i0: int, i1: int) -> np.ndarray:
        """What each node (rows) serves its owner per step of ``[i0, i1)`` in the owner's unit,
        transit aside (the owner arrays say who holds it): its GPUs unless cordoned, or in a
        world with a slice platform what its layout holds."""
        if self.layouts_ is not None:
            return self.layouts_.capacity(self.owner_[:, i0:i1], self._closed(i0, i1), i0, i1)
        return np.array([n.gpus for n in self.nodes], dtype=float)[:, None] * ~self._closed(i0, i1)

    def _closed(self, i0: int, i1: int) -> np.ndarray:
        """Nodes (rows) serving nobody per step of ``[i0, i1)``: cordoned, or powered off."""
        closed = self.cordoned_[:, i0:i1]
        return closed if self.off_ is None else closed | self.off_[:, i0:i1]

    def capacity(self) -> np.ndarray:
        """Schedulable capacity per platform and step in its unit, shape (platforms, steps)."""
        if self._cap_cache is None:
            cap = np.zeros((len(self.platforms), len(self.index)))
            live = self.node_capacity(0, len(self.index))
            for i in range(len(self.platforms)):
                cap[i] = (live * (self.owner_ == i)).sum(axis=0)
            self._cap_cache = cap
        return self._cap_cache

    def capacity_at(self, i: int) -> np.ndarray:
        """Schedulable capacity per platform at step ``i`` (cheap: one column)."""
        gpus = self.node_capacity(i, i + 1)[:, 0]
        owner = self.owner_[:, i]
        return np.array([gpus[owner == p].sum() for p in range(len(self.platforms))])

    def served(self) -> np.ndarray:
        """GPUs serving demand per platform and step (the fluid model)."""
        return np.minimum(self.demand_, self.capacity())

    def demand(self, platform: str, start=None, end=None) -> pd.Series:
        """True demand of ``platform`` per step over ``[start, end)`` (whole window by default)."""
        i0, i1 = self._window(start, end, clip_to_clock=False)
        return pd.Series(self.demand_[self._platform(platform), i0:i1], index=self.index[i0:i1], name=platform)

    def hourly_demand(self, platform: str, start=None, end=None) -> pd.Series:
        """True demand of ``platform`` averaged per hour over ``[start, end)``."""
        s = self.demand(platform, start, end)
        return s.resample("1h").mean()

    def _busy_by_node(self, i0: int, i1: int) -> np.ndarray:
        """GPUs busy per node and step in ``[i0, i1)``: served work packed onto nodes by name (a
        node serving slices is busy in proportion: the requests it holds over those it can)."""
        owner = self.owner_[:, i0:i1]
        cordoned = self._closed(i0, i1)
        live = self.node_capacity(i0, i1)
        if self._cap_cache is not None:
            cap = self._cap_cache[:, i0:i1]
        else:
            cap = np.vstack([(live * (owner == p)).sum(axis=0) for p in range(len(self.platforms))])
        served = np.minimum(self.demand_[:, i0:i1], cap)
        busy = np.zeros((len(self.nodes), i1 - i0))
        order = self._name_order
        for p in range(len(self.platforms)):
            left = served[p].copy()
            for j in order:
                here = (owner[j] == p) & ~cordoned[j]
                if not here.any():
                    continue
                if self.layouts_ is None:
                    take = np.where(here, np.minimum(left, self.nodes[j].gpus), 0.0)
                    busy[j] = np.where(here, take, busy[j])
                else:
                    room = np.where(here, live[j], 0.0)
                    take = np.minimum(left, room)
                    share = np.divide(take, room, out=np.zeros_like(take), where=room > 0)
                    busy[j] = np.where(here, share * self.nodes[j].gpus, busy[j])
                left = left - take
        return busy

    @property
    def clock_index(self) -> int:
        """Index of the first step not yet final (``len(index)`` when the clock is at the end)."""
        return self._clock_i

    def busy_by_node(self, start=None, end=None) -> np.ndarray:
        """GPUs busy per node (rows in ``nodes`` order) and step over ``[start, end)``."""
        i0, i1 = self._window(start, end, clip_to_clock=False)
        return self._busy_by_node(i0, i1)

    def exporter_distortion(self, platform: str) -> tuple[np.ndarray, np.ndarray]:
        """``(factor, gap)`` per step of ``platform``'s exporter anomalies (ones and False for traces)."""
        self._platform(platform)
        n = len(self.index)
        return self._glitch.get(platform, (np.ones(n), np.zeros(n, dtype=bool)))

    # ------------------------------------------------------------------ what the APIs show
    def pool(self, at: str | pd.Timestamp | None = None) -> list[dict]:
        """Every pool node's state at instant ``at`` (default: the clock).

        ``platform`` is the owner (for a node in transit: where it is going, with
        ``in_transit=True`` and ``available_in_minutes``); ``busy_gpus`` is the work running at
        that instant, i.e. the packing of the step that just ended (of the first step at the start).
        """
        i = self._index_of(self.clock if at is None else at, allow_end=True)
        if i > self._clock_i:
            raise WorldError(f"instant {at} is after the simulated clock {self.clock}")
        n = len(self.index)
        look = min(i, n - 1)
        prev = max(i - 1, 0)  # at the world's first instant, its first step's work is running
        busy = self._busy_by_node(prev, prev + 1)[:, 0]
        at_ts = self.index[look] if i < n else self.end
        last_move: dict[str, pd.Timestamp] = {}
        bound_for: dict[str, str] = {}  # where a node in transit goes, when it arrives after the end
        reasons: dict[str, str] = {}
        for ev in self.events_:
            if ev["ts"] > at_ts:
                break
            if ev["kind"] == "move":
                last_move[ev["node"]] = ev["ts"]
                bound_for[ev["node"]] = ev["target"]
            elif ev["kind"] in ("cordon", "uncordon"):
                reasons[ev["node"]] = ev["reason"]
        out = []
        for j, node in enumerate(self.nodes):
            owner = int(self.owner_[j, look])
            transit = owner == TRANSIT
            remaining = 0.0
            if transit:
                ahead = np.nonzero(self.owner_[j, look:] != TRANSIT)[0]
                stop = look + (int(ahead[0]) if len(ahead) else n - look)
                owner = int(self.owner_[j, stop]) if stop < n else self._pidx[bound_for[node.name]]
                remaining = (stop - i) * self.step_hours * 60.0
            cordoned = bool(self.cordoned_[j, look]) or (self.off_ is not None and bool(self.off_[j, look]))
            layout = self.mig_layout_[node.name]
            if self.layouts_ is not None:
                layout = self.layouts_.at(j, look)
                cordoned = cordoned or bool(self.layouts_.out_[j, look])  # re-laying out: drained
            out.append({
                "name": node.name,
                "platform": self.platforms[owner] if owner != TRANSIT else None,
                "gpus": node.gpus,
                "gpu_model": node.gpu_model,
                "mig_capable": node.mig_capable,
                "mig_layout": layout,
                "schedulable": not cordoned and not transit,
                "drain_reason": reasons.get(node.name, "") if cordoned else "",
                "busy_gpus": float(busy[j]),
                "in_transit": transit,
                "available_in_minutes": remaining,
                "last_moved_at": last_move.get(node.name),
                "home": node.home,
                "powered": self.off_ is None or not bool(self.off_[j, look]),
            })
        return out

    def inventory(self, platform: str, at: str | pd.Timestamp | None = None) -> list[dict]:
        """The nodes ``platform`` holds at instant ``at`` (nodes in transit belong to nobody yet).

        Each dict: name, platform, gpus, gpu_model, mig_capable, mig_layout, schedulable,
        drain_reason, busy_gpus (whole GPUs running work), last_moved_at, home.
        """
        self._platform(platform)
        out = []
        for node in self.pool(at):
            if node["platform"] == platform and not node["in_transit"]:
                node = {k: v for k, v in node.items() if k not in ("in_transit", "available_in_minutes")}
                node["busy_gpus"] = int(math.ceil(node["busy_gpus"] - 1e-6))
                out.append(node)
        return out

    def samples(self, platform: str, start=None, end=None, per_gpu: bool = True) -> pd.DataFrame:
        """What ``platform``'s metrics APIs report over ``[start, end)``, as canonical samples.

        Platform level: ``gpu_capacity``, ``gpu_allocated`` (served), ``gpu_pending`` (unmet).
        Node level: ``gpu_capacity`` and ``gpu_allocated`` of each node the platform holds.
        GPU level (``per_gpu``): ``gpu_util`` of each GPU (``node/gpuK``). Exporter anomalies of
        a synthetic platform distort the usage series (drops, spikes, resets) or remove their
        rows (gaps); capacity comes from the inventory API and is never distorted.
        """
        p = self._platform(platform)
        i0, i1 = self._window(start, end, clip_to_clock=True)
        if i1 <= i0:
            return empty_samples()
        ts = self.index[i0:i1]
        cap, reported, keep = self.demand_telemetry(platform, i0, i1)
        factor = self.exporter_distortion(platform)[0][i0:i1]
        parts = [
            _rows(platform, "platform", "", "gpu_capacity", ts, cap),
            _rows(platform, "platform", "", "gpu_allocated", ts[keep], reported["gpu_allocated"][keep]),
            _rows(platform, "platform", "", "gpu_pending", ts[keep], reported["gpu_pending"][keep]),
        ]
        busy = self._busy_by_node(i0, i1)
        util = self.util_[p, i0:i1] * 100.0
        owner = self.owner_[:, i0:i1]
        for j, node in enumerate(self.nodes):
            here = owner[j] == p
            if not here.any():
                continue
            parts.append(_rows(platform, "node", node.name, "gpu_capacity", ts[here],
                               np.full(int(here.sum()), float(node.gpus)) * ~self.cordoned_[j, i0:i1][here]))
            seen = here & keep
            parts.append(_rows(platform, "node", node.name, "gpu_allocated", ts[seen], (busy[j] * factor)[seen]))
            if per_gpu:
                for k in range(node.gpus):
                    frac = np.clip(busy[j] - k, 0.0, 1.0)
                    parts.append(_rows(platform, "gpu", f"{node.name}/gpu{k}", "gpu_util", ts[seen],
                                       np.round(np.clip(frac * util * factor, 0.0, 100.0), 3)[seen]))
        out = pd.concat([x for x in parts if len(x)], ignore_index=True)
        return out[SAMPLE_COLUMNS]

    def demand_telemetry(self, platform: str, i0: int, i1: int) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray]:
        """The platform-level series of steps ``[i0, i1)`` as its exporter reports them.

        Returns ``(capacity, {"gpu_allocated": ..., "gpu_pending": ...}, kept)``: served and
        pending GPUs distorted by the platform's exporter anomalies, and which steps have a row
        at all. This is what :meth:`samples` reports at platform level, without the node rows
        (the closed-loop study reads it every hour).
        """
        p = self._platform(platform)
        if i1 > self._clock_i:
            raise WorldError(f"steps up to {i1} asked, the clock is at step {self._clock_i}")
        cap = self.capacity()[p, i0:i1]
        served = np.minimum(self.demand_[p, i0:i1], cap)
        pending = self.demand_[p, i0:i1] - served
        factor, gap = self.exporter_distortion(platform)
        factor = factor[i0:i1]
        return cap, {"gpu_allocated": served * factor, "gpu_pending": pending * factor}, ~gap[i0:i1]

    def ground_truth(self) -> pd.DataFrame:
        """Injected anomalies of all synthetic platforms, with a ``platform`` column."""
        frames = [a.assign(platform=p) for p, a in self.anomalies_.items() if len(a)]
        if not frames:
            return pd.DataFrame(columns=["platform", "start", "end", "kind", "layer", "magnitude"])
        out = pd.concat(frames, ignore_index=True)
        return out[["platform", "start", "end", "kind", "layer", "magnitude"]]

    def summary(self) -> dict:
        """The study's numbers over ``[start, clock)``: per platform and in total.

        ``moves`` of a platform counts the nodes it received. A platform with a ``slice_profile``
        counts its hours in slice requests of it: its block has ``unit`` (the profile), and
        ``unmet_slice_hours`` and the rest name it; ``total``'s hours then sum the whole-GPU
        platforms only (its ``moves`` all of them) and ``slice_platforms`` names the others' units.
        """
        i1 = self._clock_i
        demand = self.demand_[:, :i1]
        cap = self.capacity()[:, :i1]
        served = np.minimum(demand, cap)
        h = self.step_hours
        received = {p: 0 for p in self.platforms}
        for ev in self.events_:
            if ev["kind"] == "move":
                received[ev["target"]] += 1
        platforms = {}
        for p, i in self._pidx.items():
            platforms[p] = _metrics(demand[i].sum() * h, served[i].sum() * h, cap[i].sum() * h, received[p])
            if self.units[i] != GPU_UNIT:
                platforms[p] = _in_unit(platforms[p], self.units[i])
        if not self.sliced:
            total = _metrics(demand.sum() * h, served.sum() * h, cap.sum() * h, sum(received.values()))
            return {"total": total, "platforms": platforms}
        whole = [i for i, u in enumerate(self.units) if u == GPU_UNIT]
        total = _metrics(demand[whole].sum() * h, served[whole].sum() * h, cap[whole].sum() * h,
                         sum(received.values()))
        total["slice_platforms"] = {p: self.units[i] for p, i in self._pidx.items() if self.units[i] != GPU_UNIT}
        return {"total": total, "platforms": platforms}

    # ------------------------------------------------------------------ helpers
    def _platform(self, platform: str) -> int:
        if platform not in self._pidx:
            raise WorldError(f"unknown platform {platform!r}; platforms are {list(self.platforms)}")
        return self._pidx[platform]

    def _node(self, node: str) -> int:
        if node not in self._nidx:
            raise WorldError(f"unknown node {node!r}")
        return self._nidx[node]

    def _require_open(self, what: str) -> int:
        if self._clock_i >= len(self.index):
            raise WorldError(f"cannot {what}: the clock is at the end of the world ({self.end})")
        return self._clock_i

    def _index_of(self, ts, allow_end: bool = False) -> int:
        ts = pd.Timestamp(ts)
        ts = ts.tz_localize("UTC") if ts.tzinfo is None else ts.tz_convert("UTC")
        if ts == self.end and allow_end:
            return len(self.index)
        if ts < self.start or ts >= self.end:
            raise WorldError(f"{ts} is outside the world's window [{self.start}, {self.end})")
        return int((ts - self.start) // self.step)

    def _window(self, start, end, clip_to_clock: bool) -> tuple[int, int]:
        i0 = 0 if start is None else self._bound(start)
        i1 = (self._clock_i if clip_to_clock else len(self.index)) if end is None else self._bound(end)
        if clip_to_clock and i1 > self._clock_i:
            raise WorldError(f"window end {end} is after the simulated clock {self.clock}")
        return i0, max(i0, i1)

    def _bound(self, ts) -> int:
        """Step index of the first step at or after ``ts``, clipped to the world."""
        ts = pd.Timestamp(ts)
        ts = ts.tz_localize("UTC") if ts.tzinfo is None else ts.tz_convert("UTC")
        if ts <= self.start:
            return 0
        if ts >= self.end:
            return len(self.index)
        return int(math.ceil((ts - self.start) / self.step - 1e-9))


def _rows(platform, kind, entity, metric, ts, values) -> pd.DataFrame:
    n = len(ts)
    return pd.DataFrame({
        "platform": platform, "cluster": "", "entity_kind": kind, "entity_id": entity, "metric": metric,
        "ts": ts, "value": np.asarray(values, dtype=float), "unit": CANONICAL_METRICS[metric],
    }, index=pd.RangeIndex(n))


def _metrics(demand: float, served: float, capacity: float, moves: int) -> dict:
    return {
        "demand_gpu_hours": round(float(demand), 3),
        "served_gpu_hours": round(float(served), 3),
        "unmet_gpu_hours": round(float(demand - served), 3),
        "capacity_gpu_hours": round(float(capacity), 3),
        "utilization": round(float(served / capacity), 6) if capacity > 0 else 0.0,
        "moves": int(moves),
    }


def _in_unit(block: dict, unit: str) -> dict:
    """A slice platform's :func:`_metrics`: its unit named, and its hours also under keys that
    say slices (the ``*_gpu_hours`` keys stay, in the same unit, for the readers of every block)."""
    named = {k.replace("_gpu_hours", "_slice_hours"): v for k, v in block.items() if k.endswith("_gpu_hours")}
    return {**block, **named, "unit": unit}


def default_world(start: str | pd.Timestamp, end: str | pd.Timestamp, seed: int = 0) -> World:
    """A small synthetic three-platform world for the demo, with injected anomalies.

    One datacenter whose platforms are busy at different hours, so that one queues while another
    has idle nodes (what pooling is for):

    * ``openstack`` (8 nodes): an inference and interactive-VM cloud for office users, busy in
      working hours (peak 13:00 UTC), quiet at night and at weekends, rare bursts;
    * ``slurm`` (12 nodes): an HPC batch cluster whose users submit at the end of the day, so its
      queue peaks at night (02:00) and it has room in the afternoon; long bursts (parameter
      sweeps), little weekend dip;
    * ``kubernetes`` (10 MIG-capable nodes): an AI platform peaking in the late afternoon
      (16:00), with frequent short bursts.

    The same world is shipped as ``config/scenarios/demo-world.yaml``. Ground truth is in
    :meth:`World.ground_truth`.
    """
    raw = {
        "step": "5min",
        "decision_every": "1h",
        "node_gpus": 8,
        "start": str(pd.Timestamp(start)),
        "end": str(pd.Timestamp(end)),
        "seed": seed,
        "name": "default-world",
        "platforms": {
            "openstack": {
                "synthetic": {"base": 38, "daily_amplitude": 0.4, "weekly_amplitude": 0.3, "peak_hour": 13,
                              "noise": 0.06, "bursts_per_day": 0.3, "burst_size": 0.4, "total_gpus": 64},
                "nodes": 8, "gpu_model": "NVIDIA A100-PCIE-40GB",
            },
            "slurm": {
                "synthetic": {"base": 78, "daily_amplitude": 0.25, "weekly_amplitude": 0.1, "peak_hour": 2,
                              "noise": 0.08, "bursts_per_day": 0.5, "burst_size": 0.35, "burst_hours": 6,
                              "total_gpus": 96},
                "nodes": 12, "gpu_model": "NVIDIA A100-SXM4-80GB",
            },
            "kubernetes": {
                "synthetic": {"base": 54, "daily_amplitude": 0.35, "weekly_amplitude": 0.15, "peak_hour": 16,
                              "noise": 0.1, "bursts_per_day": 1.0, "burst_size": 0.4, "burst_hours": 2,
                              "total_gpus": 80},
                "nodes": 10, "gpu_model": "NVIDIA H100 80GB HBM3",
            },
        },
    }
    return World(scenario_from_dict(raw, where="default_world"))


__all__ = ["World", "Node", "WorldError", "default_world", "mig_capable", "TRANSIT"]
