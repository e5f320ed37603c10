"""The fast path end to end: the `gpupool_fastpath` DAG, run by Airflow (`dag.test()`, one run
per 5-minute logical date as the simulated clock reaches it), against the virtual datacenter
served by `gpupool sim serve` at a speed-up, through the real sources and actuators of kind
slurm (Prometheus + slurmrestd, drain/resume through `scontrol`) and kubernetes (the API
server facade), with actuation on. A burst on slurm while kubernetes has idle nodes: the first
handover starts within 5 simulated minutes of the burst reaching the exporter and completes
within `move_minutes` + 5. With `dry_run` on, nothing reaches the platforms and the audit
shows what would have been sent.

Why `dag.test()` and not a scheduler: a scheduler's 5-minute cron runs on wall time, so a
simulated half hour would take a real half hour; the runs here are the DAG's own task, at the
logical dates the scheduler would give it, with the simulated clock as their time.

The datacenter between the platforms (provisioning a released node to its next platform) is
datacenter.py's :class:`ProvisionedActuator`, the one thing this test adds to what the product builds.
"""

from __future__ import annotations

import contextlib
import os
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pandas as pd
import pytest
import sqlalchemy as sa

import datacenter  # tests/e2e/, on sys.path by conftest.py

pytestmark = pytest.mark.slow

T0 = datetime(2026, 6, 1, tzinfo=timezone.utc)
NOW = T0 + timedelta(days=1)  # where the served clock starts
BURST = NOW + timedelta(minutes=10)  # slurm's demand jumps from 24 to 48 GPUs (it holds 32)
MOVE_MINUTES = 15
SPEED = 60  # simulated seconds per wall second: a 5-minute tick every 5 s
TICK = timedelta(minutes=5)
TICKS = 7  # NOW + 5 min .. NOW + 35 min: the burst, and the move with a tick to spare


# ------------------------------------------------------------------------------ the datacenter


def _trace(path: Path, running: list[float], pending: list[float], total: float) -> Path:
    return datacenter.write_trace(path, T0, running, pending, total)


def _scenario(tmp_path: Path) -> Path:
    idx = pd.date_range(T0, T0 + timedelta(days=2), freq="5min", inclusive="left")
    burst = idx >= pd.Timestamp(BURST)
    slurm = _trace(tmp_path / "slurm.csv", [32.0 if b else 24.0 for b in burst], [16.0 if b else 0.0 for b in burst], 32)
    k8s = _trace(tmp_path / "kubernetes.csv", [8.0] * len(idx), [0.0] * len(idx), 32)
    return datacenter.write_scenario(tmp_path, slurm, k8s, MOVE_MINUTES)


def _tick(dag, at: datetime, dry_run: bool) -> None:
    run = dag.test(logical_date=at, run_conf={"dry_run": dry_run})
    assert str(run.state).endswith("success"), (at, run.state)


@pytest.fixture(scope="module")
def dag(dags_root, airflow_home, tmp_path_factory):
    """The fast-path DAG after one run on the embedded default, so the timed runs below start
    warm (imports, the DAG's serialization in Airflow's database) while the served clock runs."""
    return datacenter.warm_dag(dags_root, "gpupool_fastpath", tmp_path_factory.mktemp("warm"), NOW - TICK,
                               {"dry_run": True})


@contextlib.contextmanager
def _vdc(tmp_path: Path, start_at: datetime):
    with datacenter.serve(_scenario(tmp_path), start_at, SPEED) as urls:
        yield urls


def _sim_now(urls) -> datetime:
    return datacenter.sim_now(urls)


def _pool(urls) -> dict[str, dict]:
    return datacenter.pool(urls["control"])


def _deployment(monkeypatch, tmp_path: Path, urls: dict, staging_url: str):
    """Connections, configuration and staging (with an hourly plan) as a deployment has them."""
    from gpupool.staging import db

    datacenter.connect(monkeypatch, tmp_path, urls)
    datacenter.provisioned(monkeypatch, urls["control"])
    monkeypatch.setenv("GPUPOOL_CONFIG", str(datacenter.write_config(tmp_path)))
    monkeypatch.setenv("GPUPOOL_STAGING_URL", staging_url)
    engine = db.make_engine(staging_url)
    db.upgrade(engine)
    datacenter.record_plan(engine, NOW)
    return engine


