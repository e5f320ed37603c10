"""The maintenance DAG end to end: `gpupool_maintenance` run by Airflow (`dag.test()` at its
daily 00:30 logical date, retention and look-ahead from the run's conf as a UI trigger gives
them) on PostgreSQL staging that holds days inside and past retention. The run drops the day
partitions of `sample` past retention and the rows of the other tables there, keeps the
recent ones and what gpupool did to the platforms (handovers, their audit, the plan a
handover names, fast-path decisions), creates the partitions of the days ahead, and a rerun of
the same day changes nothing more.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import numpy as np
import pandas as pd
import pytest
import sqlalchemy as sa

pytestmark = pytest.mark.slow

AT = datetime(2026, 6, 10, tzinfo=timezone.utc)  # the run's window ends at AT 00:30
RETENTION = 30
OLD, MID, NEW = AT - timedelta(days=40), AT - timedelta(days=20), AT - timedelta(days=1)
PLATFORMS = ("slurm", "kubernetes")


def _stage_day(engine, day: datetime) -> None:
    """A day of 2-hourly samples and their cleaned rows for each platform, through the loader
    the extract and detect stages use (on PostgreSQL it creates the day's partition)."""
    from gpupool.staging import loader

    ts = pd.date_range(day, periods=12, freq="2h")
    for p in PLATFORMS:
        key = {"platform": p, "cluster": "", "entity_kind": "platform", "entity_id": "", "metric": "gpu_allocated"}
        frame = pd.DataFrame({**key, "ts": ts, "value": np.arange(12.0), "unit": "gpus"})
        loader.replace_slice(engine, loader.Slice("sample", {"platform": p}, day, day + timedelta(days=1)), frame)
        clean = pd.DataFrame({**key, "ts": ts, "value": np.arange(12.0), "expected": np.arange(12.0), "score": 0.0,
                              "is_anomaly": False, "cleaned": False, "filled": False, "detector": "sr",
                              "clean_value": np.arange(12.0)})
        loader.replace_slice(engine, loader.Slice("clean_sample", {"platform": p}, day, day + timedelta(days=1)), clean)


def _stage_decisions(engine) -> dict:
    """Forecasts and plans of an old and a recent hour; an old handover (done on paper, its
    audit written) naming one of the old plans; an old fast-path decision."""
    from gpupool.actuation import handover as ho
    from gpupool.staging.schema import allocation_plan, fastpath_decision, forecast, forecast_run

    with engine.begin() as conn:
        for when in (OLD, NEW):
            conn.execute(forecast_run.insert().values(platform="slurm", series="demand", issued_at=when,
                                                      model="arima", summary={}, level=90.0))
            conn.execute(forecast.insert().values(platform="slurm", series="demand", issued_at=when, step=1,
                                                  ts=when + timedelta(hours=1), yhat=1.0, yhat_lower=0.0, yhat_upper=2.0))
        plans = [conn.execute(allocation_plan.insert().values(
            decided_at=when, policy="predictive", solver="milp", dry_run=True, summary={}, moves=[])).inserted_primary_key[0]
            for when in (OLD, OLD, NEW)]
        conn.execute(fastpath_decision.insert().values(decided_at=OLD, platform="slurm", pressure={}, reason="short",
                                                       dry_run=True))
    hid = ho.open_handover(engine, "k8s-gpu001", "kubernetes", "slurm", at=OLD, plan_id=plans[0], dry_run=True)
    ho.advance_all(engine, {}, OLD + timedelta(minutes=5), dry_run=True)
    assert ho.get_handover(engine, hid).state == ho.DONE and ho.audit_rows(engine, hid)
    return {"plans": plans, "handover": hid, "audit": len(ho.audit_rows(engine, hid))}


def _counts(engine) -> dict[str, dict[str, int]]:
    """Rows of each table, old (before the cutoff) and recent."""
    from gpupool.staging.schema import (action_audit, allocation_plan, clean_sample, fastpath_decision, forecast,
                                        forecast_run, handover, sample)

    cutoff = AT - timedelta(days=RETENTION)
    tables = {"sample": (sample, sample.c.ts), "clean_sample": (clean_sample, clean_sample.c.ts),
              "forecast": (forecast, forecast.c.issued_at), "forecast_run": (forecast_run, forecast_run.c.issued_at),
              "allocation_plan": (allocation_plan, allocation_plan.c.decided_at),
              "fastpath_decision": (fastpath_decision, fastpath_decision.c.decided_at),
              "handover": (handover, handover.c.created_at), "action_audit": (action_audit, None)}
    out = {}
    with engine.connect() as conn:
        for name, (t, col) in tables.items():
            total = conn.execute(sa.select(sa.func.count()).select_from(t)).scalar()
            old = total if col is None else conn.execute(sa.select(sa.func.count()).select_from(t).where(col < cutoff)).scalar()
            out[name] = {"old": old, "recent": total - old}
    return out


def _run(dag) -> None:
    run = dag.test(logical_date=AT + timedelta(minutes=30), run_conf={"retention_days": RETENTION, "ahead_days": 2})
    assert str(run.state).endswith("success"), run.state


def test_maintenance_purges_the_window_past_retention(airflow_home, dags_root, staging_url, monkeypatch):
    from airflow.dag_processing.dagbag import DagBag

    from gpupool.actuation import handover as ho
    from gpupool.staging import db
    from gpupool.staging.schema import allocation_plan

    monkeypatch.delenv("GPUPOOL_CONFIG", raising=False)
    monkeypatch.setenv("GPUPOOL_STAGING_URL", staging_url)  # the DAG's task runs in this process
    engine = db.make_engine(staging_url)
    assert engine.dialect.name == "postgresql"
    db.upgrade(engine)
    for day in (OLD, MID, NEW):
        _stage_day(engine, day)
    staged = _stage_decisions(engine)
    with engine.connect() as conn:
        parts_before = set(db.list_partitions(conn))
    before = _counts(engine)
    assert db.partition_name(OLD) in parts_before and before["sample"] == {"old": 24, "recent": 48}

    dag = DagBag(dag_folder=str(dags_root / "dags" / "gpupool_maintenance.py")).dags["gpupool_maintenance"]
    _run(dag)

    with engine.connect() as conn:
        parts = set(db.list_partitions(conn))
        kept_plans = sorted(conn.execute(sa.select(allocation_plan.c.id)).scalars())
    after = _counts(engine)
    assert db.partition_name(OLD) not in parts  # the whole day past retention is gone
    assert {db.partition_name(MID), db.partition_name(NEW)} <= parts
    assert {db.partition_name(AT + timedelta(days=d)) for d in range(3)} <= parts  # the days ahead are ready
    for name in ("sample", "clean_sample", "forecast", "forecast_run"):
        assert after[name] == {"old": 0, "recent": before[name]["recent"]}, (name, before[name], after[name])
    assert before["sample"]["recent"] == 48 and before["clean_sample"]["recent"] == 48
    # plans past retention go, except the one a handover names; what gpupool did stays
    assert kept_plans == [staged["plans"][0], staged["plans"][2]]
    assert after["handover"] == before["handover"] == {"old": 1, "recent": 0}
    assert after["action_audit"]["old"] == staged["audit"] and after["fastpath_decision"] == before["fastpath_decision"]
    assert ho.get_handover(engine, staged["handover"]).plan_id == staged["plans"][0]

    _run(dag)  # a rerun of the same day: nothing more goes
    assert _counts(engine) == after
    with engine.connect() as conn:
        assert set(db.list_partitions(conn)) == parts
    engine.dispose()
