"""DAG validation: the dags/ folder imports cleanly, light, and follows the house rules."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("pandas", "statsmodels", "prophet", "sklearn", "scipy", "gpupool.pipeline")


@pytest.fixture(scope="module")
def dagbag(airflow_home, dags_root):
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(dags_root / "dags"))


def test_no_import_errors(dagbag):
    assert dagbag.import_errors == {}
    assert "gpupool_pipeline" in dagbag.dags


def test_tags_and_retries(dagbag):
    for dag_id, dag in dagbag.dags.items():
        assert dag.tags, f"{dag_id} has no tags"
        assert "gpupool" in dag.tags
        for task in dag.tasks:
            if task.pool == "gpupool_actuation":
                # actuation is never retried: a handover advances on the next run, and a retry of
                # an attempt that reported a failed handover would succeed and hide the alert
                assert task.retries == 0, f"{dag_id}.{task.task_id} retries={task.retries}"
                continue
            assert task.retries >= 2, f"{dag_id}.{task.task_id} retries={task.retries}"


def test_pipeline_shape(dagbag):
    from airflow.timetables.interval import CronDataIntervalTimetable

    dag = dagbag.dags["gpupool_pipeline"]
    assert isinstance(dag.timetable, CronDataIntervalTimetable)
    assert dag.max_active_runs == 1
    assert set(dag.params) >= {"window_start", "window_end", "platforms", "dry_run", "policy"}
    assert dag.params["dry_run"] is True
    assert dag.task_dict["actuate"].pool == "gpupool_actuation"
    assert dag.doc_md and "gpupool_pipeline" in dag.doc_md
    order = ["resolve_window", "extract_parts", "extract", "extract_finish", "detect", "forecast", "plan", "actuate"]
    for up, down in zip(order, order[1:]):
        assert down in dag.task_dict[up].downstream_task_ids, f"{up} -> {down}"
    # the step that promotes a sharded platform's parts runs after failed parts too, to say which failed
    assert dag.task_dict["extract_finish"].trigger_rule == "all_done"


def test_importing_dags_stays_light(tmp_path, dags_root, make_airflow_env):
    """Parsing a DAG file must not import the heavy scientific stack."""
    code = (
        "import sys, runpy\n"
        f"for f in sorted(__import__('pathlib').Path({str(dags_root / 'dags')!r}).glob('*.py')):\n"
        "    runpy.run_path(str(f))\n"
        f"heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "print('HEAVY', heavy)\n"
    )
    env = {**make_airflow_env(tmp_path), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "HEAVY []" in out.stdout, out.stdout


def test_fastpath_shape(dagbag):
    from airflow.timetables.interval import CronDataIntervalTimetable

    dag = dagbag.dags["gpupool_fastpath"]
    assert isinstance(dag.timetable, CronDataIntervalTimetable)
    assert dag.max_active_runs == 1 and dag.catchup is False
    assert dag.params["dry_run"] is True
    assert [t.task_id for t in dag.tasks] == ["tick"]  # one light task: nothing else runs when nothing happens
    assert dag.task_dict["tick"].pool == "gpupool_actuation"
    assert dag.doc_md and "asset watcher" in dag.doc_md
