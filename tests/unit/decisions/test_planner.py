"""The MILP planner: invariants (hypothesis), solver labelling, MIG layouts, expected unmet."""

from __future__ import annotations

import random

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gpupool.decisions.plan_model as plan_model
from gpupool.decisions.planner import (
    PlatformDemand,
    NodeRecord,
    PlanningError,
    expected_unmet,
    node_capacity,
    plan,
)
from gpupool.decisions.policy import Policy

PLATFORMS = ("kubernetes", "slurm", "openstack")
AT = pd.Timestamp("2024-03-01 12:00", tz="UTC")


@st.composite
def problems(draw):
    n = draw(st.integers(1, 14))
    nodes = []
    for k in range(n):
        gpus = draw(st.sampled_from([4, 8]))
        busy = draw(st.sampled_from([0.0, 0.0, 0.0, 1.0, float(gpus), 2.5]))
        moved = draw(st.sampled_from([None, 30, 90, 600]))
        nodes.append(NodeRecord(
            name=f"n{k:02d}", owner=draw(st.sampled_from(PLATFORMS)), gpus=gpus, busy_gpus=min(busy, gpus),
            in_handover=draw(st.booleans()) and draw(st.booleans()),
            last_moved_at=None if moved is None else AT - pd.Timedelta(minutes=moved),
            mig_capable=draw(st.booleans()),
        ))
    hours = draw(st.integers(1, 3))
    demand = {}
    for p in PLATFORMS:
        mean = [draw(st.floats(0, 80, allow_nan=False)) for _ in range(hours)]
        spread = draw(st.floats(0, 20, allow_nan=False))
        demand[p] = {"mean": mean, "upper": [m + spread for m in mean]}
    bounds = {p: draw(st.integers(0, 4)) for p in PLATFORMS}
    tops = {p: bounds[p] + draw(st.integers(0, 6)) for p in PLATFORMS}
    policy = Policy(
        kind="predictive",
        min_nodes=bounds,
        max_nodes=tops,
        max_moves_per_decision=draw(st.integers(0, 4)),
        move_cost=draw(st.sampled_from([0.0, 1.0, 5.0])),
        cooldown_hours=1.0,
    )
    return nodes, demand, policy


def _counts(nodes, targets=None):
    out = {p: 0 for p in PLATFORMS}
    for n in nodes:
        out[targets[n.name] if targets else n.owner] += 1
    return out


def _outside(count, lo, hi):
    return max(0, lo - count) + max(0, count - hi)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_planner_invariants(problem):
    nodes, demand, policy = problem
    result = plan(nodes, demand, policy, at=AT)
    by_name = {n.name: n for n in nodes}
    moved = [m.node for m in result.moves]
    # move budget, one move per node, targets agree with moves
    assert len(result.moves) <= policy.max_moves_per_decision
    assert len(moved) == len(set(moved))
    assert {n for n, t in result.targets.items() if t != by_name[n].owner} == set(moved)
    leaving = {p: 0.0 for p in PLATFORMS}
    for m in result.moves:
        node = by_name[m.node]
        assert m.source == node.owner != m.target
        assert node.busy_gpus == 0, "no busy node moved"
        assert not node.in_handover, "no node in two handovers"
        assert node.last_moved_at is None or AT - node.last_moved_at >= pd.Timedelta(hours=policy.cooldown_hours), "cool-down respected"
        leaving[m.source] += node.gpus
    for p in PLATFORMS:  # never more GPUs leave a platform than it has idle
        idle = sum(n.gpus - n.busy_gpus for n in nodes if n.owner == p and not n.in_handover)
        assert leaving[p] <= idle + 1e-9
    # min/max per platform: kept when they held, never made worse when they did not
    before, after = _counts(nodes), _counts(nodes, result.targets)
    for p in PLATFORMS:
        lo, hi = policy.min_nodes[p], policy.max_nodes[p]
        assert _outside(after[p], lo, hi) <= _outside(before[p], lo, hi)
    assert result.objective_after <= result.objective_before + 1e-9
    # idempotent: same inputs, in any order, give the same plan
    again = plan(list(reversed(nodes)), dict(demand), policy, at=AT)
    assert again == result
    shuffled = nodes[:]
    random.Random(0).shuffle(shuffled)
    assert plan(shuffled, demand, policy, at=AT) == result


