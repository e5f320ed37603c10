"""Which platform should hold each pool node for the coming hours: a mixed-integer program.

Inputs
------
* the pool inventory — one :class:`NodeRecord` per node (owner, GPUs, busy GPUs, whether it is in
  a handover, when it last moved, its MIG capability and layout);
* each platform's demand for the next hours — :class:`PlatformDemand` (``decisions.demand``,
  whose :func:`~gpupool.decisions.demand.plan_demand` makes it) in the platform's unit;
* the :class:`~gpupool.decisions.policy.Policy`. Nodes and their MIG layouts: ``decisions.layouts``.

Model
-----
Demand of platform ``p`` in hour ``h`` is taken as Normal with the given mean and the spread
implied by the upper quantile; for ``reactive`` and ``predictive`` that upper is at least
``1 + Policy.min_headroom`` times the mean where the pool could give every platform that much at
once, since a spread read from a week in which demand sat still says it cannot rise, and such a
platform then gives away every idle node. The expected unmet demand ``E[(D - c)+]`` is convex in the capacity
``c``; the program represents it exactly at a set of tangent points (a convex piecewise-linear
lower envelope), so "expected unmet" stays linear. The planner minimises

    sum_{p,h} w_p * g_p * U[p,h]                          (weighted expected unmet, GPU-hours)
  + idle_weight * sum_{p,h} g_p * (held[p] - mean[p,h] + U[p,h])   (expected idle held capacity)
  + move_cost * moves + LAYOUT_CHANGE_COST * re-layouts
  + source_risk * sum_p w_p * g_p * (F_p(held_after[p]) - F_p(held_now[p]))+   (what a source gives up later)
  + peak_weight * sum_p g_p * (peak[p] - held_after[p])+   (reactive, predictive: spare nodes park where demand has been)

where ``F_p(c) = E[(D_p - c)+]`` one horizon further out: demand as in the last horizon hour with
its spread grown as a random walk's (``sqrt 2`` for twice the lead time). Within the horizon two
sources that both keep enough look equally safe; the last term breaks that tie toward the source
with the most headroom left after giving (the platform with the largest surplus in its own spread
units), and, being small, it does not outweigh a real difference in expected unmet within the
horizon.

and ``peak[p]`` is the platform's highest hourly demand over the last week
(:attr:`PlatformDemand.peak`). The last term is small, and on only where the pool could hold
every platform's peak at once: it parks the nodes the pool can spare with platforms that held
more demand lately than they hold nodes now.

``g_p`` converts the platform's unit to GPUs. A node that moves serves nobody for
``move_minutes``; a node leaves its source at once. Each hour is cut into slots where some node
starts serving (a move's arrival, a re-layout's end, a handover in flight), ``U[p,h]`` is the
slot-length-weighted sum of each slot's expected unmet, and a node counts fully in the slots
after it arrives and not at all before: an arriving node is credited with the part of the hour
it really serves. Identical nodes are grouped into classes with integer counts, so the program is
small and its solution unique up to the deterministic choice of which member moves (idempotent).

Constraints: each node has one target; at most ``max_moves_per_decision`` moves; only idle nodes
(``busy_gpus == 0``, unless the policy may evict), not in a handover and out of their cool-down
may move, and the GPUs leaving a platform never exceed its idle GPUs; per-platform min/max node
counts are soft (large penalty) but never made worse than they are now; with owners
(``NodeRecord.home``) and a platform's ``lend_limit`` or ``borrow_limit``, nodes lent and
borrowed stay within them. If the MILP solver fails, a greedy search over single actions on the
same exact objective is used and the plan says so.

Fair share: with owners known, where two platforms could take the same moving node equally well
(exact objectives within ``FAIR_TIE``), the one holding the least of what it owns gets it
(:meth:`PlanModel.fair_share`, the borrowers' order of Kueue's and KAI's fair sharing). It only
breaks ties: a platform whose need weighs more still gets the node.

Where it lives: :func:`plan` here (the inputs, the policy's headroom floor, the bounds' check);
the model over node classes, its exact objective, the MILP and the greedy search in
:mod:`gpupool.decisions.plan_model`; the answer (:class:`Plan`, :class:`Move`,
:class:`LayoutChange`) in :mod:`gpupool.decisions.plan_records`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from gpupool.values import utc
from gpupool.decisions.demand import PlatformDemand
from gpupool.decisions.layouts import (  # noqa: F401 - re-exported: the planner's inputs
    GPU_UNIT,
    SLICES_PER_GPU,
    WHOLE_LAYOUTS,
    NodeRecord,
    PlanningError,
    ideal_layout,
    node_capacity,
    node_records,
    units_per_gpu,
)
from gpupool.decisions.plan_model import (  # noqa: F401 - re-exported: the model's constants and envelope
    LAYOUT_CHANGE_COST,
    LAYOUT_CHANGE_MINUTES,
    SOLVER_TIME_LIMIT_S,
    PlanModel,
    SolverFailed,
    expected_unmet,
)
from gpupool.decisions.plan_records import LayoutChange, Move, Plan  # noqa: F401 - re-exported: the answer
from gpupool.decisions.policy import Policy


def _infeasible_bounds(policy: Policy, platforms: Sequence[str], nodes: int) -> str | None:
    """Why the platforms' node bounds cannot all hold with ``nodes`` nodes in all, or None.

    The bounds count every node a platform holds (movable or not), so only the whole inventory
    can tell: a pool listed in the configuration does not (its non-members count too)."""
    low = sum(policy.min_nodes.get(p, 0) for p in platforms)
    if low > nodes:
        return f"infeasible bounds: platforms' min_nodes add up to {low} but the platforms hold {nodes} nodes in all"
    if all(p in policy.max_nodes for p in platforms):
        high = sum(policy.max_nodes[p] for p in platforms)
        if high < nodes:
            return f"infeasible bounds: platforms' max_nodes add up to {high} but the platforms hold {nodes} nodes in all"
    return None


def plan(
    nodes: Iterable[NodeRecord | Mapping[str, Any]],
    demand: Mapping[str, PlatformDemand | Mapping[str, Any] | Sequence[float]],
    policy: Policy | None = None,
    at: str | pd.Timestamp | dt.datetime | None = None,
    solver: str = "auto",
) -> Plan:
    """Choose the target platform (and MIG layout) of every pool node.

    Parameters
    ----------
    nodes:
        The pool: :class:`NodeRecord` or mappings with the same keys (``platform`` is read as
        ``owner``). Order does not matter; names must be unique.
    demand:
        Platform -> demand over the next hours (:class:`PlatformDemand`, ``{mean, upper, unit}``
        or a sequence of certain numbers). A platform that owns nodes but has no demand entry is
        planned with zero demand.
    policy:
        The knobs; ``Policy()`` when omitted. ``kind="static"`` never moves anything.
    at:
        The decision time (for cool-downs); nodes' ``last_moved_at`` are compared with it.
    solver:
        ``"auto"`` (MILP, greedy if it fails), ``"milp"`` (MILP only; a failure raises) or
        ``"greedy"``.

    Returns
    -------
    Plan
        Same inputs, same plan.
    """
    policy = policy or Policy()
    at_ts = None if at is None else utc(at)
    records = node_records(nodes)
    platforms = sorted(set(demand) | {r.owner for r in records})
    demands = {p: PlatformDemand.coerce(p, demand[p]) if p in demand else None for p in platforms}
    horizons = {len(d.mean) for d in demands.values() if d is not None}
    if not horizons or 0 in horizons:
        raise PlanningError("demand: at least one platform with at least one hour of demand")
    hours = min(min(horizons), policy.plan_horizon_hours)
    reasons: list[str] = []
    for p in platforms:
        if demands[p] is None:
            demands[p] = PlatformDemand(mean=(0.0,) * hours, upper=(0.0,) * hours)
            reasons.append(f"{p}: no demand given, planned as zero")
    if policy.min_headroom > 0 and policy.kind in ("reactive", "predictive"):
        # only where the pool could give every platform that much above its mean at once: in a
        # short pool a floor on one platform's spread only reorders who goes short
        need = sum((1.0 + policy.min_headroom) * max(d.mean) / units_per_gpu(d.unit) for d in demands.values())
        if need <= sum(r.gpus for r in records):
            demands = {p: _with_min_headroom(d, policy.min_headroom) for p, d in demands.items()}
    infeasible = _infeasible_bounds(policy, platforms, len(records))
    if infeasible:
        reasons.append(infeasible)
    model = PlanModel(records, platforms, demands, policy, hours, at_ts)
    before = model.counts_keep()
    obj_before, unmet_before = model.evaluate(before)

    if policy.kind == "static":
        counts, used, status = before, "none", "static policy never moves"
    elif not any(c.movable for c in model.classes):
        counts, used, status = before, "none", "no node may change (busy, in handover or cooling down)"
    elif solver == "greedy":
        counts, used, status = model.greedy(), "greedy", "greedy (requested)"
    else:
        try:
            counts, status = model.solve_milp()
            used = "milp"
        except SolverFailed as exc:
            if solver == "milp":
                raise PlanningError(f"MILP failed: {exc}") from exc
            counts, used, status = model.greedy(), "greedy", f"greedy fallback: MILP failed ({exc})"
            reasons.append(status)
    obj_after, unmet_after = model.evaluate(counts)
    if obj_after > obj_before + 1e-9:  # never worse than doing nothing (approximation safety)
        reasons.append(f"solution ({obj_after:.3f}) not better than no change ({obj_before:.3f}); keeping all nodes")
        counts, obj_after, unmet_after = before, obj_before, unmet_before
    elif counts is not before:
        counts = model.fair_share(counts, reasons, ceiling=obj_before)
        obj_after, unmet_after = model.evaluate(counts)
    moves, changes, targets = model.realise(counts, reasons)
    if infeasible:  # the bounds are soft (penalised), so the solver still says "optimal": say why not
        status = f"{status}; {infeasible}"
    return Plan(
        at=at_ts,
        policy=policy.kind,
        solver=used,
        status=status,
        moves=tuple(moves),
        layout_changes=tuple(changes),
        targets=targets,
        expected_unmet_before={p: round(float(v), 6) for p, v in unmet_before.items()},
        expected_unmet_after={p: round(float(v), 6) for p, v in unmet_after.items()},
        objective_before=round(float(obj_before), 6),
        objective_after=round(float(obj_after), 6),
        reasons=tuple(reasons),
    )


def _with_min_headroom(demand: PlatformDemand, share: float) -> PlatformDemand:
    """``demand`` with every hour's ``upper`` at least ``(1 + share)`` times its mean."""
    mean = np.asarray(demand.mean, dtype=float)
    upper = np.maximum(np.asarray(demand.upper, dtype=float), mean * (1.0 + share))
    return PlatformDemand(mean=demand.mean, upper=tuple(round(float(v), 6) for v in upper), unit=demand.unit,
                          peak=demand.peak)
