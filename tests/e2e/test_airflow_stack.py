"""The product through a running Airflow: REST trigger with Params, then the GPU pool page in
real headless Chromium behind Airflow's auth (screenshot saved to artifacts/pool-page.png),
then a short backfill that fills staging and sends nothing. Staging is a PostgreSQL database of
the module's own."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import requests
import sqlalchemy as sa

# --import-mode=importlib keeps test directories off sys.path; the helpers live beside us.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from chromium import find_chromium, layout_problems, render  # noqa: E402
from airflow_stack import (  # noqa: E402
    Api,
    StackError,
    create_metadata_db,
    drop_metadata_db,
    free_port,
    migrate,
    stack_env,
    standalone,
)

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts"
END = datetime(2026, 11, 1, 12, tzinfo=timezone.utc)
PASSWORD = "gpupool-e2e"
PG_URL = os.environ.get("GPUPOOL_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stack(tmp_path_factory, make_airflow_env, module_staging_url):
    """`airflow standalone` on loopback with small parallelism, staging (PostgreSQL) seeded with history."""
    home = tmp_path_factory.mktemp("airflow_stack")
    port = free_port()
    # Airflow's metadata in a database of its own on the real PostgreSQL (see airflow_stack.py)
    meta_db = f"gpupool_e2e_{os.getpid()}"
    admin, metadata_url = create_metadata_db(PG_URL, meta_db)
    env = stack_env(home, port, metadata_url, staging_url=module_staging_url, password=PASSWORD, jwt_secret="gpupool-e2e-secret",
                    base={**make_airflow_env(home), "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO"})
    # history before the run's window, as earlier hourly runs or a backfill leave it
    seed = subprocess.run(
        [sys.executable, "-m", "gpupool.cli", "run", "--start", (END - timedelta(days=2, hours=1)).isoformat(),
         "--end", (END - timedelta(hours=1)).isoformat()],
        env=env, capture_output=True, text=True,
    )
    assert seed.returncode == 0, seed.stderr[-3000:]
    try:
        migrate(env)
    except StackError as exc:
        pytest.fail(str(exc))
    try:
        with standalone(env, password=PASSWORD) as (base, token):
            yield {"base": base, "token": token, "api": Api(base, token), "env": env, "home": home}
    except StackError as exc:
        pytest.fail(str(exc))
    finally:
        drop_metadata_db(admin, meta_db)
        admin.dispose()


def _api(stack, method, path, **kw):
    return stack["api"].request(method, path, **kw)


def _staging(stack):
    from gpupool.staging import db

    return db.make_engine(stack["env"]["GPUPOOL_STAGING_URL"])


def test_trigger_with_params_through_the_rest_api(stack):
    from gpupool.staging.schema import action_audit, allocation_plan, extract_run, forecast, sample

    api = stack["api"]
    api.wait_dag("gpupool_pipeline")
    start = END - timedelta(hours=1)
    run_id = api.trigger("gpupool_pipeline", {
        "window_start": start.isoformat(), "window_end": END.isoformat(), "dry_run": True, "policy": "predictive",
    })
    state = api.wait_run("gpupool_pipeline", run_id)
    assert state == "success", (state, (stack["home"] / "standalone.log").read_text()[-4000:])
    engine = _staging(stack)
    with engine.connect() as conn:
        runs = conn.execute(sa.select(extract_run).where(extract_run.c.window_start == start, extract_run.c.status == "success")).all()
        rows = conn.execute(sa.select(sa.func.count()).select_from(sample).where(sample.c.ts >= start, sample.c.ts < END)).scalar()
        fc = conn.execute(sa.select(sa.func.count()).select_from(forecast).where(forecast.c.issued_at == END)).scalar()
        plan = conn.execute(sa.select(allocation_plan).where(allocation_plan.c.decided_at == END)).all()
        live = conn.execute(sa.select(action_audit).where(action_audit.c.dry_run.is_(False))).all()
    assert {x.platform for x in runs} == {"openstack", "slurm", "kubernetes"}
    assert rows > 0 and fc > 0 and len(plan) >= 1
    assert live == []


def test_pool_page_requires_auth(stack):
    r = requests.get(stack["base"] + "/gpupool/api/pool", timeout=10)
    assert r.status_code in (401, 403)
    ok = _api(stack, "GET", "/gpupool/api/pool")
    assert ok.status_code == 200, ok.text
    body = ok.json()
    assert set(body["platforms"]) == {"openstack", "slurm", "kubernetes"}
    assert all(p["gpus"] > 0 and p["demand"] for p in body["platforms"].values())


def test_pool_page_in_headless_chromium(stack):
    """Real Chromium, logged in with Airflow's session cookie; fails on an error or no data, on a
    chart outside its card or a page that scrolls sideways at 1,300 or 800 px."""
    chromium = find_chromium()
    assert chromium, "chromium is not installed (scripts/install-test-tools.sh installs it)"
    text, png, geometry = render(chromium, stack["base"] + "/gpupool/", cookie=("_token", stack["token"], stack["base"]),
                                 widths=(1300, 800))
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "pool-page.png").write_bytes(png)
    assert "GPU pool" in text
    for name in ("openstack", "slurm", "kubernetes"):
        assert name in text
    assert "GPUs" in text and "Last plan" in text
    lowered = text.lower()
    assert "internal server error" not in lowered and "not authenticated" not in lowered and "no data" not in lowered
    assert len(png) > 20_000  # a rendered page with charts, not a blank or an error stub
    for width, g in geometry.items():
        assert len(g["cards"]) == 3 and all(c["charts"] for c in g["cards"]), (width, g["cards"])
        assert layout_problems(g) == [], (width, layout_problems(g))


def test_backfill_fills_staging_and_sends_nothing(stack):
    from gpupool.staging.schema import action_audit, allocation_plan, extract_run

    start = END - timedelta(hours=3)
    out = subprocess.run(
        [sys.executable, "-m", "airflow", "backfill", "create", "--dag-id", "gpupool_pipeline",
         "--from-date", (start - timedelta(hours=1)).isoformat(), "--to-date", start.isoformat(),
         "--max-active-runs", "1"],
        env=stack["env"], capture_output=True, text=True,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    engine = _staging(stack)
    deadline = time.time() + 600
    while time.time() < deadline:
        runs = _api(stack, "GET", "/api/v2/dags/gpupool_pipeline/dagRuns", params={"run_type": "backfill"}).json()["dag_runs"]
        if runs and all(r["state"] in ("success", "failed") for r in runs):
            break
        time.sleep(5)
    assert runs and all(r["state"] == "success" for r in runs), [(r["dag_run_id"], r["state"]) for r in runs]
    with engine.connect() as conn:
        ok = conn.execute(sa.select(extract_run.c.window_start).where(extract_run.c.status == "success")).all()
        plans = conn.execute(sa.select(allocation_plan).where(allocation_plan.c.decided_at > start - timedelta(hours=1),
                                                               allocation_plan.c.decided_at < END)).all()
        live = conn.execute(sa.select(action_audit).where(action_audit.c.dry_run.is_(False))).all()
    assert len(runs) >= 2 and len(plans) >= len(runs)
    assert all(p.dry_run for p in plans)
    assert live == []  # a backfill never sends a command
    assert len({r.window_start for r in ok}) >= len(runs)
