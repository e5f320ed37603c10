"""`dag.test()` of gpupool_pipeline on the embedded virtual datacenter, with staging on the real
PostgreSQL: every stage leaves real rows."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy as sa

END = datetime(2026, 11, 1, 12, tzinfo=timezone.utc)


@pytest.mark.slow
def test_pipeline_dag_runs_end_to_end(airflow_home, dags_root, staging_url, monkeypatch):
    from airflow.dag_processing.dagbag import DagBag

    from gpupool import pipeline
    from gpupool.staging import db
    from gpupool.staging.schema import action_audit, allocation_plan, clean_sample, extract_run, forecast, sample

    monkeypatch.setenv("GPUPOOL_STAGING_URL", staging_url)  # the DAG's tasks run in this process
    ctx = pipeline.Context.load()
    assert ctx.engine.dialect.name == "postgresql"
    db.upgrade(ctx.engine)
    # two days of history first, as a backfill leaves it, then the DAG's own hour
    history = pipeline.Window(END - timedelta(days=2, hours=1), END - timedelta(hours=1))
    for p in ctx.platforms():
        pipeline.extract(ctx, p, history)
        pipeline.detect(ctx, p, history)

    dag = DagBag(dag_folder=str(dags_root / "dags")).dags["gpupool_pipeline"]
    run = dag.test(logical_date=END)  # a manual run at END covers the hour that ends there
    assert str(run.state).endswith("success"), run.state

    window_start = END - timedelta(hours=1)
    with ctx.engine.connect() as conn:
        runs = conn.execute(sa.select(extract_run).where(extract_run.c.window_start == window_start)).all()
        assert {r.platform for r in runs} == {"openstack", "slurm", "kubernetes"}
        assert all(r.status == "success" and r.rows > 0 for r in runs)
        n_sample = conn.execute(sa.select(sa.func.count()).select_from(sample).where(sample.c.ts >= window_start)).scalar()
        n_clean = conn.execute(sa.select(sa.func.count()).select_from(clean_sample).where(clean_sample.c.ts >= window_start)).scalar()
        n_fc = conn.execute(sa.select(sa.func.count()).select_from(forecast).where(forecast.c.issued_at == END)).scalar()
        plans = conn.execute(sa.select(allocation_plan).where(allocation_plan.c.decided_at == END)).all()
        sent = conn.execute(sa.select(action_audit).where(action_audit.c.dry_run.is_(False))).all()
    assert n_sample > 0 and n_clean > 0
    assert n_fc == 3 * ctx.config.limits.horizon_hours
    assert len(plans) == 1 and plans[0].dry_run is True
    assert set(plans[0].summary["platforms"]) == {"openstack", "slurm", "kubernetes"}
    assert sent == []  # dry run by default: nothing was sent to any platform
