"""The distributed stack, really run: scripts/celery-stack.sh starts on loopback what
docker-compose.yaml describes (api-server, scheduler, dag-processor, triggerer, two Celery workers
with distinct host names, Redis as the broker, PostgreSQL for Airflow's metadata and for staging).

One stack serves the module: an undisturbed run of one window spreads its mapped tasks over both
workers; then the same window runs again while one worker is killed (SIGKILL to its process group,
as if its machine died) mid-task, and Airflow's retries finish it on the other worker with the
same staged rows. A last test keeps the compose file and the script in agreement.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml

# --import-mode=importlib keeps test directories off sys.path; the helpers live beside us.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from airflow_stack import StackError, celery_stack  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PG_URL = os.environ.get("GPUPOOL_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("GPUPOOL_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
PASSWORD = "gpupool-celery-e2e"
DAG = "gpupool_pipeline"
END = datetime(2026, 11, 1, 12, tzinfo=timezone.utc)
START = END - timedelta(hours=1)
MAPPED = ("extract", "detect", "forecast")
# a killed worker's task stops heartbeating: the scheduler fails it after this many seconds and
# Airflow retries it (the DAG's retries) after GPUPOOL_RETRY_DELAY_SECONDS
HEARTBEAT_TIMEOUT_S = 20

pytestmark = pytest.mark.slow


def _pg_server() -> str:
    url = sa.engine.make_url(PG_URL)
    return url._replace(drivername="postgresql", database=None).render_as_string(hide_password=False)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """The Celery stack: two workers of concurrency 1, a failed try retried after 3 s."""
    directory = tmp_path_factory.mktemp("celery_stack")
    settings = {
        "PG_SERVER": _pg_server(),
        "REDIS_URL": REDIS_URL,
        "WORKERS": "2",
        "WORKER_CONCURRENCY": "1",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False",  # only the runs the tests trigger
        "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": str(HEARTBEAT_TIMEOUT_S),
        "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "5",
        "GPUPOOL_RETRY_DELAY_SECONDS": "3",
    }
    try:
        with celery_stack(directory, name=f"gpupool_celery_{os.getpid()}", password=PASSWORD,
                          settings=settings) as st:
            yield st
    except StackError as exc:
        pytest.fail(str(exc))


def _workers(stack) -> list[str]:
    return [line.split("\t")[1].split("--celery-hostname ")[1].split()[0]
            for line in (stack["dir"] / "services").read_text().splitlines() if line.startswith("worker-")]


def _logs_tail(stack) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text()[-1500:]}" for p in sorted(stack["dir"].glob("*.log")))


def _live_in_group(pgid: int) -> list[int]:
    """Pids of process group `pgid` still running (zombies not counted)."""
    live = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            live.append(int(stat.parent.name))
    return live


def _trigger(stack) -> str:
    return stack["api"].trigger(DAG, {"window_start": START.isoformat(), "window_end": END.isoformat(), "dry_run": True})


# --- what the window staged, compared between runs -------------------------------------------

def _slices():
    from gpupool.staging.schema import (
        clean_sample, extract_run, forecast, forecast_run, inventory_node, sample, series_profile)

    return {
        "sample": (sample, [sample.c.ts >= START, sample.c.ts < END]),
        "inventory_node": (inventory_node, [inventory_node.c.snapshot_at == END]),
        "clean_sample": (clean_sample, [clean_sample.c.ts >= START, clean_sample.c.ts < END]),
        "series_profile": (series_profile, [series_profile.c.computed_at == END]),
        "forecast_run": (forecast_run, [forecast_run.c.issued_at == END]),
        "forecast": (forecast, [forecast.c.issued_at == END]),
        # one row per attempt: compare what succeeded, without the attempt's id and wall times
        "extract_run": (extract_run, [extract_run.c.window_start == START, extract_run.c.status == "success"]),
    }


VOLATILE = {"extract_run": {"id", "started_at", "finished_at", "error"}}


def _norm(value):
    if isinstance(value, float):
        return "nan" if math.isnan(value) else repr(value)
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    if isinstance(value, datetime):
        return value.isoformat()
    return value


def _snapshot(engine) -> dict[str, list[tuple]]:
    out = {}
    with engine.connect() as conn:
        for name, (table, where) in _slices().items():
            cols = [c for c in table.c if c.name not in VOLATILE.get(name, set())]
            rows = conn.execute(sa.select(*cols).where(*where)).all()
            out[name] = sorted((tuple(_norm(v) for v in row) for row in rows), key=repr)
    return out


def _clear_window(engine) -> None:
    """Delete what the window staged, so that only the next run can put it back."""
    with engine.begin() as conn:
        for table, where in _slices().values():
            conn.execute(table.delete().where(*where[:1] if table.name == "extract_run" else where))


@pytest.fixture(scope="module")
def staging(stack):
    from gpupool.staging import db

    engine = db.make_engine(stack["env"]["GPUPOOL_STAGING_URL"])
    yield engine
    engine.dispose()


@pytest.fixture(scope="module")
def undisturbed(stack, staging):
    """One run of the window with both workers up: its task instances and what it staged."""
    # history before the window, as earlier hourly runs leave it (detection and ARIMA need it)
    seed = subprocess.run(
        [sys.executable, "-m", "gpupool.cli", "run", "--start", (START - timedelta(days=1)).isoformat(),
         "--end", START.isoformat()], env=stack["env"], capture_output=True, text=True,
    )
    assert seed.returncode == 0, seed.stderr[-3000:]
    stack["api"].wait_dag(DAG)
    run_id = _trigger(stack)
    state = stack["api"].wait_run(DAG, run_id, timeout=300)
    assert state == "success", (state, _logs_tail(stack))
    return {"tis": stack["api"].task_instances(DAG, run_id), "staged": _snapshot(staging)}


def test_mapped_tasks_run_on_both_workers(stack, undisturbed):
    workers = _workers(stack)
    assert len(workers) == 2 and len(set(workers)) == 2, workers
    mapped = [t for t in undisturbed["tis"] if t["task_id"] in MAPPED]
    assert {(t["task_id"], t["map_index"]) for t in mapped} == {(s, i) for s in MAPPED for i in range(3)}
    assert all(t["state"] == "success" for t in mapped), mapped
    by_host: dict[str, list[str]] = {}
    for t in mapped:
        by_host.setdefault(t["hostname"], []).append(f"{t['task_id']}[{t['map_index']}]")
    assert set(by_host) == set(workers), by_host
    # the run staged the window for every platform
    staged = undisturbed["staged"]
    assert {r[0] for r in staged["extract_run"]} == {"openstack", "slurm", "kubernetes"}
    assert staged["sample"] and staged["clean_sample"] and staged["forecast"]


def test_killed_worker_retried_on_the_other_with_the_same_rows(stack, staging, undisturbed):
    api = stack["api"]
    victim = _workers(stack)[1]
    pgid = int((stack["dir"] / "worker-w2.pid").read_text())
    _clear_window(staging)
    assert all(not rows for name, rows in _snapshot(staging).items()), "the window's rows were not cleared"

    run_id = _trigger(stack)
    killed = None
    deadline = time.time() + 240
    while killed is None and time.time() < deadline:
        for t in api.task_instances(DAG, run_id):
            if t["task_id"] in MAPPED and t["state"] == "running" and t["hostname"] == victim:
                os.killpg(pgid, signal.SIGKILL)  # the worker, its pool process and the task it runs
                killed = (t["task_id"], t["map_index"])
                break
        else:
            if api.run_state(DAG, run_id) in ("success", "failed"):
                break
            time.sleep(0.3)
    assert killed, f"no mapped task ran on {victim} to kill it there"
    time.sleep(0.5)
    assert _live_in_group(pgid) == [], "the killed worker left processes running"

    state = api.wait_run(DAG, run_id, timeout=360)
    assert state == "success", (state, killed, _logs_tail(stack))
    tis = {(t["task_id"], t["map_index"]): t for t in api.task_instances(DAG, run_id)}
    retried = tis[killed]
    # the killed try failed by heartbeat timeout; a later try succeeded on the surviving worker
    assert retried["try_number"] >= 2 and retried["hostname"] != victim, retried
    assert all(t["state"] == "success" for t in tis.values())
    assert _snapshot(staging) == undisturbed["staged"]


# --- the compose file and the script describe one topology ------------------------------------

def _compose():
    return yaml.safe_load((ROOT / "docker-compose.yaml").read_text())


def test_compose_file_and_script_run_the_same_topology(stack):
    spec = _compose()
    env = spec["x-airflow-common"]["environment"]
    stack_env = stack["env"]

    # the same Airflow services, each with the same command; the workers as many
    compose_cmds = {name: svc["command"] for name, svc in spec["services"].items()
                    if name.startswith("airflow-") and name != "airflow-init"}
    services = dict(line.split("\t") for line in (stack["dir"] / "services").read_text().splitlines())
    script_cmds = sorted({" ".join(cmd.split()[1:3]) if "celery" in cmd else cmd.split()[1]
                          for cmd in services.values()})
    assert sorted(set(compose_cmds.values())) == script_cmds
    replicas = spec["services"]["airflow-worker"].get("deploy", {}).get("replicas", 1)
    assert replicas == sum(name.startswith("worker-") for name in services) == 2
    # the init steps of airflow-init, in the script
    init = spec["services"]["airflow-init"]["command"][-1]
    script = (ROOT / "scripts" / "celery-stack.sh").read_text()
    for step in ("airflow db migrate", "airflow pools set gpupool_actuation 1", "gpupool db upgrade"):
        assert step in init
        assert step.replace("airflow ", '"$PYTHON" -m airflow ').replace("gpupool db", '"$PYTHON" -m gpupool.cli db') in script

    # the same key settings
    for key in ("AIRFLOW__CORE__EXECUTOR", "AIRFLOW__CORE__AUTH_MANAGER", "AIRFLOW__CORE__HOSTNAME_CALLABLE"):
        assert stack_env[key] == env[key], key
    assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    assert stack_env["AIRFLOW__CORE__LOAD_EXAMPLES"].lower() == env["AIRFLOW__CORE__LOAD_EXAMPLES"].lower() == "false"
    for key in ("AIRFLOW__CORE__EXECUTION_API_SERVER_URL",):
        assert stack_env[key].endswith("/execution/") and env[key].endswith("/execution/")

    def url(value):
        return sa.engine.make_url(value)

    for e in (env, stack_env):
        broker = url(e["AIRFLOW__CELERY__BROKER_URL"])
        meta = url(e["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
        result = url(e["AIRFLOW__CELERY__RESULT_BACKEND"])
        staging = url(e["AIRFLOW_CONN_GPUPOOL_STAGING"])
        assert broker.drivername == "redis" and (broker.database or "0").isdigit()
        assert meta.drivername == "postgresql+psycopg2"
        # Celery's results beside Airflow's metadata; staging a database of its own on the same server
        assert result.drivername == "db+postgresql" and result.database == meta.database
        assert staging.drivername == "postgresql" and staging.host == meta.host
        assert (staging.port or 5432) == (meta.port or 5432)
        assert staging.database != meta.database
