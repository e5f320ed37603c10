"""Benchmark of the closed-loop simulator: all four policies over the six Helios traces.

    nice -n 10 .venv/bin/python bench/simulate.py [--scenario config/scenarios/helios-3platforms.yaml]
                                                  [--days 31] [--policies static,reactive,predictive,oracle]
                                                  [--baseline]

Prints the wall time per simulated day of each policy and the study's table: per platform and in
total, demand, served, unmet and capacity GPU-hours, utilisation and moves (and of them the fast
path's), with unmet as a ratio to static. ``reactive`` and ``predictive`` run the whole decision
chain every hour (telemetry -> detect/clean -> forecast -> plan) and, as the scenario says (absent:
on, at the shipped DAG's cadence), the fast path between the plans (readings -> the detect stage's
judge -> decide); target: a month of the whole chain with the fast path in under 10 minutes on 2
cores, i.e. under 19.4 s per simulated day (hourly only, ``--fastpath off``: under 5 minutes).
``--no-clean`` skips cleaning (and the fast path's judge); ``--fastpath off|5min|...`` overrides
the scenario's key.

``--baseline`` also runs ``predictive`` as it ran before the forecast stage kept its ARIMA orders
and Holt-Winters parameters within a day (``ForecastTuning(order_search_every=None)``: every hour
searches and re-estimates them) and prints its wall time and unmet beside the default's, as a
ratio measured in the same run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
from pathlib import Path

from gpupool.decisions.policy import POLICY_KINDS
from gpupool.forecast.stage import ForecastTuning
from gpupool.sim.scenario import Scenario, load_scenario
from gpupool.sim.study import simulate
from gpupool.sim.world import World

ROOT = Path(__file__).resolve().parents[1]
#: seconds per simulated day: a month of the whole chain in 10 minutes with the fast path, 5 without
TARGET_S_PER_DAY = {"static": 1.0, "reactive": 600.0 / 31, "predictive": 600.0 / 31, "oracle": None}
TARGET_S_PER_DAY_HOURLY = {"static": 1.0, "reactive": 300.0 / 31, "predictive": 300.0 / 31, "oracle": None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default=str(ROOT / "config/scenarios/helios-3platforms.yaml"))
    ap.add_argument("--days", type=float, default=None,
                    help="simulate the first DAYS days (a synthetic scenario is generated that far)")
    ap.add_argument("--policies", default=",".join(POLICY_KINDS))
    ap.add_argument("--no-clean", action="store_true", help="forecast from raw telemetry (skip detect/clean)")
    ap.add_argument("--fastpath", help="the scenario's fastpath key for this run (off, 5min, ...)")
    ap.add_argument("--baseline", action="store_true",
                    help="also run predictive re-searching ARIMA orders every hour (order_search_every=None)")
    args = ap.parse_args(argv)
    scenario = load_scenario(args.scenario)
    if args.fastpath is not None:  # checked as the scenario's own key would be
        raw = {**scenario.model_dump(exclude={"platforms", "fastpath"}), "fastpath": args.fastpath,
               "platforms": scenario.platforms}
        scenario = Scenario.model_validate(raw).model_copy(update={"source": scenario.source})
    probe = World(scenario)
    if args.days is not None:
        scenario = scenario.model_copy(update={"end": (probe.start + dt.timedelta(days=args.days)).to_pydatetime()})
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    results, timing = {}, {}
    # a synthetic world is generated to any end; a traced one stops where its traces do
    end = probe.end if args.days is None else World(scenario).end
    days = (end - probe.start).total_seconds() / 86400.0
    runs = [(p, p) for p in policies]
    if args.baseline:
        runs.append(("predictive, hourly search", "predictive"))
    for label, policy in runs:
        # the forecast stage as it was: orders searched and parameters estimated every hour
        tuning = ForecastTuning(order_search_every=None) if label.endswith("hourly search") else None
        t0, c0 = time.perf_counter(), time.process_time()
        results[label] = simulate(scenario, policy, progress=sys.stderr.isatty(), clean=not args.no_clean,
                                  forecast_tuning=tuning)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        timing[label] = wall / days
        # CPU time beside wall: on a shared machine the wall time counts the neighbours' work too
        print(f"{label:>10}: {wall:7.1f} s wall ({cpu:.1f} s CPU), {timing[label]:6.3f} s per simulated day",
              flush=True)
    print()
    fast = "off" if scenario.fastpath is None else f"every {scenario.fastpath}"
    print(f"scenario {scenario.label()}, {days:g} days, step {scenario.step}, decisions every "
          f"{scenario.decision_every}, fast path {fast}, move {scenario.move_minutes:g} min, "
          f"<= {scenario.max_moves_per_decision} moves per decision and per rolling hour")
    print()
    print(table(results))
    print()
    print("| policy | s per simulated day | target | met |")
    print("|---|---:|---:|:---:|")
    targets = TARGET_S_PER_DAY if scenario.fastpath is not None else TARGET_S_PER_DAY_HOURLY
    for policy, s in timing.items():
        target = targets.get(policy)
        met = "-" if target is None else ("yes" if s < target else "NO")
        print(f"| {policy} | {s:.3f} | {'-' if target is None else f'< {target:.3g}'} | {met} |")
    base = "predictive, hourly search"
    if base in timing and "predictive" in timing:
        u, ub = results["predictive"]["total"]["unmet_gpu_hours"], results[base]["total"]["unmet_gpu_hours"]
        print()
        print(f"predictive / the same with an hourly order search (same run): wall {timing['predictive'] / timing[base]:.3f}, "
              f"unmet {u:.0f} vs {ub:.0f} GPU-h, moves {results['predictive']['total']['moves']} vs "
              f"{results[base]['total']['moves']}")
    return 0


def table(results: dict[str, dict]) -> str:
    """A markdown table of study results, one row per policy and platform (total first)."""
    static = results.get("static")
    lines = [
        "| policy | platform | demand GPU-h | served GPU-h | unmet GPU-h | unmet / static | capacity GPU-h "
        "| utilization | moves | fast-path moves |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for policy, res in results.items():
        blocks = [("total", res["total"])] + list(res["platforms"].items())
        for name, m in blocks:
            ref = (static["total"] if name == "total" else static["platforms"][name]) if static else None
            ratio = (f"{m['unmet_gpu_hours'] / ref['unmet_gpu_hours']:.3f}"
                     if ref and ref["unmet_gpu_hours"] > 0 else "-")
            lines.append(
                f"| {policy} | {name} | {m['demand_gpu_hours']:.0f} | {m['served_gpu_hours']:.0f} | "
                f"{m['unmet_gpu_hours']:.0f} | {ratio} | {m['capacity_gpu_hours']:.0f} | "
                f"{m['utilization']:.3f} | {m['moves']} | {m.get('fastpath_moves', '-')} |"
            )
    return "\n".join(lines)


def _table_name(argv: list[str]) -> str:
    """simulate.md for the default Helios scenario; another scenario, length or --no-clean its own file."""
    scenario = option(argv, "--scenario")
    days = option(argv, "--days")
    return ("simulate" + (f"-{Path(scenario).stem}" if scenario else "") + (f"-{float(days):g}d" if days else "")
            + ("-no-clean" if "--no-clean" in argv else "")
            + (f"-fastpath-{option(argv, '--fastpath')}" if option(argv, "--fastpath") else ""))


if __name__ == "__main__":
    from _tables import option, record_run  # bench/ is sys.path[0] when a bench is run

    raise SystemExit(record_run(_table_name, main))
