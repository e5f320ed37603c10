"""The fast path's tick with parking over a large pool, beside today's tick (no ``power:``).

    nice -n 10 .venv/bin/python bench/power_tick.py [--nodes 12500] [--ticks 9] [--staging-url URL]

One platform of ``--nodes`` 8-GPU nodes, half of them busy, read through a stand-in source (the
reading itself is the platform's cost, not gpupool's) and staged in SQLite (or ``--staging-url``),
its parks and wakes sent to an in-memory power means (``tests/unit/actuation/mempower.py``). Every
tick runs ``gpupool.jobs.fastpath.run_fastpath`` as the DAG does: read, stage, judge, the power
step (advance, read staging, the rule, parks and wakes through the power machine), decide, record.
Ticks are 5 minutes apart; the idle half becomes parkable at the seventh (``idle_minutes`` 30), so
that tick begins as many parks as ``parking.park_per_minute`` allows (the rest follow over the
next ticks): the worst tick there is.

Printed: each leg's median steady tick and its worst, and the ratio of the parking tick to
today's. Target (issue 41): a tick over 12,500 nodes (read, judge, decide, wake) under 10 s.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "unit" / "actuation"))
T0 = datetime(2026, 6, 3, 12, 0, tzinfo=timezone.utc)
TARGET_S = 10.0


def leg(nodes: int, ticks: int, power: bool, url: str | None) -> list[tuple[float, int, int]]:
    """(seconds, parks, wakes) of each tick of one leg, on a fresh staging."""
    from mempower import MemPower

    from gpupool.config import parse_config
    from gpupool.jobs.fastpath import run_fastpath
    from gpupool.pipeline import Context
    from gpupool.sources.base import Pressure
    from gpupool.staging import db
    from gpupool.staging.schema import inventory_node

    names = [f"n{i:05d}" for i in range(nodes)]
    busy = set(names[: nodes // 2])
    platform = {"name": "hpc", "kind": "slurm", "conn_id": "hpc", "actuation": True}
    if power:
        platform["power"] = {"means": "slurm"}
    cfg = parse_config({"platforms": [platform], "dry_run": False})
    tmp = tempfile.mkdtemp()
    engine = db.make_engine(url or f"sqlite:///{tmp}/staging.db")
    db.upgrade(engine)
    with engine.begin() as conn:
        conn.execute(inventory_node.insert(), [
            {"platform": "hpc", "node": n, "snapshot_at": T0 - timedelta(hours=1), "gpus": 8, "schedulable": True,
             "drain_reason": None, "busy_gpus": 8.0 if n in busy else 0.0} for n in names])

    class Source:
        platform = "hpc"

        def pressure(self, at):
            return Pressure("hpc", at, 8.0 * len(busy), 0.0, 8.0 * nodes, tuple(n for n in names if n not in busy),
                            {n: 8 for n in names}, nodes, {"bench": "stand-in"})

    ctx, means = Context(cfg, engine), MemPower("hpc", names)
    out = []
    for i in range(ticks):
        began = time.perf_counter()
        res = run_fastpath(ctx, T0 + timedelta(minutes=5 * i), dry_run=False, sources={"hpc": Source()},
                           actuators={}, power_actuators={"hpc": means})
        out.append((time.perf_counter() - began, len(res["power"]["parks"]), len(res["power"]["wakes"])))
    engine.dispose()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=12500)
    ap.add_argument("--ticks", type=int, default=9)
    ap.add_argument("--staging-url", help="a fresh, empty database (default: a SQLite file per leg)")
    args = ap.parse_args(argv)
    today = leg(args.nodes, args.ticks, False, args.staging_url)
    parking = leg(args.nodes, args.ticks, True, args.staging_url)
    steady = lambda ticks: statistics.median(t for t, parks, wakes in ticks[1:] if not parks and not wakes)  # noqa: E731
    rows = [("today (no `power:`)", today), ("with parking", parking)]
    lines = [f"{args.nodes:,} nodes of 8 GPUs, half busy; {args.ticks} ticks 5 minutes apart; staging "
             f"{'given' if args.staging_url else 'SQLite'}", "",
             "| leg | median steady tick | worst tick (its parks) | target |", "| --- | ---: | ---: | --- |"]
    for label, ticks in rows:
        worst = max(ticks)
        lines.append(f"| {label} | {steady(ticks):.2f} s | {worst[0]:.2f} s ({worst[1]:,}) | "
                     f"{'< %g s' % TARGET_S if label != rows[0][0] else ''} |")
    lines += ["", f"steady tick with parking / today's: {steady(parking) / max(steady(today), 1e-9):.1f}x; "
                  f"the worst tick begins as many parks as parking.park_per_minute allows over a tick "
                  f"({sum(t[1] for t in parking):,} parks over the leg)"]
    text = "\n".join(lines)
    print(text)
    from _tables import command_line, write_table

    write_table("power_tick", text, command_line(argv, "bench/power_tick.py"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
