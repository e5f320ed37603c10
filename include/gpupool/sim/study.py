"""The closed-loop what-if study: the allocator driving the world, in process.

Every ``decision_every`` the study reads the pool's state from the :class:`~gpupool.sim.world.World`,
asks a demand source for each platform's next hours, calls
:func:`gpupool.allocate.planner.plan` — exactly the planner production uses — and carries out
the plan's moves in the world. At the end the world's fluid-model numbers are the result.

Demand sources by policy kind:

* ``static`` — the planner is called and never moves (``Policy.kind == "static"``);
* ``reactive`` — the last hour's mean demand, as certain, for every hour ahead;
* ``predictive`` — one :class:`gpupool.forecast.arima.ArimaForecaster` per platform on hourly
  mean demand, refit daily on the last four weeks and updated (filtered, no re-estimation)
  every hour; its mean and its ``headroom_quantile`` upper bound, widened by the spread of
  demand inside an hour seen over the last day (the planner serves steps, not hourly means).
  Until a day of history exists it answers like ``reactive``;
* ``oracle`` — the true demand of the next ``horizon_hours``: hourly mean and, as upper bound,
  mean + z_q x the true spread inside each hour.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from scipy.special import ndtri
from tqdm.auto import tqdm

from gpupool.allocate.planner import NodeRecord, PlatformDemand, plan
from gpupool.allocate.policy import POLICY_KINDS, Policy
from gpupool.forecast.arima import ArimaForecaster
from gpupool.sim.scenario import Scenario, load_scenario
from gpupool.sim.world import World

#: how much history the daily refit of the predictive policy uses
REFIT_WINDOW = pd.Timedelta(days=28)
#: how much history the daily refit uses when the forecaster sees every step
STEP_WINDOW = pd.Timedelta(days=3)
#: history the predictive policy needs before it trusts its forecaster
MIN_HISTORY = pd.Timedelta(days=1)


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
    return base.model_copy(update={
        "max_moves_per_decision": scenario.max_moves_per_decision,
        "move_minutes": float(scenario.move_minutes),
    })


def simulate(
    scenario: Scenario | str | Path,
    policy: str | Policy,
    progress: bool = False,
    plans: list | None = None,
) -> dict:
    """Run ``policy`` against ``scenario`` and return the study's numbers.

    Returns ``{"total": {...}, "platforms": {name: {...}}, "policy": kind, "scenario": label}``,
    each block with ``demand_gpu_hours``, ``served_gpu_hours``, ``unmet_gpu_hours``,
    ``capacity_gpu_hours``, ``utilization`` (served / capacity) and ``moves`` (per platform:
    nodes received). ``plans``, when given a list, receives every :class:`Plan` made.
    """
    if not isinstance(scenario, Scenario):
        scenario = load_scenario(scenario)
    policy = resolve_policy(policy, scenario)
    world = World(scenario, clock="start")
    source = demand_source(policy, world)
    every = pd.Timedelta(scenario.decision_every)
    times = pd.date_range(world.start, world.end, freq=every, inclusive="left")
    for t in tqdm(times, desc=f"{scenario.label()}:{policy.kind}", unit="decision", disable=not progress,
                  leave=False):
        world.advance(t)
        demand = source.demand(t)
        if demand is None:
            continue
        records = [NodeRecord.from_mapping(n) for n in world.pool(t)]
        result = plan(records, demand, policy, at=t)
        if plans is not None:
            plans.append(result)
        for mv in result.moves:
            world.move(mv.node, mv.target)
    world.advance(world.end)
    out = world.summary()
    return {"total": out["total"], "platforms": out["platforms"], "policy": policy.kind,
            "scenario": scenario.label()}


class DemandSource:
    """Per-platform demand of the next hours, as the planner takes it; ``None`` when unknown."""

    def __init__(self, policy: Policy, world: World):
        self.policy = policy
        self.world = world
        self.z = float(ndtri(policy.headroom_quantile))
        self.steps_per_hour = int(round(pd.Timedelta("1h") / world.step))

    def demand(self, t: pd.Timestamp) -> dict[str, PlatformDemand] | None:
        raise NotImplementedError

    def _last_hour(self, t: pd.Timestamp) -> dict[str, PlatformDemand] | None:
        if t - pd.Timedelta("1h") < self.world.start:
            return None
        hours = self.policy.horizon_hours
        out = {}
        for p in self.world.platforms:
            level = float(self.world.demand(p, t - pd.Timedelta("1h"), t).mean())
            out[p] = PlatformDemand(mean=(level,) * hours, upper=(level,) * hours)
        return out


class StaticDemand(DemandSource):
    """The static policy plans on the last hour's demand (and never moves)."""

    def demand(self, t):
        hours = self.policy.horizon_hours
        return {p: PlatformDemand(mean=(0.0,) * hours, upper=(0.0,) * hours) for p in self.world.platforms}


