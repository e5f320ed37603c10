"""Ownership in the pure decisions: the plan's and the fast path's lending and borrowing limits,
the fair order of borrowers, and the reclaim (first, its minimum runtime, its deadline and the
move budget)."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from gpupool.config import Ownership
from gpupool.decisions.fastpath import FastMove, Judged, PlanBounds, Settings, decide
from gpupool.decisions.ownership import (HeldNode, covered, first_sight_homes, lent_and_borrowed, may_move, need_since,
                                         reclaim)
from gpupool.decisions.demand import PlatformDemand
from gpupool.decisions.plan_model import PlanModel
from gpupool.decisions.planner import NodeRecord, plan
from gpupool.decisions.policy import Policy
from gpupool.sources.base import Pressure

AT = datetime(2026, 6, 3, 12, 5, tzinfo=timezone.utc)


# ------------------------------------------------------------------ the plan


def _pool():
    # a: 4 idle nodes it owns, no demand; b: 2 busy nodes of its own and 48 GPUs of demand
    return ([NodeRecord(f"a{i}", "a", 8, home="a") for i in range(4)]
            + [NodeRecord(f"b{i}", "b", 8, busy_gpus=8, home="b") for i in range(2)])


DEMAND = {"a": [0.0, 0.0], "b": [48.0, 48.0]}


@pytest.mark.parametrize("solver", ["milp", "greedy"])
def test_the_plan_never_lends_nor_borrows_past_a_limit(solver):
    free = plan(_pool(), DEMAND, Policy(kind="reactive"), solver=solver)
    assert len(free.moves) == 4
    cases = [({"a": Ownership(lend_limit=1)}, 1), ({"a": Ownership(lend_limit=0)}, 0),
             ({"b": Ownership(borrow_limit=2)}, 2), ({"a": Ownership(lend_limit=3), "b": Ownership(borrow_limit=1)}, 1)]
    for ownership, most in cases:
        moved = plan(_pool(), DEMAND, Policy(kind="reactive", ownership=ownership), solver=solver).moves
        assert len(moved) == most, ownership
        assert all(m.source == "a" and m.target == "b" for m in moved)


@pytest.mark.parametrize("solver", ["milp", "greedy"])
def test_unowned_nodes_and_nodes_going_home_pass_the_limits(solver):
    # two of a's nodes are the pool's (no owner): lend_limit 0 still lets those two go; and a node
    # of b's lent to a goes home whatever a's lend_limit or b's borrow_limit says
    pool = _pool()
    pool[2:4] = [replace(pool[2], home=None), replace(pool[3], home=None)]
    policy = Policy(kind="reactive", ownership={"a": Ownership(lend_limit=0), "b": Ownership(borrow_limit=0)})
    assert sorted(m.node for m in plan(pool, DEMAND, policy, solver=solver).moves) == ["a2", "a3"]
    back = [NodeRecord("b9", "a", 8, home="b")] + [replace(r, home=None) for r in _pool()[:1]]
    moved = plan(back, {"a": [0.0, 0.0], "b": [16.0, 16.0]}, policy, solver=solver).moves
    assert sorted(m.node for m in moved) == ["a0", "b9"]


def test_a_limit_already_passed_is_not_made_worse_nor_forced():
    # a lends 2 while its lend_limit says 1 (set since): the plan moves no more of a's, and moves none back
    pool = _pool() + [NodeRecord(f"x{i}", "b", 8, busy_gpus=8, home="a") for i in range(2)]
    out = plan(pool, DEMAND, Policy(kind="reactive", ownership={"a": Ownership(lend_limit=1)}))
    assert out.moves == ()


def test_without_limits_owners_change_nothing():
    policy = Policy(kind="reactive", ownership={"a": Ownership(reclaim_minutes=30)})
    with_homes = plan(_pool(), DEMAND, policy)
    without = plan([replace(r, home=None) for r in _pool()], DEMAND, Policy(kind="reactive"))
    assert with_homes.moves == without.moves and with_homes.objective_after == without.objective_after


def _two_borrowers():
    # a lends: 2 idle nodes of its own. b holds its 4 and 2 of c's (150 % of what it owns), c holds
    # 2 of its 4 (50 %); all busy
    return ([NodeRecord(f"a{i}", "a", 8, home="a") for i in range(2)]
            + [NodeRecord(f"b{i}", "b", 8, busy_gpus=8, home="b") for i in range(4)]
            + [NodeRecord(f"c{i}", "b", 8, busy_gpus=8, home="c") for i in range(2)]
            + [NodeRecord(f"c{i}", "c", 8, busy_gpus=8, home="c") for i in range(2, 4)])


@pytest.mark.parametrize("solver", ["milp", "greedy"])
def test_two_borrowers_equally_short_the_one_furthest_below_its_share_gets_the_surplus(solver):
    demand = {"a": [0.0, 0.0], "b": [200.0, 200.0], "c": [200.0, 200.0]}
    out = plan(_two_borrowers(), demand, Policy(kind="reactive"), solver=solver)
    assert [(m.source, m.target) for m in out.moves] == [("a", "c"), ("a", "c")]
    # the mirror: b furthest below its share now gets both
    swap = {"b": "c", "c": "b"}
    mirror = [replace(r, owner=swap.get(r.owner, r.owner), home=swap.get(r.home, r.home)) for r in _two_borrowers()]
    out = plan(mirror, demand, Policy(kind="reactive"), solver=solver)
    assert [m.target for m in out.moves] == ["b", "b"]


@pytest.mark.parametrize("solver", ["milp", "greedy"])
def test_fair_share_only_breaks_ties(solver):
    # c needs one node more, not two: the second serves b better, whatever the shares say
    demand = {"a": [0.0, 0.0], "b": [200.0, 200.0], "c": [24.0, 24.0]}
    out = plan(_two_borrowers(), demand, Policy(kind="reactive"), solver=solver)
    assert sorted(m.target for m in out.moves) == ["b", "c"]
    # a platform that weighs more gets both, below its share or not
    heavy = Policy(kind="reactive", priority={"b": 3.0})
    out = plan(_two_borrowers(), {"a": [0.0, 0.0], "b": [200.0, 200.0], "c": [200.0, 200.0]}, heavy, solver=solver)
    assert [m.target for m in out.moves] == ["b", "b"]


def test_fair_share_moves_a_node_to_the_platform_below_its_share_and_says_so():
    demand = {p: PlatformDemand.coerce(p, v) for p, v in {"a": [0.0], "b": [200.0], "c": [200.0]}.items()}
    model = PlanModel(_two_borrowers(), ["a", "b", "c"], demand, Policy(kind="reactive"), 1, None)
    # a plan sending one of a's two idle nodes to b (the other stays), everything else kept
    to_b = [[len(cls.members) - (cls.owner == "a")] + [int(cls.owner == "a" and o.target == "b")
                                                        for o in cls.options[1:]] for cls in model.classes]
    reasons: list[str] = []
    fair = model.fair_share(to_b, reasons)
    (k,) = [k for k, cls in enumerate(model.classes) if cls.owner == "a"]
    targets = {o.target: n for o, n in zip(model.classes[k].options, fair[k]) if n}
    assert targets == {"c": 1, "a": 1}
    assert reasons == ["fair share: a node goes to c (75% of what it owns after) rather than b, which serves no better"]
    # without owners there is nothing to rank by: the plan is returned as it came
    anon = PlanModel([replace(r, home=None) for r in _two_borrowers()], ["a", "b", "c"], demand,
                     Policy(kind="reactive"), 1, None)
    assert anon.fair_share(to_b, reasons) == to_b and len(reasons) == 1


# ------------------------------------------------------------------ the fast path


def _p(platform, alloc, pending, idle, nodes):
    return Pressure(platform, AT, alloc, pending, 8.0 * len(nodes), tuple(idle), {n: 8 for n in nodes}, len(nodes))


def _readings():
    return {"slurm": Judged(_p("slurm", 64, 20, [], [f"s{i}" for i in range(8)])),
            "k8s": Judged(_p("k8s", 8, 0, ["k3", "k4", "k5"], [f"k{i}" for i in range(6)])),
            "os": Judged(_p("os", 16, 0, ["o2", "o3", "o4", "o5"], [f"o{i}" for i in range(6)]))}


HOMES = {**{f"s{i}": "slurm" for i in range(8)}, **{f"k{i}": "k8s" for i in range(6)},
         **{f"o{i}": "os" for i in range(6)}}
NO_PLAN = PlanBounds(None, None)


def _settings(**ownership):
    return Settings(max_moves_per_hour=4, cooldown=timedelta(hours=1), homes=HOMES,
                    ownership={p: Ownership(**kw) for p, kw in ownership.items()})


def _moves(out):
    return [d for d in out if isinstance(d, FastMove)]


def test_the_fast_path_keeps_the_lend_and_borrow_limits():
    (m,) = _moves(decide(_readings(), NO_PLAN, [], [], AT, _settings()))
    assert (m.source, m.target) == ("k8s", "slurm")
    # k8s lends nothing of its own: os lends instead
    (m,) = _moves(decide(_readings(), NO_PLAN, [], [], AT, _settings(k8s={"lend_limit": 0})))
    assert m.source == "os"
    # k8s already lends one (k0 sits on os): a lend_limit of 1 stops it
    readings = _readings()
    readings["os"] = Judged(_p("os", 16, 0, ["o2", "o3", "o4", "o5"], [f"o{i}" for i in range(6)] + ["k0"]))
    (m,) = _moves(decide(readings, NO_PLAN, [], [], AT, _settings(k8s={"lend_limit": 1})))
    assert m.source == "os"
    out = decide(_readings(), NO_PLAN, [], [], AT, _settings(slurm={"borrow_limit": 0}))
    assert not _moves(out) and any("borrow_limit 0" in d.reason for d in out)


def test_a_lender_gives_a_node_home_first_and_the_platform_furthest_below_its_share_is_served_first():
    readings = _readings()
    # k8s holds s7 (slurm's): lending to slurm, it gives s7 back before k3, its own
    readings["k8s"] = Judged(_p("k8s", 8, 0, ["k3", "k4", "k5", "s7"], [f"k{i}" for i in range(6)] + ["s7"]))
    readings["slurm"] = Judged(_p("slurm", 56, 20, [], [f"s{i}" for i in range(7)]))
    (m,) = _moves(decide(readings, NO_PLAN, [], [], AT, _settings()))
    assert (m.node, m.target) == ("s7", "slurm")
    # two short: os is shorter (30 GPUs) but holds all it owns; slurm holds 7 of its 8: slurm first
    readings["os"] = Judged(_p("os", 48, 30, [], [f"o{i}" for i in range(6)]))
    (m,) = _moves(decide(readings, NO_PLAN, [], [], AT, _settings()))
    assert m.target == "slurm"
    # without owners the shortest goes first, as before
    (m,) = _moves(decide(readings, NO_PLAN, [], [], AT, Settings(max_moves_per_hour=4)))
    assert m.target == "os"


def test_limit_helpers():
    lent, borrowed = lent_and_borrowed([("a", "b"), ("a", "a"), (None, "b"), ("b", "c")])
    assert lent == {"a": 1, "b": 1} and borrowed == {"b": 1, "c": 1}
    own = {"a": Ownership(lend_limit=1), "c": Ownership(borrow_limit=1)}
    assert "lend_limit 1" in may_move("a", "a", "b", lent, borrowed, own)
    assert may_move("b", "c", "b", lent, borrowed, own) is None  # home
    assert "borrow_limit 1" in may_move("a", "b", "c", lent, borrowed, own)
    assert may_move(None, "a", "c", lent, borrowed, own) is None
    # explicit owners first, then each platform's first `owns` of what it held; the rest nobody's
    homes = first_sight_homes({"a": ["a2", "a1", "a3"], "b": ["b1"]}, {"a": 2, "b": None}, {"a1": "b"})
    assert homes == {"a1": "b", "a2": "a", "a3": "a"}


# ------------------------------------------------------------------ the reclaim

PROMISE = {"a": Ownership(reclaim_minutes=30, min_runtime_minutes=20)}


def _lent(*nodes):
    return [HeldNode(n, "a", "b", 8, busy, ran) for n, busy, ran in nodes] + [HeldNode("a0", "a", "a", 8, 8.0, 600)]


def test_an_owner_that_needs_its_node_gets_it_back_idle_first_then_busy_after_its_minimum_runtime():
    nodes = _lent(("a1", 8.0, 30.0), ("a2", 0.0, 0.0), ("a3", 4.0, 10.0))
    since = need_since({}, {"a": 8.0, "b": 5.0}, nodes, AT, PROMISE)
    assert since == {"a": AT}  # b promises nothing
    moves, waits = reclaim({"a": 8.0}, nodes, PROMISE, since, [], AT, 4, 30.0)
    assert [(m.node, m.source, m.target, m.busy_gpus, m.outside_budget) for m in moves] == [("a2", "b", "a", 0.0, False)]
    # more short: the busy node whose work ran its 20 minutes comes too, a3 (10 minutes) waits
    moves, waits = reclaim({"a": 20.0}, nodes, PROMISE, since, [], AT, 4, 30.0)
    assert [m.node for m in moves] == ["a2", "a1"] and "ending 8 GPUs" in moves[1].reason
    (owner, why), = waits
    assert owner == "a" and "a3" in why and "10 more min" in why
    # no need (not short, or nothing lent): nothing; a promise without reclaim_minutes: nothing
    assert need_since(since, {"a": 0.0}, nodes, AT, PROMISE) == {}
    assert need_since({}, {"a": 8.0}, nodes, AT, {"a": Ownership(lend_limit=1)}) == {}
    # the need keeps its start while it lasts, and an owner not read this tick keeps it
    later = AT + timedelta(minutes=5)
    assert need_since(since, {"a": 8.0}, nodes, later, PROMISE) == {"a": AT}
    assert need_since(since, {}, nodes, later, PROMISE) == {"a": AT}


def test_a_reclaim_takes_a_budget_slot_and_goes_outside_the_budget_only_to_keep_its_deadline():
    nodes = _lent(("a1", 0.0, 0.0), ("a2", 0.0, 0.0))
    spent = [{"node": f"x{i}", "created_at": AT - timedelta(minutes=50 - i)} for i in range(4)]
    # the budget frees at 12:15 (the move of 11:15 leaves the hour): back by 12:45, but the need
    # began at 12:00 and reclaim_minutes 60 says 13:00: it waits
    promise = {"a": Ownership(reclaim_minutes=60)}
    since = {"a": AT - timedelta(minutes=5)}
    moves, waits = reclaim({"a": 8.0}, nodes, promise, since, spent, AT, 4, 30.0)
    assert moves == [] and "waits for the move budget" in waits[0][1]
    # reclaim_minutes 30: waiting would bring it back at 12:45, past 12:30: now, outside the budget
    promise = {"a": Ownership(reclaim_minutes=30)}
    (m,), _ = reclaim({"a": 8.0}, nodes, promise, since, spent, AT, 4, 30.0)
    assert m.outside_budget and "outside the move budget" in m.reason
    # a reclaim outside the budget took no slot: the next in-budget move still counts four
    assert len(reclaim({"a": 16.0}, nodes, promise, since, spent + [{"created_at": AT, "outside_budget": True}],
                       AT, 4, 30.0)[0]) == 2
    # with a free slot it takes it, and the second one goes outside the budget
    moves, _ = reclaim({"a": 16.0}, nodes, promise, since, spent[1:], AT, 4, 30.0)
    assert [m.outside_budget for m in moves] == [False, True]


def test_the_most_short_owner_reclaims_first():
    own = {"a": Ownership(reclaim_minutes=30), "c": Ownership(reclaim_minutes=30)}
    nodes = [HeldNode("a1", "a", "b", 8), HeldNode("c1", "c", "b", 8)]
    moves, _ = reclaim({"a": 8.0, "c": 16.0}, nodes, own, {"a": AT, "c": AT}, [], AT, 1, 30.0)
    # one slot: c (more short) takes it; a's would wait past its deadline, so it goes outside
    assert [(m.node, m.outside_budget) for m in moves] == [("c1", False), ("a1", True)]


def test_a_flagged_reading_waits_for_the_next_unless_that_is_too_late():
    nodes = [HeldNode("a1", "a", "b", 8)]
    since = {"a": AT}
    # the next reading in 5 minutes, back by 12:40: within 60 minutes, it waits
    moves, waits = reclaim({"a": 8.0}, nodes, {"a": Ownership(reclaim_minutes=60)}, since, [], AT, 4, 30.0, {"a": 5.0})
    assert moves == [] and "the next reading decides" in waits[0][1]
    # within 30 minutes it cannot: the flagged reading reclaims
    (m,), _ = reclaim({"a": 8.0}, nodes, {"a": Ownership(reclaim_minutes=30)}, since, [], AT, 4, 30.0, {"a": 5.0})
    assert m.node == "a1" and "flag" in m.reason


def test_a_need_the_reclaims_cover_ends_and_a_larger_shortage_later_is_a_new_need():
    nodes = [HeldNode(f"a{i}", "a", "b", 8) for i in range(4)]
    own = {"a": Ownership(reclaim_minutes=30)}
    moves, _ = reclaim({"a": 15.6}, nodes, own, {"a": AT}, [], AT, 4, 30.0)
    assert [m.node for m in moves] == ["a0", "a1"] and covered({"a": 15.6}, moves) == {"a"}
    assert covered({"a": 20.0}, moves) == set()  # 16 GPUs on their way do not cover 20
    # the caller ends the covered need; the next reading, short net of the 16 on their way, starts a new one
    later = AT + timedelta(minutes=5)
    assert need_since({}, {"a": 28.4}, nodes, later, own) == {"a": later}
