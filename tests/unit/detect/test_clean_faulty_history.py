"""A history that carries exporter faults itself: its scales are read without them, and a move
still open at the end of the data is cleaned only when the demand does not move like that."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from gpupool.detect.clean import FittedSeriesModel, fit_series_model, score_window
from gpupool.detect.rules.faults import fault_shaped
from gpupool.detect.settings import CleaningRules, RouterConfig

#: both rules are off by default (docs/decisions/0006-fault-shape-knobs-off.md); these tests turn them on
ROBUST = RouterConfig(cleaning=CleaningRules(scales_without_fault_shapes=True))
OPEN = RouterConfig(cleaning=CleaningRules(open_move_factor=3.0))


def gpu_count(n: int = 2016, seed: int = 7, level: float = 80.0, step_p: float = 0.08) -> pd.Series:
    """A platform's GPUs allocated: holds a value, now and then steps by a few GPUs (5-minute steps)."""
    rng = np.random.default_rng(seed)
    moves = np.where(rng.random(n) < step_p, rng.choice([-3, -2, -1, 1, 2, 3], n) * 1.6, 0.0)
    values = np.clip(level + np.cumsum(moves), 40.0, 120.0)
    idx = pd.date_range("2025-01-06", periods=n, freq="5min", tz="UTC")
    return pd.Series(values, index=idx, name="gpu_allocated")


def with_faults(y: pd.Series, seed: int = 1, per_day: float = 4.0) -> pd.Series:
    """Drops to zero (1-3 points) and one-point spikes (4 x the value + 8), each `per_day` a day."""
    rng = np.random.default_rng(seed)
    out = y.to_numpy().copy()
    rate = per_day / 288
    for s in np.flatnonzero(rng.random(out.size) < rate):
        out[s : s + int(rng.integers(1, 4))] = 0.0
    for s in np.flatnonzero(rng.random(out.size) < rate):
        out[s] = 4.0 * out[s] + 8.0
    return pd.Series(out, index=y.index, name=y.name)


def test_fault_shapes_are_drops_between_readings_and_towering_single_points():
    v = np.array([90, 90, 0, 90, 90, 0, 0, 90, 300, 90, 0, 24, 48, 90, 0, 0, 5, 0, 0, 0, 0, 8, 0], dtype=float)
    # drops of 1 and 2 points, a spike, a reset's fall, a fall between two readings; a count
    # idling at zero for longer, or rising from zero, has no such points
    assert list(np.flatnonzero(fault_shaped(v, 0.1, 3, 3.0))) == [2, 5, 6, 8, 10, 14, 15]


def test_a_faulty_historys_scales_are_its_demands_not_its_faults():
    truth = gpu_count()
    clean = fit_series_model(truth, ROBUST, detector="zscore")
    faulty = fit_series_model(with_faults(truth), ROBUST, detector="zscore")
    # at faults on ~3 % of the steps, the 0.99 quantile of peak heights and the typical step would be
    # the faults' own (tens of GPUs): the spike bar and τ would let the next faults pass
    assert faulty.excursion_scale_ <= clean.excursion_scale_ + 1.6
    assert faulty.residual_scale_ <= 1.5 * clean.residual_scale_
    assert faulty.step_scale_ <= clean.step_scale_ + 1.6
    again = FittedSeriesModel.from_params(json.loads(json.dumps(faulty.to_params(), allow_nan=False)))
    assert again.step_scale_ == faulty.step_scale_ and again.excursion_scale_ == faulty.excursion_scale_
    # off (the default), and on a fault-free history, the rule changes nothing
    assert fit_series_model(with_faults(truth), detector="zscore").excursion_scale_ > 10 * faulty.excursion_scale_
    assert fit_series_model(truth, detector="zscore").excursion_scale_ == clean.excursion_scale_


def test_a_spike_after_a_faulty_history_is_cleaned():
    y = gpu_count(n=2304)
    y.iloc[:2016] = with_faults(y.iloc[:2016])
    start = y.index[2016]
    model = fit_series_model(y.iloc[:2016], ROBUST, detector="zscore")
    y.iloc[2100] = 4.0 * y.iloc[2099] + 8.0
    y.iloc[2200:2202] = 0.0
    out = score_window(model, y, start, None, ROBUST)
    for i in (2100, 2200, 2201):
        assert out["cleaned"].loc[y.index[i]]
        assert abs(out["clean_value"].loc[y.index[i]] - y.iloc[i - 1 if i != 2201 else 2199]) < 10


def test_an_ordinary_step_at_the_end_of_the_data_is_kept_a_spike_is_not():
    y = gpu_count(n=2100, seed=3, step_p=0.15)
    model = fit_series_model(y.iloc[:2016], OPEN, detector="svr")
    start = y.index[2016]
    bar = OPEN.cleaning.open_move_factor * model.step_scale_
    assert model.tau_ < bar  # a step between the two is flagged, and is the demand's own size
    stepped = y.iloc[:2060].copy()
    stepped.iloc[-1] = stepped.iloc[-2] + 0.5 * (model.tau_ + bar)
    out = score_window(model, stepped, start, None, OPEN)
    assert not out["cleaned"].iloc[-1]
    assert out["clean_value"].iloc[-1] == stepped.iloc[-1]
    dropped = y.iloc[:2060].copy()
    dropped.iloc[-1] = dropped.iloc[-2] - 0.5 * (model.tau_ + bar)
    assert not score_window(model, dropped, start, None, OPEN)["cleaned"].iloc[-1]
    spiked = y.iloc[:2060].copy()
    spiked.iloc[-1] = 4.0 * spiked.iloc[-2] + 8.0
    assert score_window(model, spiked, start, None, OPEN)["cleaned"].iloc[-1]
    zeroed = y.iloc[:2060].copy()
    zeroed.iloc[-1] = 0.0
    assert score_window(model, zeroed, start, None, OPEN)["cleaned"].iloc[-1]
    # off (the default): the open step is cleaned as a point anomaly, as before
    off = fit_series_model(y.iloc[:2016], detector="svr")
    assert score_window(off, stepped, start, None)["cleaned"].iloc[-1]
