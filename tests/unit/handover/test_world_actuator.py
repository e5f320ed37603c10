"""The simulator's actuator: a handover on an in-process World (cordon, wait, move, uncordon)."""

from __future__ import annotations

import pandas as pd

from gpupool.allocate import handover as ho
from gpupool.sim.actuator import WorldActuator
from gpupool.sim.world import World, default_world


def test_handover_moves_an_idle_node_in_the_world(sqlite_engine):
    world = World(default_world("2026-03-01", "2026-03-02", seed=1).scenario, clock=pd.Timestamp("2026-03-01 04:00", tz="UTC"))
    acts = {p: WorldActuator(world, p) for p in world.platforms}
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
