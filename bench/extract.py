"""Extract one hour of 1,000 nodes x 8 GPUs x 5 metrics at a 1-minute step from a real Prometheus.

    python bench/extract.py [--nodes 1000] [--pg postgresql://postgres@127.0.0.1:5432/postgres | --no-pg]

Writes the Slurm + DCGM exporter history with `gpupool.sources.openmetrics`, backfills a
private Prometheus with promtool (scripts/prometheus.sh), then times `SlurmSource.usage`
over the hour with five per-GPU DCGM fields and, unless --no-pg, a plain COPY of the rows
into a temporary PostgreSQL table. Prints seconds, rows/s and the share of the 60 s
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


def copy_to_postgres(frame, url: str) -> float:
    """COPY the frame into a temporary table; returns seconds."""
    import psycopg

    # Timestamps travel as epoch microseconds (formatting 2.4M datetimes as text costs more
    # than the COPY itself) and become timestamptz in the table's generated column.
    out = frame.assign(ts=frame["ts"].astype("int64"))
    cols = list(out.columns)
    t = time.perf_counter()
    with psycopg.connect(url) as conn, conn.cursor() as cur:
        cur.execute(
            "CREATE TEMP TABLE bench_samples (platform text, cluster text, entity_kind text, entity_id text,"
            " metric text, ts bigint, value double precision, unit text,"
            " at timestamptz GENERATED ALWAYS AS (to_timestamp(ts / 1e6)) STORED)"
        )
        # Text COPY fed with tab-separated chunks: one write per 200k rows, not per row.
        with cur.copy(f"COPY bench_samples ({', '.join(cols)}) FROM STDIN") as copy:
            for lo in range(0, len(out), 200_000):
                copy.write(out.iloc[lo:lo + 200_000].to_csv(sep="\t", header=False, index=False))
        cur.execute("SELECT count(*) FROM bench_samples")
        n = cur.fetchone()[0]
    assert n == len(frame), (n, len(frame))
    return time.perf_counter() - t


def main() -> None:
    from gpupool.sources.openmetrics import ClusterShape, write_exporter_history
    from gpupool.sources.slurm import SlurmSource

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--pg", default=os.environ.get("GPUPOOL_BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres"))
    ap.add_argument("--no-pg", action="store_true")
    args = ap.parse_args()

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
            pg_s = copy_to_postgres(frame, args.pg)
            total += pg_s
            print(f"COPY to PostgreSQL: {pg_s:.2f}s = {len(frame) / pg_s:,.0f} rows/s")
        print(f"extract{'' if args.no_pg else ' + COPY'}: {total:.2f}s; "
              f"ratio to the {BUDGET_S:.0f}s budget: {total / BUDGET_S:.2f}")
        if len(frame) != expected:
            sys.exit("row count differs from what was written")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
