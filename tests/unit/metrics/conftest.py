"""Staging filled once per module and backend (SQLite and the real PostgreSQL): the pipeline
passes behind it take a while, and the collector only reads it."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent))

import metrics_staged  # noqa: E402

#: as tests/conftest.py (not importable under --import-mode=importlib)
PG_URL = os.environ.get("GPUPOOL_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def staged_ctx(request, tmp_path_factory):
    """A pipeline Context whose staging `metrics_staged.fill` filled; tests may add handovers only."""
    from gpupool.staging import db

    admin = schema = None
    if request.param == "sqlite":
        engine = db.make_engine(f"sqlite:///{tmp_path_factory.mktemp('metrics') / 'staging.db'}")
    else:
        schema = f"t_{uuid.uuid4().hex[:12]}"
        admin = sa.create_engine(PG_URL)
        try:
            with admin.begin() as conn:
                conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
        except sa.exc.OperationalError as exc:  # the machine's PostgreSQL must run: fail, don't skip
            pytest.fail(f"PostgreSQL at {PG_URL} unreachable: {exc.orig}")
        engine = db.make_engine(PG_URL, schema=schema)
    db.upgrade(engine)
    ctx = metrics_staged.fill(engine)
    yield ctx
    engine.dispose()
    if admin is not None:
        with admin.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()
