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


def test_retention_purges_models_forecasts_and_plans_but_keeps_what_gpupool_did(engine):
    """Fitted models, forecasts, fast-path readings and plans past retention go; a plan a
    handover names stays with it, and handovers, their audit and fast-path decisions stay."""
    from gpupool.actuation import handover as ho
    from gpupool.staging.schema import (allocation_plan, fastpath_decision, forecast, forecast_run, handover,
                                        pressure_sample, series_profile)

    old, new = AT - timedelta(days=40), AT - timedelta(days=1)
    key = dict(platform="slurm", cluster="", entity_kind="platform", entity_id="", metric="gpu_allocated")
    with engine.begin() as conn:
        for when in (old, new):
            conn.execute(series_profile.insert().values(**key, computed_at=when, features={}, detector="sr",
                                                        reason="r", model=None))
            conn.execute(forecast_run.insert().values(platform="slurm", series="demand", issued_at=when,
                                                      model="arima", summary={}, level=90.0))
            conn.execute(forecast.insert().values(platform="slurm", series="demand", issued_at=when, step=1,
                                                  ts=when + timedelta(hours=1), yhat=1.0, yhat_lower=0.0, yhat_upper=2.0))
            conn.execute(pressure_sample.insert().values(platform="slurm", at=when, metric="gpu_pending_now", value=1.0))
        plans = [conn.execute(allocation_plan.insert().values(decided_at=when, policy="reactive", solver="milp",
                                                              dry_run=True, summary={}, moves=[])).inserted_primary_key[0]
                 for when in (old, old, new)]
        conn.execute(fastpath_decision.insert().values(decided_at=old, platform="slurm", pressure={}, reason="r",
                                                       dry_run=True))
    ho.open_handover(engine, "n1", "slurm", "kubernetes", at=old, plan_id=plans[0], dry_run=True)
    report = maintenance.maintain(engine, AT, retention_days=30, ahead_days=1)
    with engine.connect() as conn:
        count = lambda t: conn.execute(sa.select(sa.func.count()).select_from(t)).scalar()
        assert [count(t) for t in (series_profile, forecast_run, forecast, pressure_sample)] == [1, 1, 1, 1]
        assert sorted(conn.execute(sa.select(allocation_plan.c.id)).scalars()) == [plans[0], plans[2]]
        assert count(handover) == 1 and count(fastpath_decision) == 1
    assert report["rows_deleted"]["allocation_plan"] == 1 and report["rows_deleted"]["series_profile"] == 1
