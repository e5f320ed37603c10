"""A backfill of gpupool_pipeline over the embedded virtual datacenter through a running Airflow:
it must fill staging (samples, profiles, forecasts, plans) and send nothing.

    .venv/bin/python bench/backfill.py [--days 7] [--end 2026-11-01T00:00:00+00:00] [--keep DIR]

Starts `airflow standalone` on loopback (LocalExecutor, parallelism 4, its own AIRFLOW_HOME,
Airflow metadata in a fresh PostgreSQL database, a SQLite staging file), runs `airflow backfill create` over the window, waits for every run, then
prints runs by state, seconds per run, what staging holds, and the audit table's proof that no
command was sent (rows with dry_run = false must be 0).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import requests
import sqlalchemy as sa

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--days", type=float, default=7.0)
    ap.add_argument("--end", default="2026-11-01T00:00:00+00:00")
    ap.add_argument("--keep", help="keep the Airflow home and staging file here")
    ap.add_argument("--timeout-hours", type=float, default=3.0)
    ap.add_argument("--pg", default=os.environ.get("GPUPOOL_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres"),
                    help="PostgreSQL server for Airflow's metadata (SQLite locks when a backfill queues many runs)")
    args = ap.parse_args()
    end = pd.Timestamp(args.end)
    start = end - pd.Timedelta(days=args.days)
    home = Path(args.keep or tempfile.mkdtemp(prefix="gpupool-backfill-"))
    home.mkdir(parents=True, exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    staging = f"sqlite:///{home / 'gpupool_staging.db'}"
    meta_db = f"gpupool_backfill_{os.getpid()}"
    server = sa.engine.make_url(args.pg.replace("postgresql+psycopg://", "postgresql://"))
    admin = sa.create_engine(server.set(drivername="postgresql+psycopg"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{meta_db}"'))
        conn.execute(sa.text(f'CREATE DATABASE "{meta_db}"'))
    metadata_url = server.set(drivername="postgresql+psycopg2", database=meta_db).render_as_string(hide_password=False)
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__API__HOST": "127.0.0.1", "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__CORE__PARALLELISM": "4", "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False", "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
        "AIRFLOW__API_AUTH__JWT_SECRET": "gpupool-bench-secret", "GPUPOOL_STAGING_URL": staging,
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": metadata_url,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    (home / "passwords.json").write_text(json.dumps({"admin": "bench"}))
    for cmd in (["db", "migrate"], ["pools", "set", "gpupool_actuation", "1", "gpupool"]):
        subprocess.run([sys.executable, "-m", "airflow", *cmd], env=env, check=True, capture_output=True)
    subprocess.run([sys.executable, "-m", "gpupool.cli", "db", "upgrade"], env=env, check=True, capture_output=True)
    log = open(home / "standalone.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "airflow", "standalone"], env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            try:
                if requests.get(f"{base}/api/v2/monitor/health", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            time.sleep(2)
        token = requests.post(f"{base}/auth/token", json={"username": "admin", "password": "bench"}, timeout=10).json()["access_token"]
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
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
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
    if not args.keep:
        shutil.rmtree(home, ignore_errors=True)
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{meta_db}" WITH (FORCE)'))
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
    main()
