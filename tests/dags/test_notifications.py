"""The DAGs' failure callbacks are attached, and each one, called as Airflow calls it, hands a
mail to the SMTP provider's notifier that a real SMTP server (aiosmtpd, on loopback) receives:
for a handover the pass rolled back, the mail names the node, its platforms and what was undone."""

from __future__ import annotations

import email
import html
import json
import os
import socket
import sys
from datetime import datetime, timedelta, timezone
from email.message import Message
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "unit" / "actuation"))

from memplatform import make  # noqa: E402

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=timezone.utc)
PLATFORMS = [{"name": "slurm", "kind": "slurm", "actuation": True, "conn_id": "hpc"},
             {"name": "kubernetes", "kind": "kubernetes", "actuation": True, "conn_id": "ai"}]


@pytest.fixture(scope="module")
def dagbag(airflow_home, dags_root):
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(dags_root / "dags"))
    assert bag.import_errors == {}
    return bag


def _callbacks(obj) -> list:
    cbs = obj.on_failure_callback
    return [] if cbs is None else list(cbs) if isinstance(cbs, (list, tuple)) else [cbs]


def _names(cbs) -> list[str]:
    return [getattr(cb, "__name__", type(cb).__name__) for cb in cbs]


def test_the_failure_callbacks_are_attached(dagbag):
    pipeline = dagbag.dags["gpupool_pipeline"]
    assert _names(_callbacks(pipeline)) == ["notify_failure"]  # once per failed run
    assert all(_callbacks(t) == [] for t in pipeline.tasks)  # not once per failed mapped task
    handover = dagbag.dags["gpupool_handover"]
    assert _names(_callbacks(handover.task_dict["advance"])) == ["notify_failure"]
    assert _callbacks(handover) == []  # the task's callback already mails the run's one task


class _Inbox:
    """An aiosmtpd handler that keeps every message it receives."""

    def __init__(self):
        self.messages: list[tuple[list[str], Message]] = []

    async def handle_DATA(self, server, session, envelope):
        self.messages.append((list(envelope.rcpt_tos), email.message_from_bytes(envelope.content)))
        return "250 OK"


@pytest.fixture
def smtp(monkeypatch, airflow_home):
    """A real SMTP server on loopback, named by the Airflow connection `smtp_default`."""
    from aiosmtpd.controller import Controller

    with socket.socket() as s:  # aiosmtpd's Controller checks its port by connecting: no port 0
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    inbox = _Inbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    monkeypatch.setenv("AIRFLOW_CONN_SMTP_DEFAULT", json.dumps({
        "conn_type": "smtp", "host": "127.0.0.1", "port": port,
        "extra": {"disable_ssl": True, "disable_tls": True, "from_email": "gpupool@example.org", "timeout": 10,
                  "retry_limit": 0}}))
    yield inbox
    controller.stop()


@pytest.fixture
def staged(tmp_path, monkeypatch):
    """Staging (SQLite) and a platforms.yaml naming a recipient, as the callbacks load them."""
    from gpupool.staging import db

    url = f"sqlite:///{tmp_path / 'staging.db'}"
    engine = db.make_engine(url)
    db.upgrade(engine)
    config = tmp_path / "platforms.yaml"
    config.write_text(yaml.safe_dump({"platforms": PLATFORMS, "dry_run": False, "notify": {"to": ["oncall@example.org"]}}))
    monkeypatch.setenv("GPUPOOL_STAGING_URL", url)
    monkeypatch.setenv("GPUPOOL_CONFIG", str(config))
    yield engine, config
    engine.dispose()


