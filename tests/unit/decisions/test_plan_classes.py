"""The plan's node classes: nodes alike share one option set, and the plan is the one built node
by node (with owners, lend and borrow limits, MIG layouts, cool-downs and handovers in flight)."""

from __future__ import annotations

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpupool.config import Ownership
from gpupool.decisions.plan_model import PlanModel
from gpupool.decisions.planner import NodeRecord, PlanningError, plan
from gpupool.decisions.policy import Policy

PLATFORMS = ("kubernetes", "slurm", "openstack")
AT = pd.Timestamp("2026-06-03 12:00", tz="UTC")
LAYOUTS = (None, "all-1g.10gb", "all-3g.40gb", "all-7g.80gb")


@st.composite
def problems(draw):
    nodes = []
    for k in range(draw(st.integers(1, 16))):
        gpus = draw(st.sampled_from([4, 8]))
        mig = draw(st.booleans())
        moved = draw(st.sampled_from([None, 30, 600]))
        nodes.append(NodeRecord(
            name=f"n{k:02d}", owner=draw(st.sampled_from(PLATFORMS)), gpus=gpus,
            busy_gpus=draw(st.sampled_from([0.0, 0.0, 1.0, float(gpus)])),
            in_handover=draw(st.integers(0, 5)) == 0,
            last_moved_at=None if moved is None else AT - pd.Timedelta(minutes=moved),
            mig_capable=mig, mig_layout=draw(st.sampled_from(LAYOUTS)) if mig else None,
            available_in_minutes=draw(st.sampled_from([None, 5.0, 45.0])),
            home=draw(st.sampled_from((None,) + PLATFORMS)),
        ))
    hours = draw(st.integers(1, 3))
    demand = {}
    for p in PLATFORMS:
        mean = [draw(st.floats(0, 120, allow_nan=False)) for _ in range(hours)]
        spread = draw(st.floats(0, 20, allow_nan=False))
        demand[p] = {"mean": mean, "upper": [m + spread for m in mean],
                     "unit": draw(st.sampled_from(["gpu", "gpu", "1g.10gb", "3g.40gb"]))}
    limit = st.one_of(st.none(), st.integers(0, 3))
    ownership = {p: Ownership(lend_limit=draw(limit), borrow_limit=draw(limit)) for p in PLATFORMS}
    policy = Policy(kind="predictive", max_moves_per_decision=draw(st.integers(0, 5)),
                    move_cost=draw(st.sampled_from([0.0, 1.0])), allow_evict=draw(st.booleans()),
                    ownership=ownership if draw(st.booleans()) else {})
    return nodes, demand, policy


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(), st.sampled_from(["milp", "greedy"]))
def test_shared_option_sets_plan_as_options_built_node_by_node(problem, solver):
    nodes, demand, policy = problem
    shared = plan(nodes, demand, policy, at=AT, solver=solver)
    key = PlanModel._option_key
    with pytest.MonkeyPatch.context() as m:  # every node its own key: its options built for it alone
        m.setattr(PlanModel, "_option_key", staticmethod(lambda r, idle, can_move: (r.name,) + key(r, idle, can_move)))
        alone = plan(nodes, demand, policy, at=AT, solver=solver)
    assert shared == alone


def test_nodes_alike_share_one_class_per_holder_and_owner():
    # 3,000 nodes: idle or busy, of three holders and three owners: the model has a class per
    # (holder, owner, may move), not a variable per node
    nodes = [NodeRecord(f"n{k:04d}", PLATFORMS[k % 3], 8, busy_gpus=8.0 if k % 4 else 0.0,
                        home=PLATFORMS[(k // 3) % 3]) for k in range(3000)]
    demand = {p: [800.0] for p in PLATFORMS}
    limits = Policy(ownership={"slurm": Ownership(lend_limit=2)})
    model = PlanModel(nodes, list(PLATFORMS), {p: _demand(v) for p, v in demand.items()}, limits, 1, AT)
    assert len(model.classes) == 3 * 3 * 2
    assert sum(len(c.members) for c in model.classes) == 3000
    free = PlanModel(nodes, list(PLATFORMS), {p: _demand(v) for p, v in demand.items()}, Policy(), 1, AT)
    assert len(free.classes) == 3 * 2  # no limit: owners are not told apart


def test_duplicate_names_in_a_large_pool_are_named():
    nodes = [NodeRecord(f"n{k:05d}", "slurm", 8) for k in range(20_000)] + [NodeRecord("n00007", "openstack", 8)]
    with pytest.raises(PlanningError, match=r"duplicate names \['n00007'\]"):
        plan(nodes, {"slurm": [1.0]}, Policy())


def _demand(mean):
    from gpupool.decisions.demand import PlatformDemand

    return PlatformDemand.coerce("x", mean)
