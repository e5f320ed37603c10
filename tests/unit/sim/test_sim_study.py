"""The closed-loop study: the fluid model to the GPU-hour, policies, the move rules."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from gpupool.allocate.policy import Policy
from gpupool.forecast.arima import ArimaForecaster
from gpupool.sim.scenario import scenario_from_dict
from gpupool.sim.study import PredictiveDemand, resolve_policy, simulate
from gpupool.sim.world import World

METRICS = {"demand_gpu_hours", "served_gpu_hours", "unmet_gpu_hours", "capacity_gpu_hours", "utilization", "moves"}


def hourly(values) -> np.ndarray:
    """Per-minute demand holding each of ``values`` for one hour."""
    return np.repeat(np.asarray(values, dtype=float), 60)


def _yaml(tmp_path, platforms: dict[str, str], extra: str = "") -> str:
    lines = ["step: 5min", "decision_every: 1h", "node_gpus: 8", "move_minutes: 30", "max_moves_per_decision: 4"]
    lines.append(extra) if extra else None
    lines.append("platforms:")
    lines += [f"  {name}: {spec}" for name, spec in platforms.items()]
    path = tmp_path / "study.yaml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_static_reproduces_the_hand_computed_fluid_model(tmp_path, helios):
    # a: traced 10 GPUs -> 2 nodes (16 GPUs); demand 12, 20, 16, 30 -> unmet 0 + 4 + 0 + 14 = 18
    # b: traced 8 GPUs -> 1 node; demand 4 every hour -> unmet 0
    helios("a", hourly([12, 20, 16, 30]), total=10)
    helios("b", hourly([4, 4, 4, 4]), total=8)
    path = _yaml(tmp_path, {"a": "{trace: [a.csv]}", "b": "{trace: b.csv}"})
    out = simulate(path, "static")
    assert list(out) == ["total", "platforms", "policy", "scenario"]
    assert out["policy"] == "static" and out["scenario"] == "study"
    assert set(out["total"]) == METRICS and set(out["platforms"]["a"]) == METRICS
    assert out["platforms"]["a"]["demand_gpu_hours"] == 78.0
    assert out["platforms"]["a"]["served_gpu_hours"] == 60.0
    assert out["platforms"]["a"]["unmet_gpu_hours"] == 18.0
    assert out["platforms"]["a"]["capacity_gpu_hours"] == 64.0
    assert out["platforms"]["a"]["utilization"] == 0.9375
    assert out["total"] == {"demand_gpu_hours": 94.0, "served_gpu_hours": 76.0, "unmet_gpu_hours": 18.0,
                            "capacity_gpu_hours": 96.0, "utilization": round(76 / 96, 6), "moves": 0}
    json.dumps(out)  # the CLI writes it as JSON


def _surge(tmp_path, helios):
    # a: 4 idle nodes; b: 1 node, demand 8 for three hours then 40 for three hours
    helios("a", hourly([0] * 6), total=32)
    helios("b", hourly([8, 8, 8, 40, 40, 40]), total=8)
    return _yaml(tmp_path, {"a": "{trace: [a.csv]}", "b": "{trace: [b.csv]}"})


def test_policies_on_a_surge(tmp_path, helios):
    path = _surge(tmp_path, helios)
    static = simulate(path, "static")
    reactive = simulate(path, "reactive")
    oracle = simulate(path, "oracle")
    assert static["total"]["unmet_gpu_hours"] == 96.0
    # reactive sees the surge after its first hour and its nodes arrive 30 min later: 32 + 16
    assert reactive["total"]["unmet_gpu_hours"] == 48.0
    assert reactive["platforms"]["b"]["moves"] == 4 and reactive["platforms"]["a"]["moves"] == 0
    # the oracle moves an hour ahead and meets all of it
    assert oracle["total"]["unmet_gpu_hours"] == 0.0
    assert oracle["total"]["moves"] == 4
    for out in (static, reactive, oracle):
        t = out["total"]
        assert t["served_gpu_hours"] + t["unmet_gpu_hours"] == pytest.approx(t["demand_gpu_hours"])
    # capacity lost in transit: 4 nodes x 8 GPUs x 0.5 h
    assert static["total"]["capacity_gpu_hours"] - oracle["total"]["capacity_gpu_hours"] == 16.0


def test_a_node_leaves_only_when_its_platform_has_a_node_of_idle_gpus(tmp_path, helios):
    # a: 2 nodes with 9 GPUs of work -> 7 idle GPUs: not one whole node may leave
    helios("a", hourly([9] * 6), total=16)
    helios("b", hourly([40] * 6), total=8)
    path = _yaml(tmp_path, {"a": "{trace: [a.csv]}", "b": "{trace: [b.csv]}"})
    for policy in ("reactive", "oracle"):
        out = simulate(path, policy)
        assert out["total"]["moves"] == 0
        assert out["total"]["unmet_gpu_hours"] == simulate(path, "static")["total"]["unmet_gpu_hours"]


def test_plans_come_from_the_planner_and_respect_the_scenario(tmp_path, helios):
    path = _surge(tmp_path, helios)
    plans = []
    simulate(path, "reactive", plans=plans)
    assert plans and all(p.solver in ("milp", "none") for p in plans)
    assert all(len(p.moves) <= 4 for p in plans)
    sc = scenario_from_dict({"max_moves_per_decision": 2, "move_minutes": 10, "policy": {"move_cost": 3},
                             "platforms": {"a": {"trace": str(tmp_path / "a.csv")}}})
    pol = resolve_policy("predictive", sc)
    assert (pol.kind, pol.max_moves_per_decision, pol.move_minutes, pol.move_cost) == ("predictive", 2, 10.0, 3.0)
    with pytest.raises(ValueError, match="unknown policy"):
        resolve_policy("clairvoyant", sc)


def test_predictive_uses_the_arima_forecaster_on_a_synthetic_world():
    raw = {"start": "2024-01-01", "end": "2024-01-03", "seed": 5,
           "platforms": {"x": {"synthetic": {"base": 30, "total_gpus": 48}},
                         "y": {"synthetic": {"base": 20, "total_gpus": 40, "peak_hour": 3}}}}
    sc = scenario_from_dict(raw)
    world = World(sc, clock="start")
    source = PredictiveDemand(resolve_policy("predictive", sc), world)
    t = pd.Timestamp("2024-01-02 06:00", tz="UTC")
    world.advance(t)
    demand = source.demand(t)
    assert all(isinstance(m, ArimaForecaster) for m in source.models.values())
    for d in demand.values():
        assert len(d.mean) == 2 and all(u >= m for m, u in zip(d.mean, d.upper))
    out = simulate(sc, Policy(kind="predictive"))
    t = out["total"]
    assert t["served_gpu_hours"] + t["unmet_gpu_hours"] == pytest.approx(t["demand_gpu_hours"])
    assert t["unmet_gpu_hours"] <= simulate(sc, "static")["total"]["unmet_gpu_hours"] + 1e-6
