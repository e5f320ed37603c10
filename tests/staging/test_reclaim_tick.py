"""The reclaim in production on both staging backends: the fast-path tick (and the hourly plan's
actuation when the fast path does not run) takes an owner's lent node back first, through a live
handover of kind reclaim against the in-memory datacenter of the handover tests."""

from __future__ import annotations

import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "actuation"))

from memplatform import Datacenter, MemActuator  # noqa: E402

from gpupool.actuation import handover as ho  # noqa: E402
from gpupool.actuation.actuators.base import ActuationError  # noqa: E402
from gpupool.config import parse_config  # noqa: E402
from gpupool.jobs import allocation  # noqa: E402
from gpupool.jobs.fastpath import run_fastpath  # noqa: E402
from gpupool.pipeline import Context  # noqa: E402
from gpupool.sources.base import Pressure  # noqa: E402
from gpupool.staging import fastpath as store  # noqa: E402
from gpupool.staging import owners as owner_store  # noqa: E402
from gpupool.staging.schema import allocation_plan  # noqa: E402

AT = datetime(2026, 6, 3, 12, 5, tzinfo=timezone.utc)
TICK = timedelta(minutes=5)


def _config(reclaim_minutes=45.0, min_runtime=15.0, budget=4, owners=True):
    own = {"reclaim_minutes": reclaim_minutes, "min_runtime_minutes": min_runtime} if reclaim_minutes else {}
    return parse_config({
        "dry_run": False,
        "platforms": [{"name": "slurm", "kind": "slurm", "conn_id": "slurm_hpc", "actuation": True, **own},
                      {"name": "k8s", "kind": "kubernetes", "conn_id": "k8s_ai", "actuation": True}],
        "pool": {"nodes": [{"node": "n1", "gpus": 8, "owner": "slurm" if owners else None}]},
        "limits": {"max_moves_per_decision": budget}})


class Timed(MemActuator):
    """A :class:`MemActuator` that says when the work on each node began (``work_started``)."""

    def __init__(self, dc, platform):
        super().__init__(dc, platform)
        self.started: dict[str, datetime] = {}

    def work_started(self, node):
        return [self.started[node]] if self.dc.slots[(self.platform, node)].jobs else []


class DCSource:
    """A platform's pressure as its source reads it off the datacenter: the 8-GPU nodes it holds
    (open to its work, or still running its work), idle ones listed, ``pending`` GPUs queued."""

    def __init__(self, dc, platform, pending=0.0):
        self.dc, self.platform, self.pending = dc, platform, pending

    def pressure(self, at):
        slots = {n: self.dc.slots[(self.platform, n)] for n in self.dc.owners}
        mine = [n for n, s in slots.items() if s.schedulable or s.jobs]
        open_ = [n for n in mine if slots[n].schedulable]
        busy = [n for n in open_ if slots[n].jobs]
        return Pressure(self.platform, at, 8.0 * len(busy), float(self.pending), 8.0 * len(open_),
                        tuple(n for n in open_ if not slots[n].jobs), {n: 8 for n in mine}, len(open_), {})


def _world(busy=(), unknown=False):
    """n1 (slurm's) lent to k8s; s1 slurm's own, busy; k1 k8s's own, busy; ``busy`` nodes run work."""
    dc = Datacenter(("slurm", "k8s"), {"n1": "k8s", "s1": "slurm", "k1": "k8s"})
    for p, n in (("slurm", "s1"), ("k8s", "k1")) + tuple(("k8s", n) for n in busy):
        dc.start_job(p, n)
    acts = {p: (MemActuator if unknown else Timed)(dc, p) for p in dc.platforms}
    return dc, acts


def _sources(dc, pending=8.0):
    return {"slurm": DCSource(dc, "slurm", pending), "k8s": DCSource(dc, "k8s")}


