"""The allocation service on staging: plan from inventory + forecasts / last hour, actuate a
stored plan (dry run, live gate, backfill), list and roll back handovers."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pandas as pd
import pytest

from gpupool import pipeline
from gpupool.actuation import handover as ho
from gpupool.jobs import allocation as service
from gpupool.jobs.text import format_handovers
from gpupool.config import parse_config
from gpupool.staging.schema import clean_sample, forecast, forecast_run, inventory_node, sample

END = datetime(2026, 3, 2, 12, 0, tzinfo=timezone.utc)
WINDOW = pipeline.Window(END - timedelta(hours=1), END)


def _config(**extra):
    raw = {"platforms": [{"name": "slurm", "kind": "slurm", "conn_id": "slurm_hpc", "actuation": True},
                         {"name": "kubernetes", "kind": "kubernetes", "conn_id": "kubernetes_ai", "actuation": True}],
           "limits": {"horizon_hours": 2, "max_moves_per_decision": 2, "cooldown_hours": 0,
                      "headroom_quantile": 0.9}}  # below the level-90 interval's 0.95: rescaled
    raw.update(extra)
    return parse_config(raw)


def _stage(engine, busy_slurm=8.0):
    """slurm: 4 idle nodes of 8 GPUs (one also held by gpupool on kubernetes); kubernetes: 2 busy."""
    rows = []
    for i in range(4):
        rows.append(dict(platform="slurm", node=f"gpu-n{i}", snapshot_at=END, gpus=8, gpu_model="A100",
                         mig_layout=None, schedulable=True, drain_reason=None, busy_gpus=busy_slurm if i == 0 else 0.0))
    rows.append(dict(platform="kubernetes", node="gpu-n3", snapshot_at=END, gpus=8, gpu_model="A100", mig_layout=None,
                     schedulable=False, drain_reason="gpupool: held for the pool", busy_gpus=0.0))
    for i in range(2):
        rows.append(dict(platform="kubernetes", node=f"k8s-{i}", snapshot_at=END, gpus=8, gpu_model="H100",
                         mig_layout=None, schedulable=True, drain_reason=None, busy_gpus=8.0))
    rows.append(dict(platform="kubernetes", node="k8s-broken", snapshot_at=END, gpus=8, gpu_model="H100",
                     mig_layout=None, schedulable=False, drain_reason="hardware ticket 12", busy_gpus=0.0))
    with engine.begin() as conn:
        conn.execute(inventory_node.insert(), rows)
        for p, demand in (("slurm", 8.0), ("kubernetes", 40.0)):
            conn.execute(forecast_run.insert().values(platform=p, series="demand", issued_at=END, model="arima",
                                                      summary={}, level=90.0))
            conn.execute(forecast.insert(), [dict(platform=p, series="demand", issued_at=END, step=s,
                                                  ts=END + timedelta(hours=s), yhat=demand, yhat_lower=demand - 2,
                                                  yhat_upper=demand + 2) for s in (1, 2)])
            conn.execute(sample.insert(), [dict(platform=p, cluster="", entity_kind="platform", entity_id="",
                                                metric="gpu_allocated", ts=END - timedelta(minutes=m), value=demand / 2,
                                                unit="gpu") for m in (5, 30, 55)])
            conn.execute(clean_sample.insert(), [dict(platform=p, cluster="", entity_kind="platform", entity_id="",
                                                      metric="gpu_allocated", ts=END - timedelta(minutes=m),
                                                      value=demand / 2, expected=demand / 2, score=0.0,
                                                      is_anomaly=False, filled=False, detector="sr",
                                                      clean_value=demand / 2) for m in (5, 30, 55)])


def _model_record(engine, platform, hours=8):
    """A record the model won: over the ``hours`` before the last one the platform's demand rose
    2 GPUs an hour (flat inside each hour) up to the last hour's 20, and each hour's one-hour-ahead
    forecast was exact, while demand as it stood at each hour's start was 2 GPUs behind."""
    rows, fc = [], []
    for j in range(1, hours + 1):
        start, v = END - timedelta(hours=j + 1), 20.0 - 2 * j
        rows += [dict(platform=platform, cluster="", entity_kind="platform", entity_id="", metric="gpu_allocated",
                      ts=start + timedelta(minutes=m), value=v, expected=v, score=0.0, is_anomaly=False,
                      filled=False, detector="sr", clean_value=v) for m in (5, 30, 55)]
    for j in range(0, hours + 1):
        start = END - timedelta(hours=j + 1)
        fc.append(dict(platform=platform, series="demand", issued_at=start - timedelta(hours=1), step=1, ts=start,
                       yhat=20.0 - 2 * j, yhat_lower=18.0 - 2 * j, yhat_upper=22.0 - 2 * j))
    with engine.begin() as conn:
        conn.execute(clean_sample.insert(), rows)
        conn.execute(forecast.insert(), fc)


