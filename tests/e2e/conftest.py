"""Staging for the end-to-end tests: a fresh database of its own on the real PostgreSQL (created
here, dropped afterwards), given to the code as GPUPOOL_STAGING_URL. Every end-to-end run stages on
PostgreSQL, as production does; SQLite, the embedded default of `make demo`, is the unit and
staging tests' (tests/staging runs each loader test on both), and test_run_backends.py checks that
it leaves the same rows as PostgreSQL."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent))  # --import-mode=importlib: the helpers live beside us
from airflow_stack import create_staging_db, drop_metadata_db  # noqa: E402

PG_URL = os.environ.get("GPUPOOL_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")  # as tests/conftest.py


@contextmanager
def fresh_staging_database() -> Iterator[str]:
    """The URL of a new, empty PostgreSQL database for the block; dropped afterwards."""
    name = f"e2e_{uuid.uuid4().hex[:12]}"
    try:
        admin, url = create_staging_db(PG_URL, name)
    except sa.exc.OperationalError as exc:  # the machine's PostgreSQL must run: fail, don't skip
        pytest.fail(f"PostgreSQL at {PG_URL} unreachable: {exc.orig}")
    try:
        yield url
    finally:
        drop_metadata_db(admin, name)
        admin.dispose()


@pytest.fixture
def staging_url() -> Iterator[str]:
    """Staging for one test: a new PostgreSQL database."""
    with fresh_staging_database() as url:
        yield url


@pytest.fixture(scope="module")
def module_staging_url() -> Iterator[str]:
    """Staging shared by a module's tests (one running Airflow): a new PostgreSQL database."""
    with fresh_staging_database() as url:
        yield url