def _tick(ctx, at, dc, acts, **kw):
    return run_fastpath(ctx, at, dry_run=kw.pop("dry_run", False), sources=_sources(dc, kw.pop("pending", 8.0)),
                        actuators=acts, **kw)


def test_an_idle_lent_node_comes_back_at_the_first_tick_before_any_move(engine):
    dc, acts = _world()
    dc.slots[("k8s", "k1")].jobs = 0  # k8s could lend k1 too: the decision still runs after the reclaim
    ctx = Context(_config(), engine)
    out = _tick(ctx, AT, dc, acts, pending=16.0)
    first, second = out["opened"]
    assert (first["node"], first["from"], first["to"]) == ("n1", "k8s", "slurm")
    assert (second["node"], second["to"]) == ("k1", "slurm")  # the move came after, on another node
    h = ho.get_handover(engine, first["id"])
    assert h.kind == ho.RECLAIM and h.state == ho.DONE and not h.outside_budget and h.need_since == AT
    assert dc.open_on("n1") == ["slurm"]
    rows = [r for r in store.decisions_at(engine, AT) if r["node"]]
    assert rows[0]["node"] == "n1" and rows[0]["reason"].startswith("reclaim: slurm short 16")
    assert rows[0]["handover_id"] == h.id
    assert owner_store.needs(engine) == {"slurm": AT}  # 8 of its 16 GPUs come back: the need stays open


def test_a_busy_lent_node_waits_for_min_runtime_then_is_evicted(engine):
    dc, acts = _world(busy=("n1",))
    acts["k8s"].started["n1"] = AT - timedelta(minutes=5)
    ctx = Context(_config(min_runtime=15.0), engine)
    for i, left in enumerate((10, 5)):  # the borrowed work ran 5, then 10 minutes: it keeps running
        at = AT + i * TICK
        out = _tick(ctx, at, dc, acts)
        assert out["opened"] == [] and dc.open_on("n1") == ["k8s"]
        (wait,) = [r for r in store.decisions_at(engine, at) if r["platform"] == "slurm" and "reclaim waits" in r["reason"]]
        assert f"node n1 on k8s runs borrowed work for {left} more min" in wait["reason"]
        assert owner_store.needs(engine) == {"slurm": AT}  # the need's start persists across ticks
    at = AT + 2 * TICK
    out = _tick(ctx, at, dc, acts)  # it ran 15 minutes: ended through the handover, allow_evict false
    (opened,) = out["opened"]
    h = ho.get_handover(engine, opened["id"])
    assert h.kind == ho.RECLAIM and h.state == ho.DONE and h.need_since == AT
    assert [c.action for c in acts["k8s"].sent] == ["drain", "evict"] and dc.open_on("n1") == ["slurm"]
    assert "ending 8 GPUs of k8s's work that ran 15 min" in h.reason


def test_unknown_runtime_never_ends_borrowed_work(engine):
    dc, acts = _world(busy=("n1",), unknown=True)  # an actuator without work_started
    ctx = Context(_config(min_runtime=15.0), engine)
    out = _tick(ctx, AT + 6 * TICK, dc, acts)
    assert out["opened"] == [] and dc.open_on("n1") == ["k8s"]
    (wait,) = [w for o, w in out["reclaim"]["waits"] if o == "slurm"]
    assert "how long the work on n1 ran is unknown" in wait


def test_outside_the_budget_when_waiting_would_be_late_and_it_takes_no_slot(engine):
    dc, acts = _world()
    ctx = Context(_config(reclaim_minutes=30.0, budget=1), engine)
    earlier = ho.open_handover(engine, "k1", "k8s", "slurm", AT - timedelta(minutes=10), dry_run=False)
    ho.update_handover(engine, ho.get_handover(engine, earlier), AT - timedelta(minutes=9), state=ho.DONE)
    out = _tick(ctx, AT, dc, acts)
    (opened,) = out["opened"]
    h = ho.get_handover(engine, opened["id"])
    assert h.node == "n1" and h.kind == ho.RECLAIM and h.outside_budget and "outside the move budget" in h.reason
    # the rolling hour counts the earlier move alone: once it leaves the window a slot is free again
    assert allocation._budget_left(ctx, AT + TICK) == 0
    assert allocation._budget_left(ctx, AT + timedelta(minutes=51)) == 1


