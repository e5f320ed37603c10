"""Allocation regimes on the six shared Helios traces: the decision chain against reacting,
with the fast path beside the hourly plan (as shipped) and without it.

    nice -n 10 .venv/bin/python bench/allocate_helios.py [--days 31] [--jobs 2]
        [--tune G1,G2] [--report G3,G4,G5] [--pools 100,115,130] [--no-faults] [--fault-seeds 3]
        [--fault-pools 100] [--hourly-faults] [--regimes "static,greedy 5min,reactive off,reactive"]
        [--no-energy] [--energy-regime predictive] [--wake 10] [--slurm-buffers 2,4]

The six traces (demand = running_gpu_num + pending_gpu_num) are grouped into three platforms of
two traces each. The groupings are the five rounds of a 1-factorization (round-robin pairing):
every pair of traces shares a platform in exactly one grouping, so none is hand-picked. Each
grouping runs with pools of 100 %, 115 % and 130 % of the traces' ``total_gpu_num`` (8-GPU nodes,
largest remainder), in the scenario format of docs/stages/whatif.md: 5-minute steps, decisions every hour,
moves of 30 minutes, at most 4 moves a decision and in any rolling hour (both paths together).

Regimes: ``static``; ``greedy`` — the baseline rule of issue 30 (need = 1.1 x recent mean demand;
move one idle node from the platform with the largest surplus, capacity minus need, to the one
with the largest deficit; at most 4 moves in any rolling hour, no cool-down; a source keeps at
least its need), deciding every hour on the last hour's true demand (``greedy 1h``) and at the
fast path's cadence on the last 15 minutes' (``greedy 5min``); gpupool's ``reactive``,
``predictive`` (the whole chain: telemetry -> detect/clean -> forecast -> plan) and ``oracle``
(next hours known), each with the fast path off (hourly only) and on (the shipped default: the
production fast path every 5 minutes between the plans, :mod:`gpupool.sim.fastpath`; the oracle's
fast path reads the true current demand). Moves are printed with the fast path's apart.

The shipped policy defaults were chosen on the ``--tune`` groupings (``bench/allocate_tune.py``);
the tables report on the ``--report`` groupings only, and say which is which. With faults (the
default rates below, at ``--fault-seeds`` placements) predictive with the fast path runs with and
without cleaning (and its judge) on the ``--fault-pools`` pools (100 % by default); the fault bar
is read on the mean over the placements, since at one placement a few events decide the figure.
``--hourly-faults`` repeats those runs hourly only (the figure before the fast path).
Bars (issue 30, report groupings): reactive and predictive with the fast path at or below the
greedy rule deciding at the same cadence, and at or below themselves without it; with faults,
predictive with the fast path and cleaning within 5 % of its fault-free unmet with at most 10 %
more moves. A month of the whole chain: the wall time of one predictive run with the fast path is
printed (bar: under 10 minutes on 2 cores).

Energy beside unmet (issue 41): every study reports the idle nodes' energy; for each regime
(grouping and pool) the ``--energy-regime`` (the shipped ``predictive`` with the fast path) runs
again with gpupool's parking (the product defaults of the scenario's ``parking:`` key, wake
``--wake`` minutes) and with the Slurm-style rule per platform (``scope: platform``, a warm buffer
of N idle nodes per platform for each N of ``--slurm-buffers``, idle 30 minutes, the same wake)
as the baseline: idle kWh with parking off, then each rule's share of the idle nodes' energy
saved and the unmet it adds (``bench/_parking.py``, shared with ``bench/parking_helios.py``).
``--no-energy`` leaves those runs out.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import pandas as pd

from _parking import GPUPOOL, OFF, SLURM_BUFFERS, WAKE_MINUTES, buffers, energy_bars, energy_table, rules, with_parking
from gpupool.sim.scenario import Scenario, scenario_from_dict
from gpupool.sim.study import simulate
from gpupool.sim.traces import read_helios
from gpupool.sim.world import World

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "helios"
TRACES = ("vc6YE", "vcLJZ", "vcMod", "vcSoL", "vchbv", "vcpDC")
PLATFORMS = ("kubernetes", "slurm", "openstack")
NODE_GPUS = 8
POOLS = (100, 115, 130)
#: the bench's default fault rates (events per series per day), see gpupool.sim.faults
FAULTS = {"seed": 11, "drop": 2.0, "spike": 2.0, "gap": 2.0, "reset": 0.5, "stuck": 0.5}
TUNE = ("G1", "G2")
REPORT = ("G3", "G4", "G5")
GREEDY_NEED = 1.1


def groupings(traces: tuple[str, ...] = TRACES) -> dict[str, list[tuple[str, str]]]:
    """The five rounds of the round-robin 1-factorization of six traces (each pair once), G1..G5."""
    rounds = {}
    n = len(traces) - 1
    for r in range(n):
        pairs = [(0, r + 1)]
        for k in range(1, len(traces) // 2):
            pairs.append(((r + k) % n + 1, (r - k) % n + 1))
        rounds[f"G{r + 1}"] = [(traces[a], traces[b]) for a, b in pairs]
    return rounds


def pool_nodes(grouping, data: Path, percent: int = 100) -> dict[str, int]:
    """Nodes per platform: ``percent`` of the traces' total_gpu_num in 8-GPU nodes (largest remainder)."""
    exact = {}
    for platform, pair in zip(PLATFORMS, grouping):
        total = read_helios([data / f"{t}.csv" for t in pair], "5min")["total"].iloc[0]
        exact[platform] = total / NODE_GPUS * percent / 100.0
    want = math.ceil(sum(exact.values()) - 1e-9)
    out = {p: math.floor(v + 1e-9) for p, v in exact.items()}
    for p in sorted(exact, key=lambda p: (-(exact[p] - out[p]), p))[: want - sum(out.values())]:
        out[p] += 1
    return out


