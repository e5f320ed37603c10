"""What cleaning puts in place of a fault: the series' own readings around it, where it has them."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from gpupool.detect.clean import FittedSeriesModel, detect_and_clean, fit_series_model, stream_detect
from gpupool.detect.settings import CleaningRules, RouterConfig


def level_series(n: int = 1200, seed: int = 5, level: float = 10.0) -> pd.Series:
    rng = np.random.default_rng(seed)
    idx = pd.date_range("2025-01-06", periods=n, freq="5min", tz="UTC")
    return pd.Series(level + rng.normal(0, 0.5, n), index=idx, name="gpu_allocated")


def line(before: float, after: float, points: int) -> np.ndarray:
    return before + (after - before) * np.arange(1, points + 1) / (points + 1)


def test_a_short_gap_is_bridged_between_the_readings_on_both_sides():
    y = level_series()
    y.iloc[800:803] = np.nan
    out = stream_detect(y, detector="svr")
    assert out["filled"].iloc[800:803].all()
    np.testing.assert_allclose(out["clean_value"].iloc[800:803], line(y.iloc[799], y.iloc[803], 3))


def test_a_gap_at_the_end_of_the_data_is_filled_from_the_model():
    y = level_series(n=900)
    y.iloc[-2:] = np.nan  # nothing after it yet: no line to draw
    out = stream_detect(y, detector="svr")
    assert out["filled"].iloc[-2:].all()
    np.testing.assert_allclose(out["clean_value"].iloc[-2:], out["expected"].iloc[-2:])


def test_a_drop_is_replaced_by_the_line_from_the_reading_before_it_to_the_one_after():
    y = level_series()
    y.iloc[700:702] = 0.0
    out = stream_detect(y, detector="svr")
    assert out["cleaned"].iloc[700:702].all()
    np.testing.assert_allclose(out["clean_value"].iloc[700:702], line(y.iloc[699], y.iloc[702], 2))


def test_a_stuck_run_followed_by_a_drop_is_not_lined_down_to_the_drop():
    truth = level_series()
    y = truth.copy()
    y.iloc[701:713] = y.iloc[700]  # the exporter repeats its last reading for an hour ...
    y.iloc[713:715] = 0.0  # ... then reads zero
    out = stream_detect(y, detector="svr")
    assert out["cleaned"].iloc[701:715].all()
    # the line runs to the drop's cleaned value, near the level, not down to zero
    assert (out["clean_value"].iloc[701:715] > 8.0).all()


def square_wave(n: int = 2400, seed: int = 3) -> pd.Series:
    """Demand stepping between 32 and 64 GPUs every three hours: a rolling mean sits between
    them, so its residual spread, and τ, are wider than a fall to zero."""
    idx = pd.date_range("2025-01-06", periods=n, freq="5min", tz="UTC")
    values = np.where((np.arange(n) // 36) % 2 == 0, 32.0, 64.0)
    return pd.Series(values, index=idx, name="gpu_demand")


def test_a_counter_reset_no_flag_caught_is_told_by_its_shape():
    truth = square_wave()
    y = truth.copy()
    k = 16
    at = 36 * 55 + 4  # on a plateau at 64
    assert truth.iloc[at - 1 : at + k + 1].eq(64.0).all()
    y.iloc[at : at + k] = truth.iloc[at : at + k] * np.arange(k) / k
    out = stream_detect(y, detector="zscore")
    assert not out["is_anomaly"].iloc[at], "no flag: τ is wider than the fall"
    assert out["cleaned"].iloc[at : at + k].all()
    np.testing.assert_allclose(out["clean_value"].iloc[at + 1 : at + k], 64.0, atol=1e-9)
    assert not out["cleaned"].iloc[at + k :].any()


def test_a_fall_and_a_climb_that_is_not_a_ramp_is_kept():
    y = square_wave()
    at = 36 * 55 + 4
    y.iloc[at] = 0.0  # one reading at zero that jumps straight back: no ramp
    y.iloc[at + 1 : at + 3] = [60.0, 62.0]
    out = stream_detect(y, detector="zscore")
    assert not out["cleaned"].iloc[at + 1 : at + 3].any()


def test_an_outage_on_a_series_that_never_idles_is_cleaned_unless_switched_off():
    y = level_series()
    y.iloc[900:912] = 0.0  # an hour at zero, on a series that never idled before
    default = stream_detect(y, detector="svr")
    assert default["cleaned"].iloc[900:912].all()
    assert (default["clean_value"].iloc[900:912] - 10.0).abs().max() < 2.0
    off = stream_detect(y, RouterConfig(cleaning=CleaningRules(outage_max_idle_share=None)), detector="svr")
    assert not off["cleaned"].iloc[900:912].any()


def test_a_fall_longer_than_a_fault_run_is_idle_even_on_a_series_that_never_idles():
    y = level_series()
    y.iloc[900:960] = 0.0  # five hours at zero: longer than `max_fault_run` (3 h)
    out = stream_detect(y, detector="svr")
    assert not out["cleaned"].iloc[900:960].any()


def test_a_series_that_idles_keeps_its_idle_hours_with_the_outage_rule_on():
    y = level_series(n=2016)
    for day in range(7):  # an idle hour every day
        y.iloc[day * 288 + 100 : day * 288 + 112] = 0.0
    y.iloc[1900:1912] = 0.0
    cfg = RouterConfig()
    out = stream_detect(y, cfg, detector="svr")
    assert not out["cleaned"].iloc[1900:1912].any()
    model = fit_series_model(y.iloc[:1800], cfg, detector="svr")
    assert model.idle_share_ > 0.01


def test_the_idle_share_is_kept_with_the_model_and_an_old_model_has_none():
    model = fit_series_model(level_series(), detector="svr")
    assert model.idle_share_ == 0.0
    params = model.to_params()
    assert FittedSeriesModel.from_params(params).idle_share_ == 0.0
    del params["idle_share"]
    assert np.isnan(FittedSeriesModel.from_params(params).idle_share_)


def test_detect_and_clean_bridges_a_spike_between_its_neighbours():
    y = level_series()
    y.iloc[1000] = 30.0
    out = detect_and_clean(y, detector="svr", score_from=y.index[600])
    assert out["cleaned"].iloc[1000]
    assert out["clean_value"].iloc[1000] == pytest.approx((y.iloc[999] + y.iloc[1001]) / 2)