def test_a_late_reclaim_raises_after_the_rest_of_the_tick_and_the_next_tick_keeps_trying(engine):
    dc, acts = _world(busy=("n1",))
    acts["k8s"].started["n1"] = AT - timedelta(hours=1)
    acts["k8s"].fail = [("evict", "before")]  # a PodDisruptionBudget says not now
    ctx = Context(_config(reclaim_minutes=30.0, min_runtime=15.0), engine)
    owner_store.set_needs(engine, {"slurm": AT - timedelta(minutes=40)}, AT - timedelta(minutes=40))
    with pytest.raises(ho.ReclaimLate, match=r"node n1 of slurm still on k8s .*10 min late.*eviction refused"):
        _tick(ctx, AT, dc, acts)
    (h,) = ho.list_handovers(engine)
    assert h.kind == ho.RECLAIM and h.state == ho.RELEASING and "eviction refused" in h.error
    assert h.need_since == AT - timedelta(minutes=40)
    assert any(r["node"] == "n1" for r in store.decisions_at(engine, AT))  # the tick was recorded first
    out = _tick(ctx, AT + TICK, dc, acts)  # the refusal passed: the reclaim goes through
    assert ho.get_handover(engine, h.id).state == ho.DONE and dc.open_on("n1") == ["slurm"] and "late" not in out


class Budgeted(Timed):
    """A :class:`Timed` borrower whose disruption budgets (``budgets``: node -> "ns/name") refuse
    every eviction on their node while named, as the Kubernetes Eviction API does (429)."""

    def __init__(self, dc, platform):
        super().__init__(dc, platform)
        self.budgets: dict[str, list[str]] = {}

    def blocking_budgets(self, node):
        return list(self.budgets.get(node, ()))

    def send(self, command):
        if command.action == "evict" and self.budgets.get(command.node):
            raise ActuationError(self.platform, command.node, "evict", "eviction refused by a budget (429)")
        return super().send(command)


def _blocked_world():
    dc, acts = _world(busy=("n1",))
    acts["k8s"] = Budgeted(dc, "k8s")
    acts["k8s"].started["n1"] = AT - timedelta(hours=1)  # past min_runtime: the reclaim may end it
    acts["k8s"].budgets["n1"] = ["ml/train-pdb"]
    return dc, acts


@pytest.mark.parametrize("allow_evict", [False, True])
def test_a_budget_blocking_a_reclaim_is_reported_at_once_and_never_worked_around(engine, allow_evict):
    dc, acts = _blocked_world()
    ctx = Context(_config(reclaim_minutes=45.0, min_runtime=15.0), engine)
    out = _tick(ctx, AT, dc, acts, allow_evict=allow_evict)  # 45 min before the deadline: said, not raised
    (h,) = ho.list_handovers(engine)
    assert h.kind == ho.RECLAIM and h.state == ho.RELEASING
    assert "blocked by disruption budget(s) ml/train-pdb" in h.error
    assert "the reclaim's deadline falls at 2026-06-03T12:50:00+00:00 (slurm's reclaim_minutes 45)" in h.error
    (b,) = out["blocked"]
    assert (b["id"], b["node"], b["owner"], b["borrower"]) == (h.id, "n1", "slurm", "k8s")
    assert b["budgets"] == ["ml/train-pdb"]
    assert (b["deadline"], b["minutes_left"]) == ("2026-06-03T12:50:00+00:00", 45.0)
    # allow_evict or not, only the Eviction API was asked: the borrowed work still runs
    assert dc.slots[("k8s", "n1")].jobs == 1 and dc.open_on("n1") == []
    assert [c.action for c in acts["k8s"].sent] == ["drain"]
    from gpupool.jobs.reclaim import format_blocked

    assert format_blocked(out["blocked"]).splitlines()[1] == (
        f"  node n1 of slurm on k8s (handover #{h.id}): ml/train-pdb; deadline 2026-06-03T12:50:00+00:00, 45 min left")


