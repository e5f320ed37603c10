"""Staging for the end-to-end tests: a SQLite file, or a fresh database of its own on the real
PostgreSQL (created here, dropped afterwards), given to the code as GPUPOOL_STAGING_URL."""

from __future__ import annotations

import os
import uuid

import pytest
import sqlalchemy as sa

PG_URL = os.environ.get("GPUPOOL_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")  # as tests/conftest.py


def _admin_url() -> str:
    return sa.engine.make_url(PG_URL).set(database="postgres").render_as_string(hide_password=False)


@pytest.fixture
def pg_database_url():
    """The URL of a new, empty PostgreSQL database; dropped after the test."""
    name = f"e2e_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(_admin_url(), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    except sa.exc.OperationalError as exc:  # the machine's PostgreSQL must run: fail, don't skip
        pytest.fail(f"PostgreSQL at {PG_URL} unreachable: {exc.orig}")
    yield sa.engine.make_url(PG_URL).set(database=name).render_as_string(hide_password=False)
    with admin.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def staging_url(request, tmp_path):
    """Each end-to-end test runs on both staging backends."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'staging.db'}"
    return request.getfixturevalue("pg_database_url")
