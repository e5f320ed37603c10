"""The handover DAG end to end: a node handover opened in staging (as the hourly plan or the fast
path opens one) and advanced to `done` by `gpupool_handover` alone — one Airflow run
(`dag.test()`) per 5-minute logical date as the simulated clock reaches it — against the
virtual datacenter served by `gpupool sim serve` at a speed-up, through the real actuators of
kind kubernetes (cordon through the API server facade) and slurm (resume through `scontrol`),
with actuation on. The node drains at once (it runs nothing), is provisioned to slurm (in
transit `move_minutes`), and is attached there when it arrives; a node that still runs work
is drained and waits, and the runs say why; a node another tool drained is left exactly as
found, and the run fails so Airflow alerts.

Why `dag.test()` and not a scheduler: see test_fastpath_e2e.py (a 5-minute cron runs on wall
time). The provisioning between platforms is datacenter.py's :class:`ProvisionedActuator`.
"""

from __future__ import annotations

import subprocess
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

import datacenter  # tests/e2e/, on sys.path by conftest.py

pytestmark = pytest.mark.slow

T0 = datetime(2026, 6, 1, tzinfo=timezone.utc)
NOW = T0 + timedelta(days=1)  # where the served clock starts
MOVE_MINUTES = 10
SPEED = 60  # simulated seconds per wall second: a 5-minute tick every 5 s
TICK = timedelta(minutes=5)
MAX_TICKS = 6  # the move takes 10 minutes: done by the third or fourth run, with room to spare


def _scenario(tmp_path: Path) -> Path:
    """Flat demand: slurm runs 24 of its 32 GPUs, kubernetes 8 of its 32 (one busy node of four)."""
    n = 2 * 24 * 12
    slurm = datacenter.write_trace(tmp_path / "slurm.csv", T0, [24.0] * n, [0.0] * n, 32)
    k8s = datacenter.write_trace(tmp_path / "kubernetes.csv", T0, [8.0] * n, [0.0] * n, 32)
    return datacenter.write_scenario(tmp_path, slurm, k8s, MOVE_MINUTES)


def _run(dag, at: datetime) -> None:
    run = dag.test(logical_date=at)
    assert str(run.state).endswith("success"), (at, run.state)


@pytest.fixture(scope="module")
def dag(dags_root, airflow_home, tmp_path_factory):
    """The handover DAG after one run on the embedded default (no handover open, dry run), so
    the runs below start warm while the served clock runs."""
    return datacenter.warm_dag(dags_root, "gpupool_handover", tmp_path_factory.mktemp("warm"), NOW - TICK)


def _deployment(monkeypatch, tmp_path: Path, urls: dict, staging_url: str):
    from gpupool.staging import db

    datacenter.connect(monkeypatch, tmp_path, urls)
    datacenter.provisioned(monkeypatch, urls["control"])
    monkeypatch.setenv("GPUPOOL_CONFIG", str(datacenter.write_config(tmp_path)))
    monkeypatch.setenv("GPUPOOL_STAGING_URL", staging_url)
    engine = db.make_engine(staging_url)
    db.upgrade(engine)
    return engine


def _runs_until(dag, urls, engine, handover_id: int, done) -> list:
    """One DAG run per logical date from NOW + 5 min as the served clock reaches it, until
    ``done(handover)``; returns the handover after each run."""
    from gpupool.actuation import handover as ho

    seen = []
    for k in range(1, MAX_TICKS + 1):
        at = NOW + k * TICK
        while datacenter.sim_now(urls) < at:
            time.sleep(0.2)
        _run(dag, at)
        seen.append(ho.get_handover(engine, handover_id))
        if done(seen[-1]):
            break
    return seen


