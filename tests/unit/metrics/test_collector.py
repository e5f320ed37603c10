"""The metrics collector on staging the pipeline filled on the embedded virtual datacenter (on
SQLite and on the real PostgreSQL): every value is what staging holds, read back here with
plain queries; the exposition passes `promtool check metrics`."""

from __future__ import annotations

import math
import shutil
import subprocess
from datetime import timedelta

import pandas as pd
import pytest
import sqlalchemy as sa
from prometheus_client.parser import text_string_to_metric_families

from gpupool import metrics
from gpupool.actuation import handover as ho
from gpupool.config import default_config
from gpupool.staging import reads
from gpupool.staging.schema import allocation_plan, clean_sample, forecast, inventory_node, sample

from metrics_staged import END

AT = END + timedelta(minutes=20)


def scrape(engine, config, at) -> dict[tuple[str, tuple], float]:
    """One scrape parsed: {(sample name, sorted labels): value}."""
    text = metrics.exposition(engine, config, at).decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples, name, **labels):
    return samples[(name, tuple(sorted(labels.items())))]


def promtool_check(text: bytes) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:  # make test installs it (scripts/install-services.sh): fail, never skip
        pytest.fail("promtool not on PATH: run scripts/install-services.sh (Debian's prometheus package)")
    proc = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, timeout=60)
    assert proc.returncode == 0, (proc.stdout + proc.stderr).decode()


@pytest.fixture(scope="module")
def scraped(staged_ctx):
    return scrape(staged_ctx.engine, staged_ctx.config, AT)


def test_exposition_passes_promtool_check_metrics(staged_ctx):
    promtool_check(metrics.exposition(staged_ctx.engine, staged_ctx.config, AT))


def test_nodes_held_and_lendable_idle_nodes_are_the_latest_inventory(staged_ctx, scraped):
    with staged_ctx.engine.connect() as conn:
        inv = pd.read_sql(sa.select(inventory_node).where(inventory_node.c.snapshot_at <= AT), conn)
    inv["snapshot_at"] = pd.to_datetime(inv["snapshot_at"], utc=True)
    for p in staged_ctx.platforms():
        mine = inv[inv["platform"] == p]
        latest = mine[mine["snapshot_at"] == mine["snapshot_at"].max()]
        # no handover in this staging: a platform holds the nodes of its snapshot open for work
        # or drained by someone other than gpupool (none here)
        assert latest["schedulable"].all(), p
        assert value(scraped, "gpupool_platform_held_nodes", platform=p) == len(latest) > 0
        assert value(scraped, "gpupool_platform_held_gpus", platform=p) == latest["gpus"].sum()
        idle = int((latest["busy_gpus"].fillna(0) <= 0).sum())
        floor = staged_ctx.config.platform(p).min_nodes
        assert value(scraped, "gpupool_platform_lendable_idle_nodes", platform=p) == min(idle, len(latest) - floor)
        assert value(scraped, "gpupool_platform_min_nodes", platform=p) == floor
    assert sum(value(scraped, "gpupool_platform_lendable_idle_nodes", platform=p) for p in staged_ctx.platforms()) > 0


def test_allocated_pending_capacity_and_unmet_are_the_newest_totals(staged_ctx, scraped):
    for p in staged_ctx.platforms():
        with staged_ctx.engine.connect() as conn:
            rows = pd.read_sql(sa.select(sample.c.metric, sample.c.ts, sample.c.value).where(
                sample.c.platform == p, sample.c.entity_kind == "platform", sample.c.ts <= AT), conn)
        rows["ts"] = pd.to_datetime(rows["ts"], utc=True)
        newest = rows.sort_values("ts").groupby("metric").last()["value"]
        assert value(scraped, "gpupool_platform_allocated_gpus", platform=p) == newest["gpu_allocated"]
        assert value(scraped, "gpupool_platform_pending_gpus", platform=p) == newest["gpu_pending"]
        assert value(scraped, "gpupool_platform_capacity_gpus", platform=p) == newest["gpu_capacity"]
        last = rows[rows["ts"] == rows["ts"].max()].set_index("metric")["value"]
        unmet = max(0.0, last["gpu_allocated"] + last["gpu_pending"] - last["gpu_capacity"])
        assert value(scraped, "gpupool_platform_unmet_gpus", platform=p) == pytest.approx(unmet)


