"""The mail a failed or rolled-back handover, or a failed run, produces: built from real
handovers in staging (driven by the in-memory datacenter of the handover tests), with no
Airflow. The SMTP delivery itself is tested in tests/dags/test_notifications.py."""

from __future__ import annotations

import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "actuation"))

from gpupool import notify, pipeline  # noqa: E402
from gpupool.actuation import handover as ho  # noqa: E402
from gpupool.jobs import allocation as service  # noqa: E402
from gpupool.config import ConfigError, parse_config  # noqa: E402
from memplatform import make  # noqa: E402

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=timezone.utc)
PLATFORMS = [{"name": "slurm", "kind": "slurm", "actuation": True, "conn_id": "hpc"},
             {"name": "kubernetes", "kind": "kubernetes", "actuation": True, "conn_id": "ai"}]


def _ctx(engine, to=("oncall@example.org",)):
    return pipeline.Context(parse_config({"platforms": PLATFORMS, "dry_run": False, "notify": {"to": list(to)}}), engine)


def _timed_out_release(engine):
    """n1 is drained at slurm for kubernetes, its job never ends, the deadline passes: the
    pass lifts gpupool's hold and rolls the handover back. Returns (id, the raised error)."""
    dc, acts = make(("slurm", "kubernetes"), {"n1": "slurm"})
    dc.slots[("slurm", "n1")].jobs = 1
    hid = ho.open_handover(engine, "n1", "slurm", "kubernetes", T0, dry_run=False, timeout=timedelta(hours=1))
    ctx = _ctx(engine)
    service.advance_handovers(ctx, T0, dry_run=False, actuators=acts)
    with pytest.raises(ho.HandoverFailed) as err:
        service.advance_handovers(ctx, T0 + timedelta(hours=1), dry_run=False, actuators=acts)
    return hid, err.value, (dc, acts)


def test_a_rolled_back_handover_names_node_platforms_and_what_was_undone(engine):
    hid, err, _ = _timed_out_release(engine)
    notice = notify.notice_from_context({"dag": None, "run_id": "scheduled__x", "exception": err,
                                         "ti": type("TI", (), {"task_id": "advance"})()}, engine)
    assert notice is not None
    assert "n1" in notice.subject and "rolled back" in notice.subject and "slurm -> kubernetes" in notice.subject
    text = notice.text
    assert f"Handover #{hid} (live): node n1, slurm -> kubernetes: rolled back" in text
    assert "timed out in state releasing" in text
    assert "undone: gpupool's hold at slurm lifted, the node stays on slurm (sent: drain (ok), resume (ok))" in text
    assert "slurm        drain" in text and "slurm        resume" in text  # the audit, in order
    assert text.index("drain") < text.index("resume")
    assert "task advance" in text


def test_a_handover_still_failed_is_not_mailed_again(engine):
    _, err, _ = _timed_out_release(engine)
    again = {"failed": [{**f, "before": ho.FAILED, "state": ho.FAILED} for f in err.report["failed"]]}
    assert notify.newly_ended(again) == []
    assert notify.notice_from_context({"exception": ho.HandoverFailed(again)}, engine) is None
    assert notify.newly_ended(err.report) == [err.report["failed"][0]["id"]]


def test_a_node_sent_back_names_the_reverse_handover(engine):
    dc, acts = make(("slurm", "kubernetes"), {"n1": "slurm"})
    acts["kubernetes"].fail += [("resume", "before")] * 5  # the target never takes it
    hid = ho.open_handover(engine, "n1", "slurm", "kubernetes", T0, dry_run=False, timeout=timedelta(hours=1))
    ctx = _ctx(engine)
    service.advance_handovers(ctx, T0, dry_run=False, actuators=acts)
    with pytest.raises(ho.HandoverFailed) as err:
        service.advance_handovers(ctx, T0 + timedelta(hours=1), dry_run=False, actuators=acts)
    [case] = notify.read_cases(engine, notify.newly_ended(err.value.report))
    assert case.handover.id == hid and case.reverse is not None
    assert notify.undone(case) == (f"the node is sent back from kubernetes to slurm by reverse handover "
                                   f"#{case.reverse.id} (now {case.reverse.state})")


def test_a_failed_run_names_its_window_task_and_the_handovers_it_ended(engine):
    hid, _, _ = _timed_out_release(engine)
    window = {"data_interval_start": T0, "data_interval_end": T0 + timedelta(hours=1)}
    dag = type("Dag", (), {"dag_id": "gpupool_pipeline"})()
    notice = notify.notice_from_context({"dag": dag, "run_id": "r1", "reason": "task_failure",
                                         "ti": {"task_id": "actuate"}, **window}, engine)
    assert notice.subject == "gpupool: gpupool_pipeline run failed at actuate (1 handover(s) failed or rolled back)"
    assert "gpupool_pipeline run r1 failed: task_failure." in notice.text
    assert "window: [2026-03-02 12:00:00Z, 2026-03-02 13:00:00Z)" in notice.text
    assert f"Handover #{hid} (live): node n1" in notice.text
    # a window in which nothing ended badly mails the run alone
    later = {"data_interval_start": T0 + timedelta(hours=2), "data_interval_end": T0 + timedelta(hours=3)}
    quiet = notify.notice_from_context({"dag": dag, "run_id": "r2", "exception": ValueError("no data"), **later}, engine)
    assert "Handover" not in quiet.text and "error: ValueError: no data" in quiet.text


def test_off_without_recipients_and_the_notifier_arguments_with(sqlite_engine):
    _, err, _ = _timed_out_release(sqlite_engine)
    context = {"exception": err}
    assert notify.mail_for_failure(context, _ctx(sqlite_engine, to=())) is None
    mail = notify.mail_for_failure(context, _ctx(sqlite_engine))
    assert mail["to"] == ["oncall@example.org"] and mail["smtp_conn_id"] == "smtp_default" and mail["from_email"] is None
    assert mail["html_content"].startswith("<pre") and "n1" in mail["html_content"]


def test_the_html_body_is_escaped_and_never_a_template():
    notice = notify.Notice("s {{ x }}", 'a <b> & {{ ti }} {% if %} {"k": 1}')
    body = notice.html()
    assert "<b>" not in body and "&lt;b&gt;" in body and "{" not in body and "}" not in body
    assert notice.notifier_kwargs(parse_config({"platforms": PLATFORMS}).notify)["subject"] == "s (( x ))"


def test_notify_config_refuses_what_is_no_address():
    with pytest.raises(ConfigError, match=r"notify.to.*not a mail address: \['oncall'\]"):
        parse_config({"platforms": PLATFORMS, "notify": {"to": ["oncall"]}})
    with pytest.raises(ConfigError, match="notify.cc"):
        parse_config({"platforms": PLATFORMS, "notify": {"cc": ["a@b.c"]}})
    assert parse_config({"platforms": PLATFORMS}).notify.to == []
