"""
### gpupool_maintenance — daily care of staging

Creates the `sample` day partitions of the coming days, drops those past retention, refreshes
planner statistics (VACUUM ANALYZE on PostgreSQL) and reports the size of every staging table.
Everything is keyed on the run's data interval, so a rerun of an old day does the same thing.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import Param, dag, get_current_context, task
from airflow.timetables.interval import CronDataIntervalTimetable


@dag(
    dag_id="gpupool_maintenance",
    schedule=CronDataIntervalTimetable("30 0 * * *", timezone="UTC"),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    doc_md=__doc__,
    tags=["gpupool", "maintenance"],
    default_args={"retries": 2, "retry_delay": timedelta(minutes=5)},
    params={
        "retention_days": Param(90, type="integer", minimum=1, description="days of samples to keep"),
        "ahead_days": Param(3, type="integer", minimum=0, maximum=31, description="day partitions to create ahead"),
    },
)
def gpupool_maintenance():
    @task
    def maintain() -> dict:
        from gpupool.airflow_glue import maintain_from_context

        return maintain_from_context(get_current_context())

    maintain()


gpupool_maintenance()
