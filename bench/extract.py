"""Extract one hour of 1,000 nodes x 8 GPUs x 5 metrics at a 1-minute step from the simulator's
Prometheus facade and from a real Prometheus, and stage it in PostgreSQL with gpupool's loader.

    python bench/extract.py [--nodes 1000] [--pg postgresql://postgres@127.0.0.1:5432/postgres | --no-pg]

Writes the Slurm + DCGM exporter history with `gpupool.sources.openmetrics`, backfills a
private Prometheus with promtool (scripts/prometheus.sh), then times `SlurmSource.usage`
over the hour with five per-GPU DCGM fields and, unless --no-pg, stages the rows with the
loader (delete + COPY of the window's slice) in a fresh schema. Prints seconds, rows/s and the share of the 60 s
budget the issue sets for this hour on 2 cores. Needs `bash scripts/install-services.sh`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUDGET_S = 60.0
START = datetime(2026, 1, 5, tzinfo=timezone.utc)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _script(*args: object) -> None:
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "prometheus.sh"), *map(str, args)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"prometheus.sh {args[0]} failed:\n{proc.stderr}")


def queries():
    """Five per-GPU DCGM fields as canonical (and extra) metrics."""
    from gpupool.sources.prometheus import MetricQuery

    def q(field: str, scale: str = "") -> MetricQuery:
        return MetricQuery(f"max by (Hostname, gpu) ({field}){scale}", "gpu", "{Hostname}/{gpu}")

    return {
        "gpu_util": q("DCGM_FI_DEV_GPU_UTIL"),
        "gpu_mem_used": q("DCGM_FI_DEV_FB_USED", " * 1048576"),
        "gpu_power": MetricQuery("max by (Hostname, gpu) (DCGM_FI_DEV_POWER_USAGE)", "gpu", "{Hostname}/{gpu}", "watts"),
        "gpu_temp": MetricQuery("max by (Hostname, gpu) (DCGM_FI_DEV_GPU_TEMP)", "gpu", "{Hostname}/{gpu}", "celsius"),
        "gpu_sm_clock": MetricQuery("max by (Hostname, gpu) (DCGM_FI_DEV_SM_CLOCK)", "gpu", "{Hostname}/{gpu}", "mhz"),
    }


def stage_in_postgres(frame, url: str, start: datetime, end: datetime) -> float:
    """Stage the frame with gpupool's own loader (delete + COPY of the window's slice, in a
    day-partitioned `sample`) into a fresh schema; returns seconds."""
    import uuid

    import sqlalchemy as sa

    from gpupool.canonical import normalize_samples
    from gpupool.staging import db, loader

    url = url.replace("postgresql://", "postgresql+psycopg://", 1)
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(url)
    with admin.begin() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    try:
        engine = db.make_engine(url, schema=schema)
        db.upgrade(engine)
        t = time.perf_counter()
        frame = normalize_samples(frame, where="bench")
        platform = frame["platform"].iloc[0]
        n = loader.replace_slice(engine, loader.Slice("sample", {"platform": platform}, start, end), frame)
        took = time.perf_counter() - t
        assert n == len(frame)
        engine.dispose()
        return took
    finally:
        with admin.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


def facade_leg(nodes: int, gpus: int, pg: str | None) -> float:
    """The same hour from the virtual datacenter's Prometheus facade: a one-platform world of
    `nodes` x `gpus`, the Slurm source's default queries (capacity and allocation per node,
    pending, DCGM utilisation and framebuffer per GPU)."""
    import yaml

    from gpupool.emulator.serve import make_state, serve_in_thread
    from gpupool.sources.slurm import SlurmSource

    work = Path(tempfile.mkdtemp(prefix="bench-facade-"))
    spec = {"step": "1min", "decision_every": "1h", "node_gpus": gpus, "move_minutes": 30, "max_moves_per_decision": 4,
            "start": (START - timedelta(hours=1)).isoformat(), "end": (START + timedelta(hours=1)).isoformat(),
            "platforms": {"slurm": {"synthetic": {"base": nodes * gpus * 0.7, "total_gpus": nodes * gpus}, "nodes": nodes}}}
    (work / "s.yaml").write_text(yaml.safe_dump(spec))
    try:
        t = time.perf_counter()
        state = make_state(work / "s.yaml", speed=0, start_at=(START + timedelta(hours=1)).isoformat())
        print(f"facade setup: world of {nodes} nodes in {time.perf_counter() - t:.1f}s")
        with serve_in_thread(state) as servers:
            src = SlurmSource("slurm", prometheus_url=servers.urls["prometheus"], timeout=600)
            t = time.perf_counter()
            frame = src.usage(START, START + timedelta(hours=1), "1min")
            ext_s = time.perf_counter() - t
        print(f"facade extract: {len(frame):,} rows in {ext_s:.2f}s = {len(frame) / ext_s:,.0f} rows/s")
        total = ext_s
        if pg:
            pg_s = stage_in_postgres(frame, pg, START, START + timedelta(hours=1))
            total += pg_s
            print(f"facade staged in PostgreSQL (loader): {pg_s:.2f}s = {len(frame) / pg_s:,.0f} rows/s")
        print(f"facade extract + stage: {total:.2f}s; ratio to the {BUDGET_S:.0f}s budget: {total / BUDGET_S:.2f}")
        return total
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    from gpupool.sources.openmetrics import ClusterShape, write_exporter_history
    from gpupool.sources.slurm import SlurmSource

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--pg", default=os.environ.get("GPUPOOL_BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres"))
    ap.add_argument("--no-pg", action="store_true")
    ap.add_argument("--no-facade", action="store_true", help="skip the simulator's Prometheus facade leg")
    ap.add_argument("--no-real", action="store_true", help="skip the real Prometheus leg")
    args = ap.parse_args()
    if not args.no_facade:
        facade_leg(args.nodes, args.gpus, None if args.no_pg else args.pg)
    if args.no_real:
        return

    work = Path(tempfile.mkdtemp(prefix="bench-extract-", dir=ROOT / ".services"))
    try:
        shape = ClusterShape(nodes=args.nodes, gpus_per_node=args.gpus, extra_dcgm=True)
        t = time.perf_counter()
        truth = write_exporter_history(work / "h.om", shape, START, START + timedelta(hours=1), "1min")
        gen_s = time.perf_counter() - t
        t = time.perf_counter()
        _script("backfill", work / "prom", work / "h.om")
        fill_s = time.perf_counter() - t
        port = _free_port()
        _script("start", work / "prom", port)
        print(f"setup: {int(truth['samples']):,} samples written in {gen_s:.1f}s, backfilled in {fill_s:.1f}s")
        try:
            src = SlurmSource("slurm-bench", prometheus_url=f"http://127.0.0.1:{port}", queries=queries(),
                              timeout=120)
            t = time.perf_counter()
            frame = src.usage(START, START + timedelta(hours=1), "1min")
            ext_s = time.perf_counter() - t
        finally:
            _script("stop", work / "prom")
        expected = args.nodes * args.gpus * 5 * 60
        print(f"extract: {len(frame):,} rows (expected {expected:,}) in {ext_s:.2f}s = {len(frame) / ext_s:,.0f} rows/s")
        total = ext_s
        if not args.no_pg:
            pg_s = stage_in_postgres(frame, args.pg, START, START + timedelta(hours=1))
            total += pg_s
            print(f"staged in PostgreSQL (loader): {pg_s:.2f}s = {len(frame) / pg_s:,.0f} rows/s")
        print(f"extract{'' if args.no_pg else ' + stage'}: {total:.2f}s; "
              f"ratio to the {BUDGET_S:.0f}s budget: {total / BUDGET_S:.2f}")
        if len(frame) != expected:
            sys.exit("row count differs from what was written")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    from _tables import record_run  # bench/ is sys.path[0] when a bench is run

    raise SystemExit(record_run("extract", main))