def test_a_burst_is_answered_within_minutes(dag, tmp_path, monkeypatch, staging_url):
    from gpupool.actuation import handover as ho
    from gpupool.config import load_config
    from gpupool.platforms import build_source
    from gpupool.sources.prometheus import as_query_tuple
    from gpupool.staging import fastpath as store

    with _vdc(tmp_path, NOW) as urls:
        engine = _deployment(monkeypatch, tmp_path, urls, staging_url)
        for k in range(1, TICKS + 1):
            at = NOW + k * TICK
            while _sim_now(urls) < at:  # the run for a logical date starts once the clock reached it
                time.sleep(0.2)
            _tick(dag, at, dry_run=False)
            lag = _sim_now(urls) - at
            # a run that ends later than the next logical date measures the test's host, not gpupool
            assert lag <= TICK, f"the run for {at} ended {lag} after it: the runs fell behind the simulated clock"

        # when the burst reached telemetry: the first minute the exporter's pending GPUs show it,
        # asked as slurm's pressure() asks
        cfg = load_config(os.environ["GPUPOOL_CONFIG"])
        slurm = build_source(cfg.platform("slurm"), cfg)
        expr = f"sum({as_query_tuple(slurm.queries['gpu_pending'])[0].expr})"
        minutes = [NOW + timedelta(minutes=m) for m in range(0, 30)]
        seen = next(t for t in minutes if (slurm._prom.instant_sum(expr, t, "gpu_pending") or 0) > 0)
        pool = _pool(urls)
    assert seen >= BURST

    live = [h for h in ho.list_handovers(engine) if not h.dry_run]
    assert live, store.recent_decisions(engine, 20)
    first = min(live, key=lambda h: h.created_at)
    assert (first.from_platform, first.to_platform) == ("kubernetes", "slurm")
    assert first.created_at - seen <= timedelta(minutes=5), (first.created_at, seen)
    assert first.state == ho.DONE, first
    assert first.updated_at - first.created_at <= timedelta(minutes=MOVE_MINUTES + 5), first
    sent = [(r["platform"], r["action"], r["status"]) for r in ho.audit_rows(engine, first.id)]
    assert ("kubernetes", "cordon", "ok") in sent and ("slurm", "provision", "ok") in sent
    assert pool[first.node]["platform"] == "slurm" and pool[first.node]["schedulable"]
    (move,) = [r for r in store.recent_decisions(engine, 50, moves_only=True) if r["handover_id"] == first.id]
    assert not move["dry_run"] and "short" in move["reason"]


def test_dry_run_sends_nothing_and_audits_what_it_would(dag, tmp_path, monkeypatch, staging_url):
    from gpupool.actuation import handover as ho
    from gpupool.staging.schema import action_audit

    at = BURST + 2 * TICK
    with _vdc(tmp_path, at) as urls:
        engine = _deployment(monkeypatch, tmp_path, urls, staging_url)
        before = _pool(urls)
        _tick(dag, at, dry_run=True)
        after = _pool(urls)

    (h,) = ho.list_handovers(engine)
    assert h.dry_run and h.state == ho.DONE and (h.from_platform, h.to_platform) == ("kubernetes", "slurm")
    rows = ho.audit_rows(engine, h.id)
    assert rows and all(r["status"] == "dry_run" and r["dry_run"] for r in rows)
    assert {r["platform"] for r in rows} == {"kubernetes", "slurm"}  # the release and the attach it would send

    def held(pool):
        return {n: (e["platform"], e["schedulable"], e["drain_reason"]) for n, e in pool.items()}

    assert held(after) == held(before)  # nothing reached the platforms
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(action_audit)
                            .where(action_audit.c.dry_run.is_(False))).scalar() == 0
