"""The planning problem over node classes: the exact objective, the MILP and the greedy search.

:func:`gpupool.decisions.planner.plan` builds one :class:`PlanModel` per decision (its module
docstring states the model); this module holds the expected-unmet envelope, the grouping of
identical nodes into classes with their options (keep, re-layout, move), the exact evaluation of
a solution, the mixed-integer program (``scipy.optimize.milp``), the greedy search on the same
objective when the solver fails, and the naming of the nodes that act.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.special import ndtr, ndtri

from gpupool.decisions.layouts import NodeRecord, ideal_layout, node_capacity, units_per_gpu
from gpupool.decisions.plan_records import LayoutChange, Move
from gpupool.decisions.policy import Policy

_BOUND_PENALTY = 1e4  # per node outside a platform's min/max: above any realistic demand gain
_TANGENT_Z = np.linspace(-3.0, 3.0, 13)
_FAR_TANGENT_Z = np.linspace(-3.0, 4.5, 16)  # further into the tail: the source term is about small risks
_FAR_SPREAD = math.sqrt(2.0)  # one horizon further out: twice the lead time, a random walk's spread
_SQRT_2PI = math.sqrt(2.0 * math.pi)
LAYOUT_CHANGE_MINUTES = 10.0  # a MIG re-layout makes a node unavailable this long
LAYOUT_CHANGE_COST = 0.5  # GPU-hours charged per MIG layout change: it must pay for itself, as a move
SOLVER_TIME_LIMIT_S = 10.0  # the MILP's search time; then the best solution found is taken
#: two plans whose exact objectives differ by less than this (priority-weighted GPU-hours over the
#: horizon) serve the platforms equally well: the fair share decides between them
FAIR_TIE = 0.01


def expected_unmet(capacity: np.ndarray | float, mean: np.ndarray | float, sigma: np.ndarray | float) -> np.ndarray:
    """``E[(D - c)+]`` for ``D ~ Normal(mean, sigma)``, element-wise; ``(mean - c)+`` when sigma = 0."""
    c, m, s = np.broadcast_arrays(np.asarray(capacity, float), np.asarray(mean, float), np.asarray(sigma, float))
    shape = c.shape
    c, m, s = c.ravel(), m.ravel(), s.ravel()
    out = np.maximum(m - c, 0.0)
    pos = s > 1e-9
    if pos.any():
        z = (c[pos] - m[pos]) / s[pos]
        out[pos] = s[pos] * np.exp(-0.5 * z * z) / _SQRT_2PI + (m[pos] - c[pos]) * ndtr(-z)
    return out.reshape(shape)


def _tangents(mean: float, sigma: float, zs: np.ndarray = _TANGENT_Z) -> list[tuple[float, float]]:
    """Lines ``U >= a - b c`` whose maximum (with U >= 0) is the convex envelope of expected unmet."""
    lines = [(mean, 1.0)]  # U >= mean - c (the asymptote)
    if sigma > 1e-9:
        for z in zs:
            c0 = mean + z * sigma
            f0 = float(expected_unmet(c0, mean, sigma))
            slope = float(ndtr(-z))  # -f'(c0)
            lines.append((f0 + slope * c0, slope))
    return lines


@dataclass(frozen=True)
class _Option:
    kind: str  # "keep" | "relayout" | "move"
    target: str
    capacity: float  # in the target's unit
    avail: tuple[float, ...]  # fraction of each horizon hour the node serves
    cost: float
    layout: str | None


@dataclass
class _Class:
    owner: str
    gpus: int
    options: tuple[_Option, ...]
    members: list[NodeRecord]
    movable: bool
    home: str | None = None  # the members' owner, where a lend or borrow limit counts it


class SolverFailed(RuntimeError):
    """The MILP found no usable solution (the planner falls back to the greedy search)."""


class PlanModel:
    """The planning problem over node classes, shared by the MILP and the greedy search."""

    def __init__(self, records, platforms, demands, policy: Policy, hours: int, at):
        self.platforms = platforms
        self.pidx = {p: i for i, p in enumerate(platforms)}
        self.policy = policy
        self.hours = hours
        self.mean = np.array([demands[p].mean[:hours] for p in platforms], dtype=float)
        upper = np.array([demands[p].upper[:hours] for p in platforms], dtype=float)
        z = float(ndtri(policy.headroom_quantile))
        self.sigma = np.clip(upper - self.mean, 0.0, None) / z
        self.units = {p: demands[p].unit for p in platforms}
        self.gpu_per_unit = np.array([1.0 / units_per_gpu(self.units[p]) for p in platforms])
        self.weight = np.array([policy.weight(p) for p in platforms])
        self.records = records
        self.fixed: list[tuple[int, float, tuple[float, ...]]] = []  # (platform, capacity, avail) nobody decides on
        self.fixed_held = np.zeros(len(platforms))
        self.fixed_count = np.zeros(len(platforms))
        self.current_count = np.zeros(len(platforms))
        self.idle_gpus = np.zeros(len(platforms))
        # ownership: nodes are told apart by owner only where some platform limits its lending or
        # borrowing; the nodes in a handover each platform has lent and borrowed (nobody decides on them)
        self.limited = any(policy.limit(p, w) is not None for p in platforms for w in ("lend_limit", "borrow_limit"))
        self.fixed_lent = np.zeros(len(platforms))
        self.fixed_borrowed = np.zeros(len(platforms))
        self.classes: list[_Class] = []
        self._build(at)
        # fair share: the GPUs each platform owns (its nominal share), where owners are known
        self.owned_gpus = np.zeros(len(platforms))
        for r in records:
            if r.home is not None and r.home in self.pidx:
                self.owned_gpus[self.pidx[r.home]] += r.gpus
        # the source-risk term: demand one horizon further out, and each platform's risk there now
        self.far_mean = self.mean[:, -1].copy()
        self.far_sigma = self.sigma[:, -1] * _FAR_SPREAD
        self.held_now = self.capacity(self.counts_keep())[1]  # what each platform holds if nothing changes
        self.far_now = expected_unmet(self.held_now, self.far_mean, self.far_sigma)
        # the park term: what each platform holds below its last week's peak demand (0 where unknown)
        self.peak = np.array([demands[p].peak if demands[p].peak is not None else 0.0 for p in platforms], dtype=float)
        # only where the pool could hold every platform's peak at once: where it cannot, parking one
        # platform up to its peak is a guess at which peak returns first
        held_gpus = float((self.held_now * self.gpu_per_unit).sum())
        fits = float((self.peak * self.gpu_per_unit).sum()) <= held_gpus
        if not fits and policy.park_when_short:
            # (Policy.park_when_short) the same term with each target at most what the platform
            # holds now: a platform below its peak pays for what it gives, nobody gains by pulling
            self.peak = np.minimum(self.peak, self.held_now)
            fits = True
        self.park = (policy.peak_weight > 0 and policy.kind in ("reactive", "predictive") and bool((self.peak > 0).any())
                     and fits)

    # ---- construction
    def _avail(self, minutes: float) -> tuple[float, ...]:
        return tuple(float(np.clip(h + 1 - minutes / 60.0, 0.0, 1.0)) for h in range(self.hours))

    def _build(self, at) -> None:
        pol = self.policy
        groups: dict[tuple, _Class] = {}
        option_sets: dict[tuple, tuple[_Option, ...]] = {}  # nodes alike share one option set (built once)
        for r in self.records:
            i = self.pidx[r.owner]
            self.current_count[i] += 1
            unit = self.units[r.owner]
            if r.in_handover:
                minutes = pol.move_minutes if r.available_in_minutes is None else float(r.available_in_minutes)
                layout = ideal_layout(r, unit)
                self.fixed.append((i, node_capacity(r, unit, layout), self._avail(minutes)))
                self.fixed_held[i] += node_capacity(r, unit, layout)
                self.fixed_count[i] += 1
                if r.home is not None and r.home != r.owner and r.home in self.pidx:
                    self.fixed_lent[self.pidx[r.home]] += 1
                    self.fixed_borrowed[i] += 1
                continue
            self.idle_gpus[i] += max(0.0, r.gpus - r.busy_gpus)
            idle = r.busy_gpus <= 1e-9
            cooling = (
                at is not None and r.last_moved_at is not None and at - r.last_moved_at < pd.Timedelta(hours=pol.cooldown_hours)
            )
            can_move = (idle or pol.allow_evict) and not cooling
            okey = self._option_key(r, idle, can_move)
            options = option_sets.get(okey)
            if options is None:
                options = option_sets[okey] = self._options(r, idle, can_move)
            home = r.home if self.limited else None
            key = (r.owner, r.gpus, options, home)
            if key not in groups:
                groups[key] = _Class(r.owner, r.gpus, options, [], len(options) > 1, home)
            groups[key].members.append(r)
        for key in sorted(groups, key=lambda k: min(m.name for m in groups[k].members)):
            cls = groups[key]
            # the members that move first: longest since their last move, then by name
            cls.members.sort(key=lambda m: (m.last_moved_at is not None,
                                            m.last_moved_at or pd.Timestamp(0, tz="UTC"), m.name))
            self.classes.append(cls)
        self._build_slots()
        self.lent_now, self.borrowed_now = self.ownership_counts(self.counts_keep())

    @staticmethod
    def _option_key(r: NodeRecord, idle: bool, can_move: bool) -> tuple:
        """What a node's options depend on: nodes with the same key have the same options."""
        return (r.owner, r.gpus, r.mig_capable, r.mig_layout, idle, can_move)

    def _options(self, r: NodeRecord, idle: bool, can_move: bool) -> tuple[_Option, ...]:
        """Keep, re-layout (an idle node whose best layout for its holder serves more) and a move
        to each other platform (a node that may move)."""
        pol, unit = self.policy, self.units[r.owner]
        keep = _Option("keep", r.owner, node_capacity(r, unit, r.mig_layout), (1.0,) * self.hours, 0.0,
                       r.mig_layout)
        options = [keep]
        best = ideal_layout(r, unit)
        if idle and best != r.mig_layout and node_capacity(r, unit, best) > keep.capacity:
            options.append(_Option("relayout", r.owner, node_capacity(r, unit, best),
                                   self._avail(LAYOUT_CHANGE_MINUTES), LAYOUT_CHANGE_COST, best))
        if can_move:
            for p in self.platforms:
                if p == r.owner:
                    continue
                layout = ideal_layout(r, self.units[p])
                cost = pol.move_cost + (LAYOUT_CHANGE_COST if layout != r.mig_layout else 0.0)
                options.append(_Option("move", p, node_capacity(r, self.units[p], layout),
                                       self._avail(pol.move_minutes), cost, layout))
        return tuple(options)

    def ownership_counts(self, counts) -> tuple[np.ndarray, np.ndarray]:
        """Nodes each platform owns that others hold, and nodes of others it holds, after ``counts``."""
        lent, borrowed = self.fixed_lent.copy(), self.fixed_borrowed.copy()
        for cls, row in zip(self.classes, counts):
            if cls.home is None or cls.home not in self.pidx:
                continue
            for opt, n in zip(cls.options, row):
                if n and opt.target != cls.home:
                    lent[self.pidx[cls.home]] += n
                    borrowed[self.pidx[opt.target]] += n
        return lent, borrowed

    def ownership_caps(self) -> tuple[np.ndarray, np.ndarray]:
        """The most each platform may lend and borrow (inf: no limit); a plan never goes past a
        limit nor further past one it is already past (a limit set while more was lent)."""
        caps = []
        for which, now in (("lend_limit", self.lent_now), ("borrow_limit", self.borrowed_now)):
            lim = np.array([np.inf if self.policy.limit(p, which) is None else float(self.policy.limit(p, which))
                            for p in self.platforms])
            caps.append(np.maximum(lim, now))
        return caps[0], caps[1]

    def _build_slots(self) -> None:
        """Cut each horizon hour where some node starts serving: capacity is constant in each slot.

        A node that serves the last ``a`` of an hour counts fully from ``1 - a`` on and not at all
        before, instead of as ``a`` of a node for the whole hour: with the hour's demand the same
        all hour, ``E[(D - c)+]`` over the slots is exact where the fractional node overstated
        what an arriving node saves (it covers the hour's second half, not half of every step).
        """
        avails = [o.avail for c in self.classes for o in c.options] + [a for _, _, a in self.fixed]
        slots: list[tuple[int, float, float]] = []
        for h in range(self.hours):
            cuts = sorted({0.0, 1.0} | {round(1.0 - a[h], 9) for a in avails if 0.0 < a[h] < 1.0})
            slots += [(h, s0, s1 - s0) for s0, s1 in zip(cuts[:-1], cuts[1:])]
        self.slot_hour = np.array([h for h, _, _ in slots], dtype=int)
        self.slot_start = np.array([s0 for _, s0, _ in slots])
        self.slot_len = np.array([ln for _, _, ln in slots])
        self.slot_mean = self.mean[:, self.slot_hour]
        self.slot_sigma = self.sigma[:, self.slot_hour]
        self.fixed_cap = np.zeros((len(self.platforms), len(slots)))  # per slot
        for i, capacity, avail in self.fixed:
            self.fixed_cap[i] += capacity * self._present(avail)

    def _present(self, avail: tuple[float, ...]) -> np.ndarray:
        """True in the slots where a node serving the last ``avail`` of each hour is there."""
        a = np.asarray(avail, dtype=float)[self.slot_hour]
        return (a > 0.0) & (1.0 - a <= self.slot_start + 1e-9)

    # ---- evaluation (exact)
    def counts_keep(self) -> list[list[int]]:
        """The 'change nothing' solution: every member keeps."""
        return [[len(c.members)] + [0] * (len(c.options) - 1) for c in self.classes]

    def capacity(self, counts) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        cap = self.fixed_cap.copy()
        held = self.fixed_held.copy()
        nodes = self.fixed_count.copy()
        for cls, row in zip(self.classes, counts):
            for opt, n in zip(cls.options, row):
                if n:
                    i = self.pidx[opt.target]
                    cap[i] += n * opt.capacity * self._present(opt.avail)
                    held[i] += n * opt.capacity
                    nodes[i] += n
        return cap, held, nodes

    def evaluate(self, counts) -> tuple[float, dict[str, float]]:
        """Exact objective of a solution and expected unmet per platform (units x hours)."""
        cap, held, nodes = self.capacity(counts)
        per_slot = expected_unmet(cap, self.slot_mean, self.slot_sigma) * self.slot_len
        unmet = np.zeros((len(self.platforms), self.hours))
        for h in range(self.hours):
            unmet[:, h] = per_slot[:, self.slot_hour == h].sum(axis=1)
        g = self.gpu_per_unit[:, None]
        obj = float((self.weight[:, None] * g * unmet).sum())
        obj += self.policy.idle_weight * float((g * (held[:, None] - self.mean + unmet)).sum())
        obj += sum(n * o.cost for cls, row in zip(self.classes, counts) for o, n in zip(cls.options, row))
        obj += _BOUND_PENALTY * float(self._violation(nodes).sum())
        if self.policy.source_risk > 0:
            given_up = np.clip(expected_unmet(held, self.far_mean, self.far_sigma) - self.far_now, 0.0, None)
            obj += self.policy.source_risk * float((self.weight * self.gpu_per_unit * given_up).sum())
        if self.park:
            obj += self.policy.peak_weight * float((self.gpu_per_unit * np.clip(self.peak - held, 0.0, None)).sum())
        return obj, {p: float(unmet[i].sum()) for p, i in self.pidx.items()}

    def _bounds(self) -> tuple[np.ndarray, np.ndarray]:
        lo = np.array([self.policy.min_nodes.get(p, 0) for p in self.platforms], dtype=float)
        hi = np.array([self.policy.max_nodes.get(p, np.inf) for p in self.platforms], dtype=float)
        return lo, hi

    def _violation(self, nodes: np.ndarray) -> np.ndarray:
        lo, hi = self._bounds()
        return np.clip(lo - nodes, 0, None) + np.clip(nodes - hi, 0, None)

    def feasible(self, counts) -> bool:
        """Hard constraints: move budget, idle GPUs at each source, bounds never made worse."""
        moves = 0
        leaving = np.zeros(len(self.platforms))
        for cls, row in zip(self.classes, counts):
            for opt, n in zip(cls.options, row):
                if opt.kind == "move" and n:
                    moves += n
                    leaving[self.pidx[cls.owner]] += n * cls.gpus
        if moves > self.policy.max_moves_per_decision:
            return False
        if not self.policy.allow_evict and (leaving > self.idle_gpus + 1e-9).any():
            return False
        if self.limited:
            lent, borrowed = self.ownership_counts(counts)
            lend_cap, borrow_cap = self.ownership_caps()
            if (lent > lend_cap + 1e-9).any() or (borrowed > borrow_cap + 1e-9).any():
                return False
        _, _, nodes = self.capacity(counts)
        return bool((self._violation(nodes) <= self._violation(self.current_count) + 1e-9).all())

    # ---- MILP
    def solve_milp(self) -> tuple[list[list[int]], str]:
        """The exact program over the node classes (expected unmet by its tangent envelope)."""
        var_index = [(k, o) for k, cls in enumerate(self.classes) for o in range(len(cls.options))]
        c, at = self._milp_costs(var_index)
        rows: list[np.ndarray] = []
        lbs: list[float] = []
        ubs: list[float] = []

        def add(coefs: dict[int, float], lb: float, ub: float) -> None:
            row = np.zeros(len(c))
            for j, v in coefs.items():
                row[j] += v
            rows.append(row)
            lbs.append(lb)
            ubs.append(ub)

        self._milp_unmet_rows(var_index, at, add)
        self._milp_limit_rows(var_index, at, add)
        ny = len(var_index)
        integrality = np.zeros(len(c))
        integrality[:ny] = 1
        ub = np.full(len(c), np.inf)
        for j, (k, _) in enumerate(var_index):
            ub[j] = len(self.classes[k].members)
        try:
            res = milp(
                c,
                integrality=integrality,
                bounds=Bounds(np.zeros(len(c)), ub),
                constraints=LinearConstraint(np.array(rows), np.array(lbs), np.array(ubs)),
                options={"time_limit": SOLVER_TIME_LIMIT_S, "disp": False},
            )
        except (ValueError, RuntimeError) as exc:
            raise SolverFailed(str(exc)) from exc
        if res.x is None or res.status not in (0, 1):
            raise SolverFailed(f"status {res.status}: {res.message}")
        x = np.round(res.x[:ny]).astype(int)
        counts = [[0] * len(cls.options) for cls in self.classes]
        for j, (k, o) in enumerate(var_index):
            counts[k][o] = int(x[j])
        if not self.feasible(counts) or any(sum(r) != len(c.members) for r, c in zip(counts, self.classes)):
            raise SolverFailed("rounded solution violates a constraint")
        status = "optimal" if res.status == 0 else "time limit, best found"
        return counts, status

    def _milp_costs(self, var_index: list[tuple[int, int]]) -> tuple[np.ndarray, dict[str, int]]:
        """The objective's coefficients and where each block of variables starts: the options
        chosen (y), U[p,slot], under[p], over[p], (source risk V[p]), (park Z[p])."""
        P, H = len(self.platforms), len(self.slot_len)  # H: slots of the horizon
        ny = len(var_index)
        n_far = P if self.policy.source_risk > 0 else 0
        n = ny + P * H + 2 * P + n_far + (P if self.park else 0)
        at = {"u": ny, "s": ny + P * H, "v": ny + P * H + 2 * P, "z": ny + P * H + 2 * P + n_far}
        c = np.zeros(n)
        g = self.gpu_per_unit
        idle_w = self.policy.idle_weight
        for j, (k, o) in enumerate(var_index):
            opt = self.classes[k].options[o]
            c[j] = opt.cost + idle_w * g[self.pidx[opt.target]] * opt.capacity * self.hours
        for i in range(P):
            for h in range(H):
                c[at["u"] + i * H + h] = (self.weight[i] + idle_w) * g[i] * self.slot_len[h]
        c[at["s"]:at["v"]] = _BOUND_PENALTY
        _, hi = self._bounds()
        for i in range(P):
            if not np.isfinite(hi[i]):  # no upper bound: nothing to be over
                c[at["s"] + P + i] = 0.0
        if n_far:
            c[at["v"]:at["z"]] = self.policy.source_risk * self.weight * g
        if self.park:
            c[at["z"]:] = self.policy.peak_weight * g
        return c, at

    def _milp_unmet_rows(self, var_index, at: dict[str, int], add) -> None:
        """One option per member; the expected-unmet envelope per slot; the source-risk and park terms."""
        H = len(self.slot_len)
        u0, v0, z0 = at["u"], at["v"], at["z"]
        for k, cls in enumerate(self.classes):  # every member gets exactly one option
            add({j: 1.0 for j, (kk, _) in enumerate(var_index) if kk == k}, len(cls.members), len(cls.members))
        present = {j: self._present(self.classes[k].options[o].avail) for j, (k, o) in enumerate(var_index)}
        for i, p in enumerate(self.platforms):  # expected unmet envelope, per slot
            for h in range(H):
                for a, b in _tangents(float(self.slot_mean[i, h]), float(self.slot_sigma[i, h])):
                    coefs = {u0 + i * H + h: 1.0}
                    for j, (k, o) in enumerate(var_index):
                        opt = self.classes[k].options[o]
                        if opt.target == p and present[j][h]:
                            coefs[j] = coefs.get(j, 0.0) + b * opt.capacity
                    add(coefs, a - b * float(self.fixed_cap[i, h]), np.inf)
        far = self.policy.source_risk > 0
        for i, p in enumerate(self.platforms) if far else ():  # V[p] >= F_p(held) - F_p(held now), >= 0
            fixed_held = float(self.fixed_held[i])
            lines = _tangents(float(self.far_mean[i]), float(self.far_sigma[i]), _FAR_TANGENT_Z)
            # the envelope's own value now, so that keeping everything costs exactly 0
            now = max(0.0, max(a - b * float(self.held_now[i]) for a, b in lines))
            for a, b in lines:
                coefs = {v0 + i: 1.0}
                for j, (k, o) in enumerate(var_index):
                    opt = self.classes[k].options[o]
                    if opt.target == p:
                        coefs[j] = coefs.get(j, 0.0) + b * opt.capacity
                add(coefs, a - b * fixed_held - now, np.inf)
        for i, p in enumerate(self.platforms) if self.park else ():  # Z[p] >= peak - held, >= 0
            coefs = {z0 + i: 1.0}
            for j, (k, o) in enumerate(var_index):
                opt = self.classes[k].options[o]
                if opt.target == p:
                    coefs[j] = coefs.get(j, 0.0) + opt.capacity
            add(coefs, float(self.peak[i] - self.fixed_held[i]), np.inf)

    def _milp_limit_rows(self, var_index, at: dict[str, int], add) -> None:
        """The move budget, idle GPUs at each source, and the soft node bounds (never made worse)."""
        P, s0 = len(self.platforms), at["s"]
        move_vars = {j: 1.0 for j, (k, o) in enumerate(var_index) if self.classes[k].options[o].kind == "move"}
        if move_vars:
            add(move_vars, -np.inf, self.policy.max_moves_per_decision)
        if not self.policy.allow_evict:
            for i, p in enumerate(self.platforms):
                coefs = {j: float(self.classes[k].gpus) for j, (k, o) in enumerate(var_index)
                         if self.classes[k].owner == p and self.classes[k].options[o].kind == "move"}
                if coefs:
                    add(coefs, -np.inf, float(self.idle_gpus[i]))
        if self.limited:
            self._milp_ownership_rows(var_index, add)
        lo, hi = self._bounds()
        now_viol = self._violation(self.current_count)
        for i, p in enumerate(self.platforms):
            coefs = {j: 1.0 for j, (k, o) in enumerate(var_index) if self.classes[k].options[o].target == p}
            fixed = float(self.fixed_count[i])
            # soft bounds: nodes + under >= lo ; nodes - over <= hi
            add({**coefs, s0 + i: 1.0}, lo[i] - fixed, np.inf)
            if np.isfinite(hi[i]):
                add({**coefs, s0 + P + i: -1.0}, -np.inf, hi[i] - fixed)
            # hard: never further outside than now
            add({s0 + i: 1.0, s0 + P + i: 1.0}, -np.inf, float(now_viol[i]))

    def _milp_ownership_rows(self, var_index, add) -> None:
        """Each platform's owned nodes held by others at most its lend cap, others' nodes it holds
        at most its borrow cap (:meth:`ownership_caps`)."""
        lend_cap, borrow_cap = self.ownership_caps()
        for i, p in enumerate(self.platforms):
            lends = {j: 1.0 for j, (k, o) in enumerate(var_index)
                     if self.classes[k].home == p and self.classes[k].options[o].target != p}
            if lends and np.isfinite(lend_cap[i]):
                add(lends, -np.inf, float(lend_cap[i] - self.fixed_lent[i]))
            borrows = {j: 1.0 for j, (k, o) in enumerate(var_index)
                       if self.classes[k].home not in (None, p) and self.classes[k].home in self.pidx
                       and self.classes[k].options[o].target == p}
            if borrows and np.isfinite(borrow_cap[i]):
                add(borrows, -np.inf, float(borrow_cap[i] - self.fixed_borrowed[i]))

    # ---- greedy
    def greedy(self) -> list[list[int]]:
        """Apply the single best action while it lowers the exact objective."""
        counts = self.counts_keep()
        best_obj, _ = self.evaluate(counts)
        while True:
            best = None
            for k, cls in enumerate(self.classes):
                if counts[k][0] == 0:
                    continue
                for o in range(1, len(cls.options)):
                    trial = [row[:] for row in counts]
                    trial[k][0] -= 1
                    trial[k][o] += 1
                    if not self.feasible(trial):
                        continue
                    obj, _ = self.evaluate(trial)
                    if obj < best_obj - 1e-9 and (best is None or obj < best[0] - 1e-12):
                        best = (obj, trial)
            if best is None:
                return counts
            best_obj, counts = best

    # ---- fair share between borrowers
    def shares(self, counts) -> np.ndarray:
        """Each platform's GPUs held after ``counts`` over the GPUs it owns (inf: owns none)."""
        held = self._held_gpus(counts)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(self.owned_gpus > 0, held / np.maximum(self.owned_gpus, 1e-12), np.inf)

    def _held_gpus(self, counts) -> np.ndarray:
        held = np.zeros(len(self.platforms))
        for r in self.records:
            if r.in_handover:
                held[self.pidx[r.owner]] += r.gpus
        for cls, row in zip(self.classes, counts):
            for opt, n in zip(cls.options, row):
                held[self.pidx[opt.target]] += n * cls.gpus
        return held

    def fair_share(self, counts, reasons: list[str], ceiling: float = np.inf) -> list[list[int]]:
        """Where two platforms could take the same moving node equally well (exact objectives
        within :data:`FAIR_TIE`), the one further below its nominal share (GPUs held over GPUs
        owned, as Kueue's and KAI's fair sharing rank borrowers) gets it.

        One node at a time changes target, each change lowering the larger of the two platforms'
        shares, so the search ends; the plan stays feasible and within the tie of the objective it
        started from (and never above ``ceiling``, the objective of changing nothing). Without owners (no node has a ``home``) the plan is returned unchanged."""
        if not (self.owned_gpus > 0).any():
            return counts
        counts = [row[:] for row in counts]
        limit = min(self.evaluate(counts)[0] + FAIR_TIE, ceiling)
        while True:
            share = self.shares(counts)
            best = None
            for k, cls in enumerate(self.classes):
                for o1, opt1 in enumerate(cls.options):
                    if opt1.kind != "move" or counts[k][o1] == 0:
                        continue
                    p = self.pidx[opt1.target]
                    for o2, opt2 in enumerate(cls.options):
                        q = self.pidx[opt2.target]
                        if opt2.kind != "move" or q == p or not self.owned_gpus[q] > 0:
                            continue
                        after_q = share[q] + cls.gpus / self.owned_gpus[q]
                        if not after_q < share[p] - 1e-9:
                            continue
                        key = (-share[p], after_q, opt1.target, opt2.target, k)
                        if best is not None and key >= best[0]:
                            continue
                        trial = [row[:] for row in counts]
                        trial[k][o1] -= 1
                        trial[k][o2] += 1
                        if self.feasible(trial) and self.evaluate(trial)[0] <= limit + 1e-12:
                            best = (key, trial, opt1.target, opt2.target)
            if best is None:
                return counts
            _, counts, p_name, q_name = best
            share = self.shares(counts)
            reasons.append(f"fair share: a node goes to {q_name} ({share[self.pidx[q_name]]:.0%} of what it owns "
                           f"after) rather than {p_name}, which serves no better")

    # ---- from counts to named nodes
    def realise(self, counts, reasons: list[str]):
        total_obj, _ = self.evaluate(counts)
        moves: list[Move] = []
        changes: list[LayoutChange] = []
        targets: dict[str, str] = {r.name: r.owner for r in self.records}
        for k, (cls, row) in enumerate(zip(self.classes, counts)):
            # the members sorted first are the ones that act
            acting = sum(row[1:])
            movers = cls.members[:acting]
            it = iter(movers)
            for o, n in enumerate(row):
                if o == 0 or n == 0:
                    continue
                opt = cls.options[o]
                without = [r[:] for r in counts]
                without[k][o] -= 1
                without[k][0] += 1
                gain = round(self.evaluate(without)[0] - total_obj, 6)
                for _ in range(n):
                    node = next(it)
                    targets[node.name] = opt.target
                    i = self.pidx[opt.target]
                    if opt.kind == "move":
                        why = (f"{opt.target}: expected unmet over {self.hours}h falls by {gain:.2f} GPU-h "
                               f"net of costs; {cls.owner} has {self.idle_gpus[self.pidx[cls.owner]]:.0f} idle GPUs")
                        if self.park and self.held_now[i] < self.peak[i]:
                            why += (f"; {opt.target} held {self.held_now[i]:.0f} against its last week's peak of "
                                    f"{self.peak[i]:.0f}")
                        moves.append(Move(node.name, cls.owner, opt.target, node.gpus, gain, opt.layout, why))
                    else:
                        why = (f"{opt.target} asks for {self.units[opt.target]}; re-layout adds "
                               f"{opt.capacity - cls.options[0].capacity:.0f} units, mean demand "
                               f"{self.mean[i].mean():.1f}")
                        changes.append(LayoutChange(node.name, opt.target, node.mig_layout, opt.layout or "", gain, why))
        moves.sort(key=lambda m: (-m.expected_gain, m.node))
        changes.sort(key=lambda c: (-c.expected_gain, c.node))
        if not moves and not changes:
            reasons.append("no change lowers the expected cost")
        return moves, changes, targets
