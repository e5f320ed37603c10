"""Daily care of staging: upcoming day partitions, retention, statistics, size report."""

from __future__ import annotations

from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from gpupool.staging import db
from gpupool.staging.schema import (
    allocation_plan, clean_sample, extract_part, extract_run, forecast, forecast_run, handover, inventory_node, metadata,
    pressure_sample, series_profile,
)


def maintain(engine: Engine, at: datetime, retention_days: int = 90, ahead_days: int = 3) -> dict:
    """Create partitions for the next `ahead_days`, drop data older than `retention_days`
    before `at`, refresh planner statistics, and report the size of every table.

    Past retention go samples, cleaned samples, inventories, extraction runs, fast-path
    readings, fitted models, forecasts and plans; a plan a handover names is kept with it.
    Handovers, their audit and the fast path's decisions are kept: they are the record of
    what gpupool did to the platforms, which an operator may need long after the data.

    `at` is the run's window end, never the wall clock: a rerun of an old maintenance run
    does the same thing it did then.
    """
    if retention_days < 1:
        raise ValueError(f"retention_days must be >= 1, got {retention_days}")
    db.require_migrated(engine)
    cutoff = _midnight(at) - timedelta(days=retention_days)
    with engine.begin() as conn:
        created = db.ensure_partitions(conn, _midnight(at), _midnight(at) + timedelta(days=ahead_days + 1))
        dropped = db.drop_partitions_before(conn, cutoff)
        deleted = {}
        if conn.dialect.name != "postgresql":
            deleted["sample"] = conn.execute(metadata.tables["sample"].delete().where(metadata.tables["sample"].c.ts < cutoff)).rowcount
        deleted["clean_sample"] = conn.execute(clean_sample.delete().where(clean_sample.c.ts < cutoff)).rowcount
        deleted["inventory_node"] = conn.execute(inventory_node.delete().where(inventory_node.c.snapshot_at < cutoff)).rowcount
        deleted["extract_run"] = conn.execute(extract_run.delete().where(extract_run.c.window_end < cutoff)).rowcount
        deleted["extract_part"] = conn.execute(extract_part.delete().where(extract_part.c.window_end < cutoff)).rowcount
        deleted["pressure_sample"] = conn.execute(pressure_sample.delete().where(pressure_sample.c.at < cutoff)).rowcount
        deleted["series_profile"] = conn.execute(series_profile.delete().where(series_profile.c.computed_at < cutoff)).rowcount
        deleted["forecast"] = conn.execute(forecast.delete().where(forecast.c.issued_at < cutoff)).rowcount
        deleted["forecast_run"] = conn.execute(forecast_run.delete().where(forecast_run.c.issued_at < cutoff)).rowcount
        named = sa.select(handover.c.plan_id).where(handover.c.plan_id.is_not(None))
        deleted["allocation_plan"] = conn.execute(allocation_plan.delete().where(
            allocation_plan.c.decided_at < cutoff, allocation_plan.c.id.not_in(named))).rowcount
    _analyze(engine)
    return {
        "at": at.isoformat(),
        "cutoff": cutoff.isoformat(),
        "partitions_created": created,
        "partitions_dropped": dropped,
        "rows_deleted": deleted,
        "sizes": table_sizes(engine),
    }


def _analyze(engine: Engine) -> None:
    if engine.dialect.name == "postgresql":
        # VACUUM cannot run inside a transaction block
        # and may take longer than the statement timeout staging engines set for every other
        # statement: lift it for this one, then back to the engine's setting for the pool
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(sa.text("SET statement_timeout = 0"))
            try:
                conn.execute(sa.text("VACUUM (ANALYZE)"))
            finally:
                conn.execute(sa.text("RESET statement_timeout"))
    else:
        with engine.begin() as conn:
            conn.execute(sa.text("ANALYZE"))


def table_sizes(engine: Engine) -> dict[str, dict]:
    """Rows and (PostgreSQL) bytes of each staging table; `sample` includes its partitions."""
    out = {}
    with engine.connect() as conn:
        for name, table in metadata.tables.items():
            rows = conn.execute(sa.select(sa.func.count()).select_from(table)).scalar()
            info = {"rows": int(rows)}
            if conn.dialect.name == "postgresql":
                if name == "sample":
                    size = sum(
                        conn.execute(sa.text("SELECT pg_total_relation_size(CAST(:t AS regclass))"), {"t": p}).scalar()
                        for p in db.list_partitions(conn)
                    )
                else:
                    size = conn.execute(sa.text("SELECT pg_total_relation_size(CAST(:t AS regclass))"), {"t": name}).scalar()
                info["bytes"] = int(size or 0)
            out[name] = info
    return out


def _midnight(ts: datetime) -> datetime:
    return ts.replace(hour=0, minute=0, second=0, microsecond=0)
