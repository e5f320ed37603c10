"""Energy in the what-if: every study counts it; parking parks idle nodes and wakes them."""

from __future__ import annotations

import numpy as np
import pytest

from gpupool.sim.power import ParkingSpec
from gpupool.sim.scenario import ScenarioError, scenario_from_dict
from gpupool.sim.study import simulate

ENERGY_KEYS = {"idle_kwh", "parked_kwh", "energy_kwh", "parked_node_hours", "wakes", "late_wakes"}


def _scenario(tmp_path, helios, parking=None, b_demand=None, hours=12, fastpath=None):
    # a: 4 nodes, one busy; b: 2 nodes, one busy, then a burst to 3 nodes' worth
    steps = hours * 60
    helios("a", np.full(steps, 8.0), total=32)
    b = np.full(steps, 8.0) if b_demand is None else b_demand
    helios("b", b, total=16)
    raw = {"step": "5min", "decision_every": "1h", "node_gpus": 8, "move_minutes": 30,
           "max_moves_per_decision": 4, "name": "power",
           "platforms": {"a": {"trace": ["a.csv"]}, "b": {"trace": ["b.csv"]}}}
    if parking is not None:
        raw["parking"] = parking
    if fastpath is not None:
        raw["fastpath"] = fastpath
    return scenario_from_dict(raw, base_dir=tmp_path)


def test_the_parking_key(tmp_path, helios):
    assert _scenario(tmp_path, helios).parking is None
    assert _scenario(tmp_path, helios, parking=False).parking is None  # YAML's bare `off`
    assert _scenario(tmp_path, helios, parking="off").parking is None
    assert _scenario(tmp_path, helios, parking="on").parking == ParkingSpec()
    assert _scenario(tmp_path, helios, parking={"wake_minutes": 3}).parking.wake_minutes == 3
    for bad, why in (({"wake_minute": 3}, "parking.wake_minute"), ({"buffer": -1}, "parking.buffer"),
                     ("soon", "parking: give 'off'")):
        with pytest.raises(ScenarioError, match=why):
            _scenario(tmp_path, helios, parking=bad)


def test_every_study_counts_idle_energy_and_off_changes_no_figure(tmp_path, helios):
    absent = simulate(_scenario(tmp_path, helios), "reactive")
    off = simulate(_scenario(tmp_path, helios, parking="off"), "reactive")
    assert off == absent
    for block in (absent["total"], *absent["platforms"].values()):
        assert ENERGY_KEYS <= set(block)
    # nothing parks: a's three idle nodes and b's idle one draw 1.4 kW each, 12 hours
    assert absent["total"]["idle_kwh"] == pytest.approx(4 * 1.4 * 12)
    assert absent["total"]["parked_node_hours"] == 0 and absent["total"]["wakes"] == 0
    # two busy nodes at 6.5 kW beside them
    assert absent["total"]["energy_kwh"] == pytest.approx(4 * 1.4 * 12 + 2 * 6.5 * 12)


def test_parking_saves_idle_energy_without_adding_unmet(tmp_path, helios):
    off = simulate(_scenario(tmp_path, helios), "reactive")
    on = simulate(_scenario(tmp_path, helios, parking={"buffer": 1}), "reactive")
    assert on["total"]["unmet_gpu_hours"] == off["total"]["unmet_gpu_hours"]
    assert on["total"]["idle_kwh"] < 0.5 * off["total"]["idle_kwh"]
    assert on["total"]["parked_node_hours"] > 0
    assert on["total"]["parked_kwh"] == pytest.approx(on["total"]["parked_node_hours"] * 0.04)
    # what parking adds to the figures is only energy: the served hours are the same
    assert on["total"]["served_gpu_hours"] == off["total"]["served_gpu_hours"]


def test_a_burst_wakes_parked_nodes_and_a_wake_after_its_shortage_began_is_late(tmp_path, helios):
    b = np.full(12 * 60, 8.0)
    b[6 * 60:] = 16.0  # a step up at 06:00: b's parked node must wake
    per = simulate(_scenario(tmp_path, helios, parking={"buffer": 0, "scope": "platform", "wake_minutes": 10},
                             b_demand=b), "reactive")
    blk = per["platforms"]["b"]
    assert blk["wakes"] >= 1 and blk["late_wakes"] >= 1  # woken on the shortage: late by definition
    assert blk["unmet_gpu_hours"] > 0
    # unmet while waking: the shortage lasts the wake (10 min) plus the tick that saw it
    assert blk["unmet_gpu_hours"] <= 8 * (15 / 60) + 1e-6


def test_the_pool_rule_wakes_ahead_of_a_rise_the_per_platform_rule_after_it(tmp_path, helios):
    b = np.full(12 * 60, 4.0)
    b[6 * 60:7 * 60] = np.linspace(4.0, 24.0, 60)  # b rises over an hour, from half a node to three
    b[7 * 60:] = 24.0
    runs = {scope: simulate(_scenario(tmp_path, helios, b_demand=b, parking={"buffer": 0, "scope": scope}),
                            "reactive")["platforms"]["b"] for scope in ("pool", "platform")}
    assert runs["platform"]["wakes"] >= 1 and runs["platform"]["late_wakes"] >= 1
    assert runs["pool"]["unmet_gpu_hours"] < runs["platform"]["unmet_gpu_hours"]
    assert runs["pool"]["late_wakes"] <= runs["platform"]["late_wakes"]
