"""The fast path's pure decision: the greedy rule within the plan's bounds, the move budget,
cool-downs, open handovers, and readings the detect rules flag."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import numpy as np
import pandas as pd

from gpupool.decisions.fastpath import FastMove, FastPathTuning, Judged, PlanBounds, Settings, Skip, decide
from gpupool.jobs.fastpath import judge_reading
from gpupool.detect.router import RouterConfig
from gpupool.sources.base import Pressure

AT = datetime(2026, 6, 3, 12, 5, tzinfo=timezone.utc)
PLAN = PlanBounds(7, AT - timedelta(minutes=5), {"slurm": 40.0, "k8s": 8.0, "os": 8.0}, {})
SET = Settings(min_nodes={"slurm": 1, "k8s": 1, "os": 1}, max_moves_per_hour=4, cooldown=timedelta(hours=1))


def _p(platform, alloc, pending, idle, nodes):
    gpus = {n: 8 for n in nodes}
    return Pressure(platform, AT, alloc, pending, 8.0 * len(nodes), tuple(idle), gpus, len(nodes))


def _readings(**flags):
    ps = {
        "slurm": _p("slurm", 64, 20, [], [f"s{i}" for i in range(8)]),
        "k8s": _p("k8s", 8, 0, ["k3", "k4", "k5"], [f"k{i}" for i in range(6)]),
        "os": _p("os", 16, 0, ["o2", "o3", "o4", "o5"], [f"o{i}" for i in range(6)]),
    }
    return {p: Judged(v, tuple(flags.get(p, ()))) for p, v in ps.items()}


def _moves(out):
    return [d for d in out if isinstance(d, FastMove)]


def test_one_idle_node_from_the_largest_surplus_to_the_shortage():
    out = decide(_readings(), PLAN, [], [], AT, SET)
    (m,) = _moves(out)
    # k8s: 40 free, 0 pending; os: 32 free: k8s lends its first idle node
    assert (m.node, m.source, m.target, m.gpus) == ("k3", "k8s", "slurm", 8)
    assert "short 20" in m.reason and "plan #7" in m.reason
    assert {d.platform for d in out if isinstance(d, Skip)} == {"k8s", "os"}


def test_an_anomalous_reading_is_not_acted_on():
    out = decide(_readings(slurm=["gpus_pending 20"]), PLAN, [], [], AT, SET)
    assert not _moves(out)
    assert any(d.platform == "slurm" and "anomalous" in d.reason for d in out)


def test_without_a_current_plan_a_burst_is_answered_on_the_fast_paths_own_rules():
    # no plan yet (a fresh install, the window's first hour) and a plan past its age: the plan's
    # reserves and feeding do not bind, the lender's own pending work, min_nodes and budget do
    reserve = {"slurm": 40.0, "k8s": 48.0, "os": 48.0}  # would stop every lender if it bound
    for bounds, says in ((PlanBounds(None, None), "no hourly plan yet"),
                         (PlanBounds(7, AT - timedelta(hours=3), reserve, {"k8s": "the plan #7 moves nodes to it"}),
                          "plan #7 is 3:00:00 old, more than 2:00:00")):
        (m,) = _moves(decide(_readings(), bounds, [], [], AT, SET))
        assert (m.node, m.source, m.target) == ("k3", "k8s", "slurm") and says in m.reason
        assert "own rules" in m.reason
    # the same plan while current binds: nothing may lend
    fresh = PlanBounds(7, AT - timedelta(minutes=5), reserve, {})
    assert not _moves(decide(_readings(), fresh, [], [], AT, SET))
    few = Settings(min_nodes={"k8s": 6, "os": 6}, max_moves_per_hour=4)
    assert not _moves(decide(_readings(), PlanBounds(None, None), [], [], AT, few))
    spent = [{"node": f"x{i}", "from_platform": "a", "to_platform": "b", "created_at": AT - timedelta(minutes=i + 1)}
             for i in range(4)]
    assert not _moves(decide(_readings(), PlanBounds(None, None), spent, [], AT, SET))


def test_a_backfill_moves_nothing():
    (skip,) = decide(_readings(), PLAN, [], [], AT, Settings(backfill=True))
    assert skip.platform == "*" and "backfill" in skip.reason


def test_the_plans_reserve_and_min_nodes_bind_the_lender():
    keep = PlanBounds(7, PLAN.decided_at, {"slurm": 40.0, "k8s": 48.0, "os": 48.0}, {})
    out = decide(_readings(), keep, [], [], AT, SET)
    assert not _moves(out)
    assert any("plan's reserve" in d.reason for d in out if isinstance(d, Skip) and d.platform == "slurm")
    no_lend = PlanBounds(7, PLAN.decided_at, PLAN.keep_gpus, {"k8s": "the plan #7 moves nodes to it"})
    (m,) = _moves(decide(_readings(), no_lend, [], [], AT, SET))
    assert m.source == "os"
    few = Settings(min_nodes={"k8s": 6, "os": 6}, max_moves_per_hour=4)
    assert not _moves(decide(_readings(), PLAN, [], [], AT, few))


def test_budget_cooldown_transit_and_open_handovers():
    recent = [{"node": f"x{i}", "from_platform": "a", "to_platform": "b", "created_at": AT - timedelta(minutes=10 * i + 1)}
              for i in range(4)]
    out = decide(_readings(), PLAN, recent, [], AT, SET)
    assert not _moves(out) and any("budget spent" in d.reason for d in out)
    # one of the four is older than the rolling hour: one move may start
    recent[3]["created_at"] = AT - timedelta(minutes=61)
    assert len(_moves(decide(_readings(), PLAN, recent, [], AT, SET))) == 1
    # a platform that borrowed within the cool-down does not lend, and one that lent does not borrow
    back = [{"node": "k9", "from_platform": "hpc2", "to_platform": "k8s", "created_at": AT - timedelta(minutes=20)}]
    (m,) = _moves(decide(_readings(), PLAN, back, [], AT, SET))
    assert m.source == "os"
    lent = [{**back[0], "from_platform": "slurm", "to_platform": "os"}]
    out = decide(_readings(), PLAN, lent, [], AT, SET)
    assert any(d.platform == "slurm" and "lent a node" in d.reason for d in out)
    # GPUs on their way count against the shortage; a node with an open handover never moves
    transit = [{"node": f"s{i}", "to_platform": "slurm"} for i in range(3)]
    assert not _moves(decide(_readings(), PLAN, [], transit, AT, SET))
    (m,) = _moves(decide(_readings(), PLAN, [], [{"node": "k3", "to_platform": "os"}], AT, SET))
    assert m.node == "k4"


def test_a_pending_spike_gone_at_the_next_scrape_moves_no_node():
    """An exporter glitch: one scrape reports 40 pending GPUs, the next is back to normal. The
    detect rules flag the spike, so the fast path does not act on it, and the next reading has
    no shortage; a burst that persists is acted on at its second reading."""
    rng = np.random.default_rng(0)
    idx = pd.date_range(AT - timedelta(days=2), AT, freq="5min", inclusive="left")
    history = pd.Series(np.clip(np.round(2 + rng.normal(0, 1, len(idx))), 0, None), index=idx)
    router = RouterConfig()

    def tick(hist, pending, at):
        flagged = judge_reading(hist, pending, at, router, "gpu_pending")
        p = _p("slurm", 56, pending, [], [f"s{i}" for i in range(8)])  # 8 GPUs free
        readings = {**_readings(), "slurm": Judged(p, ("gpus_pending",) if flagged else ())}
        return _moves(decide(readings, PLAN, [], [], at, SET))

    assert tick(history, 40.0, AT) == []  # the spike: flagged, not acted on
    after = pd.concat([history, pd.Series([40.0], index=[AT])])
    nxt = AT + timedelta(minutes=5)
    assert tick(after, 2.0, nxt) == []  # gone at the next scrape: no shortage
    # the same first reading followed by a second high one is a burst: the second moves a node
    assert len(tick(after, 41.0, nxt)) == 1


def test_a_node_in_transit_counts_against_the_shortage_though_no_platform_reports_it():
    # slurm is short 20 GPUs; a 24-GPU node left k8s for slurm and is reported by neither
    # platform while it moves: its handover's GPUs cover the shortage, so nothing more moves
    ps = _readings()
    in_transit = [{"node": "k9", "to_platform": "slurm", "state": "released", "gpus": 24}]
    assert "k9" not in {n for j in ps.values() for n in j.pressure.node_gpus}
    assert not _moves(decide(ps, PLAN, [], in_transit, AT, SET))
    # without its GPUs (a handover no inventory ever listed) it is counted as nothing, as before
    unknown = [{"node": "k9", "to_platform": "slurm", "state": "released"}]
    assert len(_moves(decide(ps, PLAN, [], unknown, AT, SET))) == 1


def test_headroom_is_the_greedy_rules_need_for_taker_and_lender():
    from dataclasses import replace

    # slurm full with nothing pending: short only with a headroom (64 in use, 0 free)
    ps = {"slurm": Judged(_p("slurm", 64, 0, [], [f"s{i}" for i in range(8)])),
          "k8s": Judged(_p("k8s", 8, 0, ["k3", "k4", "k5"], [f"k{i}" for i in range(6)]))}
    assert not _moves(decide(ps, PLAN, [], [], AT, SET))
    (m,) = _moves(decide(ps, PLAN, [], [], AT, replace(SET, tuning=FastPathTuning(headroom=0.1))))
    assert (m.source, m.target) == ("k8s", "slurm") and "short 6.4" in m.reason
    # a lender keeps (1 + h) x its own demand: k8s with 30 of 48 GPUs in use lends at h = 0
    # (18 free, 8 after lending) but not at h = 0.5 (it would keep 45)
    ps["k8s"] = Judged(_p("k8s", 30, 0, ["k5"], [f"k{i}" for i in range(6)]))
    ps["slurm"] = Judged(_p("slurm", 64, 20, [], [f"s{i}" for i in range(8)]))
    assert _moves(decide(ps, PLAN, [], [], AT, SET))
    out = decide(ps, PLAN, [], [], AT, replace(SET, tuning=FastPathTuning(headroom=0.5)))
    assert not _moves(out) and any("pending work" in d.reason for d in out if isinstance(d, Skip))
