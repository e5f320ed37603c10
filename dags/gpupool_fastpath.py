"""
### gpupool_fastpath — answer a burst within minutes, inside the hourly plan's bounds

Every five minutes one light task reads each platform's pressure through its own API (GPUs
allocated and pending now, idle whole nodes: an instant read, not the hourly extraction),
judges the newest reading alone with the detect stage's streaming rules, by the model of its
refit anchor from staging's model store (an exporter glitch is not acted on), parks and wakes
nodes where a platform has `power:` (wakes first: a wake is faster than a move), and where
pending demand exceeds free capacity starts the handover of one idle whole node
from the platform with the largest surplus — only a platform the latest hourly plan lets lend,
keeping what the plan reserves for it and `min_nodes`, within the move budget (both paths
together, per rolling hour) and the cool-downs. Every decision, move or not, is recorded in
`fastpath_decision` with the pressure seen and why; `gpupool plan` and `gpupool handovers`
show the recent ones. Moves go through the same audited handover as the plan and the same
one-slot `gpupool_actuation` pool; `dry_run` (default on) audits without sending, backfills
never actuate.

**Why a short-interval DAG and not an asset watcher.** An asset watcher (Airflow 3's
event-driven scheduling) needs a triggerer running and a custom trigger that polls the
platforms; the polling then lives in the triggerer's event loop, where a slow platform API
blocks the other triggers, and its errors surface outside any task log or alert. A 5-minute
DAG with one task costs the scheduler one run every five minutes whatever happens, reads
pressure where the other actuation reads its connections, fails a task (and alerts) when a
platform cannot be read, and keeps every tick re-runnable on its data interval. Parsing stays
light (nothing heavy at the top level), so a tick in which nothing happens is one short task.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import Param, dag, get_current_context, task
from airflow.timetables.interval import CronDataIntervalTimetable

from gpupool.decisions.cadence import FASTPATH_CRON  # the cadence, defined once (the what-if ticks at it too)


@dag(
    dag_id="gpupool_fastpath",
    schedule=CronDataIntervalTimetable(FASTPATH_CRON, timezone="UTC"),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    doc_md=__doc__,
    tags=["gpupool", "actuation"],
    params={"dry_run": Param(True, type="boolean", description="audit what would be sent, send nothing")},
    default_args={"retries": 2, "retry_delay": timedelta(minutes=1)},
)
def gpupool_fastpath():
    # never retried, like every actuation task: a failed handover is settled and reported by the
    # attempt that saw it, and the next tick (five minutes on) reads the pressure afresh
    @task(pool="gpupool_actuation", retries=0)
    def tick() -> dict:
        from airflow.sdk import BaseHook

        from gpupool.airflow_glue import fastpath_from_context

        return fastpath_from_context(get_current_context(), lookup=BaseHook.get_connection)

    tick()


gpupool_fastpath()