@pytest.fixture
def ctx(sqlite_engine):
    _stage(sqlite_engine)
    return pipeline.Context(_config(), sqlite_engine)


def test_plan_from_staging_predictive_moves_idle_slurm_nodes(ctx):
    _model_record(ctx.engine, "kubernetes")
    out = service.plan_from_staging(ctx, WINDOW, ["slurm", "kubernetes"], "predictive")
    assert out["solver"] == "milp"
    moves = out["moves"]
    assert 1 <= len(moves) <= 2
    assert all(m["from"] == "slurm" and m["to"] == "kubernetes" and m["node"] != "gpu-n0" for m in moves)
    assert set(moves[0]) >= {"node", "from", "to", "expected_gain", "reason", "mig_layout"}
    per = out["summary"]["platforms"]
    assert per["slurm"]["nodes"] == 4 and per["kubernetes"]["nodes"] == 2
    assert per["kubernetes"]["demand_mean"] == [40.0, 40.0]
    assert per["kubernetes"]["demand_upper"][0] < 42.0  # level-90 upper rescaled to the 0.9 quantile
    assert "forecast issued" in per["kubernetes"]["demand_from"]
    assert any("hardware ticket 12" in e["why"] for e in out["summary"]["excluded"])


def test_plan_from_staging_predictive_falls_back_to_the_last_hour_a_worse_forecast(ctx):
    # kubernetes' model forecast 5 GPUs for each of the last 12 hours, which held 20 each:
    # the last hour forecast them exactly, so the plan uses it and says why
    with ctx.engine.begin() as conn:
        for h in range(1, 13):
            issued = END - timedelta(hours=h)
            conn.execute(forecast.insert(), [dict(platform="kubernetes", series="demand", issued_at=issued, step=1,
                                                  ts=issued, yhat=5.0, yhat_lower=3.0, yhat_upper=7.0)])
            if h >= 2:  # the last hour's rows are staged already
                conn.execute(clean_sample.insert(), [dict(platform="kubernetes", cluster="", entity_kind="platform",
                                                          entity_id="", metric="gpu_allocated",
                                                          ts=issued + timedelta(minutes=m), value=20.0, expected=20.0,
                                                          score=0.0, is_anomaly=False, filled=False, detector="sr",
                                                          clean_value=20.0) for m in (5, 30)])
    out = service.plan_from_staging(ctx, WINDOW, ["slurm", "kubernetes"], "predictive")
    per = out["summary"]["platforms"]
    assert per["kubernetes"]["demand_mean"] == [20.0, 20.0]
    assert per["kubernetes"]["demand_from"].startswith("last hour: over 11 h")
    # no record for slurm's model yet: the plan is reactive's until it has one
    assert per["slurm"]["demand_from"].startswith("last hour: the model's record covers 0 h, fewer than the 6")


