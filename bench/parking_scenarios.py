"""What parking saves on the shipped scenarios: idle-node energy saved and unmet added, gpupool's
rule beside the Slurm-style rule per platform, for each of ``config/scenarios/*.yaml``.

    nice -n 5 .venv/bin/python bench/parking_scenarios.py [--days 6] [--jobs 1]
        [--scenarios demo-world,helios-3platforms,...] [--slurm-buffers 4] [--wake 10]

Each scenario runs as ``gpupool simulate`` runs it (policy ``predictive``, the scenario's own
fast-path setting, cleaning on), over its first ``--days`` days (absent: its whole window), three
ways (``bench/_parking.py``): ``parking: off``, gpupool's rule (the product defaults of
``ParkingSpec``) and the Slurm-style rule per platform (a node idle for 30 minutes beyond a warm
buffer of N idle nodes per platform parks; wake on shortage), all at the same ``wake_minutes``.
Saved is ``1 - (idle_kwh + parked_kwh) / idle_kwh(off)``: the parked nodes' standby draw is charged.
"""

from __future__ import annotations

import argparse
import datetime as dt
import time
from pathlib import Path

import pandas as pd

from _parking import OFF, WAKE_MINUTES, buffers, energy_table, rules, with_parking
from allocate_helios import run_jobs

from gpupool.sim.scenario import Scenario, load_scenario
from gpupool.sim.world import World

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "config" / "scenarios"
#: the baseline's warm buffer (idle nodes kept per platform)
SLURM_BUFFER = 4
#: the policy ``gpupool simulate`` is shown with in the README
POLICY = "predictive"


def shortened(sc: Scenario, days: float | None) -> tuple[Scenario, float]:
    """``sc`` over its first ``days`` days (None: its whole window) and the days it then spans
    (a traced world stops where its traces do)."""
    probe = World(sc)
    if days is not None:
        sc = sc.model_copy(update={"end": (probe.start + dt.timedelta(days=days)).to_pydatetime()})
        probe = World(sc)
    return sc, (probe.end - probe.start).total_seconds() / 86400.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--days", type=float, default=None, help="the first DAYS days of each scenario (absent: all)")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--scenarios", default=",".join(sorted(p.stem for p in SCENARIOS.glob("*.yaml"))))
    ap.add_argument("--wake", type=float, default=WAKE_MINUTES)
    ap.add_argument("--slurm-buffers", default=str(SLURM_BUFFER))
    args = ap.parse_args(argv)
    named = rules(args.wake, {}, buffers(args.slurm_buffers))
    jobs, spans, fast = [], {}, {}
    for stem in [s.strip() for s in args.scenarios.split(",") if s.strip()]:
        sc, spans[stem] = shortened(load_scenario(SCENARIOS / f"{stem}.yaml"), args.days)
        fast[stem] = "off" if sc.fastpath is None else f"every {pd.Timedelta(sc.fastpath).total_seconds() / 60:g} min"
        # run_jobs' regime "predictive" keeps the scenario's own fast-path key
        jobs += [((stem, spans[stem], name), with_parking(sc, parking), POLICY, True) for name, parking in named.items()]
    t0 = time.perf_counter()
    res = {key: total for key, (total, _) in run_jobs(jobs, args.jobs).items()}
    print(f"Parking on the shipped scenarios (config/scenarios/): policy {POLICY}, cleaning on, each scenario's "
          f"fast path ({', '.join(f'{s} {f}' for s, f in fast.items())}), wake {args.wake:g} min; "
          "gpupool: the product defaults of `parking:`; slurm bN: the Slurm-style rule per platform "
          "(`scope: platform`, N idle nodes kept per platform, idle 30 min, wake on shortage); "
          "saved = 1 - (idle + parked kWh) / idle kWh off; +unmet: GPU-h above parking off; "
          "late: wakes whose platform was short before the node served")
    print()
    keys = [(s, d) for s, d in spans.items()]
    energy_table(res, keys, [r for r in named if r != OFF], heads=("scenario", "days"), unit="")
    print(f"\nbench wall {(time.perf_counter() - t0) / 60:.1f} min, {args.jobs} job(s)")
    return 0


def _table_name(argv: list[str]) -> str:
    """parking_scenarios.md for the scenarios' whole windows; a shorter run its own file."""
    days = option(argv, "--days")
    return "parking_scenarios" + (f"-{float(days):g}d" if days else "")


if __name__ == "__main__":
    from _tables import option, record_run  # bench/ is sys.path[0] when a bench is run

    raise SystemExit(record_run(_table_name, main))