def test_forecast_error_against_seasonal_naive_is_scored_on_staged_forecasts(staged_ctx, scraped):
    with staged_ctx.engine.connect() as conn:
        fc = pd.read_sql(sa.select(forecast).where(forecast.c.step == 1, forecast.c.issued_at <= AT), conn)
    fc["ts"] = pd.to_datetime(fc["ts"], utc=True)
    at = pd.Timestamp(AT)
    for p in staged_ctx.platforms():
        hourly, _ = reads.hourly_demand(staged_ctx.engine, p, (END - timedelta(days=3)), AT)
        errors, naive = [], []
        for r in fc[fc["platform"] == p].itertuples():
            day_before = r.ts - pd.Timedelta(hours=24)
            complete = r.ts + pd.Timedelta(hours=1) <= at and r.ts >= at - pd.Timedelta(hours=24)
            if complete and not math.isnan(hourly.get(r.ts, math.nan)) and not math.isnan(hourly.get(day_before, math.nan)):
                errors.append(abs(hourly[r.ts] - r.yhat))
                naive.append(abs(hourly[r.ts] - hourly[day_before]))
        # four hourly passes issued forecasts at END-3h..END: the hours END-3h..END-1h are complete
        assert len(errors) == 3, p
        assert value(scraped, "gpupool_forecast_scored_points", platform=p, window="24h") == 3
        assert value(scraped, "gpupool_forecast_scored_points", platform=p, window="7d") == 3
        got = value(scraped, "gpupool_forecast_mean_absolute_error_gpus", platform=p, window="24h", forecaster="gpupool")
        assert got == pytest.approx(sum(errors) / 3)
        got = value(scraped, "gpupool_forecast_mean_absolute_error_gpus", platform=p, window="24h",
                    forecaster="seasonal_naive")
        assert got == pytest.approx(sum(naive) / 3)


def test_plan_expected_unmet_against_what_came(staged_ctx, scraped):
    horizon = staged_ctx.config.limits.plan_horizon_hours
    with staged_ctx.engine.connect() as conn:
        plans = conn.execute(sa.select(allocation_plan).order_by(allocation_plan.c.decided_at)).all()
    # the newest plan whose horizon had passed at AT
    scored = [pl for pl in plans if pd.Timestamp(pl.decided_at).tz_localize(None) + pd.Timedelta(hours=horizon)
              <= pd.Timestamp(AT).tz_localize(None)][-1]
    decided = pd.Timestamp(scored.decided_at)
    decided = decided.tz_localize("UTC") if decided.tzinfo is None else decided
    assert value(scraped, "gpupool_plan_scored_decision_timestamp_seconds") == decided.timestamp()
    for p, info in scored.summary["platforms"].items():
        assert value(scraped, "gpupool_plan_expected_unmet_gpu_seconds", platform=p) == pytest.approx(
            info["expected_unmet_after"] * 3600)
        with staged_ctx.engine.connect() as conn:
            rows = pd.read_sql(sa.select(sample.c.metric, sample.c.ts, sample.c.value).where(
                sample.c.platform == p, sample.c.entity_kind == "platform", sample.c.ts >= decided.to_pydatetime(),
                sample.c.ts < (decided + pd.Timedelta(hours=horizon)).to_pydatetime()), conn)
        wide = rows.pivot(index="ts", columns="metric", values="value").dropna()
        unmet = (wide["gpu_allocated"] + wide["gpu_pending"] - wide["gpu_capacity"]).clip(lower=0)
        assert value(scraped, "gpupool_plan_realised_unmet_gpu_seconds", platform=p) == pytest.approx(
            unmet.mean() * horizon * 3600)


def test_alarms_cleaned_points_and_freshness(staged_ctx, scraped):
    c = clean_sample.c
    for p in staged_ctx.platforms():
        for label, hours in (("1h", 1), ("24h", 24)):
            with staged_ctx.engine.connect() as conn:
                rows = pd.read_sql(sa.select(c.is_anomaly, c.cleaned).where(
                    c.platform == p, c.ts >= AT - timedelta(hours=hours), c.ts < AT), conn)
            assert value(scraped, "gpupool_alarm_points", platform=p, window=label) == int(rows["is_anomaly"].sum())
            assert value(scraped, "gpupool_cleaned_points", platform=p, window=label) == int(rows["cleaned"].sum())
        with staged_ctx.engine.connect() as conn:
            newest = pd.Timestamp(conn.execute(sa.select(sa.func.max(sample.c.ts)).where(sample.c.platform == p)).scalar())
        newest = newest.tz_localize("UTC") if newest.tzinfo is None else newest
        assert value(scraped, "gpupool_newest_sample_age_seconds", platform=p) == (pd.Timestamp(AT) - newest).total_seconds()
        assert value(scraped, "gpupool_newest_sample_timestamp_seconds", platform=p) == newest.timestamp()
    assert value(scraped, "gpupool_staging_up") == 1.0
    assert value(scraped, "gpupool_metrics_instant_timestamp_seconds") == AT.timestamp()


def test_an_earlier_instant_sees_staging_as_it_stood(staged_ctx):
    """``at`` is honoured: an hour earlier, the newest sample and forecast record are older."""
    earlier = scrape(staged_ctx.engine, staged_ctx.config, AT - timedelta(hours=1))
    for p in staged_ctx.platforms():
        age = value(earlier, "gpupool_newest_sample_age_seconds", platform=p)
        assert 0 <= age < 3600
        assert value(earlier, "gpupool_forecast_scored_points", platform=p, window="24h") == 2