def test_plan_from_staging_reactive_uses_last_hour(ctx):
    out = service.plan_from_staging(ctx, WINDOW, ["slurm", "kubernetes"], "reactive")
    per = out["summary"]["platforms"]
    assert per["kubernetes"]["demand_mean"] == [20.0, 20.0] and per["kubernetes"]["demand_from"] == "last hour"


def test_pipeline_plan_then_dry_run_actuation(ctx):
    stored = pipeline.plan(ctx, WINDOW, policy="predictive", dry_run=True, platforms=["slurm", "kubernetes"])
    out = service.actuate_plan(ctx, stored["plan_id"], dry_run=True, backfill=False)
    assert not out["live"] and len(out["opened"]) == len(stored["moves"]) >= 1
    assert all(o["dry_run"] for o in out["opened"])
    hs = service.list_handovers(ctx.engine, at=END + timedelta(minutes=30))
    assert {h["state"] for h in hs} == {ho.DONE} and hs[0]["age_minutes"] == 30.0
    assert set(hs[0]["actions"]) == {"dry_run"}
    rows = ho.audit_rows(ctx.engine)
    # no actuator for a dry run: release, MIG layout (the planner names one for A100s), attach — described
    assert {r["status"] for r in rows} == {"dry_run"}
    assert {r["action"] for r in rows} - {"prepare"} == {"release", "attach"}
    # re-running the same plan opens nothing twice
    again = service.actuate_plan(ctx, stored["plan_id"], dry_run=True, backfill=False)
    assert again["opened"] == [] and len(again["skipped"]) == len(stored["moves"])
    assert "dry-run" in format_handovers(hs)


def test_backfill_never_actuates(ctx):
    stored = pipeline.plan(ctx, WINDOW, policy="predictive", dry_run=False, platforms=["slurm", "kubernetes"])
    out = service.actuate_plan(ctx, stored["plan_id"], dry_run=False, backfill=True)
    assert out["backfill"] and out["opened"] == []
    assert ho.list_handovers(ctx.engine) == []
    rows = ho.audit_rows(ctx.engine)
    assert [(r["action"], r["status"]) for r in rows] == [("backfill_skip", "dry_run")]


def test_live_needs_config_and_platform_consent(ctx):
    """dry_run=False alone sends nothing while the configuration says dry_run (the default)."""
    from memplatform import make

    dc, acts = make(("slurm", "kubernetes"), {f"gpu-n{i}": "slurm" for i in range(4)})
    stored = pipeline.plan(ctx, WINDOW, policy="predictive", dry_run=False, platforms=["slurm", "kubernetes"])
    out = service.actuate_plan(ctx, stored["plan_id"], dry_run=False, backfill=False, actuators=acts)
    assert not out["live"] and all(o["dry_run"] for o in out["opened"])
    assert all(a.sent == [] for a in acts.values())


def test_live_actuation_and_rollback(sqlite_engine):
    from memplatform import make

    _stage(sqlite_engine)
    ctx = pipeline.Context(_config(dry_run=False), sqlite_engine)
    stored = pipeline.plan(ctx, WINDOW, policy="predictive", dry_run=False, platforms=["slurm", "kubernetes"])
    nodes = {f"gpu-n{i}": "slurm" for i in range(4)} | {"k8s-0": "kubernetes", "k8s-1": "kubernetes"}
    dc, acts = make(("slurm", "kubernetes"), nodes)
    out = service.actuate_plan(ctx, stored["plan_id"], dry_run=False, backfill=False, actuators=acts)
    assert out["live"] and out["opened"] and not any(o["dry_run"] for o in out["opened"])
    moved = [o["node"] for o in out["opened"]]
    assert all(dc.open_on(n) == ["kubernetes"] for n in moved)
    # the planner sees those nodes as freshly moved (cool-down)
    nodes_after, _ = service.pool_nodes(sqlite_engine, END, ["slurm", "kubernetes"])
    assert all(n.last_moved_at is not None for n in nodes_after if n.name in moved)
    hid = out["opened"][0]["id"]
    res = service.rollback_handover(ctx, hid, actuators=acts, at=END + timedelta(hours=1))
    assert res["state"] == ho.ROLLED_BACK and dc.open_on(moved[0]) == ["slurm"]