def test_a_blocked_reclaim_fails_the_run_at_the_last_tick_before_its_deadline(engine):
    dc, acts = _blocked_world()
    ctx = Context(_config(reclaim_minutes=30.0, min_runtime=15.0), engine)
    for minutes in (0, 20):  # the next tick comes before the deadline (12:35): waiting may still keep it
        out = _tick(ctx, AT + timedelta(minutes=minutes), dc, acts)
        assert out["blocked"][0]["minutes_left"] == 30.0 - minutes and "late" not in out
    with pytest.raises(ho.ReclaimBlocked, match=r"node n1 of slurm on k8s \(handover #\d+\): ml/train-pdb allow no "
                                                 r"disruption; deadline 2026-06-03T12:35:00\+00:00 \(5 min left\)"):
        _tick(ctx, AT + timedelta(minutes=25), dc, acts)  # the next one would be at the deadline
    (h,) = ho.list_handovers(engine)
    assert h.state == ho.RELEASING and dc.slots[("k8s", "n1")].jobs == 1  # still asking, never around it
    with pytest.raises(ho.ReclaimLate, match=r"10 min late.*ml/train-pdb") as late:  # past it: the lateness says it
        _tick(ctx, AT + timedelta(minutes=40), dc, acts)
    assert "ReclaimBlocked" not in "".join(getattr(late.value, "__notes__", []))
    acts["k8s"].budgets["n1"] = []  # the borrower's budget allows it now: the next eviction goes through
    out = _tick(ctx, AT + timedelta(minutes=45), dc, acts)
    assert ho.get_handover(engine, h.id).state == ho.DONE and dc.open_on("n1") == ["slurm"] and "blocked" not in out


def _blocked_gauge(ctx, at) -> dict[str, float]:
    """``gpupool_reclaims_blocked`` per platform, as a scrape of staging at ``at`` says it."""
    from prometheus_client.parser import text_string_to_metric_families

    from gpupool import metrics

    text = metrics.exposition(ctx.engine, ctx.config, at).decode()
    return {s.labels["platform"]: s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == "gpupool_reclaims_blocked"}


def test_the_metrics_say_a_blocked_reclaim_while_the_budget_refuses(engine):
    """What the tick staged is what any process exposing the metrics reads: the owner's reclaim
    counts as blocked from the tick whose eviction the budget refused until the one it allowed."""
    dc, acts = _blocked_world()
    ctx = Context(_config(reclaim_minutes=45.0, min_runtime=15.0), engine)
    assert _blocked_gauge(ctx, AT) == {"slurm": 0, "k8s": 0}
    out = _tick(ctx, AT, dc, acts)
    assert [b["node"] for b in out["blocked"]] == ["n1"]
    assert _blocked_gauge(ctx, AT) == {"slurm": 1, "k8s": 0}  # counted for the owner
    _tick(ctx, AT + TICK, dc, acts)
    assert _blocked_gauge(ctx, AT + TICK) == {"slurm": 1, "k8s": 0}  # still refused: still blocked
    acts["k8s"].budgets["n1"] = []
    _tick(ctx, AT + 2 * TICK, dc, acts)
    assert dc.open_on("n1") == ["slurm"] and _blocked_gauge(ctx, AT + 2 * TICK) == {"slurm": 0, "k8s": 0}