def scenario(grouping, nodes: dict[str, int] | None, days: float, data: Path, label: str,
             faults: dict | None = None, policy: dict | None = None) -> Scenario:
    """The study scenario of one grouping, in the scenario format (docs/stages/whatif.md)."""
    platforms = {}
    for platform, pair in zip(PLATFORMS, grouping):
        platforms[platform] = {"trace": [str(data / f"{t}.csv") for t in pair]}
        if nodes is not None:
            platforms[platform]["nodes"] = nodes[platform]
    raw = {"step": "5min", "decision_every": "1h", "node_gpus": NODE_GPUS, "move_minutes": 30,
           "max_moves_per_decision": 4, "platforms": platforms, "name": label}
    if faults:
        raw["faults"] = faults
    if policy:
        raw["policy"] = policy
    if days < 31:
        raw["start"] = "2020-05-01T00:00:00Z"
        raw["end"] = (pd.Timestamp("2020-05-01", tz="UTC") + pd.Timedelta(days=days)).isoformat()
    return scenario_from_dict(raw, where=label)


def greedy(sc: Scenario, need_factor: float = GREEDY_NEED, every: str = "1h", window: str = "1h") -> dict:
    """The baseline rule (see the module docstring) deciding every ``every`` on the true mean
    demand of the last ``window``, at most ``max_moves_per_decision`` moves in any rolling hour;
    the study's totals, with ``fastpath_moves`` 0 (the rule has no second path)."""
    world = World(sc, clock="start")
    span, hour = pd.Timedelta(window), pd.Timedelta("1h")
    started: list[pd.Timestamp] = []
    for t in pd.date_range(world.start, world.end, freq=pd.Timedelta(every), inclusive="left"):
        world.advance(t)
        if t - span < world.start:
            continue
        need = {p: need_factor * float(world.demand(p, t - span, t).mean()) for p in world.platforms}
        cap = {p: 0.0 for p in world.platforms}
        idle: dict[str, list[dict]] = {p: [] for p in world.platforms}
        for n in world.pool(t):
            if n["platform"] is None:  # in transit past the end of the window: nobody's
                continue
            cap[n["platform"]] += n["gpus"]
            if not n["in_transit"] and n["busy_gpus"] <= 0:
                idle[n["platform"]].append(n)
        budget = sc.max_moves_per_decision - sum(1 for s in started if s > t - hour)
        for _ in range(max(0, budget)):
            short = max(world.platforms, key=lambda p: (need[p] - cap[p], p))
            if need[short] - cap[short] <= 0:
                break
            givers = [p for p in world.platforms if p != short and idle[p] and cap[p] - idle[p][-1]["gpus"] >= need[p]]
            if not givers:
                break
            giver = max(givers, key=lambda p: (cap[p] - need[p], p))
            node = idle[giver].pop()
            world.move(node["name"], short)
            started.append(t)
            cap[giver] -= node["gpus"]
            cap[short] += node["gpus"]
    world.advance(world.end)
    return {**world.summary()["total"], "fastpath_moves": 0}


