"""Two writers at once on the real PostgreSQL: the day partition of `sample` that neither finds
(two platforms' extracts of one backfilled day) and the model of one series and anchor (two
runs of one window) are each created once, and neither writer fails."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone

import numpy as np
import pandas as pd
import pytest
import sqlalchemy as sa

from gpupool.staging import db, loader, models
from gpupool.staging.schema import sample, series_profile

DAY0 = datetime(2026, 11, 1, tzinfo=timezone.utc)
KEY = ("sim", "c1", "platform", "", "gpu_allocated")
ROUNDS = 8  # each round races on a fresh day / anchor; the old code lost most rounds


def _race(n: int, work) -> list[BaseException]:
    """Run ``work(i)`` in `n` threads released together by a barrier; the errors raised."""
    barrier = threading.Barrier(n)
    errors: list[BaseException] = []

    def body(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            work(i)
        except BaseException as exc:  # noqa: BLE001 - the test reports every writer's failure
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a writer hung"
    return errors


def _frame(platform: str, start: datetime, n: int = 12) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "platform": platform,
            "cluster": "",
            "entity_kind": "platform",
            "entity_id": "",
            "metric": "gpu_allocated",
            "ts": pd.date_range(start, periods=n, freq="5min"),
            "value": np.arange(n, dtype=float),
            "unit": "gpus",
        }
    )


def test_two_writers_create_one_day_partition(pg_engine):
    for r in range(ROUNDS):
        day = DAY0 + timedelta(days=r)

        def work(_i: int, day=day) -> None:
            with pg_engine.begin() as conn:
                db.ensure_partitions(conn, day, day + timedelta(days=1))

        errors = _race(4, work)
        assert errors == [], f"round {r}: {errors[0]!r}"
        with pg_engine.connect() as conn:
            assert db.partition_name(day) in db.list_partitions(conn)


def test_two_platforms_extract_one_new_day(pg_engine):
    platforms = ["slurm", "kubernetes", "openstack"]
    for r in range(ROUNDS):
        start = DAY0 + timedelta(days=40 + r, hours=1)

        def work(i: int, start=start) -> None:
            sl = loader.Slice("sample", {"platform": platforms[i]}, start, start + timedelta(hours=1))
            loader.replace_slice(pg_engine, sl, _frame(platforms[i], start))

        errors = _race(len(platforms), work)
        assert errors == [], f"round {r}: {errors[0]!r}"
    with pg_engine.connect() as conn:
        counts = dict(conn.execute(sa.select(sample.c.platform, sa.func.count()).group_by(sample.c.platform)).all())
    assert counts == {p: 12 * ROUNDS for p in platforms}


@pytest.mark.parametrize("backend", ["postgresql", "sqlite"])
def test_two_runs_store_one_model(backend, request):
    engine = request.getfixturevalue("pg_engine" if backend == "postgresql" else "sqlite_engine")
    for r in range(ROUNDS):
        anchor = DAY0 + timedelta(hours=r)

        def work(i: int, anchor=anchor) -> None:
            models.replace_model(engine, KEY, anchor, features={"writer": i}, detector="stl",
                                 reason=f"writer {i}", model=f'{{"writer": {i}}}')

        errors = _race(4, work)
        assert errors == [], f"round {r}: {errors[0]!r}"
        with engine.connect() as conn:
            rows = conn.execute(sa.select(series_profile).where(series_profile.c.computed_at == anchor)).all()
        assert len(rows) == 1
        # one writer's row whole, never a mix of two writers' columns
        writer = rows[0].features["writer"]
        assert rows[0].reason == f"writer {writer}" and rows[0].model == f'{{"writer": {writer}}}'


def test_storing_again_replaces_the_model(engine):
    anchor = DAY0
    models.replace_model(engine, KEY, anchor, features={"v": 1}, detector="stl", reason="first", model="{}")
    models.replace_model(engine, KEY, anchor, features={"v": 2}, detector="mad", reason="second", model=None)
    with engine.connect() as conn:
        rows = conn.execute(sa.select(series_profile)).all()
    assert len(rows) == 1
    assert (rows[0].features, rows[0].detector, rows[0].reason, rows[0].model) == ({"v": 2}, "mad", "second", None)
