"""Loader throughput against a raw COPY of the same rows, on PostgreSQL, in one run.

    .venv/bin/python bench/staging_load.py [--rows 1000000]

The loader replaces a (platform, window) slice: delete, then COPY from a DataFrame, inside
one transaction, into the day-partitioned `sample` table. The baseline is a bare
`COPY sample FROM STDIN` of the same rows, already formatted as CSV, into an identical
fresh schema. Target: loader rows/s >= 0.8 x raw COPY rows/s.
"""

from __future__ import annotations

import argparse
import io
import os
import time
import uuid
from datetime import datetime, timezone

import numpy as np
import pandas as pd
import sqlalchemy as sa

from gpupool.canonical import normalize_samples
from gpupool.staging import db, loader

PG_URL = os.environ.get("GPUPOOL_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def make_rows(n: int) -> pd.DataFrame:
    """n canonical rows: 1-minute samples of per-GPU series over one day."""
    per_series = 1440
    series = -(-n // per_series)
    ts = pd.date_range("2026-02-01", periods=per_series, freq="1min", tz="UTC")
    gpu = np.repeat(np.arange(series), per_series)[:n]
    rng = np.random.default_rng(0)
    return pd.DataFrame(
        {
            "platform": "slurm",
            "cluster": "hpc",
            "entity_kind": "gpu",
            "entity_id": [f"node{g // 8:04d}/gpu{g % 8}" for g in gpu],
            "metric": "gpu_util",
            "ts": np.tile(ts.to_numpy(), series)[:n],
            "value": rng.uniform(0, 100, n).round(2),
            "unit": "percent",
        }
    )


def fresh_schema(admin) -> str:
    name = f"bench_{uuid.uuid4().hex[:8]}"
    with admin.begin() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{name}"'))
    return name


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    args = ap.parse_args()
    frame = normalize_samples(make_rows(args.rows), where="bench")
    window = (datetime(2026, 2, 1, tzinfo=timezone.utc), datetime(2026, 2, 2, tzinfo=timezone.utc))
    admin = sa.create_engine(PG_URL)
    schemas = []
    try:
        # baseline: raw COPY of pre-formatted CSV into an identical, empty, partitioned table
        s1 = fresh_schema(admin)
        schemas.append(s1)
        e1 = db.make_engine(PG_URL, schema=s1)
        db.upgrade(e1)
        with e1.begin() as conn:
            db.ensure_partitions(conn, *window)
        buf = io.StringIO()
        out = frame.copy()
        out["ts"] = out["ts"].dt.strftime("%Y-%m-%d %H:%M:%S+00")
        out.to_csv(buf, index=False, header=False)
        data = buf.getvalue()
        t0 = time.perf_counter()
        with e1.begin() as conn:
            raw = conn.connection.driver_connection
            with raw.cursor() as cur, cur.copy("COPY sample FROM STDIN (FORMAT csv)") as cp:
                cp.write(data)
        raw_s = time.perf_counter() - t0

        # the loader, from the DataFrame, including its delete of the slice
        s2 = fresh_schema(admin)
        schemas.append(s2)
        e2 = db.make_engine(PG_URL, schema=s2)
        db.upgrade(e2)
        with e2.begin() as conn:
            db.ensure_partitions(conn, *window)
        t0 = time.perf_counter()
        loader.replace_slice(e2, loader.Slice("sample", {"platform": "slurm"}, *window), frame)
        load_s = time.perf_counter() - t0
        # and a rerun of the same window (delete of 1M rows + COPY)
        t0 = time.perf_counter()
        loader.replace_slice(e2, loader.Slice("sample", {"platform": "slurm"}, *window), frame)
        rerun_s = time.perf_counter() - t0
        with e2.connect() as conn:
            assert conn.execute(sa.text("select count(*) from sample")).scalar() == len(frame)
        e1.dispose()
        e2.dispose()
    finally:
        with admin.begin() as conn:
            for s in schemas:
                conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{s}" CASCADE'))
    n = len(frame)
    print(f"rows: {n}")
    print(f"raw COPY          {raw_s:7.2f} s  {n / raw_s:12,.0f} rows/s")
    print(f"loader (new)      {load_s:7.2f} s  {n / load_s:12,.0f} rows/s")
    print(f"loader (rerun)    {rerun_s:7.2f} s  {n / rerun_s:12,.0f} rows/s")
    print(f"ratio loader/raw  {raw_s / load_s:.2f}  (target >= 0.80)")
    print(f"ratio rerun/raw   {raw_s / rerun_s:.2f}")


if __name__ == "__main__":
    from _tables import record_run  # bench/ is sys.path[0] when a bench is run

    raise SystemExit(record_run("staging_load", main))