def test_stale_plan_opens_nothing(ctx):
    stored = pipeline.plan(ctx, WINDOW, policy="predictive", dry_run=True, platforms=["slurm", "kubernetes"])
    out = service.actuate_plan(ctx, stored["plan_id"], dry_run=True, backfill=False, at=END + timedelta(hours=5))
    assert out["opened"] == [] and all("older than" in s["why"] for s in out["skipped"])


def test_build_actuators_reads_airflow_json_connections(tmp_path):
    from gpupool.platforms import build_actuators

    cfg = parse_config({"platforms": [
        {"name": "hpc", "kind": "slurm", "conn_id": "slurm_hpc", "actuation": True},
        {"name": "sim", "kind": "simulator", "actuation": True},
        {"name": "k8s", "kind": "kubernetes", "conn_id": "kubernetes_ai", "actuation": False}]})
    env = {"AIRFLOW_CONN_SLURM_HPC": '{"conn_type": "generic", "extra": {"slurm_conf": "/etc/slurm/slurm.conf"}}'}
    acts = build_actuators(cfg, env=env)
    assert list(acts) == ["hpc"] and acts["hpc"].slurm_conf == "/etc/slurm/slurm.conf"
    with pytest.raises(service.ActuationConfigError, match="'hpc'.*slurm_conf.*'slurm_hpc'"):
        build_actuators(cfg, env={"AIRFLOW_CONN_SLURM_HPC": '{"conn_type": "generic"}'})


def test_plan_from_staging_scores_the_forecast_against_demand_as_it_stood(ctx):
    # kubernetes ramps 2 GPUs an hour, and inside each hour its last sample already stands at the
    # next hour's level; its model forecast each hour 1 GPU high. Against the hour before (2 off
    # each hour) the model wins; against demand as it stood (what reactive plans on) it loses
    from gpupool.decisions.demand import forecast_skill
    from gpupool.staging import reads

    rows, fc = [], []
    for k in range(10):  # hours END-11h .. END-2h; the last hour is staged already (20 GPUs)
        start = END - timedelta(hours=11 - k)
        v = 2.0 + 2 * k
        rows += [dict(platform="kubernetes", cluster="", entity_kind="platform", entity_id="", metric="gpu_allocated",
                      ts=start + timedelta(minutes=m), value=x, expected=x, score=0.0, is_anomaly=False, filled=False,
                      detector="sr", clean_value=x) for m, x in ((5, v), (30, v), (50, v + 2))]
        if k:
            fc.append(dict(platform="kubernetes", series="demand", issued_at=start, step=1, ts=start,
                           yhat=v + 2 / 3 + 1, yhat_lower=v, yhat_upper=v + 4))
    with ctx.engine.begin() as conn:
        conn.execute(clean_sample.insert(), rows)
        conn.execute(forecast.insert(), fc)
    out = service.plan_from_staging(ctx, WINDOW, ["slurm", "kubernetes"], "predictive")
    per = out["summary"]["platforms"]["kubernetes"]
    assert per["demand_from"].startswith("last hour: over 9 h the model issued")
    reactive = service.plan_from_staging(ctx, WINDOW, ["slurm", "kubernetes"], "reactive")
    assert per["demand_mean"] == reactive["summary"]["platforms"]["kubernetes"]["demand_mean"] == [20.0, 20.0]
    assert per["demand_upper"] == reactive["summary"]["platforms"]["kubernetes"]["demand_upper"]
    # scored the old way (against the hour before) the same record would have kept the model
    since = END - timedelta(hours=13)
    hourly, _ = reads.hourly_demand(ctx.engine, "kubernetes", since, END)
    issued = reads.forecasts_issued_between(ctx.engine, since, END)
    issued = issued[issued["platform"] == "kubernetes"]
    assert forecast_skill(pd.Series(issued["yhat"].to_numpy(float), index=pd.DatetimeIndex(issued["ts"])),
                          hourly).forecast_wins


