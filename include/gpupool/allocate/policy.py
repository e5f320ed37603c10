"""The allocation policy: the knobs an operator sets for the planner.

One :class:`Policy` object serves all four policy kinds; ``kind`` only says where the demand
numbers handed to the planner come from:

* ``static`` — never move a node (the baseline: every platform keeps what it has);
* ``reactive`` — demand as it stands (the last 15 minutes' mean), with the spread of the
  series' own hour-ahead changes (``demand_spread``) and of demand inside an hour;
* ``predictive`` — the ARIMA forecast's change, planned from demand as it stands, with its
  interval; the reactive input where the forecast's own record, planned the same way, is worse
  than reacting's (demand as it stood at each hour);
* ``oracle`` — the true future (simulator only).
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, field_validator

PolicyKind = Literal["static", "reactive", "predictive", "oracle"]
POLICY_KINDS: tuple[str, ...] = ("static", "reactive", "predictive", "oracle")

#: hours of demand the plan looks ahead, in the pipeline (``limits.plan_horizon_hours``) and in
#: ``gpupool simulate`` alike; chosen on G1, G2 (bench/allocate_tune.py, reactive, 10 days, 100 %
#: and 115 % pools, unmet GPU-h summed over the 4 runs): 1 h 1,148, 2 h 948, 4 h 972. The
#: forecast stage forecasts further (``limits.horizon_hours``); the plan reads the first hours.
PLAN_HORIZON_HOURS = 2


class Policy(BaseModel):
    """Constraints and costs of the allocation planner.

    Costs are in GPU-hours, the unit of the objective: one GPU-hour of expected unmet demand
    on a platform of priority 1 costs 1.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: PolicyKind = "predictive"
    min_nodes: dict[str, int] = Field(default_factory=dict, description="platform -> fewest nodes it keeps")
    max_nodes: dict[str, int] = Field(default_factory=dict, description="platform -> most nodes it may hold")
    # 0.95 chosen on G1, G2 (bench/allocate_tune.py --quantiles 0.8,0.9,0.95,0.98 --spreads
    # empirical,random_walk, 10 days, 100 % and 115 % pools, reactive; unmet GPU-h summed over the
    # 4 runs): empirical 1,094 / 1,029 / 990 / 990 (more moves) on the last hour's mean; on demand
    # as it stands (the last 15 minutes) empirical at 0.95 892 (170 moves), 0.98 890 (172),
    # random walk 909 (183), against 948 (154) before either change
    headroom_quantile: float = Field(
        0.95, gt=0.5, lt=1.0, description="the quantile the demand's `upper` numbers stand for"
    )
    # "chosen" from the empirical rule: see allocate.planner.SPREAD_BASE for the tuning figures
    demand_spread: Literal["chosen", "empirical", "random_walk", "wider"] = Field(
        "chosen", description="how the last hour's error grows ahead: the series' own hour-ahead changes "
        "near its current level (empirical), a random walk on the last week's changes, the wider of the two, "
        "or (chosen) whichever of these the series' own recent hours favour, the empirical rule unless clearly beaten")
    priority: dict[str, float] = Field(default_factory=dict, description="platform -> weight of its unmet demand")
    max_moves_per_decision: int = Field(4, ge=0)
    # cooldown and move_cost: chosen on the tuning groupings G1, G2 of bench/allocate_helios.py
    # (bench/allocate_tune.py: 100 % and 115 % pools, 5 days; move_cost 0.5 left 22.6 GPU-h
    # unmet against 30.3 at 1.0 and 36.2 at 2.0; cool-downs of 0, 1 and 2 h were level, 1 h kept)
    cooldown: dt.timedelta = Field(dt.timedelta(hours=1), description="a moved node stays put this long")
    move_cost: float = Field(0.5, ge=0, description="GPU-hours charged per node move (churn, risk)")
    idle_weight: float = Field(0.05, ge=0, description="weight of a held but idle GPU-hour")
    move_minutes: float = Field(30.0, ge=0, description="a moving node serves nobody for this long")
    layout_change_minutes: float = Field(10.0, ge=0, description="a MIG re-layout makes a node unavailable this long")
    layout_change_cost: float = Field(0.5, ge=0, description="GPU-hours charged per MIG layout change")
    allow_evict: bool = Field(False, description="whether a node with running work may be released")
    # 0.3 chosen on G1, G2 (bench/allocate_tune.py --days 6 --cooldowns 1h --move-costs 0.5 --spreads chosen
    # --source-risks 0,0.03,0.1,0.3,1; mean unmet GPU-h over the 100 % and 115 % pools, reactive /
    # predictive): 0 33.3 / 33.0, 0.03 and 0.1 32.6 / 32.3, 0.3 31.4 / 31.1, 1 37.7 / 37.4
    source_risk: float = Field(
        0.3, ge=0, description="weight of the expected unmet a platform gives up one horizon further out by "
        "releasing nodes: breaks ties between sources toward the one with the most headroom left")
    horizon_hours: int = Field(PLAN_HORIZON_HOURS, ge=1, description="hours of demand the planner looks ahead")
    solver_time_limit_s: float = Field(10.0, gt=0)

    @field_validator("cooldown", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        if isinstance(value, str):
            return pd.Timedelta(value).to_pytimedelta()
        return value

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
