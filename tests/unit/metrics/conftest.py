"""Staging filled once per module and backend (SQLite and the real PostgreSQL): the pipeline
passes behind it take a while, and the collector only reads it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import metrics_staged  # noqa: E402


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def staged_ctx(request, tmp_path_factory):
    """A pipeline Context whose staging `metrics_staged.fill` filled; tests may add handovers only."""
    from gpupool.staging import db

    if request.param == "postgresql":
        with request.getfixturevalue("pg_schema_engines")() as engine:
            yield metrics_staged.fill(engine)
        return
    engine = db.make_engine(f"sqlite:///{tmp_path_factory.mktemp('metrics') / 'staging.db'}")
    db.upgrade(engine)
    yield metrics_staged.fill(engine)
    engine.dispose()
