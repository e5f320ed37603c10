"""The facades' shared state: a :class:`World` driven by wall time, plus what the platforms' APIs add.

The world model is a fluid model: per step, each platform's served GPUs are packed onto its
nodes by name, and a cordoned node serves nothing from the moment it is cordoned. The APIs
show *work* (pods, jobs, instances) and real drain semantics, so this module adds:

* **work identities** — a GPU slot that stays busy over consecutive steps is one job; its id
  comes from where its run started, so the same job keeps its id from call to call;
* **draining** — cordoning a node through any API cordons it in the world (it takes no new work
  from that step on) and keeps the jobs it was running as *residual* work that ends after a
  deterministic remaining time (or when evicted); the node is empty only once they are gone;
* **moves** — a node may change platform only when it is released (cordoned) and empty;
* **MIG changes** — need an empty node, take ``mig_minutes``, keep the node out of service
  while they run, and reach the world (``World.set_mig_layout``) when they finish;
* **API bookkeeping** — resourceVersions, Kubernetes labels/annotations/taints, Placement
  generations, ``reserved`` amounts and provider traits.

Time: the simulated clock advances with wall time times ``speed`` (0 freezes it; tests move
it with :meth:`SimState.advance`). Every facade calls :meth:`SimState.sync` first, under
:attr:`SimState.lock`.
"""

from __future__ import annotations

import math
import threading
import time
import uuid
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import pandas as pd

from gpupool import mig as mig_table
from gpupool.sim.world import TRANSIT, World, WorldError

#: job ids start here (Slurm-like numbers); pending jobs use a range of their own
JOB_ID_BASE = 10_000
PENDING_ID_BASE = 900_000_000
#: the Kubernetes namespace the platform's GPU work runs in
WORK_NAMESPACE = "ml-jobs"
#: the MIG layout label of the NVIDIA GPU operator and the state label its mig-manager writes
MIG_LABEL = mig_table.CONFIG_LABEL
MIG_STATE_LABEL = mig_table.STATE_LABEL

_NS = uuid.UUID("6f1c5d1e-8a4e-4d7e-9a55-5b0c2d8e1f00")


class SimNotFound(LookupError):
    """An unknown node, pod, job or provider (the facade answers its platform's 404)."""


class SimConflict(RuntimeError):
    """A request the state of the world refuses now (409 on most platforms)."""


class SimInvalid(ValueError):
    """A request that can never succeed as given (400/422)."""


def stable_uuid(*parts: Any) -> str:
    """A deterministic UUID for an object of the simulated datacenter."""
    return str(uuid.uuid5(_NS, "/".join(str(p) for p in parts)))


@dataclass
class Residual:
    """A job left running on a drained node; it occupies ``slot`` on steps ``[first, end)``."""

    job_id: int
    node: str
    slot: int
    start: int  # step its run began (id source)
    first: int  # first step served as residual (the cordon step)
    end: int  # first step it no longer runs


@dataclass
class MigChange:
    """A MIG layout change in progress or finished."""

    layout: str | None
    state: str  # pending | success | failed
    due: int | None = None  # step at which it completes
    cordoned_here: bool = False
    message: str = ""


@dataclass
class Work:
    """One running or pending GPU job as the APIs show it."""

    job_id: int
    platform: str
    node: str | None
    gpus: int
    start: pd.Timestamp
    state: str  # Running | Pending
    slot: int = -1
    residual: bool = False

    @property
    def name(self) -> str:
        """The pod / job name."""
        return f"gpu-job-{self.job_id}"


@dataclass
class NodeMeta:
    """What the platforms' APIs store about a node beyond the world's facts."""

    resource_version: int = 1
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    taints: list[dict[str, Any]] = field(default_factory=list)
    placement_generation: int = 1
    reserved: int = 0
    cordon_via: str = ""  # the API that cordoned it: kubernetes, nova, placement, slurm, mig
    unschedulable: bool = False  # Kubernetes spec.unschedulable as last written
    aggregates: list[str] = field(default_factory=list)  # Placement aggregates of the provider
    traits: list[str] = field(default_factory=list)  # Placement traits a client set beyond nova-compute's