def test_the_plan_looks_its_own_horizon_ahead_within_the_forecasts():
    from gpupool.config import PLAN_HORIZON_HOURS
    from gpupool.decisions.policy import Policy

    cfg = parse_config({"platforms": [{"name": "slurm", "kind": "slurm", "conn_id": "slurm_hpc"}]})
    assert cfg.limits.horizon_hours == 6  # the forecast stage's horizon is unchanged
    # the pipeline's plan and `gpupool simulate` (Policy) share one default
    assert service.policy_from_config(cfg, "reactive").plan_horizon_hours == PLAN_HORIZON_HOURS == Policy().plan_horizon_hours
    cfg = parse_config({"platforms": [{"name": "slurm", "kind": "slurm", "conn_id": "slurm_hpc"}],
                        "limits": {"plan_horizon_hours": 3}})
    assert service.policy_from_config(cfg, "predictive").plan_horizon_hours == 3
    with pytest.raises(Exception, match="plan_horizon_hours \\(7\\) exceeds horizon_hours \\(6\\)"):
        parse_config({"platforms": [{"name": "slurm", "kind": "slurm", "conn_id": "slurm_hpc"}],
                      "limits": {"plan_horizon_hours": 7}})


def test_plan_from_staging_plans_the_plan_horizon_not_the_forecast_horizon(sqlite_engine):
    _stage(sqlite_engine)
    c = pipeline.Context(_config(limits={"horizon_hours": 2, "plan_horizon_hours": 1, "max_moves_per_decision": 2,
                                         "cooldown_hours": 0}), sqlite_engine)
    for kind in ("predictive", "reactive"):
        out = service.plan_from_staging(c, WINDOW, ["slurm", "kubernetes"], kind)
        assert out["summary"]["horizon_hours"] == 1
        assert all(len(p["demand_mean"]) == 1 for p in out["summary"]["platforms"].values())


def test_the_plan_task_moves_a_platform_with_a_daily_rhythm_along_it(ctx):
    # kubernetes' demand has followed the same day for ten days, rising from 20 GPUs at 03:00 to
    # 60 at 15:00: at noon (END) the level alone would miss the next two hours' rise; the plan
    # task's daily record sees that, as gpupool simulate's does, and plans the rise
    import math

    def demand(ts):
        return 40.0 + 20.0 * math.cos(2 * math.pi * (ts.hour + ts.minute / 60 - 15) / 24)

    steps = [END - timedelta(minutes=5 * i) for i in range(1, 10 * 24 * 12 + 1)]  # ten days up to END
    rows = [dict(platform="kubernetes", cluster="", entity_kind="platform", entity_id="", metric="gpu_allocated",
                 ts=ts, value=demand(ts), expected=demand(ts), score=0.0, is_anomaly=False, filled=False,
                 detector="sr", clean_value=demand(ts)) for ts in steps]
    with ctx.engine.begin() as conn:
        conn.execute(clean_sample.delete().where(clean_sample.c.platform == "kubernetes"))
        conn.execute(clean_sample.insert(), rows)
    out = service.plan_from_staging(ctx, WINDOW, ["slurm", "kubernetes"], "predictive")
    per = out["summary"]["platforms"]["kubernetes"]
    assert per["demand_from"].startswith("last hour moved by the daily change at this hour")
    reactive = service.plan_from_staging(ctx, WINDOW, ["slurm", "kubernetes"], "reactive")["summary"]["platforms"]
    level = reactive["kubernetes"]["demand_mean"]
    # the next two hours' means lie above the level by the usual rise (12:00-13:00 and 13:00-14:00)
    rise = [sum(demand(END + timedelta(hours=h, minutes=m)) for m in range(0, 60, 5)) / 12 - level[0] for h in (0, 1)]
    assert per["demand_mean"] == pytest.approx([level[0] + r for r in rise], abs=0.5)
    assert rise[1] > rise[0] > 2.0
    # both plans carry the week's peak hourly demand (the 14:00 hour, near 60 GPUs) to the planner,
    # which parks spare nodes up to it as gpupool simulate's does
    peak = max(sum(demand(END - timedelta(days=d, hours=h, minutes=-m)) for m in range(0, 60, 5)) / 12
               for d in range(7) for h in range(1, 25))
    assert per["demand_peak_week"] == reactive["kubernetes"]["demand_peak_week"] == pytest.approx(peak, abs=0.1)
    assert peak > 59.0