def test_a_platform_never_extracted_is_infinitely_stale_and_holds_nothing(staged_ctx):
    from gpupool.config import parse_config

    cfg = parse_config({"platforms": [{"name": p, "kind": "simulator", "min_nodes": 1} for p in staged_ctx.platforms()]
                        + [{"name": "lab", "kind": "simulator", "min_nodes": 2}]})
    out = scrape(staged_ctx.engine, cfg, AT)
    assert value(out, "gpupool_newest_sample_age_seconds", platform="lab") == math.inf
    assert value(out, "gpupool_platform_held_nodes", platform="lab") == 0
    assert value(out, "gpupool_platform_min_nodes", platform="lab") == 2
    assert ("gpupool_platform_allocated_gpus", (("platform", "lab"),)) not in out


# --- handovers ---------------------------------------------------------------------------


def test_handover_counts_failures_deadlines_and_durations(engine):
    cfg = default_config()
    t0 = END - timedelta(hours=6)
    # done: one live in 10 min, one live in 50 min (slurm -> kubernetes), one dry run at once
    for i, minutes in enumerate((10, 50)):
        hid = ho.open_handover(engine, f"n{i}", "slurm", "kubernetes", t0, dry_run=False)
        _set_state(engine, hid, ho.DONE, t0 + timedelta(minutes=minutes))
    hid = ho.open_handover(engine, "n2", "openstack", "slurm", t0, dry_run=True)
    _set_state(engine, hid, ho.DONE, t0)
    # failed (still held) and rolled back: two failures kubernetes -> openstack
    for i, state in enumerate((ho.FAILED, ho.ROLLED_BACK)):
        hid = ho.open_handover(engine, f"f{i}", "kubernetes", "openstack", t0, dry_run=False)
        _set_state(engine, hid, state, t0 + timedelta(minutes=5))
    # open and past its deadline at AT; another open, within its deadline
    ho.open_handover(engine, "late", "openstack", "kubernetes", AT - timedelta(hours=3), dry_run=False,
                     timeout=timedelta(hours=1))
    ho.open_handover(engine, "fine", "openstack", "kubernetes", AT - timedelta(minutes=10), dry_run=False)
    # opened after AT: not yet there
    ho.open_handover(engine, "future", "slurm", "openstack", AT + timedelta(hours=1), dry_run=False)

    out = scrape(engine, cfg, AT)
    promtool_check(metrics.exposition(engine, cfg, AT))
    hv = "gpupool_handovers"
    assert value(out, hv, state="done", source="slurm", target="kubernetes", mode="live") == 2
    assert value(out, hv, state="done", source="openstack", target="slurm", mode="dry_run") == 1
    assert value(out, hv, state="failed", source="kubernetes", target="openstack", mode="live") == 1
    assert value(out, hv, state="rolled_back", source="kubernetes", target="openstack", mode="live") == 1
    assert value(out, hv, state="planned", source="openstack", target="kubernetes", mode="live") == 2
    assert value(out, hv, state="planned", source="slurm", target="openstack", mode="live") == 0
    assert sum(v for (name, _), v in out.items() if name == hv) == 7
    assert value(out, "gpupool_handover_failures_total", source="kubernetes", target="openstack") == 2
    assert value(out, "gpupool_handover_failures_total", source="slurm", target="kubernetes") == 0
    assert value(out, "gpupool_handovers_past_deadline", source="openstack", target="kubernetes") == 1
    assert value(out, "gpupool_handovers_past_deadline", source="kubernetes", target="openstack") == 0
    h = "gpupool_handover_duration_seconds"
    live = dict(source="slurm", target="kubernetes", mode="live")
    assert value(out, f"{h}_count", **live) == 2 and value(out, f"{h}_sum", **live) == 3600
    assert value(out, f"{h}_bucket", le="600.0", **live) == 1
    assert value(out, f"{h}_bucket", le="1800.0", **live) == 1
    assert value(out, f"{h}_bucket", le="3600.0", **live) == 2
    assert value(out, f"{h}_bucket", le="+Inf", **live) == 2
    assert value(out, f"{h}_count", source="openstack", target="slurm", mode="dry_run") == 1
    assert value(out, f"{h}_count", source="kubernetes", target="slurm", mode="live") == 0


def _set_state(engine, handover_id: int, state: str, at) -> None:
    from gpupool.staging.schema import handover

    with engine.begin() as conn:
        conn.execute(handover.update().where(handover.c.id == handover_id).values(state=state, updated_at=at))


def test_unreadable_staging_answers_staging_up_zero(tmp_path):
    from gpupool.staging import db

    engine = db.make_engine(f"sqlite:///{tmp_path / 'never-upgraded.db'}")  # no gpupool tables
    out = scrape(engine, default_config(), AT)
    assert out == {("gpupool_staging_up", ()): 0.0}
