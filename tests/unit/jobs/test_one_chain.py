"""One decision chain: the plan task (``jobs.allocation.platform_demand`` on staging) and the what-if
(``sim.study``'s demand sources on the world) give the planner the same demand for the same
telemetry, forecast and track record; and the operator's ``limits`` reach the planner."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pandas as pd
import pytest

from gpupool import pipeline
from gpupool.jobs import allocation as service
from gpupool.decisions.demand import PlatformDemand, plan_demand
from gpupool.decisions.policy import Policy
from gpupool.canonical import DEMAND_METRICS
from gpupool.config import parse_config
from gpupool.forecast import stage as forecast_stage
from gpupool.sim.scenario import scenario_from_dict
from gpupool.sim.study import demand_source
from gpupool.sim.world import World
from gpupool.staging.schema import forecast, forecast_run, sample

PLATFORMS = ("x", "y")


def _world(days: int = 16, gaps: bool = False, rhythm: bool = True) -> World:
    """Two noisy synthetic platforms with a daily rhythm and exporter glitches, long enough that
    the staged history the plan task reads is shorter than what the what-if keeps; ``gaps``:
    also steps the exporter reported nothing for; without ``rhythm`` no daily or weekly shape."""
    rates = {} if gaps else {"anomalies": {"gap": 0.0}}
    if not rhythm:
        rates = {**rates, "daily_amplitude": 0.0, "weekly_amplitude": 0.0}
    raw = {"start": "2024-01-01", "end": f"2024-01-{1 + days:02d}", "seed": 7,
           "platforms": {"x": {"synthetic": {"base": 30, "total_gpus": 48, "noise": 0.15, **rates}},
                         "y": {"synthetic": {"base": 20, "total_gpus": 40, "peak_hour": 3, "noise": 0.1,
                                             "bursts_per_day": 1.0, **rates}}}}
    return World(scenario_from_dict(raw), clock="start")


def _stage_telemetry(engine, source, world: World, i1: int) -> None:
    """Write what the what-if saw (its telemetry, NaN where no row came) into staging, as the
    extract stage would: one ``sample`` row per platform-level point."""
    rows = []
    for p in PLATFORMS:
        for m in DEMAND_METRICS:
            seen = source.seen[(p, m)][:i1]
            rows += [dict(platform=p, cluster="", entity_kind="platform", entity_id="", metric=m,
                          ts=ts.to_pydatetime(), value=float(v), unit="gpu")
                     for ts, v in zip(world.index[:i1], seen) if np.isfinite(v)]
    with engine.begin() as conn:
        conn.execute(sample.insert(), rows)


def _forecast_frame(t: pd.Timestamp, base: float, hours: int = 6) -> pd.DataFrame:
    ts = pd.date_range(t, periods=hours, freq="1h")
    yhat = base + np.arange(hours, dtype=float)
    return pd.DataFrame({"ts": ts, "yhat": yhat, "yhat_lower": yhat - 3.0, "yhat_upper": yhat + 3.0})


def _both(engine, monkeypatch, policy: Policy, t: pd.Timestamp, records=None, gaps: bool = False,
          rhythm: bool = True):
    """The what-if's demand at ``t`` and the plan task's on the same telemetry (and, for
    ``predictive``, the same forecast issued at ``t`` and record of one-hour-ahead forecasts)."""
    world = _world(gaps=gaps, rhythm=rhythm)
    source = demand_source(policy, world, clean=False)
    frames = {"x": _forecast_frame(t, 33.0), "y": _forecast_frame(t, 18.0)}
    if policy.kind == "predictive":
        seen_calls = iter(PLATFORMS)  # the study forecasts the platforms in this order

        def fake_forecast(history, horizon, level, warm, tuning=None):
            return frames[next(seen_calls)].head(horizon), {"model": "fixed"}

        monkeypatch.setattr(forecast_stage, "demand_forecast", fake_forecast)
        for p in PLATFORMS:
            source.issued[p] = dict(records[p])
    world.advance(t)
    whatif = source.demand(t)
    _stage_telemetry(engine, source, world, world.clock_index)
    if policy.kind == "predictive":
        with engine.begin() as conn:
            for p in PLATFORMS:
                conn.execute(forecast_run.insert().values(platform=p, series="demand", issued_at=t.to_pydatetime(),
                                                          model="fixed", summary={"within_hour_sd": 0.0}, level=90.0))
                fc = frames[p]
                conn.execute(forecast.insert(), [
                    dict(platform=p, series="demand", issued_at=t.to_pydatetime(), step=s + 1,
                         ts=fc["ts"].iloc[s].to_pydatetime(), yhat=float(fc["yhat"].iloc[s]),
                         yhat_lower=float(fc["yhat_lower"].iloc[s]), yhat_upper=float(fc["yhat_upper"].iloc[s]))
                    for s in range(len(fc))])
                conn.execute(forecast.insert(), [
                    dict(platform=p, series="demand", issued_at=(ts - timedelta(hours=1)).to_pydatetime(), step=1,
                         ts=ts.to_pydatetime(), yhat=float(v), yhat_lower=float(v) - 1, yhat_upper=float(v) + 1)
                    for ts, v in records[p].items()])
    production, _ = service.platform_demand(engine, pipeline.Window(t - timedelta(hours=1), t), list(PLATFORMS),
                                            policy)
    return whatif, production, source


def _as_demand(row: dict) -> PlatformDemand:
    return PlatformDemand(mean=tuple(row["mean"]), upper=tuple(row["upper"]), unit=row["unit"], peak=row["peak"])


T = pd.Timestamp("2024-01-16 09:00", tz="UTC")


def test_reactive_demand_is_the_same_in_the_plan_task_and_the_what_if(sqlite_engine, monkeypatch):
    whatif, production, source = _both(sqlite_engine, monkeypatch, Policy(kind="reactive"), T)
    assert all(source.notes[p]["within_hour_sd"] > 0 for p in PLATFORMS)  # the spread inside the hour counts
    assert {p: _as_demand(production[p]) for p in PLATFORMS} == whatif


@pytest.mark.parametrize("rhythm", [True, False])
def test_predictive_demand_is_the_same_in_the_plan_task_and_the_what_if(sqlite_engine, monkeypatch, rhythm):
    # x: a record of one-hour-ahead forecasts that were exact, y: one that was far off; with a
    # daily rhythm the daily shape wins on both, without it x is planned on its forecast
    world = _world(rhythm=rhythm)
    truth = {p: pd.Series(world.demand(p, world.start, T).to_numpy(), index=world.index[world.index < T])
             .resample("1h").mean() for p in PLATFORMS}
    hours = pd.date_range(T - pd.Timedelta(hours=48), T - pd.Timedelta(hours=1), freq="1h")
    records = {"x": {ts: float(truth["x"][ts]) for ts in hours}, "y": {ts: 0.0 for ts in hours}}
    whatif, production, source = _both(sqlite_engine, monkeypatch, Policy(kind="predictive"), T, records,
                                       rhythm=rhythm)
    assert source.notes["y"]["forecast_wins"] is False
    assert source.notes["x"]["daily_wins"] is rhythm and source.notes["x"]["forecast_wins"] is True
    assert {p: _as_demand(production[p]) for p in PLATFORMS} == whatif


def test_missing_steps_change_the_hourly_means_in_their_last_bit_only(sqlite_engine, monkeypatch):
    # staging holds no row where the exporter sent nothing, the what-if a NaN step; pandas' hourly
    # mean over the one and the other can differ in the last bit, below the 6 digits mean and
    # upper are rounded to: only the (unrounded) week's peak shows it
    whatif, production, source = _both(sqlite_engine, monkeypatch, Policy(kind="reactive"), T, gaps=True)
    assert any(np.isnan(source.seen[(p, m)]).any() for p in PLATFORMS for m in DEMAND_METRICS)
    for p in PLATFORMS:
        got = _as_demand(production[p])
        assert (got.mean, got.upper, got.unit) == (whatif[p].mean, whatif[p].upper, whatif[p].unit)
        assert got.peak == pytest.approx(whatif[p].peak, rel=1e-12)


def test_plan_demand_reads_the_spread_inside_the_hour_from_the_telemetry_only():
    hourly = pd.Series([10.0] * 30, index=pd.date_range("2024-01-01", periods=30, freq="1h", tz="UTC"))
    at = hourly.index[-1] + pd.Timedelta("1h")
    frame = _forecast_frame(at, 10.0)
    calm = plan_demand(hourly, {"within_hour_sd": 0.0, "level": 10.0}, Policy(kind="reactive"), at)
    wide = plan_demand(hourly, {"within_hour_sd": 4.0, "level": 10.0}, Policy(kind="reactive"), at)
    assert calm.demand.mean == wide.demand.mean and wide.demand.upper[0] > calm.demand.upper[0]
    # without a forecast, predictive plans as reactive does; the oracle has no input here
    assert plan_demand(hourly, {"within_hour_sd": 4.0, "level": 10.0}, Policy(kind="predictive"), at) == wide
    with pytest.raises(ValueError, match="oracle"):
        plan_demand(hourly, {"within_hour_sd": 4.0, "level": 10.0}, Policy(kind="oracle"), at, forecast=frame)


def _config(limits: dict):
    return parse_config({"platforms": [{"name": "slurm", "kind": "slurm", "conn_id": "slurm_hpc", "priority": 2.0},
                                       {"name": "kubernetes", "kind": "kubernetes", "conn_id": "kubernetes_ai"}],
                         "limits": limits})


def test_the_operators_limits_reach_the_planner_under_their_own_names():
    limits = {"max_moves_per_decision": 3, "cooldown_hours": 2.5, "move_minutes": 20, "headroom_quantile": 0.9,
              "plan_horizon_hours": 3, "allow_evict": True}
    pol = service.policy_from_config(_config(limits), "reactive")
    assert {k: getattr(pol, k) for k in limits} == limits
    assert pol.priority == {"slurm": 2.0, "kubernetes": 1.0}
    assert service.policy_from_config(_config({}), "reactive").allow_evict is False


def test_with_allow_evict_the_plan_may_release_a_busy_node():
    from gpupool.decisions.planner import NodeRecord, plan

    nodes = [NodeRecord("s0", "slurm", 8, busy_gpus=2.0), NodeRecord("k0", "kubernetes", 8, busy_gpus=8.0)]
    demand = {"slurm": [0.0, 0.0], "kubernetes": [30.0, 30.0]}
    for allow, moved in ((False, []), (True, ["s0"])):
        pol = service.policy_from_config(_config({"allow_evict": allow, "cooldown_hours": 0}), "reactive")
        assert [m.node for m in plan(nodes, demand, pol).moves] == moved
