"""The reclaim's glue between production's reads and the pure rule (gpupool.jobs.reclaim), and a
reclaim handover's deadline: rolled back like any handover, never silently."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from memplatform import make

from gpupool.actuation import handover as ho
from gpupool.actuation.actuators.base import NamedActuator
from gpupool.config import parse_config
from gpupool.decisions.fastpath import Judged
from gpupool.jobs import reclaim as rc
from gpupool.sources.base import Pressure

AT = datetime(2026, 6, 3, 12, 5, tzinfo=timezone.utc)


class Started:
    """An actuator stand-in that says when its nodes' work began."""

    platform = "k8s"

    def __init__(self, starts):
        self.starts = starts

    def work_started(self, node):
        if node == "broken":
            raise RuntimeError("API down")
        return self.starts.get(node)


def test_work_ran_minutes_is_the_youngest_units_age_and_unknown_stays_unknown():
    act = Started({"a": [AT - timedelta(minutes=40), AT - timedelta(minutes=12)], "idle": []})
    assert rc.work_ran_minutes(act, "a", AT) == 12.0
    assert rc.work_ran_minutes(act, "idle", AT) == 0.0
    assert rc.work_ran_minutes(act, "gone", AT) is None  # the actuator cannot say
    assert rc.work_ran_minutes(act, "broken", AT) is None
    assert rc.work_ran_minutes(object(), "a", AT) is None  # no work_started at all
    named = NamedActuator(Started({"k8s-a": [AT - timedelta(minutes=20)]}), {"a": "k8s-a"})
    assert rc.work_ran_minutes(named, "a", AT) == 20.0  # asked in the platform's own name


def _pressure(platform, idle, nodes, alloc=0.0, pending=0.0):
    return Pressure(platform, AT, alloc, pending, 8.0 * len(nodes), tuple(idle), {n: 8 for n in nodes}, len(nodes))


def test_holders_from_handovers_idle_nodes_and_sole_listers():
    readings = {"slurm": _pressure("slurm", ["s1"], ["s1", "m"]), "k8s": _pressure("k8s", ["n1"], ["n1", "k1", "p"])}
    open_h = [{"node": "m", "to_platform": "k8s", "state": "releasing"},
              {"node": "f", "to_platform": "k8s", "state": "failed"}]
    held = rc.holders(None, AT, readings, open_h, powered_down={"p"})
    assert held == {"m": ("k8s", True), "s1": ("slurm", False), "n1": ("k8s", False), "k1": ("k8s", False)}


def test_reading_without_takes_the_reclaimed_node_off_its_borrower():
    r = _pressure("k8s", ["n1"], ["n1", "k1", "k2"], alloc=8.0)
    busy = rc.ReclaimMove("k2", "k8s", "slurm", 8, "r", busy_gpus=8.0)
    idle = rc.ReclaimMove("n1", "k8s", "slurm", 8, "r")
    out = rc.reading_without({"k8s": Judged(r, ("x",))}, [idle, busy])["k8s"]
    assert out.anomalous == ("x",)
    p = out.pressure
    assert (p.gpus_capacity, p.gpus_allocated, p.idle_nodes, p.nodes_open) == (8.0, 0.0, (), 1)
    assert r.gpus_capacity == 24.0  # the input is not changed


def test_open_kwargs_and_promised():
    assert rc.open_kwargs(rc.ReclaimMove("n", "a", "b", 8, "r", outside_budget=True, need_since=AT)) == {
        "kind": ho.RECLAIM, "outside_budget": True, "need_since": AT}
    from gpupool.decisions.fastpath import FastMove

    assert rc.open_kwargs(FastMove("n", "a", "b", 8, "r")) == {}
    plain = parse_config({"platforms": [{"name": "a", "kind": "simulator", "lend_limit": 2}]})
    assert rc.promised(plain) == {}  # a limit alone promises no reclaim: the tick reads nothing for it
    both = parse_config({"platforms": [{"name": "a", "kind": "simulator", "reclaim_minutes": 30},
                                       {"name": "b", "kind": "simulator"}]})
    assert set(rc.promised(both)) == {"a", "b"} and rc.promised(both)["a"].reclaim_minutes == 30


def test_a_wait_says_when_the_runtime_is_unknown():
    why = "short 8 GPUs; its node n1 on k8s runs borrowed work for 15 more min before min_runtime_minutes 15"
    said = rc._unknown_said(why, {"n1"}, {"n1": ("k8s", False)})
    assert said.startswith(why) and "k8s's actuator does not say" in said and "never ended on a guess" in said
    assert rc._unknown_said(why, {"n2"}, {"n2": ("k8s", False)}) == why


def test_reclaim_late_names_node_owner_borrower_minutes_and_error():
    exc = ho.ReclaimLate([{"id": 7, "node": "n1", "owner": "slurm", "borrower": "k8s", "minutes_late": 12.5,
                           "state": "releasing", "error": "waiting: eviction refused: 429"},
                          {"id": None, "node": None, "owner": "ai", "borrower": None, "minutes_late": 3,
                           "state": "waiting", "error": "short 8 GPUs"}])
    text = str(exc)
    assert text.startswith("2 reclaim(s) late")
    assert "node n1 of slurm still on k8s (handover #7, releasing): 12.5 min late; last error: waiting: eviction refused: 429" in text
    assert "ai waits for its lent nodes: 3 min late; last error: short 8 GPUs" in text


def test_a_reclaim_past_its_deadline_is_rolled_back_loudly(sqlite_engine):
    dc, acts = make(("slurm", "k8s"), {"n1": "k8s"})
    dc.start_job("k8s", "n1")
    acts["k8s"].can_evict = False  # its work cannot be ended: the reclaim waits until its deadline
    hid = ho.open_handover(sqlite_engine, "n1", "k8s", "slurm", AT, dry_run=False, kind=ho.RECLAIM,
                           need_since=AT - timedelta(minutes=5), timeout=timedelta(hours=2))
    report = ho.advance_all(sqlite_engine, acts, AT, dry_run=False)
    assert report["failed"] == [] and ho.get_handover(sqlite_engine, hid).state == ho.RELEASING
    report = ho.advance_all(sqlite_engine, acts, AT + timedelta(hours=2), dry_run=False)
    (failed,) = report["failed"]  # the run fails on it (HandoverFailed): Airflow alerts
    h = ho.get_handover(sqlite_engine, hid)
    assert h.state == ho.ROLLED_BACK and dc.open_on("n1") == ["k8s"]  # never held by gpupool
    assert "a reclaim for slurm" in h.error and "next tick reclaims it again" in failed["error"]


def test_a_rolled_back_reclaim_hands_its_need_back_to_its_owner(sqlite_engine):
    hid = ho.open_handover(sqlite_engine, "n1", "k8s", "slurm", AT - timedelta(hours=2), dry_run=False,
                           kind=ho.RECLAIM, need_since=AT - timedelta(hours=2, minutes=10))
    ho.update_handover(sqlite_engine, ho.get_handover(sqlite_engine, hid), AT - timedelta(minutes=5),
                       state=ho.ROLLED_BACK)
    resumed = rc._resumed(sqlite_engine, AT, {"slurm": AT}, {"n1": ("k8s", False)})
    assert resumed == {"slurm": AT - timedelta(hours=2, minutes=10)}  # judged against its first start
    later = rc._resumed(sqlite_engine, AT + timedelta(hours=1), {"slurm": AT + timedelta(hours=1)}, {})
    assert later == {"slurm": AT + timedelta(hours=1)}  # long ago: a new need