def test_a_dry_run_reports_a_blocking_budget_as_the_reclaim_opens(engine):
    dc, acts = _blocked_world()
    ctx = Context(_config(reclaim_minutes=30.0, min_runtime=15.0), engine)
    owner_store.set_needs(engine, {"slurm": AT - timedelta(minutes=28)}, AT - timedelta(minutes=28))
    out = _tick(ctx, AT, dc, acts, dry_run=True)  # 2 min left, but a dry run says it and does not fail
    (b,) = out["blocked"]
    assert (b["id"], b["state"], b["node"], b["budgets"], b["minutes_left"]) == (None, "opening", "n1",
                                                                                  ["ml/train-pdb"], 2.0)


def test_the_hourly_plan_fails_at_once_on_a_blocked_reclaim_its_next_run_would_be_late_for(engine):
    """The plan's actuation runs the reclaim when the fast path does not: its next chance is an
    hour away, so a budget that blocks a 45-minute promise fails this run."""
    dc, acts = _blocked_world()
    ctx = Context(_config(reclaim_minutes=45.0, min_runtime=15.0), engine)
    with engine.begin() as conn:
        plan_id = conn.execute(allocation_plan.insert().values(
            decided_at=AT, policy="predictive", solver="milp", dry_run=False, moves=[],
            summary={"platforms": {}}).returning(allocation_plan.c.id)).scalar_one()
    with pytest.raises(ho.ReclaimBlocked, match=r"ml/train-pdb allow no disruption; deadline 2026-06-03T12:50"):
        allocation.actuate_plan(ctx, plan_id, dry_run=False, actuators=acts, at=AT, sources=_sources(dc))
    (h,) = ho.list_handovers(engine)
    assert h.kind == ho.RECLAIM and h.state == ho.RELEASING and dc.slots[("k8s", "n1")].jobs == 1


def test_a_dry_run_opens_a_dry_run_reclaim_once(engine):
    dc, acts = _world(busy=("n1",))
    acts["k8s"].started["n1"] = AT - timedelta(hours=1)
    ctx = Context(_config(), engine)
    out = _tick(ctx, AT, dc, acts, dry_run=True)
    (opened,) = out["opened"]
    h = ho.get_handover(engine, opened["id"])
    assert h.dry_run and h.kind == ho.RECLAIM and h.state == ho.DONE and acts["k8s"].sent == []
    assert [r["action"] for r in ho.audit_rows(engine, h.id)] == ["drain", "evict", "resume"]
    again = _tick(ctx, AT + TICK, dc, acts, dry_run=True)  # moved on paper: on its way, not reclaimed again
    assert again["opened"] == [] and "late" not in again


def test_without_reclaim_keys_the_tick_is_unchanged(engine):
    dc, acts = _world()
    ctx = Context(_config(reclaim_minutes=None, owners=False), engine)
    out = _tick(ctx, AT, dc, acts, pending=8.0)
    assert "reclaim" not in out and owner_store.needs(engine) == {}
    (opened,) = out["opened"]  # the plain rule: the idle node moves as a move
    assert ho.get_handover(engine, opened["id"]).kind is None
    assert [r["reason"].split(";")[0] for r in store.decisions_at(engine, AT) if r["node"]] == [
        "fast path: slurm short 8 GPUs (8 pending, 0 free)"]


def test_the_hourly_plan_reclaims_first_when_the_fast_path_does_not_run(engine):
    dc, acts = _world()
    ctx = Context(_config(), engine)
    with engine.begin() as conn:  # a plan that would move the lent node elsewhere: the reclaim holds it
        plan_id = conn.execute(allocation_plan.insert().values(
            decided_at=AT, policy="predictive", solver="milp", dry_run=False,
            moves=[{"node": "n1", "from": "k8s", "to": "slurm", "gpus": 8, "reason": "plan"}],
            summary={"platforms": {}}).returning(allocation_plan.c.id)).scalar_one()
    out = allocation.actuate_plan(ctx, plan_id, dry_run=False, actuators=acts, at=AT, sources=_sources(dc))
    (reclaimed,) = out["reclaim"]["opened"]
    assert reclaimed["node"] == "n1" and ho.get_handover(engine, reclaimed["id"]).kind == ho.RECLAIM
    assert out["opened"] == [] and "already has handover" in out["skipped"][0]["why"]
    assert dc.open_on("n1") == ["slurm"]