def test_bounds_hold_when_they_held_before():
    nodes = [NodeRecord(f"s{i}", "slurm", 8) for i in range(4)] + [NodeRecord("k0", "kubernetes", 8, busy_gpus=8)]
    demand = {"slurm": [0, 0], "kubernetes": [200, 200]}
    policy = Policy(min_nodes={"slurm": 3}, max_moves_per_decision=4)
    result = plan(nodes, demand, policy)
    assert len(result.moves) == 1  # slurm keeps its minimum of 3
    capped = plan(nodes, demand, Policy(max_nodes={"kubernetes": 3}))
    assert len(capped.moves) == 2


def _two_platforms():
    nodes = [NodeRecord(f"a{i}", "a", 8, busy_gpus=8 if i < 2 else 0) for i in range(6)]
    nodes += [NodeRecord(f"b{i}", "b", 8, busy_gpus=8) for i in range(3)]
    demand = {"a": {"mean": [16, 16], "upper": [20, 20]}, "b": {"mean": [50, 60], "upper": [60, 70]}}
    return nodes, demand


def test_milp_moves_idle_nodes_towards_demand_and_says_so():
    nodes, demand = _two_platforms()
    result = plan(nodes, demand, Policy(), at=AT)
    assert result.solver == "milp"
    assert result.status == "optimal"
    assert [m.target for m in result.moves] == ["b"] * len(result.moves) and len(result.moves) >= 3
    assert all(m.expected_gain > 0 and m.reason for m in result.moves)
    assert result.expected_unmet_after["b"] < result.expected_unmet_before["b"]
    d = result.to_dict()
    assert d["solver"] == "milp" and d["moves"][0]["node"].startswith("a")


def test_greedy_fallback_when_the_solver_fails(monkeypatch):
    nodes, demand = _two_platforms()
    best = plan(nodes, demand, Policy(), at=AT)

    def broken(*args, **kwargs):
        raise ValueError("solver exploded")

    monkeypatch.setattr(plan_model, "milp", broken)
    fallback = plan(nodes, demand, Policy(), at=AT)
    assert fallback.solver == "greedy"
    assert "MILP failed" in fallback.status and "solver exploded" in fallback.status
    assert any("MILP failed" in r for r in fallback.reasons)
    assert fallback.objective_after == pytest.approx(best.objective_after, rel=0.05)
    with pytest.raises(PlanningError, match="MILP failed"):
        plan(nodes, demand, Policy(), at=AT, solver="milp")


def test_greedy_on_request_uses_no_milp(monkeypatch):
    nodes, demand = _two_platforms()
    best = plan(nodes, demand, Policy(), at=AT)
    assert best.solver == "milp"

    def must_not_run(*args, **kwargs):
        raise AssertionError("the MILP ran although greedy was requested")

    monkeypatch.setattr(plan_model, "milp", must_not_run)
    greedy = plan(nodes, demand, Policy(), at=AT, solver="greedy")
    assert greedy.solver == "greedy" and greedy.status == "greedy (requested)"
    assert greedy.objective_after < greedy.objective_before  # it does move nodes towards demand
    assert greedy.objective_after == pytest.approx(best.objective_after, rel=0.05)


def test_static_policy_never_moves():
    nodes, demand = _two_platforms()
    result = plan(nodes, demand, Policy(kind="static"))
    assert result.moves == () and result.solver == "none"


def test_priority_weights_decide_who_gets_scarce_nodes():
    nodes = [NodeRecord(f"x{i}", "x", 8) for i in range(2)]
    nodes += [NodeRecord("a0", "a", 8, busy_gpus=8), NodeRecord("b0", "b", 8, busy_gpus=8)]
    demand = {"x": [0, 0], "a": [24, 24], "b": [24, 24]}
    favour_b = plan(nodes, demand, Policy(priority={"b": 3.0}, max_moves_per_decision=1))
    assert [m.target for m in favour_b.moves] == ["b"]
    favour_a = plan(nodes, demand, Policy(priority={"a": 3.0}, max_moves_per_decision=1))
    assert [m.target for m in favour_a.moves] == ["a"]


def test_move_cost_stops_marginal_moves():
    nodes = [NodeRecord("a0", "a", 8), NodeRecord("b0", "b", 8, busy_gpus=8)]
    demand = {"a": [0, 0], "b": [8.5, 8.5]}  # one GPU-hour of gain, less transit
    assert plan(nodes, demand, Policy(move_cost=0.0)).moves
    assert not plan(nodes, demand, Policy(move_cost=5.0)).moves


