"""The closed-loop study: the fluid model to the GPU-hour, policies, the move rules."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from gpupool.decisions.policy import Policy
from gpupool.config import default_config
from gpupool.sim.scenario import scenario_from_dict
from gpupool.sim.study import resolve_policy, simulate
from gpupool.sim.world import World

METRICS = {"demand_gpu_hours", "served_gpu_hours", "unmet_gpu_hours", "capacity_gpu_hours", "utilization", "moves"}
#: what every study counts of energy, parking or not (gpupool.sim.power)
ENERGY = {"idle_kwh", "parked_kwh", "energy_kwh", "parked_node_hours", "wakes", "late_wakes"}


def hourly(values) -> np.ndarray:
    """Per-minute demand holding each of ``values`` for one hour."""
    return np.repeat(np.asarray(values, dtype=float), 60)


def _yaml(tmp_path, platforms: dict[str, str], extra: str = "", fastpath: str | None = "off") -> str:
    """A scenario file; these tests measure the hourly study, so the fast path is ``off`` unless
    ``fastpath`` says otherwise (None: the key absent, the product's default)."""
    lines = ["step: 5min", "decision_every: 1h", "node_gpus: 8", "move_minutes: 30", "max_moves_per_decision: 4"]
    lines.append(f"fastpath: {fastpath}") if fastpath is not None else None
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
    assert set(out["total"]) == METRICS | ENERGY and set(out["platforms"]["a"]) == METRICS | ENERGY
    assert out["platforms"]["a"]["demand_gpu_hours"] == 78.0
    assert out["platforms"]["a"]["served_gpu_hours"] == 60.0
    assert out["platforms"]["a"]["unmet_gpu_hours"] == 18.0
    assert out["platforms"]["a"]["capacity_gpu_hours"] == 64.0
    assert out["platforms"]["a"]["utilization"] == 0.9375
    assert {k: v for k, v in out["total"].items() if k in METRICS} == {
        "demand_gpu_hours": 94.0, "served_gpu_hours": 76.0, "unmet_gpu_hours": 18.0,
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


def _synthetic(days: int = 2, faults: dict | None = None):
    raw = {"start": "2024-01-01", "end": f"2024-01-{1 + days:02d}", "seed": 5,
           "platforms": {"x": {"synthetic": {"base": 30, "total_gpus": 48}},
                         "y": {"synthetic": {"base": 20, "total_gpus": 40, "peak_hour": 3}}}}
    if faults is not None:
        raw["faults"] = faults
    return scenario_from_dict(raw)


def test_predictive_runs_the_pipeline_stages_own_functions(monkeypatch):
    from gpupool.detect import stage as detect_stage
    from gpupool.forecast import stage as forecast_stage

    home = {"fit_detector": detect_stage, "judge_series": detect_stage, "demand_forecast": forecast_stage}
    calls = {"fit_detector": 0, "judge_series": 0, "demand_forecast": []}
    real = {name: getattr(home[name], name) for name in home}

    def spy(name):
        def wrapped(*args, **kwargs):
            if name == "demand_forecast":
                history, horizon, level, warm = args
                calls[name].append((history.index.max(), warm is not None, level))
                calls.setdefault("horizons", set()).add(horizon)
            else:
                calls[name] += 1
            return real[name](*args, **kwargs)
        return wrapped

    for name in real:
        monkeypatch.setattr(home[name], name, spy(name))
    sc = _synthetic(days=3).model_copy(update={"fastpath": None})  # the hourly chain alone
    log: list[dict] = []
    out = simulate(sc, Policy(kind="predictive"), chain_log=log)
    # 2 platforms x 2 demand metrics, refitted at least once each; judged every hour
    assert calls["fit_detector"] >= 2 * 2
    assert calls["judge_series"] == 2 * 2 * 71
    fc = calls["demand_forecast"]
    assert len(fc) == 2 * 71
    # the first hour has no model to start from; once two days of history gave a real model
    # (no fallback), the previous hour's is the warm start, as the forecast stage reads it back
    assert not fc[0][1] and all(warm for _, warm, _ in fc[-20:])
    assert all(level == 90.0 for _, _, level in fc)
    # the forecast stage's horizon (its models are validated on it); the plan reads its first hours
    assert calls["horizons"] == {default_config().limits.horizon_hours} and default_config().limits.horizon_hours > 2
    # each forecast is issued from the hours before the decision only
    assert all(last.minute == 0 for last, _, _ in fc)
    assert {e["platform"] for e in log} == {"x", "y"}
    assert all(len(e["mean"]) == 2 and all(u >= m for m, u in zip(e["mean"], e["upper"])) for e in log)
    t = out["total"]
    assert t["served_gpu_hours"] + t["unmet_gpu_hours"] == pytest.approx(t["demand_gpu_hours"])


def test_a_bench_passes_the_forecast_stages_tuning_in(monkeypatch):
    """``bench/simulate.py --baseline`` searches orders every hour by passing the forecast stage's
    tuning object in, not by changing a module global."""
    from gpupool.forecast import stage as forecast_stage

    tunings = []
    real = forecast_stage.demand_forecast

    def spy(*args, tuning=forecast_stage.ForecastTuning(), **kwargs):
        tunings.append(tuning)
        return real(*args, tuning=tuning, **kwargs)

    monkeypatch.setattr(forecast_stage, "demand_forecast", spy)
    sc = _synthetic(days=1).model_copy(update={"fastpath": None})
    every_hour = forecast_stage.ForecastTuning(order_search_every=None)
    simulate(sc, "predictive", forecast_tuning=every_hour)
    assert tunings and all(t is every_hour for t in tunings)
    tunings.clear()
    simulate(sc, "predictive")
    assert tunings and all(t == forecast_stage.ForecastTuning() for t in tunings)
    assert forecast_stage.ForecastTuning().order_search_every == pd.Timedelta("1D")


def test_the_sim_package_has_no_forecaster_of_its_own():
    import gpupool.sim.study as study

    import re

    source = open(study.__file__).read()
    assert "ArimaForecaster" not in source and "AutoForecaster" not in source
    # the forecast stage's own entry point, the one the forecast task calls, and nothing else
    assert set(re.findall(r"gpupool\.forecast[\w.]*(?: import \w+(?: as \w+)?)?", source)) <= {
        "gpupool.forecast import stage as forecast_stage", "gpupool.forecast.stage.demand_forecast",
        "gpupool.forecast.stage.FORECAST_HISTORY", "gpupool.forecast.stage.warm_start", "gpupool.forecast.stage"}


def test_faults_corrupt_what_the_chain_sees_never_what_the_world_serves():
    faults = {"seed": 3, "drop": 6, "spike": 6, "gap": 6, "reset": 2, "stuck": 2}
    clean_sc, faulty_sc = _synthetic(), _synthetic(faults=faults)
    # the world serves the same demand: static (no chain) is identical
    assert simulate(faulty_sc, "static") == {**simulate(clean_sc, "static"), "scenario": "scenario"}
    world = World(faulty_sc, clock="start")
    from gpupool.sim.study import ReactiveDemand

    source = ReactiveDemand(resolve_policy("reactive", faulty_sc), world)
    t = pd.Timestamp("2024-01-02 12:00", tz="UTC")
    world.advance(t)
    source.demand(t)
    key = ("x", "gpu_allocated")
    truth, seen, cleaned = source.truth[key][: world.clock_index], source.seen[key][: world.clock_index], \
        source.cleaned[key][: world.clock_index]
    assert np.isnan(seen).any() and (np.nan_to_num(seen) != truth).sum() > 20
    # after the first day (the detector's own history), cleaning brings what is seen closer to the truth
    late = slice(288, None)
    err_seen = np.nanmean(np.abs(np.nan_to_num(seen[late]) - truth[late]))
    err_clean = np.nanmean(np.abs(cleaned[late] - truth[late]))
    assert err_clean < 0.5 * err_seen
    raw_source = ReactiveDemand(resolve_policy("reactive", faulty_sc), World(faulty_sc, clock=t), clean=False)
    raw_source.demand(t)
    np.testing.assert_array_equal(raw_source.cleaned[key][: world.clock_index], seen)


def _faulty_yaml(tmp_path, helios, faults: str) -> str:
    helios("a", hourly([4, 6, 5, 4, 30, 30, 28, 6]), total=32)
    helios("b", hourly([20, 22, 30, 40, 10, 8, 8, 8]), total=16)
    return _yaml(tmp_path, {"a": "{trace: [a.csv]}", "b": "{trace: [b.csv]}"}, extra=f"faults: {faults}")


def test_cli_simulate_keeps_its_output_keys_and_measures_cleaning(tmp_path, helios, capsys):
    from gpupool.cli import main

    path = _faulty_yaml(tmp_path, helios, "{seed: 1, drop: 24, spike: 24}")
    outs = {}
    for flag in ([], ["--no-clean"]):
        dest = tmp_path / f"out{len(flag)}.json"
        assert main(["simulate", path, "--policy", "reactive", "--json", str(dest), "--no-progress", *flag]) == 0
        outs[bool(flag)] = json.loads(dest.read_text())
    capsys.readouterr()
    for out in outs.values():
        assert list(out) == ["total", "platforms", "policy", "scenario"] and set(out["total"]) == METRICS | ENERGY
    # the same world served either way; what the chain saw differed, so did its moves or unmet
    assert outs[True]["total"]["demand_gpu_hours"] == outs[False]["total"]["demand_gpu_hours"]


def test_cli_simulate_bad_faults_key_is_one_line(tmp_path, helios, capsys):
    from gpupool.cli import main

    path = _faulty_yaml(tmp_path, helios, "{seed: 1, dropz: 2}")
    assert main(["simulate", path, "--policy", "reactive", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "faults.dropz" in err


def test_the_what_if_table_says_why_a_policy_left_more_unmet_than_static():
    from gpupool.report import _explain_worse_than_static

    rows = [{"policy": "static", "unmet_gpu_hours": 10.0, "capacity_gpu_hours": 100.0, "moves": 0},
            {"policy": "reactive", "unmet_gpu_hours": 12.5, "capacity_gpu_hours": 96.0, "moves": 1},
            {"policy": "oracle", "unmet_gpu_hours": 4.0, "capacity_gpu_hours": 96.0, "moves": 1}]
    _explain_worse_than_static(rows)
    assert "note" not in rows[0] and "note" not in rows[2]
    assert rows[1]["note"].startswith("2.5 GPU-h more unmet than static: its 1 moves took 4.0 GPU-h")