def test_a_dry_run_says_an_owner_waits_past_its_deadline_without_failing(engine):
    dc, acts = _world(busy=("n1",), unknown=True)  # its work's runtime unknown: never ended, it waits
    ctx = Context(_config(reclaim_minutes=30.0), engine)
    owner_store.set_needs(engine, {"slurm": AT - timedelta(minutes=50)}, AT - timedelta(minutes=50))
    out = _tick(ctx, AT, dc, acts, dry_run=True)
    (late,) = out["late"]
    assert (late["owner"], late["node"], late["minutes_late"]) == ("slurm", None, 20.0)
    assert "unknown" in late["error"] and out["opened"] == []


def test_the_fast_paths_limits_bind_on_owners_taken_at_first_sight(engine):
    """``owns`` (no ``pool.nodes[].owner``, no ``reclaim_minutes``) is recorded at the tick's first
    sight, and the decision's ``lend_limit`` binds on it: k8s owns the two nodes it holds, lends
    none, and slurm's shortage is left waiting with the limit named; without the limit it is served."""
    def config(limit):
        own = {"owns": 2, **({"lend_limit": limit} if limit is not None else {})}
        return parse_config({
            "dry_run": False,
            "platforms": [{"name": "slurm", "kind": "slurm", "conn_id": "slurm_hpc", "actuation": True},
                          {"name": "k8s", "kind": "kubernetes", "conn_id": "k8s_ai", "actuation": True, **own}],
            "limits": {"max_moves_per_decision": 4}})

    for limit, moved in ((0, False), (None, True)):
        dc = Datacenter(("slurm", "k8s"), {"k1": "k8s", "k2": "k8s", "s1": "slurm"})
        dc.start_job("slurm", "s1")
        acts = {p: MemActuator(dc, p) for p in dc.platforms}
        ctx = Context(config(limit), engine)
        at = AT + (timedelta(0) if limit == 0 else timedelta(days=1))  # the second run reads the first's owners
        out = _tick(ctx, at, dc, acts, pending=8.0)
        assert owner_store.owners(engine) == {"k1": "k8s", "k2": "k8s"}
        assert bool(out["opened"]) is moved
        if not moved:
            assert any("lend_limit 0" in r["reason"] for r in store.decisions_at(engine, at))


def test_a_handover_keeps_the_gpus_its_node_brings(engine):
    """What is on its way while a node moves is known from the handover itself (a fresh install
    has no inventory staged before its first pipeline run)."""
    dc = Datacenter(("slurm", "k8s"), {"k1": "k8s", "k2": "k8s", "s1": "slurm"})
    dc.start_job("slurm", "s1")
    dc.start_job("k8s", "k2")  # busy: its move waits in releasing, the node in transit
    acts = {p: MemActuator(dc, p) for p in dc.platforms}
    hid = ho.open_handover(engine, "k2", "k8s", "slurm", AT, dry_run=False, gpus=8)
    ho.advance_all(engine, acts, AT, dry_run=False)
    h = ho.get_handover(engine, hid)
    assert (h.state, h.gpus) == (ho.RELEASING, 8) and h.as_dict()["gpus"] == 8
    ho.rollback(engine, hid, acts, AT + TICK)
    assert ho.get_handover(engine, hid).state == ho.ROLLED_BACK
    # the tick counts them on their way: slurm short 8 with k2's 8 coming is not served twice
    hid2 = ho.open_handover(engine, "k2", "k8s", "slurm", AT + 2 * TICK, dry_run=False, gpus=8)
    out = _tick(Context(_config(reclaim_minutes=None, owners=False), engine), AT + 2 * TICK, dc, acts, pending=8.0)
    assert [o["node"] for o in out["opened"]] == [] and ho.get_handover(engine, hid2).gpus == 8
