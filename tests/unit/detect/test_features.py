"""profile_series: the features the router reads, on clean and on awkward input."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from gpupool.detect.features import profile_series

KEYS = {
    "n", "step_seconds", "missing_share", "adf_p", "kpss_p", "cv", "level_shifts", "acf_daily",
    "acf_weekly", "spectral_peak", "stl_seasonal_strength", "period",
}


def test_daily_cycle_is_found(seasonal):
    prof = profile_series(seasonal)
    assert KEYS <= prof.keys()
    json.dumps(prof, allow_nan=False)
    assert prof["n"] == len(seasonal)
    assert prof["step_seconds"] == 300.0
    assert prof["period"] == 288
    assert prof["period_source"] == "daily"
    assert prof["acf_daily"] > 0.8
    assert prof["stl_seasonal_strength"] > 0.8
    assert prof["missing_share"] == 0.0


def test_white_noise_has_no_period_and_is_stationary():
    rng = np.random.default_rng(3)
    y = pd.Series(rng.normal(10, 1, 2000), index=pd.date_range("2025-01-01", periods=2000, freq="5min"))
    prof = profile_series(y)
    assert prof["period"] is None
    assert prof["adf_p"] < 0.05
    assert prof["noise_ratio"] > 0.8
    assert prof["level_shifts"] == 0


def test_level_shift_is_counted():
    rng = np.random.default_rng(4)
    v = rng.normal(0, 1, 2000)
    v[1000:] += 20
    y = pd.Series(v, index=pd.date_range("2025-01-01", periods=2000, freq="5min"))
    assert profile_series(y)["level_shifts"] >= 1


@pytest.mark.parametrize(
    "values",
    [[], [np.nan] * 10, [5.0], [1.0, 2.0], [3.0] * 500, [0.0] * 300, [1.0, np.nan, 2.0, np.nan]],
    ids=["empty", "all-nan", "one", "two", "constant", "zeros", "gappy-short"],
)
def test_awkward_input_never_raises(values):
    y = pd.Series(values, index=pd.date_range("2025-01-01", periods=len(values), freq="1min"), dtype="float64")
    prof = profile_series(y)
    json.dumps(prof, allow_nan=False)
    assert prof["n"] == len(values)


def test_constant_series():
    y = pd.Series(7.0, index=pd.date_range("2025-01-01", periods=500, freq="5min"))
    prof = profile_series(y)
    assert prof["constant"] is True
    assert prof["cv"] == 0.0
    assert prof["period"] is None


def test_missing_points_and_absent_timestamps_count_as_missing(seasonal):
    y = seasonal.copy()
    y.iloc[100:200] = np.nan  # missing values
    y = y.drop(y.index[1000:1100])  # absent rows
    prof = profile_series(y)
    assert prof["missing_share"] == pytest.approx(200 / len(seasonal), abs=0.01)
    assert prof["period"] == 288


def test_input_is_not_mutated_and_order_does_not_matter(seasonal):
    shuffled = seasonal.sample(frac=1.0, random_state=0)
    before = shuffled.copy()
    a = profile_series(shuffled)
    pd.testing.assert_series_equal(shuffled, before)
    b = profile_series(seasonal)
    assert a == b
