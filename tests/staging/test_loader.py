"""Staging idempotency and mid-load failure on SQLite and on the real PostgreSQL."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import numpy as np
import pandas as pd
import pytest
import sqlalchemy as sa

from gpupool.staging import db, loader
from gpupool.staging.schema import sample

T0 = datetime(2026, 3, 1, 23, 0, tzinfo=timezone.utc)  # the window crosses midnight: two partitions


def _frame(platform: str, start: datetime, n: int, offset: float = 0.0) -> pd.DataFrame:
    ts = pd.date_range(start, periods=n, freq="5min")
    return pd.DataFrame(
        {
            "platform": platform,
            "cluster": "",
            "entity_kind": "platform",
            "entity_id": "",
            "metric": np.where(np.arange(n) % 2 == 0, "gpu_allocated", "gpu_pending"),
            "ts": ts,
            "value": np.arange(n, dtype=float) + offset,
            "unit": "gpus",
        }
    ).drop_duplicates(["metric", "ts"])


def _rows(engine, platform=None):
    q = sa.select(sample).order_by(sample.c.platform, sample.c.metric, sample.c.ts)
    if platform:
        q = q.where(sample.c.platform == platform)
    with engine.connect() as conn:
        out = pd.read_sql(q, conn)
    out["ts"] = pd.to_datetime(out["ts"], utc=True)
    return out


def _slice(platform, start=T0, hours=2):
    return loader.Slice("sample", {"platform": platform}, start, start + timedelta(hours=hours))


def test_rerun_of_a_window_yields_identical_rows(engine):
    frame = _frame("slurm", T0, 24)
    assert loader.replace_slice(engine, _slice("slurm"), frame) == 24
    first = _rows(engine)
    assert loader.replace_slice(engine, _slice("slurm"), frame) == 24
    pd.testing.assert_frame_equal(first, _rows(engine))
    assert len(first) == 24
    assert first["value"].sum() == pytest.approx(sum(range(24)))


def test_reload_replaces_only_its_own_slice(engine):
    loader.replace_slice(engine, _slice("slurm"), _frame("slurm", T0, 24))
    loader.replace_slice(engine, _slice("kubernetes"), _frame("kubernetes", T0, 24))
    # a corrected re-extract of slurm with fewer points replaces slurm's window only
    loader.replace_slice(engine, _slice("slurm"), _frame("slurm", T0, 10, offset=100.0))
    assert len(_rows(engine, "slurm")) == 10
    assert _rows(engine, "slurm")["value"].min() == 100.0
    assert len(_rows(engine, "kubernetes")) == 24


def test_a_slice_leaves_another_writers_rows_and_refuses_to_write_them(engine):
    """A platform's extract replaces its window but not the rows its nodes' agents staged
    (cluster prefix `nvml:`); the agent's own slice
    replaces only its rows."""
    foreign = (("cluster", "nvml:"),)
    mine = lambda: loader.Slice("sample", {"platform": "slurm"}, T0, T0 + timedelta(hours=2), foreign=foreign)
    agent = _frame("slurm", T0, 6).assign(cluster="nvml:gpu_n001")
    lookalike = _frame("slurm", T0, 6).assign(cluster="nvmlXgpu")  # no prefix: the extract's own
    loader.replace_slice(engine, loader.Slice("sample", {"platform": "slurm", "cluster": "nvml:gpu_n001"}, T0,
                                              T0 + timedelta(hours=2)), agent)
    loader.replace_slice(engine, mine(), pd.concat([_frame("slurm", T0, 24), lookalike]))
    loader.replace_slice(engine, mine(), _frame("slurm", T0, 10, offset=100.0))  # a rerun with fewer points
    rows = _rows(engine, "slurm")
    assert sorted(rows["cluster"].unique()) == ["", "nvml:gpu_n001"]
    assert (rows["cluster"] == "nvml:gpu_n001").sum() == 6 and (rows["cluster"] == "").sum() == 10
    with pytest.raises(loader.LoadError, match="cluster starting 'nvml:'"):
        loader.replace_slice(engine, mine(), agent)
    assert len(_rows(engine, "slurm")) == 16


def test_failure_midway_keeps_previous_rows(engine):
    loader.replace_slice(engine, _slice("slurm"), _frame("slurm", T0, 24))
    before = _rows(engine)
    bad = _frame("slurm", T0, 24, offset=50.0)
    bad.loc[17, "value"] = None  # NOT NULL violation deep in the batch, after the delete ran
    with pytest.raises(loader.LoadError, match=r"sample\[platform=slurm\].*previous rows kept"):
        loader.replace_slice(engine, _slice("slurm"), bad)
    pd.testing.assert_frame_equal(before, _rows(engine))


def test_rows_outside_the_window_are_refused(engine):
    frame = _frame("slurm", T0 - timedelta(minutes=5), 3)
    with pytest.raises(loader.LoadError, match="outside the window"):
        loader.replace_slice(engine, _slice("slurm"), frame)
    with pytest.raises(loader.LoadError, match="platform != 'openstack'"):
        loader.replace_slice(engine, _slice("openstack"), _frame("slurm", T0, 3))
    assert _rows(engine).empty


def test_empty_strings_stay_empty_not_null(engine):
    loader.replace_slice(engine, _slice("slurm"), _frame("slurm", T0, 4))
    rows = _rows(engine)
    assert (rows["cluster"] == "").all() and (rows["entity_id"] == "").all()


def test_day_partitions_on_postgresql(pg_engine):
    loader.replace_slice(pg_engine, _slice("slurm"), _frame("slurm", T0, 24))
    with pg_engine.begin() as conn:
        parts = db.list_partitions(conn)
        assert parts == ["sample_p20260301", "sample_p20260302"]
        dropped = db.drop_partitions_before(conn, datetime(2026, 3, 2, tzinfo=timezone.utc))
    assert dropped == ["sample_p20260301"]
    assert _rows(pg_engine)["ts"].min() >= pd.Timestamp("2026-03-02", tz="UTC")


def test_migrations_match_the_schema_module(engine):
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from gpupool.staging.schema import metadata

    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), metadata)
    # partitions of `sample` are created at run time and are not part of the model
    diff = [d for d in diff if not (d[0] == "remove_table" and d[1].name.startswith("sample_p"))]
    assert diff == []
    assert db.current_revision(engine) == "0008"


def test_unreachable_database_is_a_clear_error():
    engine = db.make_engine("postgresql+psycopg://nobody@127.0.0.1:1/none")
    with pytest.raises(db.StagingError, match="unreachable"):
        db.upgrade(engine)


def _inventory(platform: str, at: datetime, layouts: list) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "platform": platform,
            "node": [f"n{i}" for i in range(len(layouts))],
            "snapshot_at": pd.Timestamp(at),
            "gpus": 8,
            "gpu_model": "NVIDIA H100 80GB",
            "mig_layout": layouts,
            "schedulable": True,
            "drain_reason": None,
            "busy_gpus": np.float64(2.5),
        }
    )


def test_json_columns_load_through_copy_and_insert_alike(engine):
    """mig_layout is JSON: a dict (with numpy scalars), a plain string, quotes and commas, and NULL
    round-trip on both backends (PostgreSQL's COPY path serializes JSON itself)."""
    from gpupool.staging.schema import inventory_node

    layouts = [{"config": "all-1g.10gb", "slices": np.int64(7)}, "all-balanced", {"note": 'a "q", b'}, None]
    sl = loader.Slice("inventory_node", {"platform": "slurm"}, T0, T0 + timedelta(microseconds=1), "snapshot_at")
    assert loader.replace_slice(engine, sl, _inventory("slurm", T0, layouts)) == 4
    with engine.connect() as conn:
        got = {r.node: r.mig_layout for r in conn.execute(sa.select(inventory_node))}
    assert got == {"n0": {"config": "all-1g.10gb", "slices": 7}, "n1": "all-balanced", "n2": {"note": 'a "q", b'}, "n3": None}


def test_several_slices_are_replaced_together_or_not_at_all(engine):
    """An extract writes samples and inventory in one transaction: a failure in the second
    slice leaves the first slice's previous rows in place."""
    from gpupool.staging.schema import inventory_node

    inv_slice = loader.Slice("inventory_node", {"platform": "slurm"}, T0, T0 + timedelta(microseconds=1), "snapshot_at")
    loader.replace_slices(engine, [(_slice("slurm"), _frame("slurm", T0, 24)), (inv_slice, _inventory("slurm", T0, [None]))])
    before = _rows(engine)
    bad_inv = _inventory("slurm", T0, [None, None])
    bad_inv.loc[1, "gpus"] = None  # NOT NULL violation in the second slice
    with pytest.raises(loader.LoadError, match=r"inventory_node\[platform=slurm\].*previous rows kept"):
        loader.replace_slices(engine, [(_slice("slurm"), _frame("slurm", T0, 10, offset=100.0)), (inv_slice, bad_inv)])
    pd.testing.assert_frame_equal(before, _rows(engine))
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(inventory_node)).scalar() == 1
