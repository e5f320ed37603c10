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
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from allocate_helios import DATA, REPORT, TUNE, groupings, pool_nodes, scenario

from gpupool.sim.power import ParkingSpec
from gpupool.sim.study import simulate

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


def run_one(job):
    key, sc, parking, policy = job
    t0 = time.perf_counter()
    sc = sc.model_copy(update={"parking": None if parking is None else ParkingSpec(**parking)})
    total = simulate(sc, policy)["total"]
    return key, total, time.perf_counter() - t0


def run_jobs(jobs, n_jobs):
    out = {}

    def note(key, total, wall):
        out[key] = total
        print(f"[{len(out)}/{len(jobs)}] {json.dumps({'key': key, 'total': total, 'wall': round(wall, 1)})}",
              file=sys.stderr, flush=True)

    if n_jobs > 1:
        with ProcessPoolExecutor(n_jobs) as ex:
            for fut in as_completed([ex.submit(run_one, j) for j in jobs]):
                note(*fut.result())
    else:
        for j in jobs:
            note(*run_one(j))
    return out


def figures(res, key, rule):
    """(saved fraction, unmet added, wakes, late wakes) of ``rule`` against ``off``."""
    off, on = res[(*key, "off")], res[(*key, rule)]
    saved = 1 - (on["idle_kwh"] + on["parked_kwh"]) / off["idle_kwh"] if off["idle_kwh"] > 0 else 0.0
    return saved, on["unmet_gpu_hours"] - off["unmet_gpu_hours"], on["wakes"], on["late_wakes"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--days", type=float, default=6)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--data", default=str(DATA))
    ap.add_argument("--report", default=",".join(REPORT))
    ap.add_argument("--pools", default="100")
    ap.add_argument("--policy", default="predictive")
    ap.add_argument("--wake", type=float, default=10.0)
    ap.add_argument("--slurm-buffers", default="2,4")
    ap.add_argument("--gpupool", default="{}", help="gpupool's parking settings (JSON) over the defaults")
    ap.add_argument("--tune", action="store_true", help="run TUNE_CANDIDATES on the tune groupings")
    args = ap.parse_args(argv)
    data, rounds = Path(args.data), groupings()
    groups = list(TUNE) if args.tune else [g.strip() for g in args.report.split(",") if g.strip()]
    pools = [int(p) for p in args.pools.split(",")]
    base = {"wake_minutes": args.wake}
    rules = {"off": None}
    if args.tune:
        rules.update({name: {**base, **c} for name, c in TUNE_CANDIDATES.items()})
    else:
        rules["gpupool"] = {**base, **json.loads(args.gpupool)}
    for n in [int(b) for b in args.slurm_buffers.split(",") if b.strip()]:
        rules[f"slurm b{n}"] = {**base, "scope": "platform", "buffer": n, "idle_minutes": 30, "cooldown_minutes": 0}
    jobs = []
    for pct in pools:
        for g in groups:
            sc = scenario(rounds[g], pool_nodes(rounds[g], data, pct), args.days, data, f"{g}-{pct}")
            for name, parking in rules.items():
                jobs.append(((g, pct, name), sc, parking, args.policy))
    t0 = time.perf_counter()
    res = run_jobs(jobs, args.jobs)
    print(f"Helios parking: {args.days:g} days, policy {args.policy} with the fast path, wake {args.wake:g} min, "
          f"park 5 min, idle 1.4 kW, parked 40 W per 8-GPU node; "
          f"{'tune groupings ' + ','.join(groups) if args.tune else 'held-out groupings ' + ','.join(groups)}")
    print()
    names = [r for r in rules if r != "off"]
    print("| grouping | pool | idle kWh off | unmet off | " + " | ".join(
        f"{r}: saved / +unmet / wakes (late)" for r in names) + " |")
    print("|---|---:|---:|---:|" + "---:|" * len(names))
    keys = [(g, pct) for pct in pools for g in groups]
    fig = {(k, r): figures(res, k, r) for k in keys for r in names}
    for k in keys:
        off = res[(*k, "off")]
        print(f"| {k[0]} | {k[1]}% | {off['idle_kwh']:.0f} | {off['unmet_gpu_hours']:.0f} | " + " | ".join(
            f"{fig[(k, r)][0]:.0%} / {fig[(k, r)][1]:+.0f} / {fig[(k, r)][2]} ({fig[(k, r)][3]})" for r in names) + " |")
    print("| mean | | | | " + " | ".join(
        f"{sum(fig[(k, r)][0] for k in keys) / len(keys):.0%} / {sum(fig[(k, r)][1] for k in keys) / len(keys):+.1f}"
        f" / {sum(fig[(k, r)][2] for k in keys) / len(keys):.0f} ({sum(fig[(k, r)][3] for k in keys) / len(keys):.0f})"
        for r in names) + " |")
    if not args.tune:
        _bars(fig, keys, [r for r in names if r.startswith("slurm")])
    print(f"\nbench wall {(time.perf_counter() - t0) / 60:.1f} min, {args.jobs} job(s)")
    return 0


def _bars(fig, keys, slurms):
    print()
    mean = {r: (sum(fig[(k, r)][0] for k in keys) / len(keys), sum(fig[(k, r)][1] for k in keys) / len(keys))
            for r in ["gpupool", *slurms]}
    s, u = mean["gpupool"]
    worst = max(keys, key=lambda k: (fig[(k, 'gpupool')][1], -fig[(k, 'gpupool')][0]))
    print(f"- mean: gpupool saves {s:.0%} (bar >= 55 %) with {u:+.1f} GPU-h unmet (bar <= +15): "
          + ("MET" if s >= 0.55 and u <= 15 else "NOT MET"))
    print(f"- worst held-out regime for unmet: {worst[0]} {worst[1]}%: saved {fig[(worst, 'gpupool')][0]:.0%}, "
          f"{fig[(worst, 'gpupool')][1]:+.1f} GPU-h")
    for r in slurms:
        rs, ru = mean[r]
        both = s > rs and u < ru
        print(f"- mean against {r} ({rs:.0%}, {ru:+.1f}): better on both counts: {'MET' if both else 'NOT MET'}")
        bad = [f"{k[0]} {k[1]}%" for k in keys
               if not (fig[(k, 'gpupool')][0] >= fig[(k, r)][0] and fig[(k, 'gpupool')][1] < fig[(k, r)][1])]
        print(f"  every regime at least its saving with less unmet added: "
              + ("MET" if not bad else f"NOT MET in {len(bad)}/{len(keys)}: {', '.join(bad)}"))


if __name__ == "__main__":
    raise SystemExit(main())
