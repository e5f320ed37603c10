"""The closed-loop what-if study: the production decision chain driving the world, in process.

Every ``decision_every`` the study runs what ``gpupool_pipeline`` runs, on what it would see:

1. **telemetry** — each platform's platform-level ``gpu_allocated`` and ``gpu_pending`` of the
   hour just ended, as its exporter reports them (:meth:`World.demand_telemetry`), corrupted by
   the scenario's ``faults:`` (:mod:`gpupool.sim.faults`; the world keeps serving the true demand);
2. **detect/clean** — :func:`gpupool.detect.stage.judge_series` (the streaming judgement) with
   :func:`gpupool.detect.stage.fit_detector` at each refit anchor, the detect stage's own functions,
   on :func:`~gpupool.detect.stage.detect_lookback` of history; ``clean=False`` (``--no-clean``)
   passes the raw values on;
3. **forecast** — :func:`gpupool.canonical.demand_of_steps` (what `staging.reads.hourly_demand` runs) and :func:`gpupool.forecast.stage.demand_forecast`
   on the last :data:`~gpupool.forecast.stage.FORECAST_HISTORY` of cleaned telemetry, warm-started from
   the previous hour's model (:func:`gpupool.forecast.stage.warm_start`), as the forecast stage does;
4. **plan** — :func:`gpupool.decisions.demand.plan_demand`, the plan stage's own function, on
   the hourly demand, the spread inside the hour and demand as it stands (``demand_of_steps``),
   the forecast and its track record (``predictive``), then :func:`gpupool.decisions.planner.plan`;
5. the plan's moves are carried out in the world, each node arriving in the plan's
   ``mig_layout``, and its ``layout_changes`` in place (the node out of service for
   :data:`~gpupool.decisions.planner.LAYOUT_CHANGE_MINUTES`, what the planner charges a re-layout).

A platform with a ``slice_profile`` is planned in slices as the plan stage plans it: its demand
in the unit :meth:`Scenario.demand_units` gives (:meth:`PlatformDemand.in_unit`, what
``jobs.allocation.platform_demand`` applies), the world's telemetry of it counting slice requests.

Between the hourly plans, the fast path ticks at the scenario's ``fastpath`` cadence (absent:
the shipped DAG's), production's :func:`gpupool.decisions.fastpath.decide` on the world's
pressure readings, bound by the last plan (before the first, on its own rules, as production
with no plan yet; :mod:`gpupool.sim.fastpath`); both paths share the
move budget of any rolling hour. ``fastpath: off`` is the hourly study alone.

``static`` never moves (the chain is not run: its plan could not change anything); ``oracle``
skips steps 1-3 and plans on the true demand of the next hours (its hourly mean, and the true
spread inside each hour) — the bound no forecast can beat. At the end the world's fluid-model
numbers are the result.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from scipy.special import ndtri
from tqdm.auto import tqdm

from gpupool.detect import stage as detect_stage
from gpupool.forecast import stage as forecast_stage
from gpupool.decisions.demand import DAILY_HISTORY_HOURS, SPREAD_HISTORY_HOURS, PlatformDemand, plan_demand
from gpupool.decisions.fastpath import FastPathTuning
from gpupool.decisions.planner import LAYOUT_CHANGE_MINUTES, NodeRecord, plan
from gpupool.decisions.policy import POLICY_KINDS, Policy
from gpupool.canonical import DEMAND_METRICS, demand_of_steps, hourly_levels
from gpupool.config import default_config
from gpupool.sim.fastpath import FastPath
from gpupool.sim.ownership import OwnershipTrack, report as ownership_report
from gpupool.sim.faults import FaultSpec, corrupt, fault_plan
from gpupool.sim.power import PowerTrack, energy
from gpupool.sim.scenario import Scenario, load_scenario
from gpupool.sim.world import World

#: the forecast stage's interval level
FORECAST_LEVEL = forecast_stage.FORECAST_LEVEL
#: hours the forecast stage forecasts (``limits.horizon_hours``'s default): its models are
#: validated on this horizon, so the study forecasts as far and the plan reads the first
#: ``Policy.plan_horizon_hours`` (``limits.plan_horizon_hours``), as the plan stage does
FORECAST_HOURS = default_config().limits.horizon_hours


def resolve_policy(policy: str | Policy, scenario: Scenario) -> Policy:
    """The policy a study runs: the scenario's ``policy`` overrides, its move rules imposed.

    ``max_moves_per_decision`` and ``move_minutes`` always come from the scenario (they are facts
    of the world the plan must respect).
    """
    if isinstance(policy, str):
        if policy not in POLICY_KINDS:
            raise ValueError(f"unknown policy {policy!r}; choose one of {', '.join(POLICY_KINDS)}")
        overrides = {k: v for k, v in scenario.policy.items() if k != "kind"}
        try:
            base = Policy(kind=policy, **overrides)
        except ValueError as exc:
            raise ValueError(f"scenario {scenario.label()}: policy: {exc}") from exc
    else:
        base = policy
    update = {"max_moves_per_decision": scenario.max_moves_per_decision, "move_minutes": float(scenario.move_minutes)}
    if scenario.ownership():  # the platforms' promises are facts of the scenario too
        update["ownership"] = scenario.ownership()
    return base.model_copy(update=update)


def simulate(
    scenario: Scenario | str | Path,
    policy: str | Policy,
    progress: bool = False,
    plans: list | None = None,
    clean: bool = True,
    chain_log: list | None = None,
    fastpath_tuning: FastPathTuning | None = None,
    forecast_tuning: forecast_stage.ForecastTuning | None = None,
    fast_log: list | None = None,
    static: dict | None = None,
) -> dict:
    """Run ``policy`` against ``scenario`` and return the study's numbers.

    Returns ``{"total": {...}, "platforms": {name: {...}}, "policy": kind, "scenario": label}``,
    each block with ``demand_gpu_hours``, ``served_gpu_hours``, ``unmet_gpu_hours``,
    ``capacity_gpu_hours``, ``utilization`` (served / capacity) and ``moves`` (per platform:
    nodes received). With the fast path on (the scenario's ``fastpath``, on unless ``off``) the
    result also has ``"fastpath"`` (its cadence; ``"off"`` for ``static``, which never moves) and
    each block ``fastpath_moves`` (of ``moves``, those the fast path started); with it ``off`` the
    result is the hourly study's alone. A platform with a ``slice_profile`` counts its hours in
    slices (:meth:`World.summary`: ``unit``, ``unmet_slice_hours``, ...), and in such a study
    each block has ``relayouts`` (the plans' in-place MIG changes on the platform's nodes).
    ``plans``, when given a list, receives every :class:`Plan` made;
    ``clean=False`` skips cleaning (the raw telemetry is forecast from, and the fast path acts on
    unjudged readings); ``chain_log``, when given a list, receives one dict per decision and
    platform (what the chain saw and decided); ``fast_log``, when given a list, one dict per
    fast-path tick (``at``, ``decisions``: its moves and skips with their reasons).
    Where the scenario gives ownership keys (:mod:`gpupool.sim.ownership`), owners reclaim before
    each fast-path tick (each hourly decision with the fast path off), the plan and the fast path
    keep the limits, and each block has ``owned_gpus``, ``lent_gpu_hours``, ``borrowed_gpu_hours``,
    ``regret_gpu_hours`` (against ``static`` on the same scenario: run here unless ``static``, its
    result, is given), ``reclaims`` and ``preempted_gpu_hours``.
    ``fastpath_tuning`` and ``forecast_tuning`` are the stages' tuning objects (default: theirs,
    as production runs); a bench passes other values in.
    """
    if not isinstance(scenario, Scenario):
        scenario = load_scenario(scenario)
    policy = resolve_policy(policy, scenario)
    world = World(scenario, clock="start")
    source = demand_source(policy, world, clean=clean, forecast_tuning=forecast_tuning)
    every = pd.Timedelta(scenario.decision_every)
    fast = None
    if scenario.fastpath is not None and policy.kind != "static":  # static never moves
        fast = FastPath(policy, world, source if isinstance(source, ChainDemand) else None, scenario.fastpath,
                        judge=clean, tuning=fastpath_tuning, log=fast_log)
    tick = every if fast is None else min(every, pd.Timedelta(scenario.fastpath))
    owners = mover = None  # ownership: the reclaim runs with the fast path's readings, before its decision
    if policy.ownership and policy.kind != "static":
        owners = OwnershipTrack(world, policy.ownership)
        mover = fast or FastPath(policy, world, source if isinstance(source, ChainDemand) else None, every,
                                 judge=clean, tuning=fastpath_tuning)
        mover.own(owners)
    power = None  # parking: the rule ticks with the fast path (the plan, without it), before its decision
    if scenario.parking is not None:
        power = PowerTrack(world, scenario.parking, policy.min_nodes,
                           source if isinstance(source, ChainDemand) else None)
        if fast is not None:
            fast.power = power
    times = pd.date_range(world.start, world.end, freq=tick, inclusive="left")
    decided = 0
    units = scenario.demand_units()
    relayouts = {p: 0 for p in world.platforms}
    for t in tqdm(times, desc=f"{scenario.label()}:{policy.kind}", unit="tick", disable=not progress,
                  leave=False):
        world.advance(t)
        if (t - world.start) % every == pd.Timedelta(0):
            demand = source.demand(t)
            if owners is not None and world.clock_index > 0:  # reclaim first: before the plan (and each fast tick)
                pool_now, readings, transit = mover.observe(t)
                owners.tick(t, readings, transit, pool_now, mover)
            if demand is not None:
                demand = {p: d.in_unit(*units[p]) for p, d in demand.items()}
                if chain_log is not None:
                    chain_log.extend({"at": t, "platform": p, "mean": d.mean, "upper": d.upper,
                                      **source.notes.get(p, {})} for p, d in demand.items())
                pool = world.pool(t) if power is None else power.records(world.pool(t))
                if owners is not None:
                    pool = owners.records(pool)
                records = [NodeRecord.from_mapping(n) for n in pool]
                # both paths (and the reclaims within it) share the move budget of the rolling hour
                budget = fast or mover
                bound = policy if budget is None else policy.model_copy(
                    update={"max_moves_per_decision": min(policy.max_moves_per_decision, budget.budget_left(t))})
                result = plan(records, demand, bound, at=t)
                if plans is not None:
                    plans.append(result)
                for mv in result.moves:
                    arrive = world.move(mv.node, mv.target, layout=mv.mig_layout)
                    if power is not None:
                        power.moved(mv.node, mv.target, t, arrive)
                    if budget is not None:
                        budget.record(t, mv.node, mv.source, mv.target, "plan")
                for change in result.layout_changes:
                    world.relayout(change.node, change.to_layout, LAYOUT_CHANGE_MINUTES)
                    relayouts[change.platform] += 1
                if fast is not None:
                    decided += 1
                    fast.planned(decided, t, result, demand)
                if power is not None:
                    power.planned(t, demand)
        if power is not None:
            power.step(t, tick / pd.Timedelta("1min"))
        if fast is not None and (t - world.start) % pd.Timedelta(scenario.fastpath) == pd.Timedelta(0):
            fast.tick(t)
    world.advance(world.end)
    out = world.summary()
    result = {"total": out["total"], "platforms": out["platforms"], "policy": policy.kind,
              "scenario": scenario.label()}
    for name, block in energy(world, scenario.parking, power).items():  # in every study, parking or not
        (result["total"] if name == "total" else result["platforms"][name]).update(block)
    if world.sliced:  # a world with a slice platform: the plans' in-place MIG changes, per platform
        for p, n in relayouts.items():
            result["platforms"][p]["relayouts"] = n
        result["total"]["relayouts"] = sum(relayouts.values())
    if scenario.fastpath is not None:
        by_fast = fast.fast_moves() if fast is not None else {p: 0 for p in world.platforms}
        for p, n in by_fast.items():
            result["platforms"][p]["fastpath_moves"] = n
        result["total"]["fastpath_moves"] = sum(by_fast.values())
        result["fastpath"] = _duration(scenario.fastpath) if fast is not None else "off"  # static: never moves
    if policy.ownership:
        if static is None and policy.kind != "static":
            static = simulate(scenario, "static", clean=clean)
        track = owners or OwnershipTrack(world, policy.ownership)
        for name, block in ownership_report(world, track, result["platforms"], static).items():
            for p, values in (block.items() if name == "platforms" else [(None, block)]):
                (result["total"] if p is None else result["platforms"][p]).update(values)
    return result


def _duration(value) -> str:
    """A cadence as a scenario writes it (``5min``, ``1h``)."""
    minutes = pd.Timedelta(value) / pd.Timedelta("1min")
    return f"{minutes:g}min" if minutes < 60 or minutes % 60 else f"{minutes / 60:g}h"


class DemandSource:
    """Per-platform demand of the next hours, as the planner takes it; ``None`` when unknown."""

    def __init__(self, policy: Policy, world: World):
        self.policy = policy
        self.world = world
        self.z = float(ndtri(policy.headroom_quantile))
        self.steps_per_hour = int(round(pd.Timedelta("1h") / world.step))
        self.notes: dict[str, dict] = {}

    def demand(self, t: pd.Timestamp) -> dict[str, PlatformDemand] | None:
        raise NotImplementedError


class StaticDemand(DemandSource):
    """The static policy never moves: the planner is given no demand worth a move."""

    def demand(self, t):
        hours = self.policy.plan_horizon_hours
        return {p: PlatformDemand(mean=(0.0,) * hours, upper=(0.0,) * hours) for p in self.world.platforms}


class OracleDemand(DemandSource):
    """The true demand of the next hours (simulator only): hourly mean and true spread inside it."""

    def demand(self, t):
        end = min(t + pd.Timedelta(hours=self.policy.plan_horizon_hours), self.world.end)
        out = {}
        for p in self.world.platforms:
            steps = self.world.demand(p, t, end).to_numpy()
            k = self.steps_per_hour
            chunks = [steps[i : i + k] for i in range(0, len(steps), k)]
            mean = tuple(float(c.mean()) for c in chunks)
            upper = tuple(float(c.mean() + self.z * c.std()) for c in chunks)
            out[p] = PlatformDemand(mean=mean, upper=upper)
        return out


class ChainDemand(DemandSource):
    """The pipeline's chain on the world's telemetry: detect/clean, forecast, demand for the plan.

    Keeps, per platform and demand metric, the values seen (NaN where a row is missing) and the
    cleaned values on the world's step grid; the detector of each series is refitted when it is a
    refit anchor is reached (the detect stage's streaming rule), and each hour's forecast
    model is the warm start of the next, as in the forecast stage.
    """

    def __init__(self, policy: Policy, world: World, clean: bool = True):
        super().__init__(policy, world)
        self.clean = clean
        self.router = default_config().detect.router_config()
        n = len(world.index)
        spd = pd.Timedelta("1D") / world.step
        faults = world.scenario.faults or FaultSpec()
        self.faults = {(p, m): fault_plan(faults, p, m, n, spd) for p in world.platforms for m in DEMAND_METRICS} \
            if faults.any() else {}
        self.truth = {(p, m): np.full(n, np.nan) for p in world.platforms for m in DEMAND_METRICS}
        self.seen = {k: np.full(n, np.nan) for k in self.truth}
        self.cleaned = {k: np.full(n, np.nan) for k in self.truth}
        self.models: dict[tuple[str, str], dict] = {}
        self.summaries: dict[str, tuple[pd.Timestamp, dict | None]] = {}
        self.read_until = 0  # steps before it are in `seen`
        self.clean_until = 0  # steps before it are in `cleaned`

    # --- 1. telemetry
    def read(self, i1: int) -> None:
        """The telemetry of the steps before ``i1`` as seen (faults applied), into ``seen``: the
        hourly chain reads it each hour, the fast path at each tick (the same values)."""
        i0 = self.read_until
        if i1 <= i0:
            return
        for p in self.world.platforms:
            _, reported, kept = self.world.demand_telemetry(p, i0, i1)
            for m in DEMAND_METRICS:
                key = (p, m)
                self.truth[key][i0:i1] = reported[m]
                values, rows = reported[m], kept
                if key in self.faults:
                    values, extra = corrupt(self.truth[key], self.faults[key], i0, i1)
                    rows = rows & extra
                self.seen[key][i0:i1] = np.where(rows, values, np.nan)
        self.read_until = i1

    def _observe(self, i1: int) -> None:
        self.read(i1)
        i0 = self.clean_until
        if i1 <= i0:
            return
        self._clean(i0, i1)
        self.clean_until = i1

    def model_for(self, key: tuple[str, str]):
        """``model_for(anchor, history)`` of series ``key``: the detect stage's model of each refit
        anchor, fitted once and kept in memory (the pipeline's ``series_profile``)."""
        cache = self.models.setdefault(key, {})

        def model_for(anchor, history, cache=cache, metric=key[1]):
            if anchor not in cache:
                cache[anchor] = detect_stage.fit_detector(history, self.router, metric)
            return cache[anchor]

        return model_for

    # --- 2. detect/clean, the detect stage's functions
    def _clean(self, i0: int, i1: int) -> None:
        index = self.world.index
        start, end = index[i0], (index[i1] if i1 < len(index) else self.world.end)
        h0 = max(0, i0 - int(detect_stage.detect_lookback(self.router) / self.world.step))
        for key, seen in self.seen.items():
            if not self.clean:
                self.cleaned[key][i0:i1] = seen[i0:i1]
                continue
            series = pd.Series(seen[h0:i1], index=index[h0:i1])
            scored = detect_stage.judge_series(series, self.router, key[1], start, end, self.model_for(key))
            self.cleaned[key][i0:i1] = scored["clean_value"].reindex(index[i0:i1]).to_numpy(float)

    # --- 3. what the forecast stage reads: hourly demand from cleaned telemetry
    def _wide(self, p: str, i1: int, span: pd.Timedelta) -> pd.DataFrame:
        i0 = max(0, i1 - int(span / self.world.step))
        return pd.DataFrame({m: self.cleaned[(p, m)][i0:i1] for m in DEMAND_METRICS}, index=self.world.index[i0:i1])

    def _history(self, p: str, i1: int, span: pd.Timedelta) -> tuple[pd.Series, dict]:
        return demand_of_steps(self._wide(p, i1, span))

    def demand(self, t):
        i1 = self.world.clock_index
        self._observe(i1)
        if i1 == 0:
            return None
        return self._demand(t, i1)

    def _demand(self, t, i1):
        raise NotImplementedError


class ReactiveDemand(ChainDemand):
    """The plan stage's ``reactive`` input: the last hour's (cleaned) demand, with its spread."""

    def _demand(self, t, i1):
        out = {}
        for p in self.world.platforms:
            hourly, info = self._history(p, i1, pd.Timedelta(hours=SPREAD_HISTORY_HOURS + 1))
            out[p] = plan_demand(hourly, info, self.policy, t).demand
            self.notes[p] = {"within_hour_sd": info["within_hour_sd"]}
        return out


class PredictiveDemand(ChainDemand):
    """The plan stage's ``predictive`` input: the forecast stage's model on cleaned telemetry,
    weighed on its own track record (the one-hour-ahead forecasts it issued) against what the
    reactive plan would have planned on (demand as it stood at each hour's start); where the
    platform's daily shape has the better record (``demand.daily_record``), demand as it stands
    moved along that shape: :func:`~gpupool.decisions.demand.plan_demand` decides, as in the plan stage."""

    def __init__(self, policy: Policy, world: World, clean: bool = True,
                 forecast_tuning: forecast_stage.ForecastTuning | None = None):
        super().__init__(policy, world, clean=clean)
        self.issued: dict[str, dict[pd.Timestamp, float]] = {}
        self.forecast_tuning = forecast_tuning or forecast_stage.ForecastTuning()

    def _demand(self, t, i1):
        out = {}
        for p in self.world.platforms:
            history, info = self._history(p, i1, forecast_stage.FORECAST_HISTORY)
            history = history[history.index < t]
            if history.notna().sum() == 0:
                return None
            issued, summary = self.summaries.get(p, (None, None))
            warm = forecast_stage.warm_start(summary) if issued is not None and issued >= t - pd.Timedelta("1D") else None
            fc, summary = forecast_stage.demand_forecast(history, max(FORECAST_HOURS, self.policy.plan_horizon_hours),
                                                         FORECAST_LEVEL, warm, tuning=self.forecast_tuning)
            self.summaries[p] = (t, summary)
            past = self.issued.setdefault(p, {})
            levels = hourly_levels(self._wide(p, i1, pd.Timedelta(hours=DAILY_HISTORY_HOURS)))
            choice = plan_demand(history, info, self.policy, t, forecast=fc, level=FORECAST_LEVEL,
                                 issued=pd.Series(past, dtype=float), levels=levels)
            past[pd.Timestamp(fc["ts"].iloc[0])] = float(fc["yhat"].iloc[0])
            out[p] = choice.demand
            skill, daily = choice.skill, choice.daily
            self.notes[p] = {"within_hour_sd": info["within_hour_sd"], "model": summary.get("model"),
                             "fallback": summary.get("fallback"), "forecast_wins": skill.forecast_wins,
                             "rmse_forecast": skill.rmse_forecast, "rmse_naive": skill.rmse_naive,
                             "daily_wins": daily.wins}
        return out


def demand_source(policy: Policy, world: World, clean: bool = True,
                  forecast_tuning: forecast_stage.ForecastTuning | None = None) -> DemandSource:
    """The demand source of ``policy.kind`` reading ``world`` (``predictive``'s forecasts with
    ``forecast_tuning``, default the forecast stage's)."""
    if policy.kind == "predictive":
        return PredictiveDemand(policy, world, clean=clean, forecast_tuning=forecast_tuning)
    if policy.kind == "reactive":
        return ReactiveDemand(policy, world, clean=clean)
    return {"static": StaticDemand, "oracle": OracleDemand}[policy.kind](policy, world)