def pooling_floor(sc: Scenario) -> float:
    """Unmet GPU-hours with the whole pool serving the total demand at every step (no allocation beats it)."""
    world = World(sc)
    total_gpus = sum(n.gpus for n in world.nodes)
    return float((world.demand_.sum(axis=0) - total_gpus).clip(min=0).sum() * world.step_hours)


#: the regimes: label -> (policy, how it decides); a gpupool policy's "off" is the hourly plan
#: alone, "on" the shipped fast path beside it; greedy's is its cadence and look-back
REGIMES = {
    "static": ("static", "off"),
    "greedy 1h": ("greedy", ("1h", "1h")),
    "greedy 5min": ("greedy", ("5min", "15min")),
    "reactive off": ("reactive", "off"), "reactive": ("reactive", "on"),
    "predictive off": ("predictive", "off"), "predictive": ("predictive", "on"),
    "oracle off": ("oracle", "off"), "oracle": ("oracle", "on"),
}


def run_one(job) -> tuple[tuple, dict, float]:
    """``job = (key, sc, regime, clean)`` -> ``(key, totals, wall seconds)``."""
    key, sc, regime, clean = job
    policy, how = REGIMES[regime]
    t0 = time.perf_counter()
    if policy == "greedy":
        total = greedy(sc, every=how[0], window=how[1])
    else:
        sc = sc.model_copy(update={"fastpath": None}) if how == "off" else sc
        total = simulate(sc, policy, clean=clean)["total"]
    return key, {**total, "fastpath_moves": total.get("fastpath_moves", 0)}, time.perf_counter() - t0


def run_jobs(jobs: list, n_jobs: int) -> dict:
    """Run every job (in ``n_jobs`` processes); ``{key: (totals, wall)}``."""
    out = {}

    def note(key, total, wall):
        out[key] = (total, wall)
        print(f"[{len(out)}/{len(jobs)}] {json.dumps({'key': key, 'total': total, 'wall': round(wall, 1)})}",
              file=sys.stderr, flush=True)

    if n_jobs > 1:
        with ProcessPoolExecutor(n_jobs) as ex:
            for fut in as_completed([ex.submit(run_one, job) for job in jobs]):
                note(*fut.result())
    else:
        for job in jobs:
            note(*run_one(job))
    return out


