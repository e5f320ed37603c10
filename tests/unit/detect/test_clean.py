"""detect_and_clean, fit_series_model and score_window: flags, cleaning, gaps, shapes."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from gpupool.detect.clean import (
    OUTPUT_COLUMNS,
    FittedSeriesModel,
    detect_and_clean,
    fit_series_model,
    score_window,
)
from gpupool.detect.rules.stuck import stuck_runs
from gpupool.detect.settings import AlarmRules, CleaningRules, RouterConfig


@pytest.mark.parametrize("detector", ["auto", "sr", "svr"])
def test_injected_spikes_are_flagged_and_cleaned(detector, spiky):
    y, where = spiky
    out = detect_and_clean(y, detector=detector)
    assert list(out.columns) == OUTPUT_COLUMNS
    assert out.index.equals(y.index)
    flagged = set(np.flatnonzero(out["is_anomaly"].to_numpy()))
    assert set(where) <= flagged
    assert len(flagged) < 0.01 * len(y)  # ordinary noise is not an anomaly
    for i in where:
        # a spike takes x̂; a fall towards zero a line from x̂ to the value after it (close to x̂)
        assert out["clean_value"].iloc[i] == pytest.approx(out["expected"].iloc[i], abs=1.5)
        assert abs(out["clean_value"].iloc[i] - y.iloc[i]) > 5
    ok = ~out["cleaned"] & y.notna()
    assert (out.loc[ok, "clean_value"] == y[ok]).all()
    assert out["detector"].nunique() == 1


def test_auto_routes_a_daily_cycle_to_prophet_and_flags_spikes(spiky):
    y, where = spiky
    out = detect_and_clean(y, score_from=y.index[1000])  # 3.5 days of history: enough cycles
    assert out["detector"].iloc[0] == "prophet"
    assert "period 288" in out.attrs["reason"]
    judged = [i for i in where if i >= 1000]
    assert judged and set(judged) <= set(np.flatnonzero(out["is_anomaly"].to_numpy()))


def test_history_rows_are_never_judged(spiky):
    y, _ = spiky
    out = detect_and_clean(y, detector="sr", score_from=y.index[1000])
    head = out.iloc[:1000]
    assert head["score"].isna().all() and head["expected"].isna().all() and not head["is_anomaly"].any()
    assert out["score"].iloc[1000:].notna().all()


def test_no_look_ahead_through_detect_and_clean(spiky):
    y, _ = spiky
    a = detect_and_clean(y, detector="svr", score_from=y.index[600])
    changed = y.copy()
    changed.iloc[1500:] = 1e6
    b = detect_and_clean(changed, detector="svr", score_from=y.index[600])
    pd.testing.assert_frame_equal(a.iloc[:1500], b.iloc[:1500])


def test_short_gaps_filled_long_gaps_kept_missing_never_zero(make_seasonal):
    y = make_seasonal(n=1200)
    y.iloc[800:802] = np.nan  # short: filled
    y.iloc[900:950] = np.nan  # long: stays missing
    y.iloc[100] = np.nan  # short gap in the history-only part: bridged from its neighbours
    out = detect_and_clean(y, detector="svr")  # gaps of up to MAX_FILL_GAP_POINTS (3) points are filled
    assert out["filled"].iloc[800:802].all() and out["clean_value"].iloc[800:802].notna().all()
    assert out["clean_value"].iloc[800:802].between(10, 30).all()
    assert out["clean_value"].iloc[900:950].isna().all() and not out["filled"].iloc[900:950].any()
    assert out["filled"].iloc[100] and out["clean_value"].iloc[100] == pytest.approx((y.iloc[99] + y.iloc[101]) / 2)
    assert out["filled"].sum() == 3
    assert out["value"].iloc[800:802].isna().all()  # the raw value stays missing


def test_zeros_stay_values(make_seasonal):
    # utilisation that is legitimately zero every night (idle GPUs)
    rng = np.random.default_rng(7)
    y = make_seasonal(n=2016, noise=0.0)
    t = np.arange(len(y))
    y[:] = np.maximum(0.0, 10 * np.sin(2 * np.pi * t / 288) + rng.normal(0, 0.3, len(y))).round(1)
    y.iloc[1500] = np.nan
    out = detect_and_clean(y, score_from=y.index[1000])
    zeros = (y == 0).to_numpy()
    assert zeros.sum() > 500
    assert out["clean_value"][zeros].notna().all()  # a zero never becomes missing
    kept = zeros & ~out["is_anomaly"].to_numpy()
    assert (out["clean_value"][kept] == 0).all()
    assert out["is_anomaly"].mean() < 0.02
    assert out["filled"].iloc[1500] and np.isfinite(out["clean_value"].iloc[1500])


def test_leading_gap_stays_missing(make_seasonal):
    y = make_seasonal(n=600)
    y.iloc[:2] = np.nan
    out = detect_and_clean(y, detector="sr")
    assert out["clean_value"].iloc[:2].isna().all()


def test_constant_short_empty_and_all_nan_never_raise(make_seasonal):
    idx = pd.date_range("2025-01-01", periods=400, freq="5min", tz="UTC")
    const = pd.Series(4.0, index=idx)
    const.iloc[300] = 9.0
    out = detect_and_clean(const)
    assert out["is_anomaly"].iloc[300] and out["clean_value"].iloc[300] == 4.0
    for y in (const.iloc[:3], const.iloc[:0], pd.Series(np.nan, index=idx)):
        out = detect_and_clean(y)
        assert len(out) == len(y) and list(out.columns) == OUTPUT_COLUMNS
        assert not out["is_anomaly"].any()


def test_rows_keep_input_order_duplicates_and_input_is_not_mutated(spiky):
    y, _ = spiky
    messy = pd.concat([y.iloc[:1000].sample(frac=1.0, random_state=1), y.iloc[[10, 20]], y.iloc[1000:]])
    before = messy.copy()
    out = detect_and_clean(messy, detector="sr")
    pd.testing.assert_series_equal(messy, before)
    assert out.index.equals(messy.index)
    assert (out["value"].to_numpy() == messy.to_numpy()).all()
    sorted_out = detect_and_clean(y, detector="sr")
    pd.testing.assert_frame_equal(out.iloc[-(len(y) - 1000) :], sorted_out.iloc[1000:], check_freq=False)


def test_hourly_shape_matches_one_go_after_a_json_round_trip(spiky):
    y, where = spiky
    cut = y.index[1400]
    model = fit_series_model(y[y.index < cut], detector="svr")
    model = FittedSeriesModel.from_params(json.loads(json.dumps(model.to_params(), allow_nan=False)))
    assert model.detector_name == "svr" and model.reason and model.tau_ > 0
    one_go = detect_and_clean(y, detector="svr", score_from=cut)
    start, end = y.index[1500], y.index[1512]
    window = score_window(model, y, start, end)
    assert window.index.equals(y.index[1500:1512])
    pd.testing.assert_frame_equal(window, one_go.iloc[1500:1512])
    # points at or after `end` are never seen
    changed = y.copy()
    changed.iloc[1512:] = -1e6
    pd.testing.assert_frame_equal(score_window(model, changed, start, end), window)
    hour = score_window(model, y, y.index[1800], y.index[1812])
    assert hour["is_anomaly"].iloc[0]  # the exporter zero at 1800


def test_threshold_multiplier_is_configuration(spiky):
    y, _ = spiky
    # without the spike-height test, which keeps excursions the size of the series' own noise
    no_bar = CleaningRules(spike_height_factor=0)
    loose = detect_and_clean(y, detector="svr", config=RouterConfig(tau_multiplier=2.0, cleaning=no_bar))
    strict = detect_and_clean(y, detector="svr", config=RouterConfig(tau_multiplier=8.0, cleaning=no_bar))
    assert loose["cleaned"].sum() > strict["cleaned"].sum()
    # alarms follow τ too once the history budget is off
    no_budget = AlarmRules(history_share=None)
    loose = detect_and_clean(y, detector="svr", config=RouterConfig(tau_multiplier=2.0, alarms=no_budget))
    strict = detect_and_clean(y, detector="svr", config=RouterConfig(tau_multiplier=8.0, alarms=no_budget))
    assert loose["is_anomaly"].sum() > strict["is_anomaly"].sum()


def _with_burst_and_spikes(make_seasonal):
    """Daily cycle; a 4-hour burst of real demand at 1300, a spike at 1600, a 2-point spike at 1700."""
    y = make_seasonal(n=2016, seed=3)
    y.iloc[1300:1348] += 15.0
    y.iloc[1600] += 25.0
    y.iloc[1700:1702] -= 25.0
    return y


@pytest.mark.parametrize("detector", ["svr", "sr"])
def test_a_burst_is_kept_and_short_spikes_are_cleaned(detector, make_seasonal):
    y = _with_burst_and_spikes(make_seasonal)
    out = detect_and_clean(y, detector=detector, score_from=y.index[1000])
    burst = slice(1300, 1348)
    # the burst is real demand: none of it is replaced, but its first point raises the alarm
    assert out["is_anomaly"].iloc[1300] and out["is_anomaly"].iloc[burst].sum() == 1
    assert not out["cleaned"].iloc[burst].any()
    assert (out["clean_value"].iloc[burst] == y.iloc[burst]).all()
    assert out["sustained"].iloc[1300]
    assert not (out["cleaned"] & out["sustained"]).any()
    # one alarm per event: the 2-point dip raises one, at its first point
    assert out["is_anomaly"].iloc[1600] and out["is_anomaly"].iloc[1700] and not out["is_anomaly"].iloc[1701]
    # SR judges the second point of a 2-point spike against a saliency map the first one shaped
    for i in (1600, 1700, 1701) if detector == "svr" else (1600, 1700):
        assert out["cleaned"].iloc[i] and out["clean_value"].iloc[i] == pytest.approx(out["expected"].iloc[i], abs=1.5)
    # the limit is configuration: without it the burst's flagged points are "cleaned" away
    every = RouterConfig(cleaning=CleaningRules(max_anomaly_run=0))
    loose = detect_and_clean(y, detector=detector, score_from=y.index[1000], config=every)
    assert loose["is_anomaly"].iloc[1300] and loose["cleaned"].iloc[1300] and not loose["sustained"].any()
    assert loose["clean_value"].iloc[1300] < y.iloc[1300] - 5


def test_a_run_straddling_the_window_start_is_judged_as_in_one_go(make_seasonal):
    y = _with_burst_and_spikes(make_seasonal)
    cut = y.index[1000]
    model = fit_series_model(y[y.index < cut], detector="svr")
    one_go = detect_and_clean(y, detector="svr", score_from=cut)
    start, end = y.index[1302], y.index[1314]  # the burst began two points before the window
    window = score_window(model, y, start, end)
    # a window on its own knows nothing of the alarm raised before it; everything else agrees
    cols = [c for c in OUTPUT_COLUMNS if c != "is_anomaly"]
    pd.testing.assert_frame_equal(window[cols], one_go.iloc[1302:1314][cols])
    assert not window["cleaned"].any()


def test_zero_inflated_counts_are_never_cleaned_below_zero():
    # GPUs pending: mostly zero, now and then a few jobs queue
    rng = np.random.default_rng(11)
    idx = pd.date_range("2025-01-06", periods=2016, freq="5min", tz="UTC")
    pending = np.where(rng.random(idx.size) < 0.8, 0.0, rng.poisson(2.0, idx.size).astype(float))
    y = pd.Series(pending, index=idx, name="gpu_pending")
    y.iloc[1500] = 40.0  # a real anomaly still stands out
    for detector in ("auto", "svr", "sr"):
        out = detect_and_clean(y, detector=detector, score_from=y.index[1000])
        judged = out["expected"].notna()
        assert (out.loc[judged, "expected"] >= 0).all()
        assert (out["clean_value"].dropna() >= 0).all()
        zeros = (y == 0).to_numpy()
        assert not out["is_anomaly"][zeros].any(), detector  # a zero is this series' normal state
        assert out["is_anomaly"].iloc[1500], detector
        assert out["is_anomaly"].mean() < 0.02, detector


def test_nonnegative_is_configuration(make_seasonal):
    y = make_seasonal(n=1200, seed=4) - 21.0  # crosses zero: not a non-negative metric
    y.iloc[900] = -60.0
    out = detect_and_clean(y, detector="svr")
    assert out["expected"].min() < 0  # inferred: the history has negative values, nothing is clipped
    forced = detect_and_clean(y.clip(lower=0.0), detector="svr", config=RouterConfig(nonnegative=True))
    assert (forced["expected"].dropna() >= 0).all() and (forced["clean_value"] >= 0).all()


def _stuck_at(y: pd.Series, at: int, points: int) -> pd.Series:
    """`y` with its exporter repeating the value at `at` for the `points` after it."""
    y = y.copy()
    y.iloc[at + 1 : at + 1 + points] = y.iloc[at]
    return y


@pytest.mark.parametrize("detector", ["auto", "svr", "zscore"])
def test_a_stuck_run_on_a_varying_series_is_cleaned_with_one_alarm(detector, make_seasonal):
    truth = make_seasonal(n=2016, seed=4)
    # 100 minutes of one repeated value, on the daily cycle's steepest slope
    y = _stuck_at(truth, 1584, 20)
    out = detect_and_clean(y, detector=detector, score_from=y.index[1000])
    run = slice(1585, 1605)
    assert out["cleaned"].iloc[run].all()
    assert not out["cleaned"].iloc[1584]  # the last value really read is kept
    # a line from the last value read to the first value after the run
    line = y.iloc[1584] + (y.iloc[1605] - y.iloc[1584]) * np.arange(1, 21) / 21
    assert out["clean_value"].iloc[run].to_numpy() == pytest.approx(line)
    assert out["is_anomaly"].iloc[1580:1620].sum() == 1 and out["is_anomaly"].iloc[1585]
    # the replacement is closer to the truth than the repeated value
    err_raw = np.abs(y.iloc[run] - truth.iloc[run]).mean()
    err_clean = np.abs(out["clean_value"].iloc[run] - truth.iloc[run]).mean()
    assert err_clean < 0.8 * err_raw
    # the rule is configuration
    rule_off = RouterConfig(cleaning=CleaningRules(min_stuck_run=0))
    off = detect_and_clean(y, detector=detector, score_from=y.index[1000], config=rule_off)
    assert not off["cleaned"].iloc[1590:1605].any()


def test_a_run_no_longer_than_the_history_makes_plausible_is_kept(make_seasonal):
    y = _stuck_at(make_seasonal(n=2016, seed=4), 1500, 4)  # 5 equal points: below min_stuck_run
    out = detect_and_clean(y, detector="svr", score_from=y.index[1000])
    assert not out["cleaned"].iloc[1501:1505].any()


def test_flat_and_step_series_are_never_stuck():
    idx = pd.date_range("2025-01-06", periods=2016, freq="5min", tz="UTC")
    # a small tenant: a few GPUs held for hours, then another count
    levels = np.repeat([2.0, 3.0, 2.0, 4.0, 2.0, 1.0, 2.0], 288)
    steps = pd.Series(levels, index=idx)
    steps.iloc[1500:1800] = 3.0  # a long plateau in the judged part, longer than the history's runs
    flat = pd.Series(np.full(2016, 5.0), index=idx)
    for y in (steps, flat):
        out = detect_and_clean(y, score_from=y.index[1000])
        assert not out["cleaned"].any()
        assert (out["clean_value"] == y).all()


def _stuck(raw: np.ndarray, model, rules: CleaningRules | None = None):
    """The stuck rule on `raw` with the numbers `model` read from its history."""
    return stuck_runs(raw, np.full(raw.size, np.nan), model.repeats, rules or CleaningRules(), model.tau_,
                      model.nonnegative_)


def test_an_idle_run_at_zero_is_not_stuck(make_seasonal):
    y = make_seasonal(n=2016, seed=4).clip(lower=0.0)
    y.iloc[1500:1520] = 0.0
    model = fit_series_model(y.iloc[:1000], detector="svr")
    assert model.nonnegative_
    assert not _stuck(y.to_numpy(), model)[0].any()
    assert _stuck(_stuck_at(y, 1600, 20).to_numpy(), model)[0][1601:1621].all()


def test_repeat_statistics_round_trip_and_old_params_read_as_off(make_seasonal):
    y = make_seasonal(n=1000, seed=4)
    model = fit_series_model(y, detector="svr")
    assert 0.0 <= model.repeats.share < 0.05 and model.repeats.run == 1.0
    params = json.loads(json.dumps(model.to_params(), allow_nan=False))
    again = FittedSeriesModel.from_params(params)
    assert again.repeats.share == model.repeats.share and again.repeats.run == model.repeats.run
    # a model stored before the rule existed lacks the statistics: the rule is off for it
    del params["repeat_share"], params["repeat_run"]
    old = FittedSeriesModel.from_params(params)
    assert np.isnan(old.repeats.share) and np.isnan(old.repeats.run)
    assert not _stuck(_stuck_at(y, 500, 30).to_numpy(), old)[0].any()
    assert _stuck(_stuck_at(y, 500, 30).to_numpy(), again)[0][501:531].all()


def test_runs_too_long_or_entered_by_a_jump_are_kept(make_seasonal):
    y = make_seasonal(n=2016, seed=4)
    model = fit_series_model(y.iloc[:1000], detector="svr")
    assert _stuck(_stuck_at(y, 1500, 60).to_numpy(), model)[0][1501:1561].all()
    # longer than max_stuck_run: the demand itself stood still
    capped = CleaningRules(max_stuck_run=50)
    assert not _stuck(_stuck_at(y, 1500, 60).to_numpy(), model, capped)[0].any()
    # a jump to a new level held exactly: a burst for the burst rule, not a stuck reading
    jumped = y.copy()
    jumped.iloc[1500:1520] = y.iloc[1499] + 20 * model.tau_
    assert not _stuck(jumped.to_numpy(), model)[0].any()


def test_excursion_scale_is_the_historys_peak_height_and_round_trips(make_seasonal):
    y = make_seasonal(n=1000, seed=4, noise=0.3)
    model = fit_series_model(y, detector="svr")
    # a point's height above (or below) both neighbours: for Gaussian noise of 0.3 its 0.99
    # quantile is about twice the noise
    assert 0.3 < model.excursion_scale_ < 1.2
    spiky = y.copy()
    spiky.iloc[::100] += 50.0  # one spike per 100 points stays beyond the 0.99 quantile
    assert fit_series_model(spiky, detector="svr").excursion_scale_ < 1.5
    again = FittedSeriesModel.from_params(json.loads(json.dumps(model.to_params(), allow_nan=False)))
    assert again.excursion_scale_ == model.excursion_scale_
    # too short a history to read a 0.99 quantile from: no scale, only τ decides
    assert np.isnan(fit_series_model(y.iloc[:300], detector="svr").excursion_scale_)
