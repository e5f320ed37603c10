"""Fixtures shared by every test layer: staging engines on SQLite and on the real PostgreSQL,
and an isolated Airflow home (SQLite metadata, examples off, our dags/ folder)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa

PG_URL = os.environ.get("GPUPOOL_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")

#: tests that share long-lived services run as one unit on one xdist worker: the two modules
#: that start a running Airflow (one stack at a time), and the integration directories, whose real
#: services start once per session. Every other module is a unit of its own (its module-scoped
#: fixtures set up once).
SHARED_SCOPES = {
    "tests/e2e/test_airflow_stack.py": "airflow",
    "tests/e2e/test_celery_stack.py": "airflow",
    "tests/integration": "services",
    "tests/integration_actuation": "services",
}


def xdist_scope(nodeid: str) -> str:
    """The unit of work of the test `nodeid` (relative to the rootdir) under `pytest -n`."""
    path = nodeid.split("::", 1)[0]
    parts = path.split("/")
    for depth in (len(parts), 2):
        shared = SHARED_SCOPES.get("/".join(parts[:depth]))
        if shared:
            return shared
    return path


def pytest_xdist_make_scheduler(config, log):
    """`make test` runs `pytest -n auto --dist loadscope`: scopes are :func:`xdist_scope`'s, so no
    service or Airflow stack starts twice and no two stacks start at once. (xdist's own
    `loadgroup` marks do not reach its scheduler on this pytest.)"""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedScopes(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_scope(nodeid)

    return SharedScopes(config, log)


@pytest.fixture
def sqlite_engine(tmp_path):
    from gpupool.staging import db

    engine = db.make_engine(f"sqlite:///{tmp_path / 'staging.db'}")
    db.upgrade(engine)
    yield engine
    engine.dispose()


@contextlib.contextmanager
def _pg_schema_engine():
    """A migrated staging schema of its own on the real PostgreSQL, dropped afterwards."""
    from gpupool.staging import db

    schema = f"t_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(PG_URL)
    try:
        with admin.begin() as conn:
            conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    except sa.exc.OperationalError as exc:  # the machine's PostgreSQL must run: fail, don't skip
        pytest.fail(f"PostgreSQL at {PG_URL} unreachable: {exc.orig}")
    engine = db.make_engine(PG_URL, schema=schema)
    db.upgrade(engine)
    try:
        yield engine
    finally:
        engine.dispose()
        with admin.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture(scope="session")
def pg_schema_engines():
    """The factory behind :func:`pg_engine`, for fixtures of a wider scope (``with
    pg_schema_engines() as engine: ...``); tests/conftest.py is not importable under importlib."""
    return _pg_schema_engine


@pytest.fixture
def pg_engine():
    """A migrated staging schema of its own on the real PostgreSQL, dropped afterwards."""
    with _pg_schema_engine() as engine:
        yield engine


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request):
    """Each staging test runs on both backends."""
    yield request.getfixturevalue(f"{request.param}_engine" if request.param == "sqlite" else "pg_engine")


# --- Airflow -----------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]
# --import-mode=importlib keeps test directories off sys.path; the Airflow helpers live in e2e/
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
from airflow_stack import home_env  # noqa: E402


def airflow_env(home: Path) -> dict[str, str]:
    """The isolated Airflow home of `home_env`, quiet and not in Airflow's unit-test mode."""
    return {
        **home_env(home),
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
    }


@pytest.fixture(scope="session")
def dags_root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def make_airflow_env():
    return airflow_env


@pytest.fixture(scope="session")
def airflow_home(tmp_path_factory):
    """Set up once per session: env vars for this process and a migrated metadata DB."""
    home = tmp_path_factory.mktemp("airflow_home")
    env = airflow_env(home)
    os.environ.update(env)
    proc = subprocess.run(
        [sys.executable, "-m", "airflow", "db", "migrate"], env={**os.environ, **env}, capture_output=True, text=True
    )
    if proc.returncode != 0:
        pytest.fail(f"airflow db migrate failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return home