POLICIES = tuple(REGIMES)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--days", type=float, default=31)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--data", default=str(DATA))
    ap.add_argument("--tune", default=",".join(TUNE), help="groupings the defaults were chosen on (not reported)")
    ap.add_argument("--report", default=",".join(REPORT), help="groupings reported")
    ap.add_argument("--pools", default=",".join(map(str, POOLS)), help="pool sizes, percent of the traces' totals")
    ap.add_argument("--no-faults", action="store_true", help="skip the runs with telemetry faults")
    ap.add_argument("--fault-seeds", type=int, default=3,
                    help="fault placements per grouping (seeds 11, 12, ...): one seed's few events decide too much")
    ap.add_argument("--fault-pools", default="100",
                    help="pool sizes (among --pools) whose predictive runs are repeated with faults")
    ap.add_argument("--hourly-faults", action="store_true",
                    help="repeat the fault runs with the fast path off (hourly only) too")
    ap.add_argument("--spread", help="run reactive and predictive with this Policy.demand_spread "
                    "(the policy's default when not given)")
    ap.add_argument("--from-log", help="render the tables from the per-run lines an earlier run wrote to stderr")
    ap.add_argument("--regimes", default=",".join(POLICIES),
                    help="the regimes run (a subset writes a table of its own; the bars need their regimes)")
    ap.add_argument("--no-energy", action="store_true", help="skip the parking runs (the energy columns)")
    ap.add_argument("--energy-regime", default="predictive",
                    help="the gpupool regime (among --regimes) run again with each parking rule")
    ap.add_argument("--wake", type=float, default=WAKE_MINUTES, help="minutes to wake a node, every rule")
    ap.add_argument("--slurm-buffers", default=",".join(map(str, SLURM_BUFFERS)),
                    help="warm buffers of the Slurm-style rule per platform (the baseline)")
    args = ap.parse_args(argv)
    policies = [r.strip() for r in args.regimes.split(",") if r.strip()]
    if set(policies) - set(POLICIES):
        ap.error(f"unknown regimes {sorted(set(policies) - set(POLICIES))}; there are {list(POLICIES)}")
    policies = [r for r in POLICIES if r in policies]
    energy = not args.no_energy and args.energy_regime in policies
    if energy and REGIMES[args.energy_regime][0] == "greedy":
        ap.error(f"--energy-regime {args.energy_regime!r}: the greedy rule does not park; give a gpupool regime")
    parking = {k: v for k, v in rules(args.wake, {}, buffers(args.slurm_buffers)).items() if k != OFF}
    data = Path(args.data)
    rounds = groupings()
    report = [g.strip() for g in args.report.split(",") if g.strip()]
    tune = [g.strip() for g in args.tune.split(",") if g.strip()]
    if set(report) & set(tune):
        ap.error(f"--report and --tune share {sorted(set(report) & set(tune))}: report on groupings not tuned on")
    unknown = sorted(set(report) - set(rounds))
    if unknown:
        ap.error(f"unknown groupings {unknown}; there are {sorted(rounds)}")
    pools = [int(p) for p in args.pools.split(",")]
    fault_pools = [int(p) for p in args.fault_pools.split(",") if p.strip()]
    if set(fault_pools) - set(pools):
        ap.error(f"--fault-pools {sorted(set(fault_pools) - set(pools))} not among --pools {pools}")
    seeds = fault_seeds(args.fault_seeds)
    fault_regimes = ("predictive", "predictive off") if args.hourly_faults else ("predictive",)
    jobs, scen = [], {}
    for pct in pools:  # pool by pool, so an interrupted run has whole regimes
        for g in report:
            nodes = pool_nodes(rounds[g], data, pct)
            sc = scenario(rounds[g], nodes, args.days, data, f"{g}-{pct}",
                          policy={"demand_spread": args.spread} if args.spread else None)
            scen[(g, pct)] = sc
            for regime in policies:
                jobs.append(((g, pct, regime, "clean"), sc, regime, True))
            for name, spec in (parking.items() if energy else ()):
                jobs.append(((g, pct, args.energy_regime, f"parking {name}"), with_parking(sc, spec),
                             args.energy_regime, True))
            if not args.no_faults and pct in fault_pools and "predictive" in policies:
                for seed in seeds:
                    spec = {**FAULTS, "seed": seed}
                    faulty = sc.model_copy(update={"faults": scenario(rounds[g], nodes, args.days, data, "f",
                                                                      faults=spec).faults})
                    for regime in fault_regimes:
                        jobs.append(((g, pct, regime, f"faults+clean s{seed}"), faulty, regime, True))
                        jobs.append(((g, pct, regime, f"faults, no clean s{seed}"), faulty, regime, False))
    t0 = time.perf_counter()
    if args.from_log:
        res = read_log(args.from_log)
        scen = {k: v for k, v in scen.items() if all((*k, p, "clean") in res for p in policies)}
        pools = [p for p in pools if any(k[1] == p for k in scen)]
        print(f"(rendered from {args.from_log}: {len(scen)} complete regimes)")
    else:
        res = run_jobs(jobs, args.jobs)
    wall = time.perf_counter() - t0
    if not scen:
        print("no complete regime to report")
        return 1
    print(f"Helios allocation regimes: {args.days:g} days, 5-min steps, plans hourly, fast path every 5 min (off: "
          "hourly only), move 30 min, <= 4 moves per plan and per rolling hour (both paths), 8-GPU nodes")
    print(f"policy defaults chosen on {', '.join(tune) or 'nothing'}; reported on {', '.join(report)}"
          + (f"; demand_spread={args.spread}" if args.spread else ""))
    for g in report:
        print(f"- {g}: " + ", ".join(f"{p}={a}+{b}" for p, (a, b) in zip(PLATFORMS, rounds[g])))
    rows = _regime_tables(scen, res, pools, policies)
    _bars(rows, policies)
    if not args.no_faults and "predictive" in policies:
        _fault_table(scen, res, report, fault_pools, seeds, fault_regimes)
    if energy:
        _energy(scen, res, args.energy_regime, list(parking), args.wake)
    chain = next((p for p in ("predictive", "reactive") if p in policies), None)
    if chain is None:
        return 0
    walls = [w for (g, pct, p, kind), (t, w) in res.items() if p == chain and kind == "clean"]
    per_month = sum(walls) / len(walls) / args.days * 31
    print()
    print(f"whole chain ({chain} with the fast path) wall time: {sum(walls) / len(walls):.0f} s per "
          f"{args.days:g}-day run = {per_month / 60:.1f} min per simulated month (bar: < 10 min); bench wall "
          f"{wall / 60:.1f} min, {args.jobs} job(s)")
    return 0


