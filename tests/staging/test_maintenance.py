"""Daily maintenance: partitions ahead, retention behind, a size report — on both backends."""

from datetime import datetime, timedelta, timezone

import numpy as np
import pandas as pd
import sqlalchemy as sa

from gpupool.staging import db, loader, maintenance
from gpupool.staging.schema import sample

AT = datetime(2026, 6, 10, tzinfo=timezone.utc)


def _load_day(engine, day: datetime):
    ts = pd.date_range(day, periods=12, freq="2h")
    frame = pd.DataFrame({"platform": "slurm", "cluster": "", "entity_kind": "platform", "entity_id": "",
                          "metric": "gpu_allocated", "ts": ts, "value": np.arange(12.0), "unit": "gpus"})
    loader.replace_slice(engine, loader.Slice("sample", {"platform": "slurm"}, day, day + timedelta(days=1)), frame)


def test_retention_keeps_recent_days_and_reports_sizes(engine):
    for back in (40, 20, 1):
        _load_day(engine, AT - timedelta(days=back))
    report = maintenance.maintain(engine, AT, retention_days=30, ahead_days=2)
    with engine.connect() as conn:
        left = pd.to_datetime(pd.read_sql(sa.select(sample.c.ts), conn)["ts"], utc=True)
    assert left.min() >= pd.Timestamp(AT - timedelta(days=30))
    assert len(left) == 24
    assert report["sizes"]["sample"]["rows"] == 24
    if engine.dialect.name == "postgresql":
        assert report["partitions_dropped"] == ["sample_p20260501"]
        with engine.connect() as conn:
            parts = db.list_partitions(conn)
        assert "sample_p20260612" in parts  # two days ahead are ready before data arrives
        assert report["sizes"]["sample"]["bytes"] > 0
    else:
        assert report["rows_deleted"]["sample"] == 12


def test_vacuum_is_not_cut_short_by_the_statement_timeout(pg_engine):
    """Every staging statement has a timeout; the daily VACUUM runs without one, and the
    connection goes back to the pool with the engine's timeout."""
    seen = []

    def before(conn, cursor, statement, *_):
        if statement.startswith("VACUUM"):
            seen.append(conn.connection.driver_connection.execute("SHOW statement_timeout").fetchone()[0])

    sa.event.listen(pg_engine, "before_cursor_execute", before)
    maintenance.maintain(pg_engine, datetime(2026, 3, 10, tzinfo=timezone.utc))
    sa.event.remove(pg_engine, "before_cursor_execute", before)
    assert seen == ["0"]
    with pg_engine.connect() as conn:
        assert conn.execute(sa.text("SHOW statement_timeout")).scalar() == "5min"
