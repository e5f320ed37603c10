"""Ownership on the shared Helios groupings: each platform's regret against keeping its own nodes,
pooled as today and with every platform owning what it holds at the start and reclaiming.

    nice -n 5 .venv/bin/python bench/ownership_helios.py [--days 6] [--jobs 2] [--policy predictive]
        [--groupings G1,G2,G3,G4,G5] [--reclaim-minutes 30] [--min-runtime-minutes 0] [--keep-home N]
        [--no-pooled] [--foresight M]

The groupings, pools (100 % of the traces' totals) and scenario are those of
``bench/allocate_helios.py`` (imported from it), with the fast path as shipped. Per grouping:
``static``; the policy pooled as today (nobody owns anything); and the policy where each platform
owns the nodes it holds at the start with ``reclaim_minutes`` (and ``min_runtime_minutes``), the
what-if of docs/stages/ownership.md; ``--keep-home N`` sets each platform's ``lend_limit`` to its
nodes less N (N of its own always stay). ``--no-pooled`` skips the pooled runs. A platform's regret is its unmet GPU-hours minus its unmet
under ``static``. Bars (issue 42, held out: the ``REPORT`` groupings of allocate_helios): no
platform's regret above +5 GPU-hours, no reclaim late, mean total unmet at most 110 GPU-hours
(a 31-day figure: at 6 days read the mean against the pooled one instead).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from allocate_helios import DATA, PLATFORMS, REPORT, groupings, pool_nodes, scenario
from _tables import option, record_run

import pandas as pd

import gpupool.sim.ownership as sim_ownership
import gpupool.sim.study as study
from gpupool.sim.study import simulate


def _scenario(name, grouping, days, own: dict | None, data: Path = DATA, keep_home: int | None = None):
    nodes = pool_nodes(grouping, data)
    sc = scenario(grouping, nodes, days, data, f"{name}-100")
    if own:
        # the keys given (model_copy marks them set): each platform owns what it holds at the start
        lend = {p: {} if keep_home is None else {"lend_limit": max(0, nodes[p] - keep_home)} for p in nodes}
        sc = sc.model_copy(update={"platforms": {p: spec.model_copy(update={**own, **lend[p]})
                                                 for p, spec in sc.platforms.items()}})
    return sc


class Foresight(sim_ownership.OwnershipTrack):
    """A bound, not a rule: the reclaim reads each owner's true demand ``minutes`` ahead (the
    largest over the next ``minutes``), so a reclaim starts that much before the burst it serves."""

    minutes = 0.0

    def shortage(self, at, readings, transit):
        short = super().shortage(at, readings, transit)
        w = self.world
        i = w.clock_index
        k = int(round(self.minutes / (pd.Timedelta(w.scenario.step) / pd.Timedelta("1min"))))
        cap = w.capacity_at(i)
        on_way: dict[str, float] = {}
        for h in transit:
            on_way[h["to_platform"]] = on_way.get(h["to_platform"], 0.0) + float(h["gpus"])
        for p in short:
            if p in self.ownership:
                j = w.platforms.index(p)
                ahead = float(w.demand_[j, i:i + k + 1].max()) - float(cap[j]) - on_way.get(p, 0.0)
                short[p] = max(short[p], ahead)
        return short


def run_one(job):
    name, regime, grouping, days, policy, own, data, keep_home, foresight = job
    t0 = time.perf_counter()
    sc = _scenario(name, grouping, days, own, data, keep_home)
    if foresight:
        Foresight.minutes = foresight
        study.OwnershipTrack = Foresight
    out = simulate(sc, "static" if regime == "static" else policy)
    return (name, regime), out, time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--days", type=float, default=6)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--data", default=str(DATA))
    ap.add_argument("--policy", default="predictive")
    ap.add_argument("--groupings", default="G1,G2,G3,G4,G5")
    ap.add_argument("--reclaim-minutes", type=float, default=30.0)
    ap.add_argument("--min-runtime-minutes", type=float, default=0.0)
    ap.add_argument("--keep-home", type=int, help="each platform's lend_limit: its nodes less this many")
    ap.add_argument("--no-pooled", action="store_true", help="skip the pooled runs (today's, without owners)")
    ap.add_argument("--foresight", type=float, default=0.0,
                    help="a bound: the reclaim reads each owner's true demand this many minutes ahead")
    args = ap.parse_args()
    groups = groupings()
    names = args.groupings.split(",")
    own = {"reclaim_minutes": args.reclaim_minutes, "min_runtime_minutes": args.min_runtime_minutes}
    regimes = ("static", "owned") if args.no_pooled else ("static", "pooled", "owned")
    jobs = [(n, r, groups[n], args.days, args.policy, own if r == "owned" else None, Path(args.data), args.keep_home,
             args.foresight) for n in names for r in regimes]
    res = {}
    with ProcessPoolExecutor(max(1, args.jobs)) as ex:
        for fut in as_completed([ex.submit(run_one, j) for j in jobs]):
            key, out, wall = fut.result()
            res[key] = out
            print(f"[{len(res)}/{len(jobs)}] {key} {wall:.0f}s unmet {out['total']['unmet_gpu_hours']:.1f}",
                  file=sys.stderr, flush=True)
    print(f"## Regret per platform, {args.policy} with the fast path, {args.days:g} days, pool 100 %")
    print()
    print(f"owned: each platform owns what it holds at the start, reclaim_minutes {args.reclaim_minutes:g}, "
          f"min_runtime_minutes {args.min_runtime_minutes:g}"
          + ("" if args.keep_home is None else f", lend_limit its nodes less {args.keep_home}")
          + ("" if not args.foresight else f", the reclaim reading true demand {args.foresight:g} minutes ahead (a bound)")
          + ". Regret: unmet minus static's unmet (GPU-h). "
          f"Held out: {', '.join(g for g in names if g in REPORT)}.")
    print()
    print("Served less: what the platform served less than its own nodes would have, step by step; beyond: "
          "the part outside every reclaim's promise (the tick before the need was read to the node's arrival, "
          "at most reclaim_minutes).")
    print()
    print("| grouping | platform | static unmet | pooled unmet | pooled regret | owned unmet | owned regret "
          "| served less | beyond deadline | lent GPU-h | borrowed GPU-h | reclaims | late | p95 min | max min "
          "| preempted GPU-h |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
          "| ---: |")
    worst = {}
    for n in names:
        st, ow = res[(n, "static")]["platforms"], res[(n, "owned")]["platforms"]
        po = res[(n, "pooled")]["platforms"] if (n, "pooled") in res else {p: {"unmet_gpu_hours": float("nan")} for p in st}
        for p in PLATFORMS:
            s, o = st[p]["unmet_gpu_hours"], ow[p]
            rc = o["reclaims"]
            pooled = po[p]["unmet_gpu_hours"]
            pooled_cols = "- | -" if pooled != pooled else f"{pooled:.1f} | {pooled - s:+.1f}"
            print(f"| {n}{'' if n in REPORT else ' (tune)'} | {p} | {s:.1f} | {pooled_cols} | "
                  f"{o['unmet_gpu_hours']:.1f} | {o['regret_gpu_hours']:+.1f} | "
                  f"{o['served_less_gpu_hours']:.1f} | {o['served_less_beyond_deadline_gpu_hours']:.1f} | "
                  f"{o['lent_gpu_hours']:.0f} | {o['borrowed_gpu_hours']:.0f} | {rc['count']} | {rc['late']} | "
                  f"{rc['p95_minutes'] if rc['p95_minutes'] is not None else '-'} | "
                  f"{rc['max_minutes'] if rc['max_minutes'] is not None else '-'} | {o['preempted_gpu_hours']:.1f} |")
            for regime, regret in (("pooled", po[p]["unmet_gpu_hours"] - s), ("owned", o["regret_gpu_hours"])):
                if n in REPORT and regret == regret and regret > worst.get(regime, (float("-inf"),))[0]:
                    worst[regime] = (regret, n, p)
    print()
    print("| regime | held-out mean total unmet | worst platform regret (held out) | reclaims late (held out) | moves |")
    print("| --- | ---: | --- | ---: | ---: |")
    held = [n for n in names if n in REPORT]
    for regime in regimes:
        tot = [res[(n, regime)]["total"] for n in held]
        mean = sum(t["unmet_gpu_hours"] for t in tot) / max(1, len(tot))
        w = worst.get(regime)
        late = sum(t.get("reclaims", {}).get("late", 0) for t in tot) if regime == "owned" else "-"
        print(f"| {regime} | {mean:.1f} | " + (f"{w[0]:+.1f} ({w[1]} {w[2]})" if w else "-")
              + f" | {late} | {sum(t['moves'] for t in tot)} |")
    print()
    print("bar, held out: worst platform regret <= +5 GPU-h: "
          + ("MET" if worst.get("owned", (0,))[0] <= 5 else "NOT MET")
          + "; no reclaim late: " + ("MET" if all(res[(n, 'owned')]['total']['reclaims']['late'] == 0 for n in held)
                                     else "NOT MET"))
    beyond = max(((res[(n, "owned")]["platforms"][p]["served_less_beyond_deadline_gpu_hours"], n, p)
                  for n in held for p in PLATFORMS), default=None)
    if beyond is not None:
        print(f"served less beyond the deadline's promise, worst platform held out: {beyond[0]:.1f} GPU-h "
              f"({beyond[1]} {beyond[2]})")
    print(json.dumps({"worst_regret": {k: list(v) for k, v in worst.items()}}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    def name(argv):
        keep = option(argv, "--keep-home")
        ahead = option(argv, "--foresight")
        return (f"ownership_helios-{option(argv, '--days', '6')}d" + (f"-keep{keep}" if keep else "")
                + (f"-foresight{ahead}" if ahead else ""))

    raise SystemExit(record_run(name, main))