def test_the_plan_gets_what_the_fast_path_left_of_the_hours_move_budget(ctx):
    """Both paths share the move budget of any rolling hour: a fast-path move opened 20 minutes
    before the plan leaves it one of the two moves an hour allows; two leave it none."""
    _model_record(ctx.engine, "kubernetes")
    assert len(service.plan_from_staging(ctx, WINDOW, ["slurm", "kubernetes"], "predictive")["moves"]) == 2
    ho.open_handover(ctx.engine, "gpu-n1", "slurm", "kubernetes", at=END - timedelta(minutes=20), dry_run=True)
    assert len(service.plan_from_staging(ctx, WINDOW, ["slurm", "kubernetes"], "predictive")["moves"]) == 1
    ho.open_handover(ctx.engine, "gpu-n2", "slurm", "kubernetes", at=END - timedelta(minutes=10), dry_run=True)
    assert service.plan_from_staging(ctx, WINDOW, ["slurm", "kubernetes"], "predictive")["moves"] == []


@pytest.mark.parametrize("lend_limit", [0, 1, None])
def test_the_plan_job_hands_owners_to_the_planner_so_lend_limit_binds(sqlite_engine, lend_limit):
    """slurm owns its 4 idle nodes at first sight (recorded in staging) and kubernetes, short, its
    own 3: the plan moves none of slurm's with ``lend_limit: 0``, at most one with 1, and without a
    limit as before (the control: the limit is what holds them)."""
    from gpupool.staging import owners as owner_store

    _stage(sqlite_engine)
    _model_record(sqlite_engine, "kubernetes")
    cfg = _config(platforms=[
        {"name": "slurm", "kind": "slurm", "conn_id": "slurm_hpc", "actuation": True, "owns": 4, "lend_limit": lend_limit},
        {"name": "kubernetes", "kind": "kubernetes", "conn_id": "kubernetes_ai", "actuation": True, "owns": 3}])
    ctx = pipeline.Context(cfg, sqlite_engine)
    out = service.plan_from_staging(ctx, WINDOW, ["slurm", "kubernetes"], "predictive")
    lent = [m for m in out["moves"] if m["from"] == "slurm"]
    if lend_limit is None:
        assert 1 <= len(lent) <= 2
    else:
        assert len(lent) == lend_limit, out["moves"]
    # a node drained by someone else is still its platform's: kubernetes owns it with its others
    assert owner_store.owners(sqlite_engine) == {**{f"gpu-n{i}": "slurm" for i in range(4)},
                                                 **{n: "kubernetes" for n in ("k8s-0", "k8s-1", "k8s-broken")}}
    per = out["summary"]["platforms"]
    assert (per["slurm"]["owned"], per["slurm"]["lent"], per["kubernetes"]["borrowed"]) == (4, 0, 0)


def test_a_plan_without_ownership_keys_records_no_owner(ctx):
    from gpupool.staging import owners as owner_store

    out = service.plan_from_staging(ctx, WINDOW, ["slurm", "kubernetes"], "predictive")
    assert owner_store.owner_rows(ctx.engine) == [] and owner_store.seen_platforms(ctx.engine) == set()
    assert "owned" not in out["summary"]["platforms"]["slurm"]
    assert service.policy_from_config(ctx.config, "predictive").ownership == {}
