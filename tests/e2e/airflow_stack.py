"""A running Airflow for the e2e tests and bench/backfill.py: `airflow standalone` on loopback
(LocalExecutor, parallelism 4, simple auth with one admin), its metadata in a database of its own on
the real PostgreSQL, started and waited for until its API answers.

SQLite metadata locks ("database is locked") when a backfill queues runs while the scheduler works,
hence PostgreSQL. Not a test module (pytest collects only test_*.py): tests/e2e/test_airflow_stack.py
and bench/backfill.py put this directory on sys.path and import it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import requests
import sqlalchemy as sa

ROOT = Path(__file__).resolve().parents[2]


class StackError(RuntimeError):
    """Airflow did not come up; the message carries the command's stderr or the log's tail."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def create_metadata_db(pg_url: str, name: str) -> tuple[sa.engine.Engine, str]:
    """(Re)create database `name` on the PostgreSQL server of `pg_url`.

    Returns an AUTOCOMMIT engine on the server (to drop it with `drop_metadata_db`) and the URL
    Airflow's SQL_ALCHEMY_CONN takes (psycopg2, password included).
    """
    server = sa.engine.make_url(pg_url.replace("postgresql+psycopg://", "postgresql://"))
    admin = sa.create_engine(server.set(drivername="postgresql+psycopg"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    return admin, server.set(drivername="postgresql+psycopg2", database=name).render_as_string(hide_password=False)


def drop_metadata_db(admin: sa.engine.Engine, name: str) -> None:
    """Drop database `name`, closing whatever still holds it."""
    with admin.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def home_env(home: Path) -> dict[str, str]:
    """An Airflow home with our dags/ and plugins/, no examples, and a SQLite staging file in it."""
    return {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "GPUPOOL_STAGING_URL": f"sqlite:///{home / 'gpupool_staging.db'}",
    }


def stack_env(home: Path, port: int, metadata_url: str, *, password: str, jwt_secret: str,
              base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of every `airflow` command of the stack; writes the admin's password file.

    os.environ, then `base` (default `home_env(home)`), then the stack's own settings: API on
    127.0.0.1:`port`, parallelism 4, DAGs unpaused, no scheduled runs (only those a caller
    creates), simple auth with `admin` / `password`, metadata at `metadata_url`, and this Python's
    bin/ first on PATH.
    """
    (home / "passwords.json").write_text(json.dumps({"admin": password}))
    return {
        **os.environ,
        **(home_env(home) if base is None else base),
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__CORE__PARALLELISM": "4",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
        "AIRFLOW__API_AUTH__JWT_SECRET": jwt_secret,
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": metadata_url,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }


def migrate(env: dict[str, str]) -> None:
    """`airflow db migrate`, then the `gpupool_actuation` pool (1 slot) the DAG's actuation uses."""
    for args in (["db", "migrate"], ["pools", "set", "gpupool_actuation", "1", "gpupool"]):
        proc = subprocess.run([sys.executable, "-m", "airflow", *args], env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise StackError(f"airflow {' '.join(args)} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")


@contextmanager
def standalone(env: dict[str, str], *, password: str, timeout: float = 180) -> Iterator[tuple[str, str]]:
    """Run `airflow standalone` with `env` (log: $AIRFLOW_HOME/standalone.log) for the block.

    Yields (base URL, API token) once /api/v2/monitor/health answers 200; raises StackError with
    the log's tail if it exits or is not healthy within `timeout` s. Stops its whole process group.
    """
    port = env["AIRFLOW__API__PORT"]
    log_path = Path(env["AIRFLOW_HOME"]) / "standalone.log"
    log = open(log_path, "w")
    proc = subprocess.Popen([sys.executable, "-m", "airflow", "standalone"], env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + timeout
        while True:
            if proc.poll() is not None:
                raise StackError(f"airflow standalone exited {proc.returncode}:\n{log_path.read_text()[-4000:]}")
            try:
                if requests.get(f"{base}/api/v2/monitor/health", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.time() > deadline:
                raise StackError(f"airflow standalone not healthy in {timeout:.0f} s:\n{log_path.read_text()[-4000:]}")
            time.sleep(2)
        token = requests.post(f"{base}/auth/token", json={"username": "admin", "password": password}, timeout=10)
        if token.status_code not in (200, 201):
            raise StackError(f"POST /auth/token: {token.status_code} {token.text[:2000]}")
        yield base, token.json()["access_token"]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