class ReactiveDemand(DemandSource):
    """Last hour's mean demand, taken as certain for every hour ahead."""

    def demand(self, t):
        return self._last_hour(t)


class OracleDemand(DemandSource):
    """The true demand of the next hours (simulator only)."""

    def demand(self, t):
        end = min(t + pd.Timedelta(hours=self.policy.horizon_hours), self.world.end)
        out = {}
        for p in self.world.platforms:
            steps = self.world.demand(p, t, end).to_numpy()
            k = self.steps_per_hour
            chunks = [steps[i : i + k] for i in range(0, len(steps), k)]
            mean = tuple(float(c.mean()) for c in chunks)
            upper = tuple(float(c.mean() + self.z * c.std()) for c in chunks)
            out[p] = PlatformDemand(mean=mean, upper=upper)
        return out


class PredictiveDemand(DemandSource):
    """ARIMA per platform: refit daily, updated (filtered) every hour.

    ``resolution="step"`` fits the demand at the world's step over the last ``window`` (default 3
    days): the forecast starts from the latest sample, and each planning hour gets the mean of its
    steps' forecasts with the root-mean-square of their standard errors. ``resolution="hour"`` fits
    hourly mean demand over the last 28 days with a daily season hint, and adds the spread of
    demand inside an hour (seen over the last day) to the forecast's error.
    """

    def __init__(self, policy: Policy, world: World, resolution: str = "step", window: pd.Timedelta | None = None):
        super().__init__(policy, world)
        if resolution not in ("step", "hour"):
            raise ValueError("resolution must be 'step' or 'hour'")
        self.resolution = resolution
        self.window = window if window is not None else (STEP_WINDOW if resolution == "step" else REFIT_WINDOW)
        self.level = 100.0 * (2.0 * policy.headroom_quantile - 1.0)
        self.models: dict[str, ArimaForecaster] = {}
        self.fitted_day: pd.Timestamp | None = None
        self.seen_until: pd.Timestamp | None = None

    def demand(self, t):
        if t - self.world.start < MIN_HISTORY:
            return self._last_hour(t)
        hours = self.policy.horizon_hours
        out = {}
        for p, (mean, sigma) in self.forecast(t, hours).items():
            if self.resolution == "hour":
                sigma = np.sqrt(sigma**2 + self._within_hour_sd(p, t) ** 2)
            out[p] = PlatformDemand(mean=tuple(mean), upper=tuple(mean + self.z * sigma))
        return out

    def forecast(self, t: pd.Timestamp, hours: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Per platform, the mean demand of each of the next ``hours`` and its standard error."""
        day = t.floor("1D")
        if self.fitted_day != day or not self.models:
            self._refit(t)
            self.fitted_day = day
        elif self.seen_until < t:
            for p, model in self.models.items():
                model.update(self._series(p, self.seen_until, t))
        self.seen_until = t
        per_hour = self.steps_per_hour if self.resolution == "step" else 1
        out = {}
        for p, model in self.models.items():
            fc = model.predict(hours * per_hour, level=self.level)
            mean = np.clip(fc["yhat"].to_numpy(float), 0.0, None)
            sd = np.clip(fc["yhat_upper"].to_numpy(float) - fc["yhat"].to_numpy(float), 0.0, None) / self.z
            mean = mean.reshape(hours, per_hour).mean(axis=1)
            sd = np.sqrt((sd.reshape(hours, per_hour) ** 2).mean(axis=1))
            out[p] = (mean, sd)
        return out

    def _series(self, p: str, start: pd.Timestamp, end: pd.Timestamp) -> pd.Series:
        if self.resolution == "step":
            return self.world.demand(p, start, end)
        return self.world.hourly_demand(p, start, end)

    def _refit(self, t: pd.Timestamp) -> None:
        since = max(self.world.start, t - self.window)
        season = None if self.resolution == "step" else 24
        for p in self.world.platforms:
            y = self._series(p, since, t)
            self.models[p] = ArimaForecaster(level=self.level, season=season, criterion="aic", lower_bound=0.0).fit(y)

    def _within_hour_sd(self, p: str, t: pd.Timestamp) -> float:
        steps = self.world.demand(p, max(self.world.start, t - pd.Timedelta("1D")), t)
        if len(steps) < 2 * self.steps_per_hour:
            return 0.0
        hourly = steps.groupby(steps.index.floor("1h")).transform("mean")
        return float((steps - hourly).std())


def demand_source(policy: Policy, world: World) -> DemandSource:
    """The demand source of ``policy.kind`` reading ``world``."""
    return {"static": StaticDemand, "reactive": ReactiveDemand, "predictive": PredictiveDemand,
            "oracle": OracleDemand}[policy.kind](policy, world)
