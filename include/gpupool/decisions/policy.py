"""The allocation policy: the knobs of the planner, sorted by who sets them.

One :class:`Policy` object serves all four policy kinds; ``kind`` only says where the demand
numbers handed to the planner come from (:func:`gpupool.decisions.demand.plan_demand`):

* ``static`` — never move a node (the baseline: every platform keeps what it has);
* ``reactive`` — demand as it stands (the last 15 minutes' mean), with the spread of the
  series' own hour-ahead changes (``demand_spread``) and of demand inside an hour;
* ``predictive`` — the ARIMA forecast's change, planned from demand as it stands, with its
  interval; the reactive input where the forecast's own record, planned the same way, is worse
  than reacting's (demand as it stood at each hour);
* ``oracle`` — the true future (simulator only).

A :class:`Policy` is the operator's limits (:class:`gpupool.config.PlanLimits`, the very model
``limits`` of ``platforms.yaml`` is), the platforms' bounds (``platforms[]``: ``min_nodes``,
``max_nodes``, ``priority``; :func:`gpupool.jobs.allocation.policy_from_config`) and the plan's
tuning (:class:`PlanTuning`: costs and rules chosen on benchmarks, not in ``platforms.yaml``,
which ``bench/allocate_tune.py`` and the what-if pass in). A what-if scenario may override any
field in its ``policy:`` section. The comment beside each default names the bench that chose it.

This module imports only pydantic and the configuration's models: the DAG files read
:data:`PLANNED_KINDS` from it.
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gpupool.config import Ownership, PlanLimits

PolicyKind = Literal["static", "reactive", "predictive", "oracle"]
#: every policy kind, the what-if's choice (``gpupool simulate --policy``, the report's table)
POLICY_KINDS: tuple[str, ...] = get_args(PolicyKind)
#: the kinds the pipeline can plan with (``gpupool plan``/``run``, the DAG's Param): the oracle
#: needs the true future, which only the what-if has
PLANNED_KINDS: tuple[str, ...] = tuple(k for k in POLICY_KINDS if k != "oracle")


class PlanTuning(BaseModel):
    """The plan's costs and rules chosen on benchmarks, one object: not in platforms.yaml; a
    :class:`Policy` carries them, and the what-if and ``bench/allocate_tune.py`` pass other values
    in through its fields (a scenario's ``policy:`` section). Costs are in GPU-hours."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # "chosen" from the empirical rule: see decisions.demand.SPREAD_BASE
    demand_spread: Literal["chosen", "empirical", "random_walk", "wider"] = Field(
        "chosen", description="how the last hour's error grows ahead: the series' own hour-ahead changes "
        "near its current level (empirical), a random walk on the last week's changes, the wider of the two, "
        "or (chosen) whichever of these the series' own recent hours favour, the empirical rule unless clearly beaten")
    # chosen with bench/allocate_tune.py --move-costs (tuning groupings)
    move_cost: float = Field(0.5, ge=0, description="GPU-hours charged per node move (churn, risk)")
    idle_weight: float = Field(0.05, ge=0, description="weight of a held but idle GPU-hour")
    # chosen with bench/allocate_tune.py --source-risks (tuning groupings, reactive and predictive)
    source_risk: float = Field(
        0.3, ge=0, description="weight of the expected unmet a platform gives up one horizon further out by "
        "releasing nodes: breaks ties between sources toward the one with the most headroom left")
    # the greedy baseline's own margin, kept after a sweep over the six-day regimes of
    # bench/allocate_helios.py held apart in time from its tables. Without it a platform that sat
    # flat for a week (empirical spread near 0) gave all its idle nodes and was short the next day.
    # On only where the pool could give every platform that much above its mean at once
    # (decisions.planner.plan): in a short pool a floor under one spread only reorders who goes short
    min_headroom: float = Field(
        0.1, ge=0, description="the least headroom reactive and predictive plan above demand's mean, as a share "
        "of it: demand that sat flat for a week can still rise, and a spread read from that week says it cannot")
    # chosen with min_headroom on the same regimes. On only where the pool could hold every
    # platform's peak at once: where it cannot, which peak returns first is a guess; where it can
    # spare, a platform that gave its nodes away in a quiet week gets some back before its demand returns
    peak_weight: float = Field(
        0.25, ge=0, description="reactive and predictive: weight per GPU a platform holds below its last week's "
        "peak hourly demand; parks nodes the pool can spare where demand has been (0 = off)")
    # off by default: level on the Helios regimes of bench/allocate_helios.py with fewer moves,
    # worse on the synthetic world (config/scenarios/synthetic-3platforms.yaml), which has a daily
    # rhythm; for pools whose demand bursts rather than cycles
    park_when_short: bool = Field(
        False, description="reactive and predictive, where the pool could not hold every platform's last week's "
        "peak at once (so peak_weight's parking is off): still charge a platform peak_weight per GPU it gives "
        "below that peak, without paying anyone to pull nodes toward theirs")


class Policy(PlanLimits, PlanTuning):
    """Constraints and costs of the allocation planner: the operator's limits
    (:class:`~gpupool.config.PlanLimits`), the platforms' bounds and the plan's tuning
    (:class:`PlanTuning`).

    Costs are in GPU-hours, the unit of the objective: one GPU-hour of expected unmet demand
    on a platform of priority 1 costs 1.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    # ---- set by the operator (platforms[] of platforms.yaml, same names; the limits: PlanLimits)
    kind: PolicyKind = "predictive"
    min_nodes: dict[str, int] = Field(default_factory=dict, description="platform -> fewest nodes it keeps")
    max_nodes: dict[str, int] = Field(default_factory=dict, description="platform -> most nodes it may hold")
    priority: dict[str, float] = Field(default_factory=dict, description="platform -> weight of its unmet demand")
    ownership: dict[str, Ownership] = Field(default_factory=dict, description=(
        "platform -> its ownership promises (platforms[]' owns, lend_limit, borrow_limit, reclaim_minutes, "
        "min_runtime_minutes): the plan never lends its owned nodes beyond lend_limit nor lets it borrow beyond "
        "borrow_limit (the nodes' `home`)"))

    @field_validator("min_nodes", "max_nodes")
    @classmethod
    def _non_negative(cls, value: dict[str, int]) -> dict[str, int]:
        bad = {k: v for k, v in value.items() if v < 0}
        if bad:
            raise ValueError(f"node counts must be >= 0, got {bad}")
        return value

    @field_validator("priority")
    @classmethod
    def _positive(cls, value: dict[str, float]) -> dict[str, float]:
        bad = {k: v for k, v in value.items() if not v > 0}
        if bad:
            raise ValueError(f"priority weights must be > 0, got {bad}")
        return value

    def weight(self, platform: str) -> float:
        """The priority weight of ``platform`` (1 when not set)."""
        return float(self.priority.get(platform, 1.0))

    def limit(self, platform: str, which: str) -> int | None:
        """``platform``'s ``lend_limit`` or ``borrow_limit`` (``which``), None when it sets none."""
        own = self.ownership.get(platform)
        return None if own is None else getattr(own, which)