def _regime_tables(scen: dict, res: dict, pools: list, policies: list = POLICIES) -> list:
    """Unmet GPU-hours per regime and grouping, then means per pool; the rows for the bars."""
    print()
    print("unmet GPU-h per regime (off: hourly plan only; the others with the fast path as shipped)")
    print()
    print("| grouping | pool | nodes | floor | " + " | ".join(policies) + " |")
    print("|---|---:|---:|---:|" + "---:|" * len(policies))
    rows = []
    for (g, pct), sc in scen.items():
        u = {p: res[(g, pct, p, "clean")][0]["unmet_gpu_hours"] for p in policies}
        m = {p: res[(g, pct, p, "clean")][0]["moves"] for p in policies}
        f = {p: res[(g, pct, p, "clean")][0]["fastpath_moves"] for p in policies}
        rows.append((g, pct, u, m, f))
        print(f"| {g} | {pct}% | {sum(p.nodes for p in sc.platforms.values())} | {pooling_floor(sc):.0f} | "
              + " | ".join(f"{u[p]:.0f}" for p in policies) + " |")
    print()
    print("moves per regime (of them the fast path's in brackets)")
    print()
    print("| grouping | pool | " + " | ".join(p for p in policies if p != "static") + " |")
    print("|---|---:|" + "---:|" * (len(policies) - 1))
    for g, pct, u, m, f in rows:
        print(f"| {g} | {pct}% | " + " | ".join(f"{m[p]}" + (f" ({f[p]})" if f[p] else "")
                                              for p in policies if p != "static") + " |")
    print()
    print("means per pool: unmet GPU-h (moves, of them the fast path's)")
    print()
    print("| pool | " + " | ".join(policies) + " |")
    print("|---|" + "---:|" * len(policies))
    for pct in pools + ["all"]:
        sel = [r for r in rows if pct == "all" or r[1] == pct]
        if not sel:
            continue
        cell = []
        for p in policies:
            u = sum(r[2][p] for r in sel) / len(sel)
            m = sum(r[3][p] for r in sel) / len(sel)
            f = sum(r[4][p] for r in sel) / len(sel)
            cell.append(f"{u:.0f} ({m:.0f}" + (f", {f:.0f}" if f else "") + ")")
        print(f"| {pct if pct == 'all' else f'{pct}%'} | " + " | ".join(cell) + " |")
    return rows


def _bars(rows: list, policies: list = POLICIES) -> None:
    """Issue 30's bars on the report groupings: the fast path against the greedy rule at its
    cadence and against the hourly plan alone, in every regime and on the means."""
    print()
    print("bars (report groupings, all pools; every regime, and the mean):")
    mean = {p: sum(r[2][p] for r in rows) / len(rows) for p in policies}
    for pol in ("reactive", "predictive"):
        for ref, what in (("greedy 5min", "the greedy rule every 5 min"), (f"{pol} off", "itself hourly only")):
            if pol not in policies or ref not in policies:
                continue
            worse = [f"{g} {pct}% ({u[pol]:.0f} vs {u[ref]:.0f})" for g, pct, u, *_ in rows if u[pol] > u[ref] + 1e-6]
            print(f"- {pol} with the fast path <= {what}: mean {mean[pol]:.0f} vs {mean[ref]:.0f}; "
                  + ("MET in every regime" if not worse else f"NOT MET in {len(worse)}/{len(rows)}: " + ", ".join(worse)))
    if {"oracle", "oracle off"} <= set(policies):
        print(f"- oracle bound: hourly {mean['oracle off']:.0f}, with the fast path on true current demand "
              f"{mean['oracle']:.0f}")