def test_an_arriving_node_counts_from_when_it_arrives():
    # b is 4 GPUs short for one hour; a node moved now arrives after 30 min and covers the second
    # half hour only (not half a node over the whole hour, which would look like no unmet at all)
    nodes = [NodeRecord("a0", "a", 8), NodeRecord("b0", "b", 8, busy_gpus=8)]
    demand = {"a": [0], "b": [12]}
    result = plan(nodes, demand, Policy(move_cost=0.0, idle_weight=0.0), at=AT)
    assert [m.node for m in result.moves] == ["a0"]
    assert result.expected_unmet_before["b"] == pytest.approx(4.0)
    assert result.expected_unmet_after["b"] == pytest.approx(2.0)
    # so a move that costs more than the 2 GPU-hours it saves is not made
    assert not plan(nodes, demand, Policy(move_cost=3.0, idle_weight=0.0), at=AT).moves
    # a node still in its handover serves from when it arrives
    moving = nodes + [NodeRecord("b1", "b", 8, in_handover=True, available_in_minutes=20)]
    held = plan(moving, demand, Policy(idle_weight=0.0), at=AT)
    assert held.expected_unmet_before["b"] == pytest.approx(4.0 * 20 / 60)


def test_mig_layout_follows_the_platform_unit():
    # kubernetes asks for 1g.10gb slices; an idle MIG-capable node there in whole-GPU mode is re-laid out
    nodes = [
        NodeRecord("k0", "kubernetes", 8, mig_capable=True, mig_layout="all-disabled"),
        NodeRecord("k1", "kubernetes", 8, busy_gpus=8, mig_capable=True, mig_layout="all-disabled"),
        NodeRecord("s0", "slurm", 8, mig_capable=True, mig_layout="all-disabled"),
        NodeRecord("s1", "slurm", 8, busy_gpus=8, mig_capable=True, mig_layout="all-disabled"),
    ]
    demand = {"kubernetes": {"mean": [100, 100], "unit": "1g.10gb"}, "slurm": [8, 8]}
    result = plan(nodes, demand, Policy(), at=AT)
    assert [(c.node, c.to_layout) for c in result.layout_changes] == [("k0", "all-1g.10gb")]
    assert all(m.node != "k1" for m in result.moves)
    # a node moving to the slice platform arrives laid out for it
    demand = {"kubernetes": {"mean": [200, 200], "unit": "1g.10gb"}, "slurm": [0, 0]}
    result = plan(nodes, demand, Policy(), at=AT)
    moved = {m.node: m for m in result.moves}
    assert moved["s0"].target == "kubernetes" and moved["s0"].mig_layout == "all-1g.10gb"


def test_node_capacity_in_units():
    mig = NodeRecord("m", "k", 8, mig_capable=True)
    plain = NodeRecord("p", "k", 4)
    assert node_capacity(mig, "gpu", "all-disabled") == 8
    assert node_capacity(mig, "1g.10gb", "all-1g.10gb") == 56
    assert node_capacity(mig, "gpu", "all-1g.10gb") == 0
    assert node_capacity(mig, "3g.40gb", "all-1g.10gb") == 0  # a small slice cannot serve a big request
    assert node_capacity(mig, "1g.10gb", "all-3g.40gb") == 16
    assert node_capacity(plain, "1g.10gb", None) == 4


def test_expected_unmet_matches_its_definition():
    rng = np.random.default_rng(0)
    draws = rng.normal(50, 10, 400_000)
    for c in (30, 50, 65):
        assert expected_unmet(c, 50, 10) == pytest.approx(np.maximum(draws - c, 0).mean(), rel=0.02)
    assert expected_unmet(40, 50, 0) == 10
    assert expected_unmet(60, 50, 0) == 0


@pytest.mark.parametrize(
    ("nodes", "demand", "match"),
    [
        ([NodeRecord("a", "x", 8), NodeRecord("a", "y", 8)], {"x": [1]}, "duplicate"),
        ([NodeRecord("a", "x", 8, busy_gpus=9)], {"x": [1]}, "busy_gpus"),
        ([NodeRecord("a", "x", 8)], {"x": {"mean": [1, 2], "upper": [1]}}, "mean has 2 hours"),
        ([NodeRecord("a", "x", 8)], {"x": [-1]}, ">= 0"),
        ([NodeRecord("a", "x", 8)], {"x": {"mean": [1], "unit": "9g.1gb"}}, "unknown unit"),
        ([NodeRecord("a", "x", 8)], {}, "at least one platform"),
    ],
)
def test_bad_inputs_are_refused(nodes, demand, match):
    with pytest.raises(PlanningError, match=match):
        plan(nodes, demand, Policy())


