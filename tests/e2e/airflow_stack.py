"""A running Airflow for the e2e tests and bench/backfill.py: `airflow standalone` on loopback
(LocalExecutor, parallelism 4, simple auth with one admin), its metadata and gpupool's staging in
databases of their own on the real PostgreSQL, started and waited for until its API answers; or
(`celery_stack`) the distributed topology of docker-compose.yaml as scripts/celery-stack.sh starts it.

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


def create_staging_db(pg_url: str, name: str) -> tuple[sa.engine.Engine, str]:
    """(Re)create database `name` for gpupool's staging, as `create_metadata_db` does; returns the
    admin engine and the staging URL (psycopg 3, password included). Drop it with `drop_metadata_db`."""
    admin, url = create_metadata_db(pg_url, name)
    return admin, sa.engine.make_url(url).set(drivername="postgresql+psycopg").render_as_string(hide_password=False)


def home_env(home: Path) -> dict[str, str]:
    """An Airflow home with our dags/ and plugins/ and no examples. Staging is the caller's to
    give (`stack_env`'s `staging_url`): the end-to-end tests stage on PostgreSQL, as production does."""
    return {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    }


def stack_env(home: Path, port: int, metadata_url: str, *, staging_url: str, password: str, jwt_secret: str,
              base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of every `airflow` command of the stack; writes the admin's password file.

    os.environ, then `base` (default `home_env(home)`), then the stack's own settings: API on
    127.0.0.1:`port`, parallelism 4, DAGs unpaused, no scheduled runs (only those a caller
    creates), simple auth with `admin` / `password`, metadata at `metadata_url`, staging at
    `staging_url` (GPUPOOL_STAGING_URL), and this Python's bin/ first on PATH.
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
        "GPUPOOL_STAGING_URL": staging_url,
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
        yield base, api_token(base, password)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


def api_token(base: str, password: str, username: str = "admin") -> str:
    """A bearer token for the REST API at `base` (simple auth manager)."""
    token = requests.post(f"{base}/auth/token", json={"username": username, "password": password}, timeout=10)
    if token.status_code not in (200, 201):
        raise StackError(f"POST /auth/token: {token.status_code} {token.text[:2000]}")
    return token.json()["access_token"]


class Api:
    """Airflow's REST API v2 with a bearer token: trigger a DAG, wait for its run, read its tasks."""

    def __init__(self, base: str, token: str):
        self.base, self.token = base, token

    def request(self, method: str, path: str, **kw) -> requests.Response:
        return requests.request(method, self.base + path, headers={"Authorization": f"Bearer {self.token}"},
                                timeout=30, **kw)

    def wait_dag(self, dag_id: str, timeout: float = 120) -> dict:
        deadline = time.time() + timeout
        while True:
            r = self.request("GET", f"/api/v2/dags/{dag_id}")
            if r.status_code == 200:
                return r.json()
            if time.time() > deadline:
                raise StackError(f"{dag_id} never appeared: {r.status_code} {r.text[:500]}")
            time.sleep(2)

    def trigger(self, dag_id: str, conf: dict) -> str:
        r = self.request("POST", f"/api/v2/dags/{dag_id}/dagRuns", json={"logical_date": None, "conf": conf})
        if r.status_code not in (200, 201):
            raise StackError(f"trigger {dag_id}: {r.status_code} {r.text[:2000]}")
        return r.json()["dag_run_id"]

    def run_state(self, dag_id: str, run_id: str) -> str | None:
        return self.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}").json().get("state")

    def wait_run(self, dag_id: str, run_id: str, timeout: float = 420, poll: float = 3) -> str | None:
        """The run's final state (success/failed), or its state when `timeout` s ran out."""
        deadline = time.time() + timeout
        state = None
        while time.time() < deadline:
            state = self.run_state(dag_id, run_id)
            if state in ("success", "failed"):
                return state
            time.sleep(poll)
        return state

    def task_instances(self, dag_id: str, run_id: str) -> list[dict]:
        r = self.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances", params={"limit": 1000})
        r.raise_for_status()
        return r.json()["task_instances"]


CELERY_STACK = ROOT / "scripts" / "celery-stack.sh"


def source_env(env_file: Path, base: dict[str, str]) -> dict[str, str]:
    """`base` after sourcing the shell file `env_file` (export lines)."""
    out = subprocess.run(["bash", "-c", '. "$1" && env -0', "_", str(env_file)], env=base, capture_output=True,
                         check=True)
    return dict(item.split("=", 1) for item in out.stdout.decode().split("\0") if "=" in item)


@contextmanager
def celery_stack(directory: Path, *, name: str, password: str, settings: dict[str, str] | None = None,
                 timeout: float = 420) -> Iterator[dict]:
    """scripts/celery-stack.sh start `directory` for the block; afterwards stop it and drop its
    two databases.

    The script sees this environment without any AIRFLOW_* / GPUPOOL_* variable of the caller's,
    plus STACK_NAME=`name`, ADMIN_PASSWORD, this Python, free ports, and `settings`. Yields
    {"base", "token", "api" (Api), "env" (the stack's environment, from DIR/env), "dir"}; raises
    StackError with the script's output when it fails or does not finish within `timeout` s.
    """
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "GPUPOOL_"))}
    env = {
        **clean,
        "STACK_NAME": name,
        "ADMIN_PASSWORD": password,
        "PYTHON": sys.executable,
        "API_PORT": str(free_port()),
        "LOG_PORTS": " ".join(str(free_port()) for _ in range(3)),
        **(settings or {}),
    }
    if "PYTHONPATH" in os.environ:  # a checkout's include/ ahead of the installed package
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]

    def script(cmd: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(CELERY_STACK), cmd, str(directory)], env=env, capture_output=True,
                              text=True, timeout=timeout)

    try:
        try:
            start = script("start")
        except subprocess.TimeoutExpired as exc:
            raise StackError(f"celery-stack.sh start did not finish in {timeout:.0f} s:\n{exc.stderr or ''}") from exc
        if start.returncode != 0:
            raise StackError(f"celery-stack.sh start failed (exit {start.returncode}):\n{start.stderr[-6000:]}")
        stack_env = source_env(directory / "env", env)
        base = stack_env["GPUPOOL_API_URL"]
        token = api_token(base, password)
        yield {"base": base, "token": token, "api": Api(base, token), "env": stack_env, "dir": directory}
    finally:
        script("stop")
        # the script (re)creates its two databases; the tests leave none behind
        server = sa.engine.make_url(env.get("PG_SERVER", "postgresql://postgres@127.0.0.1:5432"))
        admin = sa.create_engine(server.set(drivername="postgresql+psycopg", database="postgres"),
                                 isolation_level="AUTOCOMMIT")
        for suffix in ("airflow", "staging"):
            drop_metadata_db(admin, f"{name}_{suffix}")
        admin.dispose()
