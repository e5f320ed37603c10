"""The what-if's fast path: production's tick between the hourly plans, at its cadence, against the world."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from gpupool.decisions import fastpath as production
from gpupool.decisions.cadence import FASTPATH_CRON, FASTPATH_EVERY
from gpupool.jobs import fastpath as tick
from gpupool.sim import fastpath as sim_fastpath
from gpupool.sim.scenario import ScenarioError, scenario_from_dict
from gpupool.sim.study import simulate

ROOT = Path(__file__).resolve().parents[3]
BASELINE = Path(__file__).parent / "data" / "fastpath_off_baseline.json"


def _surge_yaml(tmp_path, helios, burst: float = 40.0, fastpath: str | None = None) -> str:
    # a: 4 idle nodes; b: 1 node with 8 GPUs of work, `burst` GPUs from 02:10 (mid-hour) on
    b = np.full(6 * 60, 8.0)
    b[130:] = burst
    helios("a", np.zeros(6 * 60), total=32)
    helios("b", b, total=8)
    lines = ["step: 5min", "decision_every: 1h", "node_gpus: 8", "move_minutes: 30", "max_moves_per_decision: 4"]
    if fastpath is not None:
        lines.append(f"fastpath: {fastpath}")
    lines += ["platforms:", "  a: {trace: [a.csv]}", "  b: {trace: [b.csv]}"]
    path = tmp_path / "surge.yaml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_the_cadence_is_defined_once_for_the_dag_and_the_what_if():
    assert tick.FASTPATH_EVERY is FASTPATH_EVERY  # the tick judges its readings on this grid
    assert FASTPATH_CRON == f"*/{int(FASTPATH_EVERY.total_seconds() // 60)} * * * *"
    dag = (ROOT / "dags" / "gpupool_fastpath.py").read_text()
    assert "CronDataIntervalTimetable(FASTPATH_CRON" in dag and '"*/5' not in dag


def test_the_fastpath_key(tmp_path):
    base = {"step": "5min", "start": "2024-01-01", "end": "2024-01-02",
            "platforms": {"s": {"synthetic": {"base": 4, "total_gpus": 16}}}}
    assert scenario_from_dict(base).fastpath == FASTPATH_EVERY  # absent: what the shipped DAG does
    assert scenario_from_dict({**base, "fastpath": False}).fastpath is None  # YAML's bare `off`
    assert scenario_from_dict({**base, "fastpath": "off"}).fastpath is None
    assert scenario_from_dict({**base, "fastpath": "15min"}).fastpath.total_seconds() == 900
    assert yaml.safe_load("fastpath: off")["fastpath"] is False
    for bad, why in (("7min", "whole multiple of step"), (None, "'off'"), ("soon", "not a duration")):
        with pytest.raises(ScenarioError, match=why):
            scenario_from_dict({**base, "fastpath": bad})
    # on a coarser grid the product's cadence is every step (the world changes only there)
    assert scenario_from_dict({**base, "step": "1h", "decision_every": "1h"}).fastpath.total_seconds() == 3600


def test_off_reproduces_the_hourly_study_exactly():
    # BASELINE was written by the study before the fast path existed, on this scenario
    raw = yaml.safe_load((ROOT / "config/scenarios/synthetic-3platforms.yaml").read_text())
    raw.update(end="2024-01-03T00:00:00Z", name="baseline", fastpath="off",
               faults={"seed": 3, "drop": 2, "spike": 2, "gap": 2, "reset": 0.5, "stuck": 0.5})
    sc = scenario_from_dict(raw, base_dir=ROOT / "config/scenarios", where="baseline")
    before = json.loads(BASELINE.read_text())
    energy = {"idle_kwh", "parked_kwh", "energy_kwh", "parked_node_hours", "wakes", "late_wakes"}
    for policy in ("static", "reactive", "oracle"):
        out = json.loads(json.dumps(simulate(sc, policy)))
        for block in (out["total"], *out["platforms"].values()):  # every study counts energy since
            assert energy <= set(block) and block["parked_node_hours"] == 0
            for key in energy:
                del block[key]
        assert out == before[policy], policy


def test_a_burst_between_plans_is_answered_at_the_next_accepted_reading(tmp_path, helios):
    on = simulate(_surge_yaml(tmp_path, helios), "reactive")
    off = simulate(_surge_yaml(tmp_path, helios, fastpath="off"), "reactive")
    # hourly only: the 03:00 plan sees it, its nodes arrive at 03:30: 32 GPUs short for 80 min
    assert off["total"]["unmet_gpu_hours"] == pytest.approx(32 * 80 / 60, abs=1e-3)
    assert "fastpath_moves" not in off["total"] and "fastpath" not in off
    # the fast path: 02:15 reads the burst's first step, which the detect rules flag (an alarm at
    # an event's start) and it is not acted on; 02:20 accepts the next and moves a node; one move
    # per tick until the budget of the hour is spent (02:20..02:35), arriving 30 min later; the
    # 03:00 plan may start none (four already started within the hour)
    assert on["fastpath"] == "5min"
    assert on["total"]["fastpath_moves"] == on["total"]["moves"] == 4
    assert on["platforms"]["b"]["fastpath_moves"] == 4 and on["platforms"]["a"]["fastpath_moves"] == 0
    expected = 32 * 40 / 60 + (24 + 16 + 8) * 5 / 60
    assert on["total"]["unmet_gpu_hours"] == pytest.approx(expected, abs=1e-3)
    # unjudged (--no-clean), the first reading already moves a node: five minutes earlier
    raw = simulate(_surge_yaml(tmp_path, helios), "reactive", clean=False)
    assert raw["total"]["unmet_gpu_hours"] == pytest.approx(expected - 32 * 5 / 60, abs=1e-3)


def test_gpus_on_their_way_count_against_the_shortage(tmp_path, helios):
    # 8 GPUs short: one node answers it; the ticks while it is in transit start no second one
    out = simulate(_surge_yaml(tmp_path, helios, burst=16.0), "reactive", clean=False)
    assert out["platforms"]["b"]["fastpath_moves"] == 1


def test_static_never_moves_and_the_oracle_has_both_cadences(tmp_path, helios):
    path = _surge_yaml(tmp_path, helios)
    static = simulate(path, "static")
    assert static["total"]["moves"] == 0 and static["total"]["fastpath_moves"] == 0 and static["fastpath"] == "off"
    oracle = simulate(path, "oracle")
    assert oracle["total"]["unmet_gpu_hours"] == 0.0 and "fastpath_moves" in oracle["total"]


def test_the_fast_path_decides_with_productions_function(tmp_path, helios, monkeypatch):
    seen = []
    real = sim_fastpath.decide

    def spy(**kwargs):
        seen.append(kwargs)
        return real(**kwargs)

    monkeypatch.setattr(sim_fastpath, "decide", spy)
    assert real is production.decide
    simulate(_surge_yaml(tmp_path, helios), "reactive")
    # a tick every five minutes from the first reading (00:05) to the end (06:00), on the fast
    # path's own rules until the first plan exists (01:00), within the latest plan from then on
    ats = sorted({k["at"] for k in seen})
    assert len(ats) == 6 * 12 - 1 and ats[0].strftime("%H:%M") == "00:05"
    first = seen[0]
    assert set(first) == {"pressures", "plan_bounds", "recent_moves", "open_handovers", "at", "settings"}
    assert first["plan_bounds"].plan_id is None and first["settings"].max_moves_per_hour == 4
    hour = next(k for k in seen if k["at"].strftime("%H:%M") == "01:00")
    assert hour["plan_bounds"].plan_id == 1
    moving = [k for k in seen if k["open_handovers"]]
    assert moving and all(h["to_platform"] == "b" for k in moving for h in k["open_handovers"])


def test_a_bench_passes_the_fast_paths_tuning_in_and_reads_each_ticks_decisions(tmp_path, helios, monkeypatch):
    """No module global to patch: the tuning object goes in through simulate, and each tick's
    decisions (moves and skips, with their reasons) come back in ``fast_log``."""
    seen = []
    real = sim_fastpath.decide

    def spy(**kwargs):
        out = real(**kwargs)
        seen.append((kwargs["at"], kwargs["settings"], out))
        return out

    monkeypatch.setattr(sim_fastpath, "decide", spy)
    ticks: list[dict] = []
    tuned = production.FastPathTuning(headroom=0.5)
    simulate(_surge_yaml(tmp_path, helios), "oracle", fastpath_tuning=tuned, fast_log=ticks)
    assert seen and all(settings.tuning is tuned for _, settings, _ in seen)
    # the oracle is not judged: one decision per tick, and the log holds exactly it
    assert [(t["at"].to_pydatetime(), t["decisions"]) for t in ticks] == [(at, out) for at, _, out in seen]
    assert any(isinstance(d, production.Skip) for t in ticks for d in t["decisions"])
    seen.clear()
    simulate(_surge_yaml(tmp_path, helios), "oracle")
    assert seen and all(settings.tuning == production.FastPathTuning() for _, settings, _ in seen)


def test_telemetry_faults_reach_the_fast_path_and_the_judge_holds_them(tmp_path, helios):
    # flat demand, a spare node on each side: no true shortage, ever; spikes in pending GPUs
    # every few hours read as one. Unjudged, the fast path moves nodes for them; judged, fewer.
    steady = np.full(3 * 24 * 60, 8.0)
    helios("a", steady, total=16)
    helios("b", steady, total=16)
    lines = ["step: 5min", "decision_every: 1h", "node_gpus: 8", "move_minutes: 30", "max_moves_per_decision: 4",
             "faults: {seed: 5, spike: 6}", "platforms:", "  a: {trace: [a.csv]}", "  b: {trace: [b.csv]}"]
    path = tmp_path / "faulty.yaml"
    path.write_text("\n".join(lines) + "\n")
    raw = simulate(str(path), "reactive", clean=False)
    judged = simulate(str(path), "reactive")
    assert raw["total"]["fastpath_moves"] > 0
    assert judged["total"]["fastpath_moves"] < raw["total"]["fastpath_moves"]


def test_the_reports_what_if_shows_the_fast_path_beside_the_hourly_plan(tmp_path):
    import pandas as pd

    from gpupool.report import what_if

    # a: 4 idle nodes; b: 1 node, 40 GPUs wanted from 02:10 (staged platform-level samples)
    ts = pd.date_range("2024-01-01", periods=6 * 12, freq="5min", tz="UTC")
    burst = np.where(ts >= pd.Timestamp("2024-01-01 02:10", tz="UTC"), 32.0, 0.0)
    rows = []
    for p, cap, alloc, pend in (("a", 32.0, 0.0 * burst, 0.0 * burst), ("b", 8.0, 8.0 + 0.0 * burst, burst)):
        for metric, values in (("gpu_capacity", np.full(len(ts), cap)), ("gpu_allocated", alloc), ("gpu_pending", pend)):
            rows.append(pd.DataFrame({"platform": p, "metric": metric, "ts": ts, "value": values}))
    table = what_if(pd.concat(rows, ignore_index=True), tmp_path)
    by = {(r["policy"], r["fastpath"]): r for r in table}
    assert set(by) == {("static", "off"), *((p, f) for p in ("reactive", "predictive", "oracle") for f in ("5min", "off"))}
    assert by[("reactive", "5min")]["fastpath_moves"] > 0 and by[("reactive", "off")]["fastpath_moves"] == 0
    assert by[("reactive", "5min")]["unmet_gpu_hours"] < by[("reactive", "off")]["unmet_gpu_hours"]
    assert by[("static", "off")]["moves"] == 0
