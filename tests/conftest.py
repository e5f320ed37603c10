"""Fixtures shared by every test layer: staging engines on SQLite and on the real PostgreSQL."""

from __future__ import annotations

import os
import uuid

import pytest
import sqlalchemy as sa

PG_URL = os.environ.get("GPUPOOL_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


@pytest.fixture
def sqlite_engine(tmp_path):
    from gpupool.staging import db

    engine = db.make_engine(f"sqlite:///{tmp_path / 'staging.db'}")
    db.upgrade(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def pg_engine():
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
    yield engine
    engine.dispose()
    with admin.begin() as conn:
        conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
    admin.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request):
    """Each staging test runs on both backends."""
    yield request.getfixturevalue(f"{request.param}_engine" if request.param == "sqlite" else "pg_engine")
