"""Where each platform's regret comes from in the ownership what-if: a breakdown per platform.

    nice -n 5 .venv/bin/python bench/ownership_why.py [--groupings G1,G2] [--days 6]
        [--data DIR]

Runs the ``owned`` regime of ``bench/ownership_helios.py`` (each platform owns what it holds at the
start, ``reclaim_minutes`` 30) and splits, step by step, what a platform served less than it would
have with its own nodes (``min(demand, owned) - min(demand, held)``, the positive part of its
regret) among its own nodes away at that step, in this order: a node coming home (a move to it in
flight: the move's time), a node leaving (lent while the owner rises), a node held by its borrower
(the reclaim not started: the need not read yet, or held by the detect rules, the move budget or
the minimum runtime, as the reclaim's own waits say). Each part also names the path that lent the
node (``plan`` or ``fast``). What is left (no own node away) is not regret of lending. Read with
docs/decisions/0025-ownership-room.md.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pandas as pd

from allocate_helios import DATA, groupings
from ownership_helios import _scenario

import gpupool.sim.ownership as sim_ownership
import gpupool.sim.study as study
from gpupool.decisions.fastpath import FastPathTuning
from gpupool.sim.world import TRANSIT


def run(name: str, days: float, data: Path, tuning: FastPathTuning) -> dict:
    """The owned study of grouping ``name`` with what the breakdown reads: its world, its moves
    (both paths and the reclaims) and the reclaim's waits at each tick."""
    seen: dict = {"worlds": [], "fast": [], "waits": []}

    class World(study.World):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            seen["worlds"].append(self)

    class FastPath(study.FastPath):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            seen["fast"].append(self)

    tick = sim_ownership.OwnershipTrack.tick

    def watched(self, at, *a, **k):
        out = tick(self, at, *a, **k)
        seen["waits"] += [(pd.Timestamp(at), owner, why) for owner, why in self.waits]
        seen["track"] = self
        return out

    saved = study.World, study.FastPath
    study.World, study.FastPath, sim_ownership.OwnershipTrack.tick = World, FastPath, watched
    try:
        sc = _scenario(name, groupings()[name], days, {"reclaim_minutes": 30.0, "min_runtime_minutes": 0.0}, data)
        out = study.simulate(sc, "predictive", fastpath_tuning=tuning)
    finally:
        study.World, study.FastPath = saved
        sim_ownership.OwnershipTrack.tick = tick
    return {"out": out, "world": seen["worlds"][0], "fast": seen["fast"][0], "track": seen["track"],
            "waits": seen["waits"]}


def breakdown(r: dict) -> dict[str, dict]:
    """Per platform: its regret, the positive part split by cause (GPU-h), and the negative part."""
    world, track = r["world"], r["track"]
    own_, cap, dem = world.owner_, world.capacity(), world.demand_
    i1, h = world.clock_index, world.step_hours
    moves = defaultdict(list)
    for m in r["fast"].moves:
        moves[m["node"]].append(m)
    waits = {(at, owner): why for at, owner, why in r["waits"]}
    out = {}
    for ip, p in enumerate(world.platforms):
        owned = [j for j, n in enumerate(world.nodes) if track.homes.get(n.name) == p]
        gpus = sum(world.nodes[j].gpus for j in owned)
        d, c = dem[ip, :i1], cap[ip, :i1]
        pos = np.clip(np.minimum(d, gpus) - np.minimum(d, c), 0, None)
        neg = np.clip(np.minimum(d, c) - np.minimum(d, gpus), 0, None)
        parts: dict[str, float] = defaultdict(float)
        for i in np.nonzero(pos > 1e-9)[0]:
            t = world.index[i]
            away = []
            for j in owned:
                if own_[j, i] == ip:
                    continue
                node = world.nodes[j]
                before = [m for m in moves[node.name] if pd.Timestamp(m["created_at"]) <= t]
                lent_by = next((m["path"] for m in reversed(before) if m["from_platform"] == p), "?")
                if own_[j, i] == TRANSIT and before and before[-1]["to_platform"] == p:
                    away.append((0, node.gpus, f"coming home ({before[-1]['path']} in flight), lent by {lent_by}"))
                elif own_[j, i] == TRANSIT:
                    away.append((1, node.gpus, f"leaving while the owner rises, lent by {lent_by}"))
                else:
                    why = waits.get((t.floor(world.step), p), "")
                    cause = ("held by the detect rules" if "flag" in why else "waiting for the move budget"
                             if "budget" in why else "waiting for min_runtime" if "min_runtime" in why
                             else "need not read yet (the tick)")
                    away.append((2, node.gpus, f"on its borrower, {cause}, lent by {lent_by}"))
            left = float(pos[i])
            for _, g, label in sorted(away, key=lambda a: a[0]):
                take = min(left, g)
                parts[label] += take * h
                left -= take
            if left > 1e-9:
                parts["no own node away"] += left * h
        out[p] = {"regret": float((pos - neg).sum() * h), "pos": float(pos.sum() * h), "neg": float(neg.sum() * h),
                  "parts": dict(sorted(parts.items(), key=lambda kv: -kv[1]))}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groupings", default="G1,G2")
    ap.add_argument("--days", type=float, default=6)
    ap.add_argument("--data", default=str(DATA))
    args = ap.parse_args()
    tuning = FastPathTuning()
    print("| grouping | platform | regret | served less (GPU-h) | served more | cause of the served less (GPU-h) |")
    print("| --- | --- | ---: | ---: | ---: | --- |")
    for name in args.groupings.split(","):
        r = run(name, args.days, Path(args.data), tuning)
        paths = defaultdict(int)
        for m in r["fast"].moves:
            paths[m["path"]] += 1
        for p, b in breakdown(r).items():
            parts = "; ".join(f"{v:.1f} {k}" for k, v in b["parts"].items() if v >= 0.05) or "-"
            print(f"| {name} | {p} | {b['regret']:+.1f} | {b['pos']:.1f} | {b['neg']:.1f} | {parts} |")
        print(f"| {name} | moves | | | | {', '.join(f'{k} {v}' for k, v in sorted(paths.items()))} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