def _rolled_back(engine):
    """A live handover n1 slurm -> kubernetes whose release outlived its deadline: the pass
    lifts gpupool's hold at slurm, rolls it back and raises, as the handover task does."""
    from gpupool import pipeline
    from gpupool.actuation import handover as ho
    from gpupool.jobs import allocation as service
    from gpupool.config import load_config

    dc, acts = make(("slurm", "kubernetes"), {"n1": "slurm"})
    dc.slots[("slurm", "n1")].jobs = 1
    hid = ho.open_handover(engine, "n1", "slurm", "kubernetes", T0, dry_run=False, timeout=timedelta(hours=1))
    ctx = pipeline.Context(load_config(os.environ["GPUPOOL_CONFIG"]), engine)
    service.advance_handovers(ctx, T0, dry_run=False, actuators=acts)
    with pytest.raises(ho.HandoverFailed) as err:
        service.advance_handovers(ctx, T0 + timedelta(hours=1), dry_run=False, actuators=acts)
    assert ho.get_handover(engine, hid).state == ho.ROLLED_BACK
    return hid, err.value


def _body(msg: Message) -> str:
    parts = [p for p in msg.walk() if p.get_content_type() == "text/html"]
    assert parts, msg.as_string()[:2000]
    return html.unescape(parts[0].get_payload(decode=True).decode(parts[0].get_content_charset() or "utf-8"))


def _task_context(dag, task_id, exception, **extra):
    return {"dag": dag, "task": dag.task_dict[task_id], "run_id": "scheduled__2026-03-02T12:55:00+00:00",
            "ti": type("TI", (), {"task_id": task_id})(), "exception": exception, **extra}


def test_a_rolled_back_handover_is_mailed_through_the_smtp_notifier(dagbag, smtp, staged):
    engine, _ = staged
    hid, err = _rolled_back(engine)
    dag = dagbag.dags["gpupool_handover"]
    [callback] = _callbacks(dag.task_dict["advance"])
    callback(_task_context(dag, "advance", err))
    [(rcpt, msg)] = smtp.messages
    assert rcpt == ["oncall@example.org"] and msg["From"] == "gpupool@example.org"
    assert "n1" in msg["Subject"] and "rolled back" in msg["Subject"] and "slurm -> kubernetes" in msg["Subject"]
    body = _body(msg)
    assert f"Handover #{hid} (live): node n1, slurm -> kubernetes: rolled back" in body
    assert "platforms: source slurm, target kubernetes" in body
    assert "undone: gpupool's hold at slurm lifted, the node stays on slurm (sent: drain (ok), resume (ok))" in body
    assert "timed out in state releasing" in body
    # the next pass fails on nothing new: no second mail
    from gpupool.actuation import handover as ho

    again = ho.HandoverFailed({"failed": [{**f, "before": ho.FAILED, "state": ho.FAILED} for f in err.report["failed"]]})
    callback(_task_context(dag, "advance", again))
    assert len(smtp.messages) == 1


def test_a_failed_pipeline_run_is_mailed_with_the_handovers_of_its_window(dagbag, smtp, staged):
    engine, _ = staged
    hid, _ = _rolled_back(engine)
    dag = dagbag.dags["gpupool_pipeline"]
    [callback] = _callbacks(dag)
    # a DAG callback's context: the run, the reason and the last failed task's template context
    callback({"dag": dag, "run_id": "scheduled__2026-03-02T12:00:00+00:00", "reason": "task_failure",
              "ti": type("TI", (), {"task_id": "actuate"})(),
              "data_interval_start": T0, "data_interval_end": T0 + timedelta(hours=1)})
    [(_, msg)] = smtp.messages
    assert msg["Subject"] == "gpupool: gpupool_pipeline run failed at actuate (1 handover(s) failed or rolled back)"
    body = _body(msg)
    assert "gpupool_pipeline run scheduled__2026-03-02T12:00:00+00:00 failed: task_failure." in body
    assert "failed task: actuate" in body and f"Handover #{hid} (live): node n1, slurm -> kubernetes" in body


def test_no_mail_while_platforms_yaml_names_no_one(dagbag, smtp, staged):
    engine, config = staged
    _, err = _rolled_back(engine)
    config.write_text(yaml.safe_dump({"platforms": PLATFORMS, "dry_run": False}))
    dag = dagbag.dags["gpupool_handover"]
    [callback] = _callbacks(dag.task_dict["advance"])
    callback(_task_context(dag, "advance", err))
    assert smtp.messages == []
