"""
### gpupool_handover — advance open node handovers every 5 minutes

A node that is being moved drains at its source platform between the hourly pipeline runs.
Every five minutes this DAG advances each open handover
(`planned → releasing → released → attaching → done`) as far as it safely goes now: a pass keeps
stepping while each step completes at once (a node that drains at once is released and attached
in the same run) and stops at the first wait (work still running, a node still arriving, a MIG
re-layout), where the next run resumes. It times out stuck ones and writes every command to
`action_audit` before it is sent. A handover that fails or times out gets gpupool's
hold lifted (or the node sent back) and then fails this task, so Airflow alerts and, when
platforms.yaml names `notify.to`, mails which node, which platforms and what was undone; deadlines are
checked even while `dry_run` is on. It shares the one-slot `gpupool_actuation` pool
with the pipeline's actuation, so two writers never act on the platforms at once.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import dag, get_current_context, task
from airflow.timetables.interval import CronDataIntervalTimetable


def notify_failure(context) -> None:
    """Failure callback: mail what failed through the SMTP provider's notifier (Airflow's own
    notifier mechanism), to platforms.yaml's `notify.to`; nothing when that names no one."""
    from airflow.providers.smtp.notifications.smtp import SmtpNotifier

    from gpupool.notify import mail_for_failure

    mail = mail_for_failure(context)
    if mail is not None:
        SmtpNotifier(**mail)(context)


@dag(
    dag_id="gpupool_handover",
    schedule=CronDataIntervalTimetable("*/5 * * * *", timezone="UTC"),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    doc_md=__doc__,
    tags=["gpupool", "actuation"],
    default_args={"retries": 2, "retry_delay": timedelta(minutes=1)},
)
def gpupool_handover():
    # never retried: a failed handover is settled (hold lifted) and reported by the attempt that
    # saw it, so a retry would succeed and hide the alert; the next run advances the rest. The
    # callback sits on the task, whose exception carries the pass's report (which handovers
    # failed or were rolled back): the DAG's own callback would see only the run's state
    @task(pool="gpupool_actuation", retries=0, on_failure_callback=notify_failure)
    def advance() -> dict:
        from airflow.sdk import BaseHook

        from gpupool.airflow_glue import advance_from_context

        return advance_from_context(get_current_context(), lookup=BaseHook.get_connection)

    advance()


gpupool_handover()
