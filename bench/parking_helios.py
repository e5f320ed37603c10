"""Parking on the shared Helios traces: idle-node energy saved and unmet added, gpupool's rule
(one warm buffer for the pool, waking ahead) beside the Slurm-style rule per platform.

    nice -n 10 .venv/bin/python bench/parking_helios.py [--days 6] [--jobs 1] [--report G3,G4,G5]
        [--pools 100] [--policy predictive] [--slurm-buffers 2,4] [--wake 10] [--tune]

The groupings, pools and scenario are those of ``bench/allocate_helios.py`` (three platforms of
two traces each; 8-GPU nodes; 5-minute steps, plans hourly, the fast path every 5 minutes, moves
of 30 minutes). Each regime (grouping and pool) runs with ``parking: off`` and with each rule at
the same ``wake_minutes``: gpupool's (the product defaults of ``ParkingSpec``, or ``--gpupool``'s
JSON) and the Slurm-style rule per platform (a node idle for 30 minutes beyond a warm buffer of N
idle nodes per platform parks; wake on shortage), for each N of ``--slurm-buffers``. Saved is
``1 - (idle_kwh + parked_kwh) / idle_kwh(off)``: the parked nodes' standby draw is charged.
``--tune`` runs the candidate settings of ``TUNE_CANDIDATES`` on the tune groupings instead and
prints their means (the choice is recorded in docs/decisions/0023-parking-rule.md).

Bars (issue 41, report groupings, ``parking: {wake_minutes: 10}``): saved >= 55 % with unmet at
most 15 GPU-h above ``off``, and better than the per-platform rule on both counts at once; every
regime: at least the per-platform rule's saving with less unmet added.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from _parking import (GPUPOOL, OFF, SLURM_BUFFERS, WAKE_MINUTES, buffers, energy_bars, energy_table, rules,
                      with_parking)
from allocate_helios import DATA, REGIMES, REPORT, TUNE, groupings, pool_nodes, run_jobs, scenario

#: the settings tried on the tune groupings (each merged over the product defaults)
TUNE_CANDIDATES = {
    "b4": {"buffer": 4},
    "b4 no-fc": {"buffer": 4, "forecast": False},
    "b2 no-fc rq.9": {"buffer": 2, "forecast": False, "rise_quantile": 0.9},
    "b2 no-fc rq.95": {"buffer": 2, "forecast": False, "rise_quantile": 0.95},
    "b1 no-fc rq.95": {"buffer": 1, "forecast": False, "rise_quantile": 0.95},
    "b2 no-fc rq.99": {"buffer": 2, "forecast": False, "rise_quantile": 0.99},
    "b2 rq.95": {"buffer": 2, "rise_quantile": 0.95},
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--days", type=float, default=6)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--data", default=str(DATA))
    ap.add_argument("--report", default=",".join(REPORT))
    ap.add_argument("--pools", default="100")
    ap.add_argument("--policy", default="predictive", help="the gpupool regime of allocate_helios the rules run under")
    ap.add_argument("--wake", type=float, default=WAKE_MINUTES)
    ap.add_argument("--slurm-buffers", default=",".join(map(str, SLURM_BUFFERS)))
    ap.add_argument("--gpupool", default="{}", help="gpupool's parking settings (JSON) over the defaults")
    ap.add_argument("--tune", action="store_true", help="run TUNE_CANDIDATES on the tune groupings")
    args = ap.parse_args(argv)
    if args.policy not in REGIMES or REGIMES[args.policy][0] == "greedy":
        ap.error(f"--policy {args.policy!r}: give one of gpupool's regimes of allocate_helios "
                 f"{[r for r, (p, _) in REGIMES.items() if p != 'greedy']}")
    data, rounds = Path(args.data), groupings()
    groups = list(TUNE) if args.tune else [g.strip() for g in args.report.split(",") if g.strip()]
    pools = [int(p) for p in args.pools.split(",")]
    named = rules(args.wake, None if args.tune else json.loads(args.gpupool), buffers(args.slurm_buffers))
    if args.tune:  # the candidates before the baselines, as the tables have always listed them
        tried = {name: {"wake_minutes": args.wake, **c} for name, c in TUNE_CANDIDATES.items()}
        named = {OFF: None, **tried, **{k: v for k, v in named.items() if k != OFF}}
    jobs = []
    for pct in pools:
        for g in groups:
            sc = scenario(rounds[g], pool_nodes(rounds[g], data, pct), args.days, data, f"{g}-{pct}")
            for name, parking in named.items():
                jobs.append(((g, pct, name), with_parking(sc, parking), args.policy, True))
    t0 = time.perf_counter()
    res = {key: total for key, (total, _) in run_jobs(jobs, args.jobs).items()}
    print(f"Helios parking: {args.days:g} days, policy {args.policy} with the fast path, wake {args.wake:g} min, "
          f"park 5 min, idle 1.4 kW, parked 40 W per 8-GPU node; "
          f"{'tune groupings ' + ','.join(groups) if args.tune else 'held-out groupings ' + ','.join(groups)}")
    print()
    names = [r for r in named if r != OFF]
    keys = [(g, pct) for pct in pools for g in groups]
    fig = energy_table(res, keys, names)
    if not args.tune:
        energy_bars(fig, keys, [r for r in names if r != GPUPOOL])
    print(f"\nbench wall {(time.perf_counter() - t0) / 60:.1f} min, {args.jobs} job(s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
