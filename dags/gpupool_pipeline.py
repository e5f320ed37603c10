"""
### gpupool_pipeline — one hour of the GPU pool

Every hour, for the data interval `[start, end)`:

1. **extract** each platform's GPU inventory and usage (one mapped task per platform, or, for a
   platform configured with `shard_nodes`, one per range of its nodes plus one for its
   platform-wide series; `extract_finish` then replaces the platform's window from its parts
   in one transaction),
2. **detect/clean** point anomalies per series (one mapped task per platform),
3. **forecast** each platform's GPU demand with ARIMA,
4. **plan** which platform should hold each pool node,
5. **actuate** the plan (one-slot pool `gpupool_actuation`; dry run by default; never on backfills).

Trigger it from the UI with **window_start / window_end** to run any window; otherwise the
run's data interval is the window. Logic lives in the `gpupool` package; each task is a call.
A failed run is mailed to platforms.yaml's `notify.to` (off when it names no one).
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.sdk import Asset, Param, dag, get_current_context, task
from airflow.timetables.interval import CronDataIntervalTimetable

from gpupool.decisions.policy import PLANNED_KINDS  # pydantic only: light enough for DAG parsing


def _platform_names() -> list[str]:
    """Platform names for the trigger form, read from the config file without the package."""
    path = os.environ.get("GPUPOOL_CONFIG")
    if path and os.path.exists(path):
        import yaml

        with open(path) as fh:
            return [p["name"] for p in (yaml.safe_load(fh) or {}).get("platforms", []) if "name" in p]
    return ["openstack", "slurm", "kubernetes"]


PLATFORMS = _platform_names()
# a failed try is retried after this delay (a deployment may shorten it; the stack tests do)
RETRY_DELAY = timedelta(seconds=float(os.environ.get("GPUPOOL_RETRY_DELAY_SECONDS", "120")))
SAMPLE_ASSET = Asset("x-gpupool://staging/sample")
FORECAST_ASSET = Asset("x-gpupool://staging/forecast")
PLAN_ASSET = Asset("x-gpupool://staging/plan")


def notify_failure(context) -> None:
    """Failure callback: mail what failed through the SMTP provider's notifier (Airflow's own
    notifier mechanism), to platforms.yaml's `notify.to`; nothing when that names no one."""
    from airflow.providers.smtp.notifications.smtp import SmtpNotifier

    from gpupool.notify import mail_for_failure

    mail = mail_for_failure(context)
    if mail is not None:
        SmtpNotifier(**mail)(context)


@dag(
    dag_id="gpupool_pipeline",
    schedule=CronDataIntervalTimetable("0 * * * *", timezone="UTC"),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    doc_md=__doc__,
    tags=["gpupool", "pipeline"],
    default_args={"retries": 2, "retry_delay": RETRY_DELAY},
    # once per failed run (not per failed mapped task): the run, its window and failed task,
    # and the handovers that failed or were rolled back in the window
    on_failure_callback=notify_failure,
    params={
        "window_start": Param(None, type=["null", "string"], format="date-time", description="UI trigger: window start (UTC)"),
        "window_end": Param(None, type=["null", "string"], format="date-time", description="UI trigger: window end (UTC, exclusive)"),
        "platforms": Param(PLATFORMS, type="array", items={"type": "string", "enum": PLATFORMS}, description="platforms to run"),
        "dry_run": Param(True, type="boolean", description="write the plan and the actions it would send; send nothing"),
        "policy": Param("predictive", type="string", enum=list(PLANNED_KINDS)),
    },
)
def gpupool_pipeline():
    @task
    def resolve_window() -> dict:
        from gpupool.airflow_glue import window_from_context

        return window_from_context(get_current_context())

    @task
    def selected_platforms() -> list[str]:
        from gpupool.airflow_glue import platforms_from_context

        return platforms_from_context(get_current_context())

    @task
    def extract_parts(window: dict, platforms: list[str]) -> list[dict]:
        from airflow.sdk import BaseHook

        from gpupool.airflow_glue import extract_parts

        return extract_parts(window, platforms, lookup=BaseHook.get_connection)

    # a part is {"platform", "index", "count"} (its nodes are in staging's extract_part plan)
    @task(map_index_template="{% set p = task.op_kwargs['part'] %}{{ p['platform'] }}"
                             "{% if 'index' in p %} {{ p['index'] + 1 }}/{{ p['count'] }}{% endif %}")
    def extract(part: dict, window: dict) -> dict:
        from airflow.sdk import BaseHook

        from gpupool.airflow_glue import extract_one_part

        return extract_one_part(window, part, lookup=BaseHook.get_connection)

    # runs when every part is done, failed ones included: it records which parts failed
    # under the platform's own extract_run row (and fails), or promotes them all
    @task(outlets=[SAMPLE_ASSET], trigger_rule="all_done", map_index_template="{{ task.op_kwargs['platform'] }}")
    def extract_finish(platform: str, window: dict, parts: list[dict]) -> dict:
        from airflow.sdk import BaseHook

        from gpupool.airflow_glue import finish_extract

        return finish_extract(window, platform, parts, lookup=BaseHook.get_connection)

    @task(map_index_template="{{ task.op_kwargs['platform'] }}")
    def detect(platform: str, window: dict) -> dict:
        from gpupool.airflow_glue import run_stage

        return run_stage("detect", window, platform=platform)

    @task(outlets=[FORECAST_ASSET], map_index_template="{{ task.op_kwargs['platform'] }}")
    def forecast(platform: str, window: dict) -> dict:
        from gpupool.airflow_glue import run_stage

        return run_stage("forecast", window, platform=platform)

    @task(outlets=[PLAN_ASSET])
    def plan(window: dict, platforms: list[str]) -> dict:
        from gpupool.airflow_glue import plan_from_context

        return plan_from_context(get_current_context(), window, platforms)

    @task(pool="gpupool_actuation", retries=0)
    def actuate(window: dict, plan_result: dict) -> dict:
        from airflow.sdk import BaseHook

        from gpupool.airflow_glue import actuate_from_context

        return actuate_from_context(get_current_context(), window, plan_result, lookup=BaseHook.get_connection)

    window = resolve_window()
    names = selected_platforms()
    parts = extract_parts(window, names)
    extracted = extract.partial(window=window).expand(part=parts)
    finished = extract_finish.partial(window=window, parts=parts).expand(platform=names)
    detected = detect.partial(window=window).expand(platform=names)
    forecasted = forecast.partial(window=window).expand(platform=names)
    extracted >> finished >> detected >> forecasted
    planned = plan(window, names)
    forecasted >> planned
    actuate(window, planned)


gpupool_pipeline()
