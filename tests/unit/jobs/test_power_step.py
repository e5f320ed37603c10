"""Production's power step on SQLite staging with an in-memory power means: an idle node parks
through the fast path's tick once idle long enough, a burst wakes it on a later tick and the
tick's decision counts it as on its way (no move for the same shortage); a dry run sends nothing;
a backfill never parks; a fresh install (no ``power:``) parks nothing; the plan plans a parked
node as fixed capacity and a handover never opens on it; the operator's ``gpupool power``."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy as sa

from gpupool.actuation import handover as ho
from gpupool.actuation.power import machine as pm
from gpupool.config import parse_config
from gpupool.jobs import power as job
from gpupool.jobs.fastpath import run_fastpath
from gpupool.pipeline import Context
from gpupool.staging import power as store
from gpupool.staging.schema import inventory_node
from mempower import HeldSource, MemPower

T0 = datetime(2026, 6, 3, 12, 0, tzinfo=timezone.utc)
HPC = [f"h{i}" for i in range(4)]
K8S = [f"k{i}" for i in range(3)]


def _config(power=True, dry_run=False, **parking):
    hpc = {"name": "hpc", "kind": "slurm", "conn_id": "c", "actuation": True}
    if power:
        hpc["power"] = {"means": "slurm"}
    return parse_config({"platforms": [hpc, {"name": "k8s", "kind": "kubernetes", "conn_id": "c", "actuation": True}],
                         "dry_run": dry_run, **({"parking": parking} if parking else {})})


def _inventory(engine, at, busy=("h0",)):
    rows = [{"platform": p, "node": n, "snapshot_at": at, "gpus": 8, "schedulable": True, "drain_reason": None,
             "busy_gpus": 8.0 if n in busy else 0.0} for p, nodes in (("hpc", HPC), ("k8s", K8S)) for n in nodes]
    with engine.begin() as conn:
        conn.execute(inventory_node.insert(), rows)


@pytest.fixture
def rig(sqlite_engine):
    _inventory(sqlite_engine, T0 - timedelta(hours=1))
    return sqlite_engine, MemPower("hpc", HPC)


def _tick(ctx, at, sources, act, dry_run=False, **kw):
    return run_fastpath(ctx, at, dry_run=dry_run, sources=sources, actuators={}, power_actuators={"hpc": act}, **kw)


def _sources(pending=0.0, held=()):
    return {"hpc": HeldSource("hpc", HPC, busy={"h0"}, held=held, pending=pending),
            "k8s": HeldSource("k8s", K8S, busy={"k0"})}


def test_an_idle_node_parks_through_the_tick_and_a_burst_wakes_it_before_any_move(rig):
    engine, act = rig
    ctx = Context(_config(), engine)
    parked_at = None
    for i in range(9):  # idle for idle_minutes (30) on the ticks' own readings before one parks
        at = T0 + timedelta(minutes=5 * i)
        out = _tick(ctx, at, _sources(), act)
        if out["power"]["parks"]:
            parked_at = at
            break
        assert pm.power_of(engine, "h3") == pm.ON
    assert parked_at == T0 + timedelta(minutes=30)
    (park,) = out["power"]["parks"]
    # one warm buffer of 2 for the pool's parking platforms: hpc needs 1 (h0's work), keeps 2 idle
    assert (park["node"], park["state"], out["power"]["need"]) == ("h3", pm.PARKED, {"hpc": 1})
    assert [c.action for c in act.sent] == ["hold", "power_off"]
    assert [t["by"] for t in store.transitions(engine, "h3")] == ["fastpath", "platform"]
    # the next tick: nothing more parks (the buffer holds), and the decision lends no parked node
    at = parked_at + timedelta(minutes=5)
    out = _tick(ctx, at, _sources(held={"h3"}), act)
    assert out["power"]["parks"] == [] and out["power"]["wakes"] == []
    # a burst: hpc wakes h3 first, and the decision counts it on its way instead of moving a k8s node
    at += timedelta(minutes=5)
    act.lag = True  # the node takes its time to boot
    out = _tick(ctx, at, _sources(pending=24.0, held={"h3"}), act)
    assert [w["node"] for w in out["power"]["wakes"]] == ["h3"]
    assert pm.power_of(engine, "h3") == pm.WAKING and [c.action for c in act.sent][-1] == "power_on"
    assert out["opened"] == []
    (hpc,) = [d for d in out["decisions"] if d["platform"] == "hpc"]
    assert "no shortage" in hpc["reason"] and "8 on their way" in hpc["reason"]
    assert ho.list_handovers(engine) == []


def test_a_dry_run_sends_nothing_and_records_what_it_would(rig):
    engine, act = rig
    ctx = Context(_config(dry_run=True), engine)
    for i in range(7):
        out = _tick(ctx, T0 + timedelta(minutes=5 * i), _sources(), act, dry_run=False)
    assert out["power"]["live"] is False
    assert [(p["node"], p["action"]) for p in out["power"]["parks"]] == [("h3", "would park")]
    assert act.sent == [] and store.get_power(engine, "h3") is None
    assert [(t["to_state"], t["dry_run"]) for t in store.transitions(engine, "h3")] == [("parked", True)]
    # the next ticks decide the same (nothing changed): recorded once within the hour, not each tick
    for i in range(7, 10):
        out = _tick(ctx, T0 + timedelta(minutes=5 * i), _sources(), act, dry_run=False)
        assert [(p["node"], p["state"]) for p in out["power"]["parks"]] == [("h3", "unchanged")]
    assert len(store.transitions(engine, "h3")) == 1 and act.sent == []


def test_a_backfill_never_parks_or_wakes(rig):
    engine, act = rig
    ctx = Context(_config(), engine)
    for i in range(7):
        out = _tick(ctx, T0 + timedelta(minutes=5 * i), _sources(), act, backfill=True)
        assert out["power"]["backfill"] and "never parks or wakes" in out["power"]["note"]
    assert act.sent == [] and store.transitions(engine) == []
    step = job.power_step(ctx, T0 + timedelta(hours=1), dry_run=False, backfill=True, actuators={"hpc": act},
                          pressures={})
    assert step["parks"] == [] and act.sent == []


def test_a_fresh_install_parks_nothing_and_its_tick_is_as_before(rig):
    engine, act = rig
    ctx = Context(_config(power=False), engine)
    for i in range(9):
        out = _tick(ctx, T0 + timedelta(minutes=5 * i), _sources(), act)
        assert out["power"]["platforms"] == [] and out["power"]["parks"] == []
    assert act.sent == [] and store.transitions(engine) == []
    from gpupool.jobs.text import format_power_step

    assert format_power_step(out["power"]) == ""


def test_the_rule_reads_its_knobs_from_the_configuration(rig):
    engine, act = rig
    ctx = Context(_config(buffer=3), engine)  # a buffer of 3: hpc's 3 idle nodes all stay warm
    for i in range(9):
        out = _tick(ctx, T0 + timedelta(minutes=5 * i), _sources(), act)
        assert out["power"]["parks"] == []
    with pytest.raises(Exception, match="parking.*buffer|buffer"):
        _config(buffer=-1)
    with pytest.raises(Exception, match="unknown key 'bufer'"):
        _config(bufer=1)


def test_the_plan_plans_a_parked_node_as_fixed_and_no_handover_opens_on_it(rig):
    engine, act = rig
    ctx = Context(_config(), engine)
    pm.park(engine, "h3", "hpc", act, T0, dry_run=False, by="operator")
    from gpupool.jobs.allocation import pool_nodes

    nodes, excluded = pool_nodes(engine, T0, ctx.platforms(), ctx.config)
    (h3,) = [n for n in nodes if n.name == "h3"]
    assert (h3.owner, h3.in_handover, h3.busy_gpus) == ("hpc", True, 0.0) and excluded == []
    with pytest.raises(ho.HandoverConflict, match="h3"):
        ho.open_handover(engine, "h3", "hpc", "k8s", T0 + timedelta(minutes=1), dry_run=False)


def test_the_plan_runs_the_power_step_only_when_the_fast_path_does_not(rig):
    engine, act = rig
    ctx = Context(_config(), engine)
    out = _tick(ctx, T0, _sources(), act)
    assert job.fastpath_running(engine, T0 + timedelta(minutes=5))
    said = job.plan_power_step(ctx, T0 + timedelta(minutes=5), dry_run=False, actuators={"hpc": act})
    assert "the fast path runs the power step" in said["note"]
    assert not job.fastpath_running(engine, T0 + timedelta(hours=2))
    at = T0 + timedelta(hours=2)
    _inventory(engine, at - timedelta(minutes=1))
    step = job.plan_power_step(ctx, at, dry_run=False, actuators={"hpc": act})
    assert step["by"] == "plan" and step["unread"] == {"hpc": step["unread"]["hpc"]}  # no source here: read fails
    assert step["parks"] == [] and out["power"]["parks"] == []


def test_operator_park_and_wake_are_dry_runs_by_default(rig, monkeypatch):
    engine, act = rig
    ctx = Context(_config(), engine)
    monkeypatch.setattr(Context, "build_power_actuators", lambda self, platforms=None, dry_run=True, lookup=None:
                        {"hpc": act})
    dry = job.operator_power(ctx, "park", "h2", T0)
    assert dry["action"] == "would park" and act.sent == [] and store.get_power(engine, "h2") is None
    live = job.operator_power(ctx, "park", "h2", T0, dry_run=False, reason="maintenance")
    assert live["state"] == pm.PARKED and [t["by"] for t in store.transitions(engine, "h2")][-1] == "platform"
    assert store.transitions(engine, "h2")[-2]["reason"] == "maintenance"
    (row,) = job.power_status(engine)
    assert (row["node"], row["state"], row["pending"]) == ("h2", "parked", None)
    woken = job.operator_power(ctx, "wake", "h2", T0 + timedelta(hours=1), dry_run=False)
    assert woken["state"] in (pm.WAKING, pm.ON)
    with pytest.raises(pm.PowerError, match="k0.*no power: section"):
        job.operator_power(ctx, "park", "k0", T0)
    with pytest.raises(pm.PowerError, match="zz.*not a pool node"):
        job.operator_power(ctx, "park", "zz", T0)


def test_the_power_status_table(rig):
    from gpupool.jobs.text import format_power

    engine, act = rig
    assert "every node is on" in format_power(job.power_status(engine))
    act.lag = True
    pm.park(engine, "h1", "hpc", act, T0, dry_run=False)
    text = format_power(job.power_status(engine))
    assert "h1" in text and "parking" in text and "-> parked by 2026-06-03 12:15" in text


def test_the_cli_checks_the_node_before_staging_and_shows_status(tmp_path, capsys):
    from gpupool.cli import main

    url = f"sqlite:///{tmp_path / 'never.db'}"
    assert main(["power", "park", "bad\x1bname", "--staging-url", url]) == 2
    assert "--node" in capsys.readouterr().err and not (tmp_path / "never.db").exists()
    assert main(["power", "wake", "h1", "--reason", "a\nb", "--staging-url", url]) == 2
    assert "--reason" in capsys.readouterr().err and not (tmp_path / "never.db").exists()
    url = f"sqlite:///{tmp_path / 's.db'}"
    assert main(["power", "status", "--staging-url", url]) == 0
    assert "every node is on" in capsys.readouterr().out