def test_the_handover_dag_moves_an_idle_node_to_done(dag, tmp_path, monkeypatch, staging_url):
    from gpupool.actuation import handover as ho

    with datacenter.serve(_scenario(tmp_path), NOW, SPEED) as urls:
        engine = _deployment(monkeypatch, tmp_path, urls, staging_url)
        before = datacenter.pool(urls["control"])
        node = sorted(n for n, e in before.items() if e["platform"] == "kubernetes" and e["busy_gpus"] == 0)[0]
        hid = ho.open_handover(engine, node, "kubernetes", "slurm", at=NOW, reason="e2e: slurm needs a node",
                               dry_run=False)
        seen = _runs_until(dag, urls, engine, hid, lambda h: h.state not in ho.OPEN_STATES)
        after = datacenter.pool(urls["control"])

    states = [h.state for h in seen]
    assert states[-1] == ho.DONE, [(h.state, h.error) for h in seen]
    # the first run drains it (it runs nothing) and sends it on its way; the move takes MOVE_MINUTES
    assert states[0] == ho.ATTACHING and "schedulable yet" in (seen[0].error or ""), seen[0]
    assert 2 <= len(seen) <= 1 + MOVE_MINUTES // 5 + 1, states
    h = seen[-1]
    assert h.error is None and h.updated_at == NOW + len(seen) * TICK  # the run's window end, not the wall clock
    sent = [(r["platform"], r["action"], r["status"]) for r in ho.audit_rows(engine, hid)]
    assert sent[0] == ("kubernetes", "cordon", "ok") and ("slurm", "provision", "ok") in sent, sent
    assert all(status == "ok" for _, _, status in sent) and not any(r["dry_run"] for r in ho.audit_rows(engine, hid))
    assert (before[node]["platform"], after[node]["platform"]) == ("kubernetes", "slurm")
    assert after[node]["schedulable"] and not after[node]["in_transit"] and after[node]["drain_reason"] == ""
    # the rest of the pool is as it was
    assert {n: e["platform"] for n, e in after.items() if n != node} == {n: e["platform"] for n, e in before.items() if n != node}


def test_a_busy_node_is_drained_and_waits(dag, tmp_path, monkeypatch, staging_url):
    """The node that runs kubernetes' work: the run cordons it (so no new work lands there) and
    the handover waits in `releasing`, saying what still runs; nothing reaches slurm."""
    from gpupool.actuation import handover as ho

    with datacenter.serve(_scenario(tmp_path), NOW, SPEED) as urls:
        engine = _deployment(monkeypatch, tmp_path, urls, staging_url)
        before = datacenter.pool(urls["control"])
        node = next(n for n, e in sorted(before.items()) if e["platform"] == "kubernetes" and e["busy_gpus"] > 0)
        hid = ho.open_handover(engine, node, "kubernetes", "slurm", at=NOW, dry_run=False)
        seen = _runs_until(dag, urls, engine, hid, lambda h: len(h.error or "") > 0)
        after = datacenter.pool(urls["control"])

    h = seen[-1]
    assert h.state == ho.RELEASING and "still on kubernetes" in h.error, h
    assert [(r["platform"], r["action"]) for r in ho.audit_rows(engine, hid)] == [("kubernetes", "cordon")]
    assert after[node]["platform"] == "kubernetes" and not after[node]["schedulable"]
    assert after[node]["drain_reason"].startswith("gpupool:")


def test_a_node_another_tool_drained_is_left_alone_and_the_run_fails(dag, tmp_path, monkeypatch, staging_url):
    """An operator drained a slurm node for maintenance (`scontrol`, a reason that is not
    gpupool's): the handover of it fails with nothing sent, the node keeps the operator's drain,
    and the DAG's run fails (the task raises HandoverFailed) so Airflow alerts."""
    from gpupool.actuation import handover as ho

    with datacenter.serve(_scenario(tmp_path), NOW, SPEED) as urls:
        engine = _deployment(monkeypatch, tmp_path, urls, staging_url)
        node = sorted(n for n, e in datacenter.pool(urls["control"]).items() if e["platform"] == "slurm")[0]
        drained = subprocess.run([str(tmp_path / "slurm-bin" / "scontrol"), "update", f"NodeName={node}",
                                  "State=DRAIN", "Reason=maintenance: PSU swap"], capture_output=True, text=True)
        assert drained.returncode == 0, drained.stderr
        hid = ho.open_handover(engine, node, "slurm", "kubernetes", at=NOW, dry_run=False)
        while datacenter.sim_now(urls) < NOW + TICK:
            time.sleep(0.2)
        run = dag.test(logical_date=NOW + TICK)
        after = datacenter.pool(urls["control"])[node]

    assert str(run.state).endswith("failed"), run.state
    h = ho.get_handover(engine, hid)
    assert h.state in (ho.FAILED, ho.ROLLED_BACK) and "left alone" in (h.error or ""), h
    assert ho.audit_rows(engine, hid) == []  # nothing was sent to either platform
    assert after["platform"] == "slurm" and not after["schedulable"]
    assert after["drain_reason"].startswith("maintenance")
