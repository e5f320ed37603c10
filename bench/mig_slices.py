"""Slices against whole GPUs: the same slice demand planned as today (every platform in whole GPUs,
MIG off everywhere) and with the AI platform's ``slice_profile: 1g.10gb`` (the planner may lay its
MIG-capable nodes out for slices).

    nice -n 10 .venv/bin/python bench/mig_slices.py [--hours 168] [--seeds 5]

A planner-level replay: ``gpupool simulate``'s world counts demand in GPUs and has no MIG in its
serving, so it cannot show slices; this runs the production planner (``decisions.planner.plan``)
hour by hour on a two-platform pool and applies its moves and re-layouts at once. ``ai`` (4 H100
nodes of 8 GPUs) runs jobs that each fit a ``1g.10gb`` slice, ``hpc`` (4 A100 nodes) whole-GPU
jobs. A whole GPU serves one job of either; a GPU laid out as ``all-1g.10gb`` serves 7 ai jobs and
no hpc job. Demand is daily with noise, known one hour ahead (the planner's mean), its upper the
mean plus 20 %. At each decision the hour's jobs are packed onto each platform's nodes by name
(only idle nodes move or change layout); jobs run up to six hours and all end at each six-hour
boundary, when every node is idle. Both arms see the same demand and the same rules. Printed per arm: unmet ai slice-hours, unmet hpc GPU-hours, moves and re-layouts,
and the ratio of unmet ai slice-hours (slices / whole GPUs; below 1: slices serve more).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import replace

import numpy as np

from gpupool.decisions.layouts import GPU_UNIT, NodeRecord, node_capacity
from gpupool.decisions.planner import plan
from gpupool.decisions.policy import Policy

PROFILE = "1g.10gb"


def traces(hours: int, seed: int) -> dict[str, np.ndarray]:
    """ai jobs (slices) and hpc jobs (GPUs) per hour."""
    rng = np.random.default_rng(seed)
    t = np.arange(hours + 2)
    ai = 200 + 150 * np.sin(2 * np.pi * (t - 6) / 24) + rng.normal(0, 20, t.size)
    hpc = 14 + 6 * np.sin(2 * np.pi * (t + 6) / 24) + rng.normal(0, 2, t.size)
    return {"ai": np.clip(np.round(ai), 0, None), "hpc": np.clip(np.round(hpc), 0, None)}


def _busy(nodes: list[NodeRecord], platform: str, unit: str, load: float) -> list[NodeRecord]:
    """Pack ``load`` requests onto ``platform``'s nodes by name: each node's GPUs with work."""
    out = []
    for n in nodes:
        if n.owner != platform:
            out.append(n)
            continue
        cap = node_capacity(n, unit, n.mig_layout)
        take = min(cap, load)
        load -= take
        per_gpu = cap / n.gpus if cap else 1.0
        out.append(replace(n, busy_gpus=float(min(n.gpus, math.ceil(take / per_gpu - 1e-9)))))
    return out


def replay(hours: int, seed: int, slices: bool) -> dict[str, float]:
    """One arm: plan every hour, apply the plan, score the next hour."""
    nodes = [NodeRecord(f"ai-{i}", "ai", 8, mig_capable=True, mig_layout="all-disabled") for i in range(4)]
    nodes += [NodeRecord(f"hpc-{i}", "hpc", 8, mig_capable=True, mig_layout="all-disabled") for i in range(4)]
    demand = traces(hours, seed)
    ai_unit = PROFILE if slices else GPU_UNIT
    policy = Policy(kind="reactive", max_moves_per_decision=2, cooldown_hours=0, min_nodes={"ai": 1, "hpc": 1})
    out = {"ai_unmet": 0.0, "hpc_unmet": 0.0, "moves": 0, "relayouts": 0}
    for h in range(hours):
        # the planner sees the next two hours; the nodes hold this hour's jobs, none at a six-hour boundary
        nodes = _busy(_busy(nodes, "ai", PROFILE, demand["ai"][h]), "hpc", GPU_UNIT, demand["hpc"][h])
        if h % 6 == 0:
            nodes = [replace(n, busy_gpus=0.0) for n in nodes]
        want = {p: {"mean": list(demand[p][h + 1:h + 3]), "upper": list(demand[p][h + 1:h + 3] * 1.2),
                    "unit": ai_unit if p == "ai" else GPU_UNIT} for p in ("ai", "hpc")}
        result = plan(nodes, want, policy)
        by = {n.name: n for n in nodes}
        for m in result.moves:
            by[m.node] = replace(by[m.node], owner=m.target, mig_layout=m.mig_layout or by[m.node].mig_layout)
        for c in result.layout_changes:
            by[c.node] = replace(by[c.node], mig_layout=c.to_layout)
        nodes = sorted(by.values(), key=lambda n: n.name)
        out["moves"] += len(result.moves)
        out["relayouts"] += len(result.layout_changes)
        # the next hour, served by the layouts chosen: ai jobs need a slice, hpc jobs a whole GPU
        ai_cap = sum(node_capacity(n, PROFILE, n.mig_layout) for n in nodes if n.owner == "ai")
        hpc_cap = sum(node_capacity(n, GPU_UNIT, n.mig_layout) for n in nodes if n.owner == "hpc")
        out["ai_unmet"] += max(0.0, demand["ai"][h + 1] - ai_cap)
        out["hpc_unmet"] += max(0.0, demand["hpc"][h + 1] - hpc_cap)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hours", type=int, default=168)
    ap.add_argument("--seeds", type=int, default=5)
    args = ap.parse_args()
    rows = []
    for seed in range(args.seeds):
        whole, sl = replay(args.hours, seed, False), replay(args.hours, seed, True)
        rows.append((seed, whole, sl))
    print("| seed | arm | unmet ai slice-h | unmet hpc GPU-h | moves | re-layouts |")
    print("|---:|---|---:|---:|---:|---:|")
    for seed, whole, sl in rows:
        for name, r in (("whole GPUs", whole), ("slice_profile 1g.10gb", sl)):
            print(f"| {seed} | {name} | {r['ai_unmet']:.0f} | {r['hpc_unmet']:.0f} | {r['moves']} | {r['relayouts']} |")
    w = sum(r[1]["ai_unmet"] for r in rows)
    s = sum(r[2]["ai_unmet"] for r in rows)
    wh = sum(r[1]["hpc_unmet"] for r in rows)
    sh = sum(r[2]["hpc_unmet"] for r in rows)
    print(f"\nunmet ai slice-hours, slices / whole GPUs: {s / w if w else float('nan'):.3f} "
          f"({s:.0f} / {w:.0f}); unmet hpc GPU-hours: {sh:.0f} against {wh:.0f}")


if __name__ == "__main__":
    from _tables import record_run  # bench/ is sys.path[0] when a bench is run

    raise SystemExit(record_run(lambda argv: "mig_slices" if not argv else "mig_slices-" + "-".join(
        a.lstrip("-") for a in argv), main))
