"""Ownership in the what-if: the reclaim against the world, the limits, what the study reports,
and a scenario without ownership keys giving the figures it gave before ownership existed."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from gpupool.sim.scenario import ScenarioError, scenario_from_dict
from gpupool.sim.study import simulate
from gpupool.sim.whatif import whatif_scenario

ROOT = Path(__file__).resolve().parents[3]
BASELINE = Path(__file__).parent / "data" / "ownership_off_baseline.json"
KEYS = {"owned_gpus", "lent_gpu_hours", "borrowed_gpu_hours", "regret_gpu_hours", "reclaims", "preempted_gpu_hours",
        "served_less_gpu_hours", "served_less_beyond_deadline_gpu_hours"}


def _lend_then_need(tmp_path, helios, a_keys: str) -> str:
    # a: 4 idle nodes until 03:00, then 32 GPUs of work; b: 1 node, 40 GPUs of work from 01:10 on.
    # The fast path lends a's nodes to b, where they run b's work; at 03:00 a needs them back
    a = np.zeros(6 * 60)
    a[180:] = 32
    b = np.full(6 * 60, 8.0)
    b[70:] = 40
    helios("a", a, total=32)
    helios("b", b, total=8)
    path = tmp_path / "lend.yaml"
    path.write_text("\n".join(["step: 5min", "decision_every: 1h", "node_gpus: 8", "move_minutes: 30",
                               "max_moves_per_decision: 4", "platforms:", f"  a: {{trace: [a.csv], {a_keys}}}",
                               "  b: {trace: [b.csv]}"]) + "\n")
    return str(path)


def test_an_owner_reclaims_its_lent_nodes_within_its_deadline(tmp_path, helios):
    out = simulate(_lend_then_need(tmp_path, helios, "reclaim_minutes: 60"), "reactive")
    a, b = out["platforms"]["a"], out["platforms"]["b"]
    assert KEYS <= set(a) and KEYS <= set(b) and KEYS <= set(out["total"])
    assert a["owned_gpus"] == 32 and b["owned_gpus"] == 8 and out["total"]["owned_gpus"] == 40
    assert b["fastpath_moves"] == 4 and a["lent_gpu_hours"] == b["borrowed_gpu_hours"] > 0
    # the first reading of a's work (03:05) is the start of an event the detect rules flag; the
    # next (03:10) reclaims all four, busy with b's work: back at 03:40, 35 minutes after the need
    assert a["reclaims"] == {"count": 4, "late": 0, "p50_minutes": 35.0, "p95_minutes": 35.0, "max_minutes": 35.0}
    assert b["reclaims"]["count"] == 0 and b["preempted_gpu_hours"] > 0 and a["preempted_gpu_hours"] == 0
    # regret: a's unmet against keeping its nodes (0 unmet); b gained from borrowing
    assert a["regret_gpu_hours"] == pytest.approx(a["unmet_gpu_hours"]) and b["regret_gpu_hours"] < 0
    assert a["unmet_gpu_hours"] == pytest.approx(32 * 40 / 60, abs=1e-3)
    # all of a's served less (it had no other regret) fell within the promise: the tick before its
    # need was read (03:00-03:05) and the reclaim's 35 minutes
    assert a["served_less_gpu_hours"] == pytest.approx(a["unmet_gpu_hours"], abs=1e-3)
    assert a["served_less_beyond_deadline_gpu_hours"] == 0 and b["served_less_gpu_hours"] == 0
    # a deadline of 30 minutes cannot wait for the next reading: the flagged one reclaims at 03:05
    tight = simulate(_lend_then_need(tmp_path, helios, "reclaim_minutes: 30"), "reactive")["platforms"]["a"]
    assert tight["reclaims"] == {"count": 4, "late": 0, "p50_minutes": 30.0, "p95_minutes": 30.0, "max_minutes": 30.0}
    assert tight["served_less_beyond_deadline_gpu_hours"] == 0
    # 20 minutes no move can keep: each reclaim is late, and what a served less after the deadline
    # (03:25 on: the need read at 03:05) is beyond the promise
    late = simulate(_lend_then_need(tmp_path, helios, "reclaim_minutes: 20"), "reactive")
    assert late["platforms"]["a"]["reclaims"]["late"] == 4
    short = late["platforms"]["a"]
    assert short["served_less_beyond_deadline_gpu_hours"] == pytest.approx(32 * 10 / 60, abs=1e-3)
    assert short["served_less_gpu_hours"] == pytest.approx(short["unmet_gpu_hours"], abs=1e-3)


def test_busy_borrowed_work_runs_its_minimum_first_and_a_lend_limit_holds(tmp_path, helios):
    # b's work on a's nodes ran about 80 minutes at 03:10: a minimum of 10 hours keeps them there
    kept = simulate(_lend_then_need(tmp_path, helios, "reclaim_minutes: 60, min_runtime_minutes: 600"), "reactive")
    assert kept["platforms"]["a"]["reclaims"]["count"] == 0 and kept["total"]["preempted_gpu_hours"] == 0
    assert kept["platforms"]["a"]["unmet_gpu_hours"] == pytest.approx(32 * 3, abs=1e-3)
    one = simulate(_lend_then_need(tmp_path, helios, "lend_limit: 1"), "reactive")
    assert one["platforms"]["b"]["moves"] == 1 and one["platforms"]["b"]["borrowed_gpu_hours"] <= 8 * 6


def test_static_reports_no_regret_and_a_bad_key_is_refused(tmp_path, helios):
    out = simulate(_lend_then_need(tmp_path, helios, "owns: 2"), "static")
    assert out["platforms"]["a"]["owned_gpus"] == 16 and out["platforms"]["b"]["owned_gpus"] == 8
    assert all(block["regret_gpu_hours"] == 0 and block["lent_gpu_hours"] == 0 for block in out["platforms"].values())
    with pytest.raises(ScenarioError, match="lend_limit"):
        simulate(_lend_then_need(tmp_path, helios, "lend_limit: -1"), "static")
    # `gpupool whatif`'s scenario takes the same keys per platform
    sc, raw = whatif_scenario({"slurm": [str(tmp_path / "a.csv")]}, {"slurm": None},
                              ownership={"slurm": {"reclaim_minutes": 30, "owns": 2}})
    assert raw["platforms"]["slurm"]["reclaim_minutes"] == 30
    assert sc.ownership()["slurm"].owns == 2 and sc.ownership()["slurm"].reclaim_minutes == 30


def test_without_ownership_keys_the_figures_are_those_before_ownership():
    # BASELINE was written by the study at the commit before ownership (094f380), on this scenario
    raw = yaml.safe_load((ROOT / "config/scenarios/synthetic-3platforms.yaml").read_text())
    raw.update(end="2024-01-03T00:00:00Z", name="baseline")
    sc = scenario_from_dict(raw, base_dir=ROOT / "config/scenarios", where="baseline")
    before = json.loads(BASELINE.read_text())
    out = json.loads(json.dumps(simulate(sc, "reactive")))
    assert not KEYS & set(out["total"])
    assert out == before["reactive"]