def _fault_table(scen, res, report, fault_pools, seeds, fault_regimes) -> None:
    """Predictive under telemetry faults, with and without cleaning, against its fault-free figure."""
    for regime in fault_regimes:
        faulted = [(g, pct) for pct in fault_pools for g in report if (g, pct) in scen
                   and all((g, pct, regime, f"faults, no clean s{s}") in res for s in seeds)]
        if not faulted:
            continue
        print()
        print(f"telemetry faults (rates per series per day: {FAULTS}, seeds {', '.join(map(str, seeds))}), "
              f"{regime}{' (hourly only)' if regime.endswith('off') else ' with the fast path'}; mean over the "
              "seeds (each seed's figure in brackets); moves likewise:")
        print("| grouping | pool | fault-free | faults + cleaning | faults, no cleaning | cleaning vs fault-free "
              "| moves fault-free | moves faults + cleaning | moves faults, no cleaning |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        worst, worst_moves = -math.inf, -math.inf
        for g, pct in faulted:
            base = res[(g, pct, regime, "clean")][0]
            fc = [res[(g, pct, regime, f"faults+clean s{s}")][0] for s in seeds]
            fn = [res[(g, pct, regime, f"faults, no clean s{s}")][0] for s in seeds]

            def mean(rows, k):
                return sum(r[k] for r in rows) / len(rows)

            mc, mn = mean(fc, "unmet_gpu_hours"), mean(fn, "unmet_gpu_hours")
            b = base["unmet_gpu_hours"]
            rel = mc / b - 1 if b > 0 else 0.0
            rel_moves = mean(fc, "moves") / base["moves"] - 1 if base["moves"] else 0.0
            worst, worst_moves = max(worst, rel), max(worst_moves, rel_moves)
            each_c = "/".join(f"{r['unmet_gpu_hours']:.0f}" for r in fc)
            each_n = "/".join(f"{r['unmet_gpu_hours']:.0f}" for r in fn)
            print(f"| {g} | {pct}% | {b:.0f} | {mc:.0f} ({each_c}) | {mn:.0f} ({each_n}) | {rel:+.1%} | "
                  f"{base['moves']} | {mean(fc, 'moves'):.0f} | {mean(fn, 'moves'):.0f} |")
        print(f"- {regime} with cleaning within 5% of fault-free (mean over seeds): worst {worst:+.1%} "
              f"{'MET' if worst <= 0.05 else 'NOT MET'}; at most 10% more moves: worst {worst_moves:+.1%} "
              f"{'MET' if worst_moves <= 0.10 else 'NOT MET'}")


def _energy(scen, res, regime: str, names: list[str], wake: float) -> None:
    """Idle-node energy beside unmet, per regime: parking off, gpupool's rule and the Slurm-style
    rule per platform (``bench/_parking.py``), with issue 41's bars."""
    keys = [k for k in scen if all((*k, regime, f"parking {r}") in res for r in names)]
    if not keys:
        return
    totals = {(*k, OFF): res[(*k, regime, "clean")][0] for k in keys}
    totals.update({(*k, r): res[(*k, regime, f"parking {r}")][0] for k in keys for r in names})
    print()
    print(f"energy beside unmet ({regime}{' (hourly only)' if regime.endswith('off') else ' with the fast path'}): "
          f"idle kWh with parking off; gpupool: the product defaults of `parking:`, wake {wake:g} min; "
          f"slurm bN: the Slurm-style rule per platform (`scope: platform`, N idle nodes kept per platform, "
          f"idle 30 min, wake on shortage, the same wake); saved = 1 - (idle + parked kWh) / idle kWh off; "
          "+unmet: GPU-h above parking off; late: wakes whose platform was short before the node served")
    print()
    fig = energy_table(totals, keys, names)
    if GPUPOOL in names:
        energy_bars(fig, keys, [r for r in names if r != GPUPOOL])


def fault_seeds(n: int) -> list[int]:
    """The fault seeds of a run: ``FAULTS["seed"]`` and the ``n - 1`` after it."""
    return [FAULTS["seed"] + i for i in range(max(n, 1))]


def read_log(path: str) -> dict:
    """The ``{key: (totals, wall)}`` of the per-run lines ``[i/n] {json}`` in a bench's stderr."""
    out = {}
    for line in Path(path).read_text().splitlines():
        if line.startswith("[") and "] {" in line:
            rec = json.loads(line.split("] ", 1)[1])
            out[tuple(rec["key"])] = (rec["total"], rec["wall"])
    return out


def _table_name(argv: list[str]) -> str:
    """The 31-day month (the default length) writes allocate_helios.md; another length its own file."""
    days = float(option(argv, "--days", "31"))
    spread = option(argv, "--spread")
    # a subset of the groupings or pools is a file of its own: it never replaces the whole grid's
    subset = [v.replace(",", "_").replace(" ", "").lower()
              for v in (option(argv, "--report"), option(argv, "--pools"), option(argv, "--regimes")) if v]
    return (("allocate_helios" if days == 31 else f"allocate_helios-{days:g}d") + (f"-{spread}" if spread else "")
            + "".join(f"-{v}" for v in subset))


if __name__ == "__main__":
    from _tables import option, record_run  # bench/ is sys.path[0] when a bench is run

    raise SystemExit(record_run(_table_name, main))
