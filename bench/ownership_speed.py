"""Ownership at fleet scale: the hourly plan with lend and borrow limits over 12,500 8-GPU nodes of
three platforms, beside the same plan without limits (today's), in one run.

    nice -n 5 .venv/bin/python bench/ownership_speed.py [--nodes 12500] [--repeat 3] [--moves 4,250]
        [--quick]

The world: OpenStack, Slurm and Kubernetes hold a third of the nodes each and each owns what it
holds (``NodeRecord.home``), but for ``--lent`` of each of OpenStack's and Kubernetes' nodes Slurm
holds already (borrowed before this plan). 70 % of every platform's nodes run work, one node in
13 moved within the last three hours (some of them still cooling down), ``--flying`` nodes are in
a handover to Slurm, each arriving at a minute of its own (every arrival cuts the plan's hours
into slots). Slurm's demand is above what it holds; OpenStack and Kubernetes have idle nodes to
spare. The limits: OpenStack ``lend_limit`` and Kubernetes ``lend_limit`` a little above what they
lend now, Kubernetes ``borrow_limit`` 10, Slurm ``borrow_limit`` a little above what it borrows:
with a large move budget they bind, so the plan with limits moves fewer nodes than today's.

Legs, each run ``--repeat`` times, alternating (the median is printed), for each move budget of
``--moves`` (``max_moves_per_decision``: 4, the default, and a fleet's hourly budget) and for the
MILP (the plan's solver) and the greedy search (its fallback when the MILP fails):

* today: :func:`gpupool.decisions.planner.plan` with no ``ownership`` (nodes are not told apart by
  owner; what production plans today);
* with ownership: the same call with the limits above (classes split by owner, the lend and borrow
  rows in the program, the greedy's feasibility counting them).

The inputs are :class:`~gpupool.decisions.planner.NodeRecord` built in the bench: the staging reads
that build them in production (:func:`gpupool.jobs.allocation.plan_from_staging`) are the same with
or without limits and are timed at this size by ``bench/parking_speed.py``. Bar (issue 42): the
plan with ownership constraints for 12,500 nodes in under 30 s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import pandas as pd

PLATFORMS = ("openstack", "slurm", "kubernetes")
AT = pd.Timestamp("2026-06-03 12:00", tz="UTC")
TARGET_S = 30.0
BUSY_SHARE = 0.7
HOURS = 6


def world(n: int, gpus: int, lent: float, flying: int):
    """The nodes (module docstring), their demand and the limits; how many each platform lends."""
    from gpupool.decisions.planner import NodeRecord

    per = {"openstack": n - 2 * (n // 3), "slurm": n // 3, "kubernetes": n // 3}
    nodes = []
    for p, count in per.items():
        for k in range(count):
            name = f"{p[:3]}-{k:05d}"
            busy = float(gpus) if k % 10 < BUSY_SHARE * 10 else 0.0
            moved = AT - pd.Timedelta(minutes=20 * (k % 10)) if k % 13 == 0 else None
            holder = "slurm" if p != "slurm" and k % round(1 / lent) == 1 else p  # lent before this plan
            nodes.append(NodeRecord(name, holder, gpus, busy if holder == p else float(gpus), last_moved_at=moved,
                                    home=p))
    lending = {p: sum(1 for r in nodes if r.home == p and r.owner != p) for p in PLATFORMS}
    for i in range(flying):  # idle OpenStack nodes on their way to Slurm
        j = next(k for k, r in enumerate(nodes) if r.home == "openstack" and r.owner == "openstack"
                 and r.busy_gpus == 0 and r.last_moved_at is None)
        nodes[j] = NodeRecord(nodes[j].name, "slurm", gpus, 0.0, in_handover=True,
                              available_in_minutes=float(3 + 27 * i / max(flying, 1)), home="openstack")
    held = {p: sum(r.gpus for r in nodes if r.owner == p) for p in PLATFORMS}
    demand = {"openstack": {"mean": [0.75 * held["openstack"]] * HOURS, "upper": [0.8 * held["openstack"]] * HOURS},
              "slurm": {"mean": [1.05 * held["slurm"]] * HOURS, "upper": [1.1 * held["slurm"]] * HOURS},
              "kubernetes": {"mean": [0.72 * held["kubernetes"]] * HOURS,
                             "upper": [0.77 * held["kubernetes"]] * HOURS}}
    away = {p: sum(1 for r in nodes if r.home == p and r.owner != p) for p in PLATFORMS}
    borrowing = sum(away.values())
    limits = {"openstack": {"lend_limit": away["openstack"] + 40},
              "kubernetes": {"lend_limit": away["kubernetes"] + 30, "borrow_limit": 10},
              "slurm": {"borrow_limit": borrowing + 60}}
    return nodes, demand, limits, away


def leg(nodes, demand, policy, solver: str) -> dict:
    from gpupool.decisions.planner import plan

    t0 = time.perf_counter()
    out = plan(nodes, demand, policy, at=AT, solver=solver)
    return {"s": time.perf_counter() - t0, "moves": len(out.moves), "solver": out.solver, "status": out.status,
            "objective": out.objective_after}


def main() -> int:
    from gpupool.config import Ownership
    from gpupool.decisions.demand import PlatformDemand
    from gpupool.decisions.layouts import node_records
    from gpupool.decisions.plan_model import PlanModel
    from gpupool.decisions.policy import Policy

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=12_500)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--moves", default="4,250", help="move budgets (max_moves_per_decision), comma-separated")
    ap.add_argument("--lent", type=float, default=0.01, help="share of OpenStack's and Kubernetes' nodes Slurm holds")
    ap.add_argument("--flying", type=int, default=20, help="nodes in a handover to Slurm")
    ap.add_argument("--quick", action="store_true", help="1,250 nodes, one repeat (while developing)")
    args = ap.parse_args()
    if args.quick:
        args.nodes, args.repeat = 1_250, 1
    budgets = [int(b) for b in args.moves.split(",")]

    nodes, demand, limits, away = world(args.nodes, args.gpus, args.lent, args.flying)
    ownership = {p: Ownership(**kw) for p, kw in limits.items()}
    print(f"ownership at fleet scale: {args.nodes:,} nodes x {args.gpus} GPUs over {', '.join(PLATFORMS)}, each owning "
          f"what it holds; lent before the plan (to Slurm): " + ", ".join(f"{p} {away[p]}" for p in PLATFORMS if away[p])
          + f" ({args.flying} of OpenStack's in a handover, arriving over 30 minutes); "
          f"{BUSY_SHARE:.0%} busy; Slurm's demand 5 % above what it holds; horizon {HOURS} h, predictive")
    print("limits: " + "; ".join(f"{p} " + ", ".join(f"{k} {v}" for k, v in kw.items()) for p, kw in limits.items()))

    t = time.perf_counter()
    records = node_records(nodes)
    checked = time.perf_counter() - t
    platforms = list(PLATFORMS)
    demands = {p: PlatformDemand.coerce(p, demand[p]) for p in platforms}
    t = time.perf_counter()
    model = PlanModel(records, platforms, demands, Policy(ownership=ownership, max_moves_per_decision=max(budgets)),
                      HOURS, AT)
    built = time.perf_counter() - t
    free = PlanModel(records, platforms, demands, Policy(max_moves_per_decision=max(budgets)), HOURS, AT)
    options = sum(len(c.options) for c in model.classes)
    print(f"the model with limits: {len(model.classes)} node classes ({len(free.classes)} without limits), "
          f"{options} option variables, {len(model.slot_len)} slots over {HOURS} h; the inputs checked in "
          f"{checked * 1000:.0f} ms, the model built in {built * 1000:.0f} ms")
    print()
    print(f"| plan ({args.nodes:,} nodes, median of {args.repeat}) | moves today | moves with limits | today | "
          "with ownership | ratio | target | met |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    worst = 0.0
    for budget in budgets:
        for solver in ("milp", "greedy"):
            today_policy = Policy(max_moves_per_decision=budget)
            own_policy = Policy(max_moves_per_decision=budget, ownership=ownership)
            today, own = [], []
            for _ in range(args.repeat):
                today.append(leg(nodes, demand, today_policy, solver))
                own.append(leg(nodes, demand, own_policy, solver))
            a, b = statistics.median(r["s"] for r in today), statistics.median(r["s"] for r in own)
            worst = max(worst, b)
            label = "MILP" if solver == "milp" else "greedy (the MILP's fallback)"
            note = "" if own[0]["solver"] == solver else f" ({own[0]['status']})"
            print(f"| {label}, max_moves_per_decision {budget} | {today[0]['moves']} | {own[0]['moves']}{note} | "
                  f"{a:.2f} s | {b:.2f} s | {b / a:.2f} | < {TARGET_S:.0f} s | {'MET' if b < TARGET_S else 'NOT MET'} |")
    print()
    print("today: plan() with no ownership (owners not told apart); with ownership: the same call with the "
          "limits above. Ratio: with ownership / today, measured in this run, legs alternating. Measured on a "
          "shared machine (2 cores, other work running): figures are indicative, the ratio is the comparison.")
    print(f"\nslowest plan with ownership: {worst:.2f} s; load average at the end: {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    from _tables import record_run  # bench/ is sys.path[0] when a bench is run

    raise SystemExit(record_run(lambda argv: "ownership_speed-quick" if "--quick" in argv else "ownership_speed", main))