def test_inventory_dicts_are_accepted():
    nodes = [{"name": "a0", "platform": "a", "gpus": 8, "busy_gpus": 0, "last_moved_at": None},
             {"name": "b0", "platform": "b", "gpus": 8, "busy_gpus": 8, "in_transit": False}]
    result = plan(nodes, {"a": [0, 0], "b": [16, 16]}, Policy())
    assert [m.node for m in result.moves] == ["a0"]


def test_policy_validation():
    with pytest.raises(ValueError):
        Policy(kind="magic")
    with pytest.raises(ValueError):
        Policy(priority={"a": 0})
    with pytest.raises(ValueError):
        Policy(min_nodes={"a": -1})
    with pytest.raises(ValueError):
        Policy(cooldown_hours=-1)
    with pytest.raises(ValueError, match="extra"):  # the knobs chosen on benchmarks are not fields
        Policy(solver_time_limit_s=5)


@pytest.mark.parametrize("openstack", [(5, 22.0, 26.0), (4, 18.0, 21.0)])
def test_the_node_comes_from_the_platform_with_the_most_headroom(openstack):
    # openstack and slurm both keep enough within the horizon whichever gives the node, but slurm
    # (48 GPUs against a demand of 2) has far more left after giving than openstack
    nodes_os, mean_os, upper_os = openstack
    nodes = [NodeRecord(name=f"os{k}", owner="openstack", gpus=8) for k in range(nodes_os)]
    nodes += [NodeRecord(name=f"sl{k}", owner="slurm", gpus=8) for k in range(6)]
    nodes += [NodeRecord(name="k0", owner="kubernetes", gpus=8, busy_gpus=8)]
    demand = {
        "kubernetes": {"mean": [14.0, 14.0], "upper": [16.0, 16.0]},
        "openstack": {"mean": [mean_os] * 2, "upper": [upper_os] * 2},
        "slurm": {"mean": [2.0, 2.0], "upper": [4.0, 4.0]},
    }
    result = plan(nodes, demand, Policy(kind="reactive"), at=AT)
    assert [(m.source, m.target) for m in result.moves] == [("slurm", "kubernetes")]
    # the tie-break does not stop the move itself
    assert result.expected_unmet_after["kubernetes"] < result.expected_unmet_before["kubernetes"]


def test_source_risk_does_not_override_a_real_gain():
    # the only idle nodes are on a platform with some risk one horizon out: the short platform still gets one
    nodes = [NodeRecord(name=f"os{k}", owner="openstack", gpus=8) for k in range(4)]
    nodes += [NodeRecord(name="k0", owner="kubernetes", gpus=8, busy_gpus=8)]
    demand = {
        "kubernetes": {"mean": [14.0, 14.0], "upper": [16.0, 16.0]},
        "openstack": {"mean": [18.0, 18.0], "upper": [21.0, 21.0]},
    }
    result = plan(nodes, demand, Policy(kind="reactive"), at=AT)
    assert [(m.source, m.target) for m in result.moves] == [("openstack", "kubernetes")]


def test_a_flat_source_keeps_the_least_headroom():
    # slurm sat at 74 GPUs all week, so its own spread says it cannot rise; openstack wants four more
    # nodes on its bound. Without a floor slurm gives all four (80 GPUs left); with the default
    # floor (10 % above the mean) it keeps 88 and gives three
    nodes = [NodeRecord(name=f"sl{k:02d}", owner="slurm", gpus=8) for k in range(14)]
    nodes = [NodeRecord(name=n.name, owner=n.owner, gpus=8, busy_gpus=8.0 if k < 9 else 0.0)
             for k, n in enumerate(nodes)]
    nodes += [NodeRecord(name=f"os{k:02d}", owner="openstack", gpus=8, busy_gpus=8.0) for k in range(20)]
    demand = {
        "slurm": {"mean": [74.0, 74.0], "upper": [74.1, 74.1]},
        "openstack": {"mean": [154.0, 154.0], "upper": [190.0, 190.0]},
    }

    def left(policy):
        moved = plan(nodes, demand, policy, at=AT).moves
        assert all((m.source, m.target) == ("slurm", "openstack") for m in moved)
        return 8 * (14 - len(moved))

    assert left(Policy(kind="reactive", min_headroom=0.0)) == 80
    assert left(Policy(kind="reactive")) == 88
    assert left(Policy(kind="predictive")) == 88
    # the oracle's demand is known: no floor
    assert left(Policy(kind="oracle")) == 80


