"""Choosing the fast path's headroom h (the greedy rule's need = (1 + h) x demand) on the tune
groupings: reactive with the fast path at each h, beside the hourly plan alone and the greedy rule
deciding every 5 minutes, on the shared Helios traces; unmet GPU-h and moves per regime, and why
the fast path left a short platform unhelped (its skip reasons, counted per tick).

    PYTHONPATH=include python bench/fastpath_tune.py --days 6 --jobs 2 --heads 0,0.05,0.1,0.2

Tune groupings only (G1, G2 by default): the report groupings stay unseen by the choice. Once h
is chosen, ``--report`` runs it on the report groupings (G3-G5, pools 100, 115, 130 % unless
``--pools``) beside the greedy rule every 5 minutes, against the bar of
``bench/allocate_helios.py``, with the skip reasons there:

    PYTHONPATH=include python bench/fastpath_tune.py --days 6 --jobs 2 --report --heads 0
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import allocate_helios as ah  # noqa: E402
from _tables import record_run  # noqa: E402

from gpupool.decisions.fastpath import FastPathTuning, Skip  # noqa: E402
from gpupool.sim.study import simulate  # noqa: E402


def _reason(text: str) -> str:
    """A skip reason without its figures: the rule that said no."""
    text = re.sub(r"[-\d.]+", "#", text)
    text = re.sub(r"#\S*", "#", text)
    if "no platform may lend" in text:
        parts = [re.sub(r"^[a-z]+: ", "", r) for r in text.split("no platform may lend an idle node: ", 1)[1].split("; ")]
        return "no lender: " + " | ".join(sorted(set(parts)))[:160]
    return text[:120]


def run(job):
    (g, pct, label), sc, h = job
    t0 = time.perf_counter()
    reasons: collections.Counter = collections.Counter()
    if label == "greedy 5min":
        total = ah.greedy(sc, every="5min", window="15min")
    elif label == "off":
        total = simulate(sc.model_copy(update={"fastpath": None}), "reactive", clean=True)["total"]
    else:
        ticks: list[dict] = []
        total = simulate(sc, "reactive", clean=True, fastpath_tuning=FastPathTuning(headroom=h), fast_log=ticks)["total"]
        for tick in ticks:
            for d in tick["decisions"]:
                if isinstance(d, Skip) and d.reason.startswith("short"):
                    reasons[_reason(d.reason)] += 1
    return (g, pct, label), total, reasons, time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--days", type=float, default=6)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--data", default=str(ah.DATA))
    ap.add_argument("--tune", default=",".join(ah.TUNE))
    ap.add_argument("--pools", default=None, help="percent of the traces' GPUs (100,115; with --report 100,115,130)")
    ap.add_argument("--no-hourly", action="store_true", help="leave out the hourly-only column (off)")
    ap.add_argument("--report", action="store_true",
                    help="the headrooms on the report groupings, beside the greedy rule every 5 minutes")
    ap.add_argument("--heads", default="0,0.1,0.2")
    args = ap.parse_args(argv)
    rounds, data = ah.groupings(), Path(args.data)
    heads = [float(h) for h in args.heads.split(",")]
    groups = list(ah.REPORT) if args.report else args.tune.split(",")
    pools = args.pools or ("100,115,130" if args.report else "100,115")
    base = ["greedy 5min"] if args.report or args.no_hourly else ["off", "greedy 5min"]
    labels = base + [f"h={h:g}" for h in heads]
    jobs = []
    for pct in [int(p) for p in pools.split(",")]:
        for g in groups:
            sc = ah.scenario(rounds[g], ah.pool_nodes(rounds[g], data, pct), args.days, data, f"{g}-{pct}")
            jobs += [((g, pct, lab), sc, None) for lab in base]
            jobs += [((g, pct, f"h={h:g}"), sc, h) for h in heads]
    res, why = {}, collections.defaultdict(collections.Counter)
    with ProcessPoolExecutor(args.jobs) as ex:
        for key, total, reasons, wall in ex.map(run, jobs):
            res[key] = total
            why[key[2]].update(reasons)
            print(f"# {key} unmet {total['unmet_gpu_hours']:.1f} moves {total['moves']} "
                  f"fast {total.get('fastpath_moves', 0)} {wall:.0f}s", file=sys.stderr, flush=True)
    regimes = sorted({(g, pct) for g, pct, _ in res}, key=lambda r: (r[1], r[0]))
    kind = "report" if args.report else "tune"
    print(f"reactive with the fast path at headroom h, {args.days:g} days, {kind} groupings {','.join(groups)}")
    print()
    print("| grouping | pool | " + " | ".join(labels) + " |")
    print("|---|---:|" + "---:|" * len(labels))
    for g, pct in regimes:
        cells = [f"{res[(g, pct, lab)]['unmet_gpu_hours']:.0f} ({res[(g, pct, lab)]['moves']})" for lab in labels]
        print(f"| {g} | {pct}% | " + " | ".join(cells) + " |")
    means = [sum(res[(g, p, lab)]["unmet_gpu_hours"] for g, p in regimes) / len(regimes) for lab in labels]
    moves = [sum(res[(g, p, lab)]["moves"] for g, p in regimes) / len(regimes) for lab in labels]
    print("| mean | | " + " | ".join(f"{u:.1f} ({m:.0f})" for u, m in zip(means, moves)) + " |")
    print()
    for lab in labels[len(base):] if args.report else []:
        unmet = {(g, p): (res[(g, p, lab)]["unmet_gpu_hours"], res[(g, p, "greedy 5min")]["unmet_gpu_hours"])
                 for g, p in regimes}
        over = [f"{g} {p}% ({u:.0f} vs {ref:.0f})" for (g, p), (u, ref) in unmet.items() if u > ref + 1e-6]
        print(f"- bar: {lab} <= the greedy rule every 5 min in every regime: "
              + (f"NOT MET in {len(over)}/{len(regimes)}: " + ", ".join(over) if over else "MET"))
    print()
    print("unmet GPU-h (moves); why a short platform was left unhelped, ticks per rule, all regimes:")
    for lab in labels[len(base):]:
        print()
        print(f"{lab}:")
        for reason, n in why[lab].most_common(6):
            print(f"- {n} x {reason}")
    return 0


if __name__ == "__main__":
    sys.exit(record_run(lambda argv: "fastpath_tune-report" if "--report" in argv else "fastpath_tune", main))