class SimState:
    """A World, the wall clock that drives it, and the API-level state of its nodes.

    Parameters
    ----------
    world:
        The world; its clock must not be at the end when actions are expected.
    speed:
        Simulated seconds per wall second (1: real time; 0: frozen, moved only by :meth:`advance`).
    job_minutes:
        Longest remaining run time of a job caught on a node when it is drained.
    mig_minutes:
        How long a MIG layout change takes.
    roles:
        Which world platform each facade serves (``{"kubernetes": "kubernetes", ...}``); a role
        whose platform is absent serves an empty cluster.
    wallclock:
        A monotonic clock in seconds (tests pass their own).
    """

    def __init__(
        self,
        world: World,
        *,
        speed: float = 1.0,
        job_minutes: float = 60.0,
        mig_minutes: float = 15.0,
        roles: dict[str, str] | None = None,
        wallclock: Callable[[], float] = time.monotonic,
    ):
        if speed < 0:
            raise ValueError("speed must be >= 0")
        self.world = world
        self.speed = float(speed)
        self.job_minutes = float(job_minutes)
        self.mig_minutes = float(mig_minutes)
        self.roles = {r: r for r in ("kubernetes", "slurm", "openstack")}
        self.roles.update(roles or {})
        self.lock = threading.RLock()
        self._wallclock = wallclock
        self._anchor_wall = wallclock()
        self._anchor_step = world.clock_index
        self.revision = 1
        self.meta: dict[str, NodeMeta] = {n.name: NodeMeta() for n in world.nodes}
        self.residuals: list[Residual] = []
        self.evictions: dict[tuple[int, int], set[int]] = {}  # (node idx, slot) -> steps a new run starts
        self.requeued: dict[str, list[tuple[int, int]]] = {}  # platform -> (job id, step requeued), oldest first
        self.mig: dict[str, MigChange] = {}
        self._node_idx = {n.name: j for j, n in enumerate(world.nodes)}
        self._gmax = max((n.gpus for n in world.nodes), default=1)
        self._cache: dict[tuple, Any] = {}
        for name in self.meta:
            self._init_labels(name)

    # ------------------------------------------------------------------ clock
    @property
    def step(self) -> pd.Timedelta:
        return self.world.step

    @property
    def clock_i(self) -> int:
        """Index of the first step not yet final (the world's clock)."""
        return self.world.clock_index

    @property
    def now(self) -> pd.Timestamp:
        """Simulated now (a step boundary)."""
        return self.world.clock

    def ts(self, i: int) -> pd.Timestamp:
        """The start of step ``i`` (``end`` for ``i == len(index)``)."""
        return self.world.start + i * self.step

    def sync(self) -> pd.Timestamp:
        """Advance the world to the step the wall clock has reached; apply due MIG completions."""
        with self.lock:
            if self.speed > 0:
                elapsed = (self._wallclock() - self._anchor_wall) * self.speed
                target = self._anchor_step + int(elapsed // self.step.total_seconds())
                self._advance_to_index(min(target, len(self.world.index)))
            return self.now

    def advance(self, delta: str | pd.Timedelta) -> pd.Timestamp:
        """Move the clock forward by ``delta`` (rounded down to whole steps) from now."""
        with self.lock:
            self.sync()
            k = int(pd.Timedelta(delta) // self.step)
            self._advance_to_index(min(self.clock_i + k, len(self.world.index)))
            self._anchor_wall, self._anchor_step = self._wallclock(), self.clock_i
            return self.now

    def _advance_to_index(self, target: int) -> None:
        while self.clock_i < target:
            due = sorted(m.due for m in self.mig.values() if m.state == "pending" and m.due is not None)
            nxt = min([d for d in due if d > self.clock_i] + [target])
            self.world.advance(self.ts(nxt))
            self._finish_mig()
        self._finish_mig()

    def _bump(self, name: str) -> None:
        self.revision += 1
        self.meta[name].resource_version = self.revision
        self._cache.clear()

    # ------------------------------------------------------------------ nodes
    def platform(self, role: str) -> str | None:
        """The world platform a facade role serves, or None if the scenario has none."""
        p = self.roles.get(role, role)
        return p if p in self.world.platforms else None

    def _init_labels(self, name: str) -> None:
        node = self.world.nodes[self._node_idx[name]]
        m = self.meta[name]
        m.labels = {
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "node-role.kubernetes.io/gpu": "",
            "nvidia.com/gpu.product": node.gpu_model.replace(" ", "-"),
            "nvidia.com/gpu.count": str(node.gpus),
        }
        if node.mig_capable:
            layout = self.world.mig_layout_.get(name) or mig_table.DISABLED
            m.labels[MIG_LABEL] = layout
            m.labels[MIG_STATE_LABEL] = "success"
        m.annotations = {}
        m.taints = []

    def node_index(self, name: str) -> int:
        if name not in self._node_idx:
            raise SimNotFound(name)
        return self._node_idx[name]

    def pool(self) -> list[dict]:
        """Every pool node's state now, with the API-level additions (cached per revision)."""
        key = ("pool", self.clock_i, self.revision)
        if key in self._cache:
            return self._cache[key]
        world_pool = self.world.pool()
        occ_now = self._occupancy_now()
        out = []
        for rec in world_pool:
            name = rec["name"]
            j = self._node_idx[name]
            cordoned = bool(self.world.cordoned_[j, min(self.clock_i, len(self.world.index) - 1)])
            busy = int(occ_now[j].sum())
            mig = self.mig.get(name)
            out.append({
                **rec,
                "busy_gpus": busy,
                "cordoned": cordoned,
                "empty": busy == 0,
                "mig_state": mig.state if mig else "success",
                "mig_target": mig.layout if mig else rec["mig_layout"],
                "meta": self.meta[name],
                "created": rec["last_moved_at"] if rec["last_moved_at"] is not None else self.world.start,
                "uuid": stable_uuid("node", name),
            })
        self._cache[key] = out
        return out

    def nodes(self, role: str) -> list[dict]:
        """The nodes the platform of ``role`` holds now (in name order)."""
        p = self.platform(role)
        if p is None:
            return []
        return sorted((n for n in self.pool() if n["platform"] == p and not n["in_transit"]),
                      key=lambda n: n["name"])

    def node(self, role: str, name: str) -> dict:
        """One node of ``role``'s platform; SimNotFound when the platform does not hold it."""
        for n in self.nodes(role):
            if n["name"] == name:
                return n
        raise SimNotFound(name)

    # ------------------------------------------------------------------ actions
    def cordon(self, role: str, name: str, reason: str, via: str) -> None:
        """Stop new work on ``name`` from now on; the jobs running on it continue as residual work."""
        node = self.node(role, name)
        j = self._node_idx[name]
        if node["cordoned"]:
            if reason and reason != node["drain_reason"]:
                self.world.cordon(name, reason)  # a new reason, same state
                self._bump(name)
            return
        occ = self._occupancy_now()[j]
        c = self.clock_i
        starts = self._run_starts_now()
        try:
            self.world.cordon(name, reason or f"{via}: cordoned")
        except WorldError as exc:
            raise SimConflict(str(exc)) from exc
        steps_per_job = max(1, int(math.ceil(pd.Timedelta(minutes=self.job_minutes) / self.step)))
        for k in np.nonzero(occ)[0]:
            start = int(starts[j, k])
            h = zlib.crc32(f"{name}/{k}/{start}".encode())
            remaining = 1 + h % steps_per_job
            self.residuals.append(Residual(self._job_id(j, int(k), start), name, int(k), start, c, c + remaining))
        self.meta[name].cordon_via = via
        self._bump(name)

    def uncordon(self, role: str, name: str) -> None:
        """Make ``name`` schedulable again; residual jobs hand back to the platform's packing."""
        node = self.node(role, name)
        if not node["cordoned"]:
            return
        mig = self.mig.get(name)
        if mig and mig.state == "pending":
            raise SimConflict(f"node {name} is changing its MIG layout; it rejoins when that ends")
        self._end_residuals(name)
        self.world.uncordon(name)
        self.meta[name].cordon_via = ""
        self._bump(name)

    def evict(self, role: str, job_id: int) -> Work:
        """Evict a running job now: a drained node loses it, an open node restarts it as a new job."""
        for w in self.running(role):
            if w.job_id == job_id:
                break
        else:
            raise SimNotFound(str(job_id))
        c = self.clock_i
        if w.residual:
            for r in self.residuals:
                if r.job_id == job_id and r.first <= c < r.end:
                    r.end = c
        else:
            j = self._node_idx[w.node]
            self.evictions.setdefault((j, w.slot), set()).add(c)
        self._bump(w.node)
        return w

    def requeue(self, role: str, job_id: int) -> Work:
        """``scontrol requeue``: the running job leaves its node now (:meth:`evict`) and waits,
        pending under its own id, as slurmctld keeps a requeued job's id and its place in the queue
        (:meth:`pending`)."""
        w = self.evict(role, job_id)
        self.requeued.setdefault(w.platform, []).append((job_id, self.clock_i))
        return w

    def power(self, name: str, on: bool, minutes: float | None = None) -> pd.Timestamp:
        """A BMC's power reset of ``name``: off stops it at once (refused while it runs work: the
        parking that asks for it waits for the node to empty), on boots it and it serves again
        ``minutes`` later (default: the scenario's ``parking.wake_minutes``, else 10). Returns
        when the change is complete. A node in transit has no BMC anyone can reach."""
        j = self.node_index(name)
        rec = next(n for n in self.pool() if n["name"] == name)
        if rec["in_transit"]:
            raise SimConflict(f"node {name} is moving")
        if not on and rec["powered"] and not rec["empty"]:
            raise SimConflict(f"node {name} still runs {rec['busy_gpus']} GPU job(s): powering it off would kill them")
        if minutes is None:
            spec = self.world.scenario.parking
            minutes = spec.wake_minutes if spec is not None else 10.0
        if not (0 <= minutes <= 24 * 60):
            raise SimInvalid("minutes must be between 0 and 1440")
        w, t = self.world, self.clock_i
        if t >= len(w.index):
            raise SimConflict("the simulated clock is at the end of the scenario")
        if w.off_ is None:  # the what-if's parking track sets the same array: a node off serves nobody
            w.off_ = np.zeros(w.owner_.shape, dtype=bool)
        ahead = w.off_[j, t:]
        if ahead.all() != on:  # already off, or on (or booting): a repeated reset changes nothing
            return self.now + (int(np.argmin(ahead)) * self.step if on else pd.Timedelta(0))
        k = int(math.ceil(pd.Timedelta(minutes=minutes) / self.step - 1e-9)) if on else 0
        w.off_[j, t:], w.off_[j, t : t + k] = not on, True
        w._cap_cache = None
        w.events_.append({"ts": self.now, "kind": "power", "node": name, "on": bool(on)})
        self._bump(name)
        return self.now + k * self.step

    def move(self, name: str, to: str) -> pd.Timestamp:
        """Hand a released, empty node to platform ``to``; returns when it arrives there."""
        j = self.node_index(name)
        rec = next(n for n in self.pool() if n["name"] == name)
        if to not in self.world.platforms:
            raise SimInvalid(f"unknown platform {to!r}; platforms are {list(self.world.platforms)}")
        if rec["in_transit"]:
            raise SimConflict(f"node {name} is already moving")
        if rec["platform"] == to:
            raise SimConflict(f"node {name} already belongs to {to}")
        if not rec["cordoned"]:
            raise SimConflict(f"node {name} is still in service on {rec['platform']}: release it there first")
        if not rec["empty"]:
            raise SimConflict(f"node {name} still runs {rec['busy_gpus']} GPU job(s) on {rec['platform']}")
        mig = self.mig.get(name)
        if mig and mig.state == "pending":
            raise SimConflict(f"node {name} is changing its MIG layout")
        try:
            self.world.uncordon(name)
            arrive = self.world.move(name, to)
        except WorldError as exc:
            raise SimConflict(str(exc)) from exc
        self._end_residuals(name)
        self.meta[name] = NodeMeta(resource_version=self.meta[name].resource_version,
                                   placement_generation=self.meta[name].placement_generation + 1)
        self._init_labels(name)
        self._bump(name)
        return arrive

    def request_mig(self, role: str, name: str, layout: str) -> MigChange:
        """Start a MIG layout change of ``name`` (MIG-capable, empty); it ends after ``mig_minutes``."""
        node = self.node(role, name)
        if not node["mig_capable"]:
            raise SimInvalid(f"node {name} ({node['gpu_model']}) is not MIG-capable")
        cur = self.mig.get(name)
        if cur and cur.state == "pending":
            if cur.layout == layout:
                return cur
            raise SimConflict(f"node {name} is already changing its MIG layout to {cur.layout}")
        if layout == node["mig_layout"]:
            change = MigChange(layout, "success")
            self.mig[name] = change
            return change
        if not node["empty"]:
            change = MigChange(layout, "failed",
                               message=f"node runs {node['busy_gpus']} GPU job(s); drain it before changing MIG")
            self.mig[name] = change
            self.meta[name].labels[MIG_STATE_LABEL] = "failed"
            self._bump(name)
            return change
        due = self.clock_i + max(1, int(math.ceil(pd.Timedelta(minutes=self.mig_minutes) / self.step)))
        change = MigChange(layout, "pending", due=due, cordoned_here=not node["cordoned"])
        if change.cordoned_here:
            try:
                self.world.cordon(name, "mig: reconfiguring GPUs")
            except WorldError as exc:
                raise SimConflict(str(exc)) from exc
            self.meta[name].cordon_via = "mig"
        self.mig[name] = change
        self.meta[name].labels[MIG_STATE_LABEL] = "pending"
        self._bump(name)
        return change

    def apply_mig_on_node(self, name: str, layout: str) -> None:
        """A node-side MIG tool (``nvidia-mig-parted apply``) on ``name``: it runs only on a node its
        platform holds out of service and empty, and returns once the layout is applied."""
        j = self.node_index(name)
        rec = next(n for n in self.pool() if n["name"] == name)
        if not rec["mig_capable"]:
            raise SimInvalid(f"node {name} ({rec['gpu_model']}) is not MIG-capable")
        if layout != mig_table.DISABLED and mig_table.layout_profile(layout) not in mig_table.SLICES_PER_GPU:
            raise SimInvalid(f"unknown MIG configuration {layout!r}")
        if not rec["cordoned"] or not rec["empty"]:
            raise SimConflict(f"node {name} must be drained and empty before its MIG layout changes "
                              f"({rec['busy_gpus']} GPU job(s), {'held' if rec['cordoned'] else 'in service'})")
        if layout != rec["mig_layout"]:
            try:
                self.world.set_mig_layout(name, layout)
            except WorldError as exc:
                raise SimConflict(str(exc)) from exc
            if self.world.nodes[j].mig_capable:
                self.meta[name].labels[MIG_LABEL] = layout
                self.meta[name].labels[MIG_STATE_LABEL] = "success"
            self.mig[name] = MigChange(layout, "success")
            self._bump(name)

    def _finish_mig(self) -> None:
        for name, change in self.mig.items():
            if change.state == "pending" and change.due is not None and change.due <= self.clock_i:
                if self.clock_i >= len(self.world.index):
                    change.state = "success"
                    self.world.mig_layout_[name] = change.layout
                else:
                    self.world.set_mig_layout(name, change.layout)
                    change.state = "success"
                    if change.cordoned_here:
                        self.world.uncordon(name)
                        self.meta[name].cordon_via = ""
                self.meta[name].labels[MIG_STATE_LABEL] = "success"
                self._bump(name)

    def _end_residuals(self, name: str) -> None:
        c = self.clock_i
        for r in self.residuals:
            if r.node == name and r.end > c:
                r.end = max(r.first, c)

    # ------------------------------------------------------------------ work
    def _job_id(self, j: int, k: int, start: int) -> int:
        return JOB_ID_BASE + start * len(self.world.nodes) * self._gmax + j * self._gmax + k

    def occupancy(self, i0: int, i1: int) -> tuple[np.ndarray, np.ndarray]:
        """Busy GPU slots and their job ids over steps ``[i0, i1)``.

        Returns ``occ`` (nodes, gpus, steps) bool and ``job`` (same shape) int64 ids (0 = idle).
        A slot is busy when the world packs work onto it or a residual job holds it.
        """
        key = ("occ", i0, i1, self.revision)
        if key in self._cache:
            return self._cache[key]
        # Run starts need the whole history before the window (a job's id must not depend on the
        # window asked for), so each node is scanned from step 0, one node at a time.
        n_nodes, gmax, steps = len(self.world.nodes), self._gmax, i1 - i0
        occ_out = np.zeros((n_nodes, gmax, max(steps, 0)), dtype=bool)
        job_out = np.zeros((n_nodes, gmax, max(steps, 0)), dtype=np.int64)
        if steps <= 0 or i1 <= 0:
            out = (occ_out, job_out)
            self._cache[key] = out
            return out
        end = self.world.index[i1] if i1 < len(self.world.index) else None
        busy = np.ceil(self.world.busy_by_node(None, end) - 1e-6).astype(np.int16)
        residuals: dict[int, list[Residual]] = {}
        for r in self.residuals:
            residuals.setdefault(self._node_idx[r.node], []).append(r)
        slots = np.arange(gmax)[:, None]
        steps_ix = np.arange(i1)[None, :]
        for j in range(n_nodes):
            occ = busy[j][None, :] > slots
            for r in residuals.get(j, ()):
                a, b = max(r.first, 0), min(r.end, i1)
                if a < b:
                    occ[r.slot, a:b] = True
            if not occ[:, :i1].any():
                continue
            start_flag = occ.copy()
            start_flag[:, 1:] &= ~occ[:, :-1]
            for k in range(gmax):
                for e in self.evictions.get((j, k), ()):
                    if e < i1:
                        start_flag[k, e] |= occ[k, e]
            starts = np.maximum.accumulate(np.where(start_flag, steps_ix, -1), axis=1)
            occ_out[j] = occ[:, i0:i1]
            job_out[j] = np.where(occ[:, i0:i1],
                                  JOB_ID_BASE + starts[:, i0:i1] * n_nodes * gmax + j * gmax + slots, 0)
        out = (occ_out, job_out)
        self._cache[key] = out
        return out

    def _occupancy_now(self) -> np.ndarray:
        """Busy slots at the current instant (the step that just ended, plus live residual jobs)."""
        c = self.clock_i
        if c == 0:
            return np.zeros((len(self.world.nodes), self._gmax), dtype=bool)
        occ, _ = self.occupancy(c - 1, c)
        now = occ[:, :, 0].copy()
        # an evicted job is gone at once; its replacement is placed at the next step
        for (j, k), steps in self.evictions.items():
            if c in steps:
                now[j, k] = False
        cordoned = self.world.cordoned_[:, min(c, len(self.world.index) - 1)]
        for j in np.nonzero(cordoned)[0]:
            live = {r.slot for r in self.residuals if r.node == self.world.nodes[j].name and r.first <= c < r.end}
            now[j] = False
            for k in live:
                now[j, k] = True
        return now

    def _run_starts_now(self) -> np.ndarray:
        c = self.clock_i
        if c == 0:
            return np.zeros((len(self.world.nodes), self._gmax), dtype=np.int64)
        _, job = self.occupancy(c - 1, c)
        n_nodes = len(self.world.nodes)
        return np.maximum(job[:, :, 0] - JOB_ID_BASE, 0) // (n_nodes * self._gmax)

    def running(self, role: str) -> list[Work]:
        """Jobs running now on the nodes of ``role``'s platform (one GPU each)."""
        p = self.platform(role)
        if p is None or self.clock_i == 0:
            return []
        key = ("running", p, self.clock_i, self.revision)
        if key in self._cache:
            return self._cache[key]
        now = self._occupancy_now()
        _, job = self.occupancy(self.clock_i - 1, self.clock_i)
        residual_ids = {r.job_id for r in self.residuals if r.first <= self.clock_i < r.end}
        n_nodes = len(self.world.nodes)
        out = []
        for rec in self.nodes(role):
            j = self._node_idx[rec["name"]]
            for k in np.nonzero(now[j])[0]:
                jid = int(job[j, k, 0])
                if jid == 0:  # a residual job that began exactly now carries its own id
                    jid = next((r.job_id for r in self.residuals if r.node == rec["name"] and r.slot == k
                                and r.first <= self.clock_i < r.end), 0)
                    if jid == 0:
                        continue
                start = (jid - JOB_ID_BASE) // (n_nodes * self._gmax)
                out.append(Work(jid, p, rec["name"], 1, self.ts(start), "Running", int(k), jid in residual_ids))
        self._cache[key] = out
        return out

    def pending(self, role: str) -> list[Work]:
        """Demand the platform of ``role`` cannot place now, as one-GPU pending jobs."""
        p = self.platform(role)
        if p is None or self.clock_i == 0:
            return []
        i = self.clock_i - 1
        pi = self.world.platforms.index(p)
        unmet = max(0.0, float(self.world.demand_[pi, i] - self.world.capacity_at(i)[pi]))
        n = int(math.ceil(unmet - 1e-6))
        since = self.ts(self.clock_i)
        ids = self._requeued_waiting(p, n)
        fresh = max(0, n - sum(1 for _, at in self.requeued.get(p, ()) if at < self.clock_i))
        return ([Work(jid, p, None, 1, since, "Pending") for jid in ids]
                + [Work(PENDING_ID_BASE + pi * 1_000_000 + k, p, None, 1, since, "Pending") for k in range(fresh)])

    def _requeued_waiting(self, p: str, n: int) -> list[int]:
        """The requeued jobs of platform ``p`` still pending, given ``n`` GPUs of its demand unmet
        in the step that just ended. A job requeued in the current step waits (the world places its
        demand from the next step); one requeued earlier is part of that unmet demand, and the
        fluid model runs demand again under new ids, so the oldest requeued (the first in the
        queue) are taken as placed once the unmet demand no longer covers them, and forgotten."""
        queue = self.requeued.get(p, [])
        older = [e for e in queue if e[1] < self.clock_i]
        kept = older[len(older) - min(n, len(older)):] + [e for e in queue if e[1] >= self.clock_i]
        if len(kept) != len(queue):
            self.requeued[p] = kept
        return [jid for jid, _ in kept]

    # ------------------------------------------------------------------ history for the exporters
    def exported(self, role: str, i0: int, i1: int) -> dict[str, Any]:
        """What the exporters of ``role``'s platform reported over steps ``[i0, i1)``.

        ``owned`` (nodes, steps) the platform held the node (not in transit); ``occ`` and ``job``
        per GPU slot; ``util`` (nodes, gpus, steps) GPU utilisation in percent; ``pending``
        (steps) unmet demand in GPUs; ``reported`` (steps) False where the exporter was silent;
        ``factor`` (steps) the exporter's distortion of usage values. Steps at or after the clock
        are not history and are clipped.
        """
        p = self.platform(role)
        i1 = min(i1, self.clock_i)
        i0 = max(0, min(i0, i1))
        if p is None:
            return {"platform": None, "i0": i0, "i1": i0}
        # the last answer is kept (one: these are arrays over every node): Gnocchi's aggregates
        # ask it once per host of a group, the simulated Prometheus once per family
        key = (role, i0, i1, self.clock_i, self.revision)
        last = getattr(self, "_last_exported", None)
        if last is not None and last[0] == key:
            return last[1]
        out = self._exported(p, i0, i1)
        self._last_exported = (key, out)
        return out

    def _exported(self, p: str, i0: int, i1: int) -> dict[str, Any]:
        pi = self.world.platforms.index(p)
        occ, job = self.occupancy(i0, i1)
        owned = self.world.owner_[:, i0:i1] == pi
        factor, gap = self.world.exporter_distortion(p)
        factor, gap = factor[i0:i1], gap[i0:i1]
        util = self.world.util_[pi, i0:i1] * 100.0
        util_slot = np.where(occ, np.clip(util * factor, 0.0, 100.0)[None, None, :], 0.0)
        cap = self.world.capacity()[pi, i0:i1]
        pending = np.maximum(self.world.demand_[pi, i0:i1] - cap, 0.0)
        return {
            "platform": p, "i0": i0, "i1": i1, "owned": owned, "occ": occ & owned[:, None, :], "job": job,
            "util": util_slot, "pending": pending * factor, "reported": ~gap, "factor": factor,
        }

    def step_of(self, ts: pd.Timestamp | float) -> int:
        """Index of the step containing instant ``ts`` (may be < 0 or >= len)."""
        if not isinstance(ts, pd.Timestamp):
            ts = pd.Timestamp(float(ts), unit="s", tz="UTC")
        return int(math.floor((ts - self.world.start) / self.step))


__all__ = ["SimState", "SimNotFound", "SimConflict", "SimInvalid", "Work", "stable_uuid", "WORK_NAMESPACE",
           "MIG_LABEL", "MIG_STATE_LABEL"]
