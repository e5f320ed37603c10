"""A backfill of gpupool_pipeline over the embedded virtual datacenter through a running Airflow:
it must fill staging (samples, profiles, forecasts, plans) and send nothing.

    .venv/bin/python bench/backfill.py [--days 7] [--end 2026-11-01T00:00:00+00:00] [--keep DIR]

Starts `airflow standalone` on loopback (LocalExecutor, parallelism 4, its own AIRFLOW_HOME,
Airflow metadata and gpupool's staging in fresh PostgreSQL databases, as production runs them),
runs `airflow backfill create` over the window, waits for every run, then prints runs by state,
seconds per run, what staging holds, and the audit table's proof that no command was sent (rows
with dry_run = false must be 0).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import requests
import sqlalchemy as sa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))

from airflow_stack import (  # noqa: E402
    create_metadata_db,
    create_staging_db,
    drop_metadata_db,
    free_port,
    migrate,
    stack_env,
    standalone,
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--days", type=float, default=7.0)
    ap.add_argument("--end", default="2026-11-01T00:00:00+00:00")
    ap.add_argument("--keep", help="keep the Airflow home here, and its two databases")
    ap.add_argument("--timeout-hours", type=float, default=3.0)
    ap.add_argument("--pg", default=os.environ.get("GPUPOOL_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres"),
                    help="PostgreSQL server for Airflow's metadata (SQLite locks when a backfill queues many runs) "
                         "and for staging")
    args = ap.parse_args()
    end = pd.Timestamp(args.end)
    start = end - pd.Timedelta(days=args.days)
    home = Path(args.keep or tempfile.mkdtemp(prefix="gpupool-backfill-"))
    home.mkdir(parents=True, exist_ok=True)
    port = free_port()
    meta_db = f"gpupool_backfill_{os.getpid()}"
    admin, metadata_url = create_metadata_db(args.pg, meta_db)
    staging_db = f"{meta_db}_staging"
    staging = create_staging_db(args.pg, staging_db)[1]
    env = stack_env(home, port, metadata_url, staging_url=staging, password="bench", jwt_secret="gpupool-bench-secret")
    migrate(env)
    subprocess.run([sys.executable, "-m", "gpupool.cli", "db", "upgrade"], env=env, check=True, capture_output=True)
    with standalone(env, password="bench", timeout=240) as (base, token):
        headers = {"Authorization": f"Bearer {token}"}
        for _ in range(60):
            if requests.get(f"{base}/api/v2/dags/gpupool_pipeline", headers=headers, timeout=10).status_code == 200:
                break
            time.sleep(2)
        t0 = time.time()
        out = subprocess.run(
            [sys.executable, "-m", "airflow", "backfill", "create", "--dag-id", "gpupool_pipeline",
             "--from-date", start.isoformat(), "--to-date", (end - pd.Timedelta(hours=1)).isoformat(),
             "--max-active-runs", "1"], env=env, capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"backfill create failed: {out.stderr[-2000:]}")
        deadline = t0 + args.timeout_hours * 3600
        states: dict[str, int] = {}
        while time.time() < deadline:
            runs = _all_runs(base, headers)
            states = {}
            for r in runs:
                states[r["state"]] = states.get(r["state"], 0) + 1
            done = states.get("success", 0) + states.get("failed", 0)
            print(f"  {time.time() - t0:7.0f}s  {states}", flush=True)
            if runs and done == len(runs):
                break
            time.sleep(30)
        took = time.time() - t0
    from gpupool.staging.schema import action_audit, allocation_plan, extract_run, forecast, sample, series_profile

    engine = sa.create_engine(staging)
    with engine.connect() as conn:
        counts = {t.name: conn.execute(sa.select(sa.func.count()).select_from(t)).scalar()
                  for t in (sample, series_profile, forecast, allocation_plan, action_audit)}
        ok_windows = conn.execute(sa.select(sa.func.count(sa.distinct(extract_run.c.window_start)))
                                  .where(extract_run.c.status == "success")).scalar()
        live = conn.execute(sa.select(sa.func.count()).select_from(action_audit).where(action_audit.c.dry_run.is_(False))).scalar()
        live_plans = conn.execute(sa.select(sa.func.count()).select_from(allocation_plan).where(allocation_plan.c.dry_run.is_(False))).scalar()
    n = sum(states.values())
    print(f"backfill {start.isoformat()} .. {end.isoformat()}: {n} runs {states} in {took:.0f}s "
          f"({took / max(n, 1):.1f}s per run)")
    print(f"staging: {counts}; windows extracted: {ok_windows}")
    print(f"commands sent (action_audit rows with dry_run = false): {live}; live plans: {live_plans}")
    engine.dispose()
    if args.keep:
        print(f"kept: {home}; metadata database {meta_db}, staging database {staging_db}")
    else:
        shutil.rmtree(home, ignore_errors=True)
        drop_metadata_db(admin, meta_db)
        drop_metadata_db(admin, staging_db)
    if live or live_plans or states.get("failed"):
        sys.exit(1)


def _all_runs(base: str, headers: dict) -> list[dict]:
    """Every backfill run of the DAG, page by page (the API caps a page at 100)."""
    runs: list[dict] = []
    while True:
        page = requests.get(f"{base}/api/v2/dags/gpupool_pipeline/dagRuns", headers=headers, timeout=30,
                            params={"run_type": "backfill", "limit": 100, "offset": len(runs)}).json()
        runs += page["dag_runs"]
        if not page["dag_runs"] or len(runs) >= page.get("total_entries", 0):
            return runs


if __name__ == "__main__":
    from _tables import record_run  # bench/ is sys.path[0] when a bench is run

    raise SystemExit(record_run("backfill", main))
