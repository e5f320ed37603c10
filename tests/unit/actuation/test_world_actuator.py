"""The simulator's actuator: a handover on an in-process World (cordon, wait, move, uncordon)."""

from __future__ import annotations

import pandas as pd

import pytest

from gpupool.actuation import handover as ho
from gpupool.actuation.actuators.base import ActuationConfigError
from gpupool.config import default_config
from gpupool.platforms import build_actuator, build_actuators
from gpupool.sim.actuator import WorldActuator
from gpupool.sim.world import World, default_world


def test_platforms_builds_the_simulators_actuator_for_a_world_it_is_given():
    cfg = default_config().model_copy(deep=True)
    for p in cfg.platforms:
        p.actuation = True
    world = World(default_world("2026-03-01", "2026-03-02", seed=1).scenario, clock=pd.Timestamp("2026-03-01 04:00", tz="UTC"))
    acts = build_actuators(cfg, world=world)
    assert sorted(acts) == sorted(world.platforms) and all(isinstance(a, WorldActuator) for a in acts.values())
    assert build_actuators(cfg) == {}  # the embedded world is rebuilt every run: nothing to act on
    with pytest.raises(ActuationConfigError, match="'slurm' \\(simulator\\).*pass the World"):
        build_actuator(cfg.platform("slurm"), cfg)


def test_handover_moves_an_idle_node_in_the_world(sqlite_engine):
    world = World(default_world("2026-03-01", "2026-03-02", seed=1).scenario, clock=pd.Timestamp("2026-03-01 04:00", tz="UTC"))
    cfg = default_config()
    acts = {p.name: build_actuator(p, cfg, world=world) for p in cfg.platforms}
    idle = next(n for n in world.pool() if n["platform"] == "openstack" and n["busy_gpus"] == 0)
    at = world.clock.to_pydatetime()
    hid = ho.open_handover(sqlite_engine, idle["name"], "openstack", "kubernetes", at, dry_run=False)
    ho.advance_all(sqlite_engine, acts, at, dry_run=False)
    h = ho.get_handover(sqlite_engine, hid)
    assert h.state == ho.ATTACHING and "not report" in h.error  # in transit for the move latency
    node = next(n for n in world.pool() if n["name"] == idle["name"])
    assert node["platform"] == "kubernetes" and node["in_transit"] and not node["drain_reason"]
    world.advance(world.clock + pd.Timedelta(minutes=30))
    ho.advance_all(sqlite_engine, acts, world.clock.to_pydatetime(), dry_run=False)
    assert ho.get_handover(sqlite_engine, hid).state == ho.DONE
    assert [(r["platform"], r["action"]) for r in ho.audit_rows(sqlite_engine, hid)] == [
        ("openstack", "cordon"), ("kubernetes", "move"), ("kubernetes", "uncordon")]
    assert [e["kind"] for e in world.events_] == ["cordon", "move", "uncordon"]