def _park_pool(openstack_nodes):
    # slurm holds 6 nodes against 40 GPUs now, but reached 70 in the last week; openstack holds
    # `openstack_nodes` idle-rich nodes against 40 GPUs (its week's peak 50)
    nodes = [NodeRecord(name=f"sl{k}", owner="slurm", gpus=8, busy_gpus=8.0 if k < 5 else 0.0) for k in range(6)]
    nodes += [NodeRecord(name=f"os{k:02d}", owner="openstack", gpus=8, busy_gpus=8.0 if k < 5 else 0.0)
              for k in range(openstack_nodes)]
    demand = {
        "slurm": PlatformDemand(mean=(40.0, 40.0), upper=(42.0, 42.0), peak=70.0),
        "openstack": PlatformDemand(mean=(40.0, 40.0), upper=(42.0, 42.0), peak=50.0),
    }
    return nodes, demand


def test_spare_nodes_are_parked_where_demand_has_been():
    # the pool can spare: openstack's 15 nodes are 70 GPUs above its week's peak; slurm holds 48
    # against a peak of 70, so three nodes park there (72 GPUs; a fourth would be above its peak)
    nodes, demand = _park_pool(15)
    moved = plan(nodes, demand, Policy(kind="reactive", peak_weight=0.25), at=AT).moves
    assert [(m.source, m.target) for m in moved] == [("openstack", "slurm")] * 3
    assert "slurm held 48 against its last week's peak of 70" in moved[0].reason
    # off, the spread alone sees no reason to move
    assert plan(nodes, demand, Policy(kind="reactive", peak_weight=0.0), at=AT).moves == ()


def test_parking_is_no_reason_to_move_when_every_platform_is_below_its_peak():
    # openstack holds 48 GPUs against its own peak of 50: a node parked on slurm would leave
    # openstack as far below its peak as it brings slurm nearer, and the move costs
    nodes, demand = _park_pool(6)
    assert plan(nodes, demand, Policy(kind="reactive", peak_weight=0.25), at=AT).moves == ()


def test_no_parking_where_the_pool_could_not_hold_every_peak():
    # slurm's week reached 130 GPUs: with openstack's 50 that is more than the pool's 168, so the
    # pool is not one that can spare, and which peak comes back first is a guess: nothing parks
    nodes, demand = _park_pool(15)
    demand["slurm"] = PlatformDemand(mean=(40.0, 40.0), upper=(42.0, 42.0), peak=130.0)
    assert plan(nodes, demand, Policy(kind="reactive", peak_weight=0.25), at=AT).moves == ()


def _short_pool(slurm_mean):
    # 6 busy slurm nodes; openstack 12 nodes, 7 idle, at 40 GPUs against a week's peak of 130:
    # with slurm's peak of 50 the peaks (180) are more than the pool's 144 GPUs
    nodes = [NodeRecord(name=f"sl{k}", owner="slurm", gpus=8, busy_gpus=8.0) for k in range(6)]
    nodes += [NodeRecord(name=f"os{k:02d}", owner="openstack", gpus=8, busy_gpus=8.0 if k < 5 else 0.0)
              for k in range(12)]
    demand = {"slurm": PlatformDemand(mean=(slurm_mean,) * 2, upper=(slurm_mean + 6.0,) * 2, peak=50.0),
              "openstack": PlatformDemand(mean=(40.0, 40.0), upper=(42.0, 42.0), peak=130.0)}
    return nodes, demand


def test_park_when_short_charges_only_the_giver():
    # slurm at 46 of its 48 GPUs gains a little from a node; by default openstack gives one
    nodes, demand = _short_pool(46.0)
    assert [(m.source, m.target) for m in plan(nodes, demand, Policy(kind="reactive"), at=AT).moves] == [
        ("openstack", "slurm")]
    # with the knob openstack, holding 96 GPUs against its week's peak of 130, pays 0.25 per GPU it
    # gives: it keeps them
    assert plan(nodes, demand, Policy(kind="reactive", park_when_short=True), at=AT).moves == ()
    # a real shortfall still moves nodes (slurm at 56 holding 48)
    nodes, demand = _short_pool(56.0)
    moved = plan(nodes, demand, Policy(kind="reactive", park_when_short=True), at=AT).moves
    assert [(m.source, m.target) for m in moved] == [("openstack", "slurm")]
    # and nobody is paid to pull toward a peak: slurm below its peak of 50 at a flat 40 gets nothing
    nodes, demand = _short_pool(40.0)
    assert plan(nodes, demand, Policy(kind="reactive", park_when_short=True), at=AT).moves == ()
