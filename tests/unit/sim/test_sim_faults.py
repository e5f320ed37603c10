"""Telemetry faults: seeded, per series, and only ever what is seen."""

from __future__ import annotations

import numpy as np
import pytest

from gpupool.sim.faults import FaultSpec, corrupt, fault_plan


def test_a_fault_plan_is_the_same_for_the_same_seed_and_series_and_differs_otherwise():
    spec = FaultSpec(seed=4, drop=5, spike=5, gap=5, reset=2, stuck=2)
    a = fault_plan(spec, "slurm", "gpu_allocated", 2000, 288)
    b = fault_plan(spec, "slurm", "gpu_allocated", 2000, 288)
    c = fault_plan(spec, "slurm", "gpu_pending", 2000, 288)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])
    assert not np.array_equal(a["scale"], c["scale"])
    assert not FaultSpec().any() and spec.any()


def test_each_fault_kind_does_what_it_says():
    truth = np.arange(1.0, 101.0)
    n = len(truth)
    plan = {"scale": np.ones(n), "add": np.zeros(n), "hold": np.full(n, -1), "gap": np.zeros(n, dtype=bool)}
    plan["scale"][10:12] = 0.0  # drop
    plan["scale"][20], plan["add"][20] = 4.0, 8.0  # spike
    plan["gap"][30:33] = True  # gap
    plan["scale"][40:43] = [0.0, 1 / 3, 2 / 3]  # reset
    plan["hold"][50:56] = 50  # stuck
    seen, kept = corrupt(truth, plan, 0, n)
    assert list(seen[10:12]) == [0.0, 0.0] and seen[20] == 4 * 21 + 8
    assert not kept[30:33].any() and kept.sum() == n - 3
    assert seen[40] == 0.0 and seen[42] == pytest.approx(43 * 2 / 3)
    assert set(seen[50:56]) == {51.0} and seen[56] == 57.0
    # a window later in the series still repeats a stuck value from before it
    later, _ = corrupt(truth, plan, 53, 60)
    assert list(later[:3]) == [51.0, 51.0, 51.0]


def test_rates_are_events_per_series_per_day():
    spec = FaultSpec(seed=1, spike=3)
    plan = fault_plan(spec, "p", "m", 288 * 200, 288)
    per_day = (plan["scale"] != 1.0).sum() / 200
    assert 2.5 < per_day < 3.5
