"""The world model: fluid capacity, moves and transit, history windows, inventory, samples."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from gpupool.canonical import SAMPLE_COLUMNS, normalize_samples
from gpupool.sim.scenario import scenario_from_dict
from gpupool.sim.world import World, WorldError, default_world


def hourly(values) -> np.ndarray:
    """Per-minute demand holding each of ``values`` for one hour."""
    return np.repeat(np.asarray(values, dtype=float), 60)



def _world(helios, tmp_path, step="1h", clock=None, **extra):
    a = helios("a", np.r_[hourly([12]), np.full(30, 10.0), np.full(30, 30.0), hourly([16, 30])], total=10)
    b = helios("b", hourly([4, 4, 4, 4]), total=8)
    raw = {"step": step, "decision_every": "1h", "node_gpus": 8, "move_minutes": 30, "max_moves_per_decision": 4,
           "platforms": {"a": {"trace": [str(a)]}, "b": {"trace": [str(b)]}}, **extra}
    return World(scenario_from_dict(raw, base_dir=tmp_path), clock=clock)


def test_hand_computed_static_case(helios, tmp_path):
    # a: 10 GPUs traced -> 2 nodes = 16 GPUs; hourly demand 12, (10|30 -> 20), 16, 30
    #    served 12 + 16 + 16 + 16 = 60, unmet 0 + 4 + 0 + 14 = 18, capacity 4 x 16 = 64
    # b: 8 GPUs -> 1 node; demand 4 each hour: served 16, unmet 0, capacity 32
    out = _world(helios, tmp_path).summary()
    assert out["platforms"]["a"] == {"demand_gpu_hours": 78.0, "served_gpu_hours": 60.0, "unmet_gpu_hours": 18.0,
                                     "capacity_gpu_hours": 64.0, "utilization": 0.9375, "moves": 0}
    assert out["platforms"]["b"]["unmet_gpu_hours"] == 0.0
    assert out["platforms"]["b"]["capacity_gpu_hours"] == 32.0
    assert out["total"]["demand_gpu_hours"] == 94.0
    assert out["total"]["unmet_gpu_hours"] == 18.0
    assert out["total"]["utilization"] == round(76 / 96, 6)
    # at 30-minute steps the second hour is 10 then 30: served 5 + 8, unmet 7 instead of 4
    half = _world(helios, tmp_path, step="30min").summary()
    assert half["platforms"]["a"]["unmet_gpu_hours"] == 21.0


def test_nodes_option_overrides_the_traced_capacity(helios, tmp_path):
    a = helios("a", hourly([12, 12]), total=10)
    raw = {"step": "1h", "platforms": {"a": {"trace": [str(a)], "nodes": 1}}}
    out = World(scenario_from_dict(raw)).summary()
    assert out["total"]["capacity_gpu_hours"] == 16.0
    assert out["total"]["unmet_gpu_hours"] == 8.0


def test_a_moving_node_serves_nobody_for_move_minutes(helios, tmp_path):
    w = _world(helios, tmp_path, step="30min", clock="start")
    w.advance("2020-05-01 01:00")
    node = w.inventory("b")[0]["name"]
    arrive = w.move(node, "a")
    assert arrive == pd.Timestamp("2020-05-01 01:30", tz="UTC")
    cap = w.capacity()
    assert list(cap[0]) == [16, 16, 16, 24, 24, 24, 24, 24]
    assert list(cap[1]) == [8, 8, 0, 0, 0, 0, 0, 0]
    pool = {n["name"]: n for n in w.pool("2020-05-01 01:00")}
    assert pool[node]["in_transit"] and pool[node]["platform"] == "a"
    assert pool[node]["available_in_minutes"] == 30.0
    with pytest.raises(WorldError, match="already moving"):
        w.move(node, "b")
    w.advance(w.end)
    assert w.summary()["platforms"]["a"]["moves"] == 1
    assert w.summary()["platforms"]["b"]["moves"] == 0
    # history before the move is untouched
    before = w.samples("b", "2020-05-01 00:00", "2020-05-01 01:00")
    cap_b = before[(before.entity_kind == "platform") & (before.metric == "gpu_capacity")]
    assert list(cap_b["value"]) == [8.0, 8.0]


def test_samples_are_canonical_and_consistent(helios, tmp_path):
    w = _world(helios, tmp_path, step="30min")
    s = w.samples("a", "2020-05-01 00:00", "2020-05-01 04:00")
    assert list(s.columns) == SAMPLE_COLUMNS
    normalize_samples(s, "world a")  # raises on any violation
    plat = s[s.entity_kind == "platform"].pivot(index="ts", columns="metric", values="value")
    assert list(plat["gpu_allocated"] + plat["gpu_pending"]) == list(w.demand("a"))
    nodes = s[s.entity_kind == "node"].pivot_table(index="ts", columns="metric", values="value", aggfunc="sum")
    assert np.allclose(nodes["gpu_capacity"], plat["gpu_capacity"])
    assert np.allclose(nodes["gpu_allocated"], plat["gpu_allocated"])
    gpus = s[s.entity_kind == "gpu"]
    assert gpus["entity_id"].str.contains("/gpu").all()
    assert gpus["value"].between(0, 100).all()
    # any past window is the same slice of the whole history (backfills)
    part = w.samples("a", "2020-05-01 01:00", "2020-05-01 02:00")
    whole = s[(s.ts >= pd.Timestamp("2020-05-01 01:00", tz="UTC")) & (s.ts < pd.Timestamp("2020-05-01 02:00", tz="UTC"))]
    key = ["entity_kind", "entity_id", "metric", "ts"]
    assert part.sort_values(key).reset_index(drop=True).equals(whole.sort_values(key).reset_index(drop=True))


def test_windows_after_the_clock_are_refused(helios, tmp_path):
    w = _world(helios, tmp_path, clock="2020-05-01 02:00")
    assert len(w.samples("a", "2020-05-01 00:00", "2020-05-01 02:00")) > 0
    with pytest.raises(WorldError, match="after the simulated clock"):
        w.samples("a", "2020-05-01 00:00", "2020-05-01 03:00")
    with pytest.raises(WorldError, match="unknown platform"):
        w.samples("nope", "2020-05-01 00:00", "2020-05-01 01:00")


def test_inventory_cordon_and_packing(helios, tmp_path):
    w = _world(helios, tmp_path, clock="start")
    w.advance("2020-05-01 01:00")
    inv = w.inventory("a", "2020-05-01 01:00")
    assert [n["name"] for n in inv] == ["a-gpu001", "a-gpu002"]
    assert set(inv[0]) >= {"name", "platform", "gpus", "gpu_model", "mig_layout", "schedulable", "drain_reason",
                           "busy_gpus"}
    # 12 GPUs of work in the first hour packed by name: 8 on the first node, 4 on the second
    assert [n["busy_gpus"] for n in inv] == [8, 4]
    w.advance("2020-05-01 02:00")
    w.cordon("a-gpu002", "gpupool: moving to b")
    node = {n["name"]: n for n in w.inventory("a", "2020-05-01 02:00")}["a-gpu002"]
    assert node["schedulable"] is False and node["drain_reason"] == "gpupool: moving to b"
    assert w.capacity()[0, 2] == 8
    w.uncordon("a-gpu002")
    assert w.capacity()[0, 2] == 16
    with pytest.raises(WorldError, match="unknown node"):
        w.cordon("nope", "x")


def test_default_world_is_small_synthetic_and_anomalous():
    w = default_world("2024-01-01", "2024-01-15", seed=0)
    assert w.platforms == ("openstack", "slurm", "kubernetes")
    for p in w.platforms:
        assert 6 <= len(w.inventory(p)) <= 12
    truth = w.ground_truth()
    assert set(truth["platform"]) == set(w.platforms)
    assert {"point", "drop", "spike", "gap"} <= set(truth["kind"])
    assert len(w.index) == 14 * 288
    # exporter gaps remove usage rows but never the inventory's capacity
    gap = truth[truth["kind"] == "gap"].iloc[0]
    s = w.samples(gap["platform"], gap["start"], gap["end"], per_gpu=False)
    assert set(s.loc[s.entity_kind == "platform", "metric"]) == {"gpu_capacity"}
    w2 = default_world("2024-01-01", "2024-01-15", seed=0)
    assert np.array_equal(w.demand_, w2.demand_)


def test_public_accessors_for_the_facades(helios, tmp_path):
    w = _world(helios, tmp_path, step="30min", clock="start")
    assert w.clock_index == 0
    w.advance("2020-05-01 02:00")
    assert w.clock_index == 4
    busy = w.busy_by_node()
    assert busy.shape == (len(w.nodes), len(w.index))
    assert np.allclose(busy.sum(axis=0), w.served().sum(axis=0))
    factor, gap = w.exporter_distortion("a")
    assert (factor == 1).all() and not gap.any()


# --- how large a world may be -------------------------------------------------------------------


def _synthetic(nodes=None, total_gpus=16, **extra):
    platform = {"synthetic": {"base": 4, "total_gpus": total_gpus}}
    if nodes is not None:
        platform["nodes"] = nodes
    raw = {"step": "5min", "start": "2026-01-01", "end": "2026-01-02", "node_gpus": 8, "platforms": {"s": platform},
           **extra}
    return scenario_from_dict(raw, where="test")


def test_nodes_times_steps_beyond_the_limit_are_refused_before_any_node_is_made(monkeypatch):
    import gpupool.sim.world as world_mod

    monkeypatch.setattr(world_mod, "MAX_WORLD_NODE_STEPS", 288 * 10)  # a day of 5-minute steps: 10 nodes
    assert len(World(_synthetic(nodes=10)).nodes) == 10
    made = []
    monkeypatch.setattr(world_mod, "Node", lambda *a: made.append(a))
    with pytest.raises(WorldError, match=r"^test: 11 nodes over 288 steps .*3,168 node-steps; platform 's': 11 nodes, "
                                         r"its nodes\); a world holds at most .*2,880 node-steps"):
        World(_synthetic(nodes=11))
    assert made == []


def test_a_node_count_taken_from_the_demand_source_names_it():
    # a traced or generated GPU total of 8e10 GPUs: 1e10 nodes, refused at once
    with pytest.raises(WorldError, match=r"10,000,000,000 nodes over 288 steps.*its synthetic total_gpus of "
                                         r"80,000,000,000 in 8-GPU nodes"):
        World(_synthetic(total_gpus=8 * 10**10))


def test_ten_million_nodes_for_a_few_steps_are_refused_by_the_node_limit():
    from gpupool.sim.world import MAX_WORLD_NODE_STEPS, MAX_WORLD_NODES

    raw = {"step": "1h", "start": "2026-01-01T00:00", "end": "2026-01-01T01:00", "node_gpus": 8, "move_minutes": 30,
           "platforms": {"s": {"synthetic": {"base": 4, "total_gpus": 16}, "nodes": 10_000_000}}}
    assert 10_000_000 <= MAX_WORLD_NODE_STEPS  # one step: only the node limit stands between it and memory
    with pytest.raises(WorldError, match=f"at most {MAX_WORLD_NODES:,} nodes"):
        World(scenario_from_dict(raw, where="test"))


def test_the_benchmarks_worlds_fit_the_limits():
    """bench/fleet.py: 12,500 nodes for two hours of 1-minute steps; bench/allocate_helios.py: a
    31-day month of 5-minute steps with the Helios pool (well under 12,500 nodes)."""
    from gpupool.sim.world import MAX_WORLD_NODE_STEPS, MAX_WORLD_NODES

    assert 12_500 <= MAX_WORLD_NODES and 12_500 * 31 * 24 * 12 <= MAX_WORLD_NODE_STEPS
    raw = {"step": "1min", "start": "2026-01-05T00:00", "end": "2026-01-05T02:00", "node_gpus": 8, "move_minutes": 30,
           "platforms": {p: {"synthetic": {"base": 4, "total_gpus": 16}, "nodes": n}
                         for p, n in (("openstack", 4166), ("slurm", 4167), ("kubernetes", 4167))}}
    world = World(scenario_from_dict(raw, where="fleet"))
    assert len(world.nodes) == 12_500 and world.owner_.shape == (12_500, 120)


def test_the_world_actuator_dates_each_gpus_run_of_work_as_the_datacenter_does(helios, tmp_path):
    from gpupool.sim.actuator import WorldActuator

    # a at 30-minute steps: demand 12, 12, 10, 30 (served 16) up to 02:00, packed by name: a-gpu001
    # holds 8 throughout, a-gpu002 holds 4, 4, 2, 8
    w = _world(helios, tmp_path, step="30min", clock="2020-05-01 02:00")
    act = WorldActuator(w, "a")
    t = pd.Timestamp("2020-05-01 00:00", tz="UTC")
    assert act.work_started("a-gpu001") == [t.to_pydatetime()] * 8
    # slots 0-1 ran from the start; slots 2-3 stopped at 01:00 and began again at 01:30; 4-7 began at 01:30
    want = [t.to_pydatetime()] * 2 + [(t + pd.Timedelta("90min")).to_pydatetime()] * 6
    assert act.work_started("a-gpu002") == want
    assert act.work_started("a-gpu002", lookback_steps=1) == want  # found across look-back chunks alike
    assert WorldActuator(w, "b").work_started("a-gpu002") == []  # not b's node: none of b's work on it
    w.cordon("a-gpu002", "gpupool: moving to b")
    w.advance("2020-05-01 02:30")
    assert act.work_started("a-gpu002") == []  # a cordoned node serves nothing in the fluid model
