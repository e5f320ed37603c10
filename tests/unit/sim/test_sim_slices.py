"""MIG slices in the what-if: a platform's ``slice_profile``, layouts in the world, the plan's
re-layouts applied, unmet counted in slice-hours."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import yaml

from gpupool.sim.scenario import ScenarioError, scenario_from_dict
from gpupool.sim.study import simulate
from gpupool.sim.world import World

METRICS = {"demand_gpu_hours", "served_gpu_hours", "unmet_gpu_hours", "capacity_gpu_hours", "utilization", "moves"}
#: what every study reports of energy, parking or not (docs/stages/whatif.md)
ENERGY = {"idle_kwh", "parked_kwh", "energy_kwh", "parked_node_hours", "wakes", "late_wakes"}


def hourly(values) -> np.ndarray:
    """Per-minute demand holding each of ``values`` for one hour."""
    return np.repeat(np.asarray(values, dtype=float), 60)


def _synthetic(slice_profile: str | None) -> dict:
    """ai: jobs that each fit a 1g.10gb slice, peaking at 16:00, on 4 A100 nodes; hpc: whole-GPU
    jobs peaking at 04:00 on 6 nodes. The same demand whether ai asks for slices or not."""
    ai = {"synthetic": {"base": 80, "daily_amplitude": 0.5, "weekly_amplitude": 0, "peak_hour": 16, "noise": 0.05,
                        "bursts_per_day": 0, "total_gpus": 32}, "nodes": 4, "gpu_model": "NVIDIA A100-SXM4-80GB"}
    if slice_profile is not None:
        ai["slice_profile"] = slice_profile
    hpc = {"synthetic": {"base": 24, "daily_amplitude": 0.4, "weekly_amplitude": 0, "peak_hour": 4, "noise": 0.05,
                         "bursts_per_day": 0, "total_gpus": 48}, "nodes": 6}
    return {"step": "5min", "decision_every": "1h", "node_gpus": 8, "move_minutes": 30, "max_moves_per_decision": 2,
            "fastpath": "off", "start": "2024-01-01", "end": "2024-01-03", "seed": 1, "name": "mig",
            "platforms": {"ai": ai, "hpc": hpc}}


def test_slices_leave_fewer_unmet_slice_hours_than_whole_gpus_on_the_same_demand():
    whole = simulate(scenario_from_dict(_synthetic(None)), "reactive")
    plans = []
    sliced = simulate(scenario_from_dict(_synthetic("1g.10gb")), "reactive", plans=plans)
    ai, ai_whole = sliced["platforms"]["ai"], whole["platforms"]["ai"]
    # the same demand: one unit is one job, a slice or a whole GPU
    assert ai["demand_slice_hours"] == ai_whole["demand_gpu_hours"] > 0
    assert ai["unit"] == "1g.10gb"
    assert ai["unmet_slice_hours"] == ai["unmet_gpu_hours"]  # the old keys stay, in the block's unit
    assert ai["served_slice_hours"] + ai["unmet_slice_hours"] == pytest.approx(ai["demand_slice_hours"])
    # whole GPUs: each job holds a GPU; slices: a node laid out all-1g.10gb holds 56
    assert ai["unmet_slice_hours"] < 0.5 * ai_whole["unmet_gpu_hours"]
    # the plans chose the layouts: nodes moving to ai arrive cut into slices, to hpc whole
    layouts = {(m.target, m.mig_layout) for p in plans for m in p.moves}
    assert ("ai", "all-1g.10gb") in layouts
    assert all(layout == "all-disabled" for target, layout in layouts if target == "hpc")
    # the hpc platform is in GPUs as before, and the total's hours are its alone
    assert "unit" not in sliced["platforms"]["hpc"]
    assert sliced["total"]["slice_platforms"] == {"ai": "1g.10gb"}
    assert sliced["total"]["unmet_gpu_hours"] == sliced["platforms"]["hpc"]["unmet_gpu_hours"]
    assert sliced["total"]["moves"] == ai["moves"] + sliced["platforms"]["hpc"]["moves"]


def test_without_the_key_the_output_is_the_gpu_studys():
    out = simulate(scenario_from_dict(_synthetic(None)), "static")
    assert set(out["total"]) == METRICS | ENERGY
    assert all(set(block) == METRICS | ENERGY for block in out["platforms"].values())
    assert World(scenario_from_dict(_synthetic(None))).layouts_ is None


def _trace_scenario(tmp_path, helios, slice_profile: str | None) -> dict:
    # ai: 4 nodes idle for three hours, then 100 jobs for three; hpc: 2 nodes, one of them busy
    a = helios("ai", hourly([0, 0, 0, 100, 100, 100]), total=32)
    h = helios("hpc", hourly([8] * 6), total=16)
    ai = {"trace": [str(a)]}
    if slice_profile:
        ai["slice_profile"] = slice_profile
    return {"step": "5min", "decision_every": "1h", "node_gpus": 8, "move_minutes": 30, "max_moves_per_decision": 4,
            "fastpath": "off", "platforms": {"ai": ai, "hpc": {"trace": [str(h)]}}}


def test_the_plans_relayouts_apply_in_place(tmp_path, helios):
    plans = []
    sc = scenario_from_dict(_trace_scenario(tmp_path, helios, "1g.10gb"))
    out = simulate(sc, "oracle", plans=plans)
    changes = [c for p in plans for c in p.layout_changes]
    assert changes and all(c.platform == "ai" and c.to_layout == "all-1g.10gb" for c in changes)
    assert out["platforms"]["ai"]["relayouts"] == len(changes)
    # the oracle re-lays ai's idle nodes out before the jobs come: 4 x 56 slices hold all 100
    assert out["platforms"]["ai"]["unmet_slice_hours"] == 0.0
    whole = simulate(scenario_from_dict(_trace_scenario(tmp_path, helios, None)), "oracle")
    # whole GPUs: at best ai's 32 and hpc's idle 8 GPUs, 60 jobs short for three hours
    assert whole["platforms"]["ai"]["unmet_gpu_hours"] >= 60 * 3 - 1e-6


def _world(tmp_path, helios) -> World:
    return World(scenario_from_dict(_trace_scenario(tmp_path, helios, "1g.10gb")), clock="start")


def test_a_node_serves_its_layout_in_its_owners_unit(tmp_path, helios):
    w = _world(tmp_path, helios)
    ai, hpc = w.platforms.index("ai"), w.platforms.index("hpc")
    assert [n["mig_layout"] for n in w.pool()] == ["all-disabled"] * 6
    # all-disabled: a whole GPU serves one slice request, 8 per node
    assert w.capacity()[ai, 0] == 4 * 8 and w.capacity()[hpc, 0] == 2 * 8
    w.advance("2020-05-01 01:00")
    node = w.inventory("ai")[-1]["name"]
    back = w.relayout(node, "all-1g.10gb", minutes=10)
    # out of service for 10 minutes (two steps), then 8 GPUs x 7 slices
    assert back == pd.Timestamp("2020-05-01 01:10", tz="UTC")
    i = w.clock_index
    assert list(w.capacity()[ai, i - 1 : i + 3]) == [32, 24, 24, 24 + 56]
    assert not next(n for n in w.pool() if n["name"] == node)["schedulable"]
    w.advance("2020-05-01 01:10")
    assert next(n for n in w.pool() if n["name"] == node)["mig_layout"] == "all-1g.10gb"
    # laid out for slices it serves no whole-GPU job: moved to hpc as it is, it adds nothing there
    w.move(node, "hpc")
    assert w.capacity()[hpc, -1] == 16
    other = w.inventory("ai")[0]["name"]
    arrive = w.move(other, "hpc", layout="all-disabled")
    assert w.capacity()[hpc, w._index_of(arrive)] == 24


def test_busy_gpus_count_the_slices_held(tmp_path, helios):
    w = _world(tmp_path, helios)
    w.advance("2020-05-01 01:00")
    names = [n["name"] for n in w.inventory("ai")]
    for name in names:
        w.relayout(name, "all-1g.10gb", minutes=0)
    w.advance("2020-05-01 04:00")
    # 100 jobs packed by name: 56 fill the first node's 8 GPUs, 44 take 44/7 of the second's
    busy = {n["name"]: n["busy_gpus"] for n in w.pool()}
    assert busy[names[0]] == pytest.approx(8.0)
    assert busy[names[1]] == pytest.approx(44 / 7)
    assert busy[names[2]] == 0.0


def test_an_unknown_slice_profile_is_refused_with_its_key():
    raw = _synthetic("1g.11gb")
    with pytest.raises(ScenarioError, match=r"platforms\.ai\.slice_profile: unknown MIG profile '1g.11gb'"):
        scenario_from_dict(raw)


def test_the_virtual_datacenter_refuses_a_slice_platform(tmp_path):
    from gpupool.emulator.serve import make_state

    path = tmp_path / "mig.yaml"
    path.write_text(yaml.safe_dump(_synthetic("1g.10gb")))
    with pytest.raises(ScenarioError, match=r"platforms\.ai\.slice_profile: .*`gpupool simulate` only"):
        make_state(path, speed=0)
    path.write_text(yaml.safe_dump(_synthetic(None)))
    assert make_state(path, speed=0).world.layouts_ is None
