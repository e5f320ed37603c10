"""The synthetic generator: seeded, reproducible, with ground truth that matches what it injected."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pandas.testing as pdt

from gpupool.sim.synthetic import (
    SyntheticSpec,
    generate,
    glitch_factors,
    load_ground_truth,
    save_ground_truth,
)

SPEC = SyntheticSpec(base=50, anomalies={"point": 2, "drop": 2, "spike": 2, "gap": 1, "counter_reset": 1})


def test_same_seed_same_frames_and_other_seed_differs():
    d1, a1 = generate(SPEC, "2024-01-01", "2024-01-08", "5min", seed=7)
    d2, a2 = generate(SPEC, "2024-01-01", "2024-01-08", "5min", seed=7)
    pdt.assert_frame_equal(d1, d2)
    pdt.assert_frame_equal(a1, a2)
    d3, _ = generate(SPEC, "2024-01-01", "2024-01-08", "5min", seed=8)
    assert not np.allclose(d1["demand"], d3["demand"])
    assert len(d1) == 7 * 288
    assert (d1["demand"] >= 0).all()
    assert set(a1["kind"]) <= {"point", "drop", "spike", "gap", "counter_reset"}
    assert len(a1) > 0


def test_ground_truth_describes_the_observed_series():
    demand, truth = generate(SPEC, "2024-01-01", "2024-01-15", "5min", seed=3)
    observed, true = demand["observed"].to_numpy(), demand["demand"].to_numpy()
    factor, gap = glitch_factors(demand.index, truth)
    assert np.isnan(observed[gap]).all()
    assert np.allclose(observed[~gap], true[~gap] * factor[~gap])
    drops = truth[truth["kind"] == "drop"]
    assert len(drops) > 0  # the loop below must check something
    for row in drops.itertuples():
        window = demand.loc[(demand.index >= row.start) & (demand.index < row.end), "observed"]
        assert (window == 0).all()
    # outside any exporter anomaly the exporter reports the truth
    untouched = (factor == 1.0) & ~gap
    assert np.array_equal(observed[untouched], true[untouched])


def test_point_anomalies_are_real_demand_surges():
    quiet = SPEC.model_copy(update={"anomalies": SPEC.anomalies.model_copy(update={"point": 0.0})})
    with_points, truth = generate(SPEC, "2024-01-01", "2024-01-08", "5min", seed=11)
    without, quiet_truth = generate(quiet, "2024-01-01", "2024-01-08", "5min", seed=11)
    points = truth[truth["kind"] == "point"]
    assert (points["layer"] == "demand").all() and len(points) > 0
    assert (quiet_truth["kind"] != "point").all()
    at = with_points.index.get_indexer(pd.DatetimeIndex(points["start"]))
    # the same seed without point anomalies gives the same demand everywhere else, and at each
    # point the surge is exactly what the ground truth says: base x magnitude more demand
    surge = with_points["demand"].to_numpy() - without["demand"].to_numpy()
    elsewhere = np.ones(len(surge), dtype=bool)
    elsewhere[at] = False
    assert np.array_equal(surge[elsewhere], np.zeros(elsewhere.sum()))
    np.testing.assert_allclose(surge[at], SPEC.base * points["magnitude"].to_numpy(), atol=0.011)
    # a point is a real surge: the platform saw it, so it is in the true demand, not only observed
    neighbours = (with_points["demand"].shift(1) + with_points["demand"].shift(-1)).to_numpy() / 2
    assert (with_points["demand"].to_numpy()[at] > neighbours[at]).mean() > 0.8


def test_ground_truth_round_trips_through_csv(tmp_path):
    _, truth = generate(SPEC, "2024-01-01", "2024-01-04", "5min", seed=1)
    path = tmp_path / "truth.csv"
    save_ground_truth(truth, path)
    back = load_ground_truth(path)
    pdt.assert_frame_equal(back[["start", "end", "kind", "layer"]], truth[["start", "end", "kind", "layer"]])
    assert np.allclose(back["magnitude"], truth["magnitude"], equal_nan=True)
