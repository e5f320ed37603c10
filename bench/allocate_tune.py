"""Choose the allocation policy's cost knobs on data: a grid on the tuning groupings only.

    nice -n 10 .venv/bin/python bench/allocate_tune.py [--groupings G1,G2] [--pools 100,115]
        [--days 10] [--policies reactive,predictive] [--jobs 2]

Runs each setting of the grid (``cooldown_hours`` x ``move_cost`` x ``headroom_quantile`` x
``demand_spread`` x ``source_risk``; with the empirical spread the quantile is the one of the series' own
hour-ahead changes the plan covers, with the random walk it only says what ``upper`` stands for
and changes nothing) over the
tuning groupings of ``bench/allocate_helios.py`` and prints mean unmet GPU-hours and moves per
policy, ranked by ``unmet + move_price x moves`` (a move priced at 1 GPU-hour of churn, the
planner's own default move cost). The telemetry is fault-free and the chain runs
without cleaning here (cleaning fault-free telemetry changes little and costs most of the time);
the regimes bench measures the chosen defaults with cleaning, on the other groupings. The
scenarios are the regimes bench's, so the fast path runs beside the plan as shipped (the
scenario format's default) unless ``--fastpath off``: the knobs are chosen for the product as
it runs.
"""

from __future__ import annotations

import argparse
import itertools
import json
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pandas as pd
from allocate_helios import DATA, groupings, pool_nodes, scenario

from gpupool.sim.study import simulate

MOVE_PRICE = 1.0


def _run(job):
    g, pct, policy, knobs, days, fastpath = job
    rounds = groupings()
    sc = scenario(rounds[g], pool_nodes(rounds[g], Path(DATA), pct), days, Path(DATA), f"{g}-{pct}", policy=knobs)
    if not fastpath:
        sc = sc.model_copy(update={"fastpath": None})
    total = simulate(sc, policy, clean=False)["total"]
    return job, total["unmet_gpu_hours"], total["moves"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groupings", default="G1,G2")
    ap.add_argument("--pools", default="100,115")
    ap.add_argument("--days", type=float, default=10)
    ap.add_argument("--policies", default="reactive")
    ap.add_argument("--quantiles", default="0.95")
    ap.add_argument("--cooldowns", default="0h,1h,2h")
    ap.add_argument("--move-costs", default="0.1,0.25,0.5,1,2")
    ap.add_argument("--spreads", default="empirical",
                    help="demand_spread values (chosen, empirical, random_walk, wider)")
    ap.add_argument("--source-risks", default="0.1", help="Policy.source_risk values")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--fastpath", choices=("on", "off"), default="on",
                    help="the fast path beside the plan (on, as shipped) or the hourly plan alone")
    args = ap.parse_args(argv)
    grid = [{"headroom_quantile": float(q), "cooldown_hours": pd.Timedelta(c) / pd.Timedelta("1h"),
             "move_cost": float(m), "demand_spread": s,
             "source_risk": float(r)}
            for q, c, m, s, r in itertools.product(args.quantiles.split(","), args.cooldowns.split(","),
                                                   args.move_costs.split(","), args.spreads.split(","),
                                                   args.source_risks.split(","))]
    jobs = [(g, int(pct), pol, knobs, args.days, args.fastpath == "on") for pol in args.policies.split(",")
            for knobs in grid for g in args.groupings.split(",") for pct in args.pools.split(",")]
    with ProcessPoolExecutor(args.jobs) as ex:
        done = list(ex.map(_run, jobs))
    table: dict[tuple, list] = {}
    for (g, pct, pol, knobs, _, _), unmet, moves in done:
        table.setdefault((pol, json.dumps(knobs, sort_keys=True)), []).append((unmet, moves))
    rows = []
    for (pol, knobs), vals in table.items():
        u = sum(v[0] for v in vals) / len(vals)
        m = sum(v[1] for v in vals) / len(vals)
        rows.append((pol, u + MOVE_PRICE * m, u, m, knobs))
    print(f"tuning groupings {args.groupings}, pools {args.pools}%, {args.days:g} days, fast path {args.fastpath}")
    print("| policy | score | mean unmet | mean moves | knobs |")
    print("|---|---:|---:|---:|---|")
    for pol, score, u, m, knobs in sorted(rows):
        print(f"| {pol} | {score:.0f} | {u:.1f} | {m:.1f} | {knobs} |")
    return 0


if __name__ == "__main__":
    from _tables import option, record_run  # bench/ is sys.path[0] when a bench is run

    # the hourly-only grid keeps a file of its own beside the shipped configuration's
    raise SystemExit(record_run(lambda argv: "allocate_tune" + ("-hourly" if option(argv, "--fastpath") == "off" else ""),
                                main))
