"""stream_detect: alarms apart from cleaning, refits as time passes, one judgement for the
CLI and the pipeline."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pandas as pd
import pytest

from gpupool.detect.clean import OUTPUT_COLUMNS, refit_anchors, stream_detect
from gpupool.detect.io import detect_csv
from gpupool.detect.settings import AlarmRules, CleaningRules, RouterConfig, RoutingRules
from gpupool.tsio import SeriesInputError


def level_series(n: int = 600, seed: int = 0, start: str = "2025-01-06") -> pd.Series:
    """A series around 10 at 5-minute steps (the issue's example)."""
    rng = np.random.default_rng(seed)
    idx = pd.date_range(start, periods=n, freq="5min", tz="UTC")
    return pd.Series(10 + rng.normal(0, 0.5, n), index=idx, name="gpu_allocated")


def test_a_burst_raises_one_alarm_and_is_kept_a_spike_is_alarmed_and_cleaned():
    y = level_series()
    y.iloc[500:510] = 20.0  # ten points at twice the level: real demand, not a fault
    y.iloc[300] = 25.0  # one point: an exporter glitch
    out = stream_detect(y)
    assert list(out.columns) == OUTPUT_COLUMNS
    assert out["is_anomaly"].iloc[500], "the burst's first point raises the alarm"
    assert out["is_anomaly"].iloc[500:510].sum() == 1, "one alarm per event"
    assert not out["cleaned"].iloc[500:510].any()
    assert (out["clean_value"].iloc[500:510] == 20.0).all()
    assert out["is_anomaly"].iloc[300] and out["cleaned"].iloc[300]
    # replaced by the line between its neighbours, the series' own readings around it
    assert out["clean_value"].iloc[300] == pytest.approx((y.iloc[299] + y.iloc[301]) / 2)
    assert abs(out["clean_value"].iloc[300] - 10) < 2
    assert out["is_anomaly"].sum() <= 6  # ordinary noise raises (almost) nothing


def test_alarm_merge_is_configuration():
    y = level_series()
    y.iloc[[300, 305]] = 25.0  # two glitches five points apart: one event by default
    every = stream_detect(y, RouterConfig(alarms=AlarmRules(merge_points=0)), detector="svr")
    merged = stream_detect(y, detector="svr")
    assert every["is_anomaly"].iloc[[300, 305]].all()
    assert merged["is_anomaly"].iloc[300] and not merged["is_anomaly"].iloc[305]
    assert merged["cleaned"].iloc[[300, 305]].all(), "both are cleaned: merging alarms changes no cleaning"


def test_a_short_file_gets_a_model_and_routing_is_redecided_at_refits():
    y = level_series(n=600)  # 50 hours: too short for the old 15 % warm-up plus 96-point minimum
    out = stream_detect(y)
    models = out.attrs["models"]
    assert out.attrs["refits"] == len(models) >= 3
    # judged from the first hours on, and by a model fitted on more than SR's minimum by the end
    assert out["score"].notna().sum() > 0.9 * len(y)
    assert not models[max(models)][1].startswith("history too short")


def test_refit_cadence_is_configuration():
    y = level_series(n=1200)
    daily = stream_detect(y, detector="svr")
    six = stream_detect(y, RouterConfig(refit_every_hours=6), detector="svr")
    day2 = str(y.index[0].normalize() + timedelta(days=1))
    n_daily = sum(a >= day2 for a in daily.attrs["models"])
    assert n_daily == 4 and sum(a >= day2 for a in six.attrs["models"]) >= 3 * n_daily
    anchors = refit_anchors(y.index, np.ones(len(y), dtype=bool), RouterConfig())
    later = anchors[300:]
    assert (later == later.floor("1D")).all(), "after the first day the refit is daily, at midnight UTC"
    assert (anchors[~anchors.isna()] <= y.index[~anchors.isna()]).all()


def test_no_look_ahead():
    y = level_series(n=900)
    y.iloc[400] = 25.0
    a = stream_detect(y, detector="svr")
    changed = y.copy()
    changed.iloc[700:] += 30.0
    b = stream_detect(changed, detector="svr")
    cols = ["expected", "score", "is_anomaly"]
    # the cleaning decision may look max_anomaly_run points ahead; alarms and x̂ never do
    pd.testing.assert_frame_equal(a[cols].iloc[:700], b[cols].iloc[:700])


def test_window_by_window_gives_the_same_alarms_as_one_go():
    y = level_series(n=900)
    y.iloc[400] = 25.0
    y.iloc[610:640] = 20.0  # a burst that runs across window starts
    one_go = stream_detect(y, detector="svr")
    hours = pd.date_range(y.index[0], y.index[-1] + timedelta(hours=1), freq="1h")
    parts = [stream_detect(y, detector="svr", start=a, end=b) for a, b in zip(hours[:-1], hours[1:])]
    windows = pd.concat(parts)
    pd.testing.assert_frame_equal(windows[["expected", "score", "is_anomaly"]], one_go[["expected", "score", "is_anomaly"]])
    assert one_go["is_anomaly"].iloc[610:640].sum() == 1


def test_cli_refit_every(tmp_path):
    y = level_series(n=1200)
    path = tmp_path / "in.csv"
    pd.DataFrame({"ts": y.index, "v": y.to_numpy()}).to_csv(path, index=False)
    a = detect_csv(path, tmp_path / "a.csv")
    b = detect_csv(path, tmp_path / "b.csv", refit_every="2h")
    assert b["refits"] > a["refits"]
    with pytest.raises(SeriesInputError, match="--refit-every"):
        detect_csv(path, tmp_path / "c.csv", refit_every="often")


def test_cli_and_pipeline_raise_the_same_alarms(tmp_path, sqlite_engine):
    from gpupool import pipeline
    from gpupool.config import default_config
    from gpupool.staging import loader

    y = level_series(n=720, seed=3, start="2026-03-01")  # 2.5 days
    y.iloc[400] = 25.0
    y.iloc[560:590] = 20.0
    y.iloc[640] = 0.0
    frame = pd.DataFrame(
        {
            "platform": "openstack",
            "cluster": "",
            "entity_kind": "platform",
            "entity_id": "",
            "metric": "gpu_allocated",
            "ts": y.index,
            "value": y.to_numpy(),
            "unit": "gpus",
        }
    )
    first, end = y.index[0], y.index[-1] + timedelta(minutes=5)
    loader.replace_slice(sqlite_engine, loader.Slice("sample", {"platform": "openstack"}, first, end), frame)
    ctx = pipeline.Context(default_config(), sqlite_engine)
    judged_from = pd.Timestamp("2026-03-02 08:00", tz="UTC")
    hours = pd.date_range(judged_from, end, freq="1h")
    for a, b in zip(hours[:-1], hours[1:]):
        pipeline.detect(ctx, "openstack", pipeline.Window(a.to_pydatetime(), b.to_pydatetime()))
    import sqlalchemy as sa

    from gpupool.staging.schema import clean_sample

    with sqlite_engine.connect() as conn:
        stored = pd.read_sql(sa.select(clean_sample).order_by(clean_sample.c.ts), conn)
    stored["ts"] = pd.to_datetime(stored["ts"], utc=True)
    path = tmp_path / "series.csv"
    pd.DataFrame({"timestamp": y.index, "gpu_allocated": y.to_numpy()}).to_csv(path, index=False)
    detect_csv(path, tmp_path / "out.csv")
    cli = pd.read_csv(tmp_path / "out.csv")
    cli["timestamp"] = pd.to_datetime(cli["timestamp"], utc=True)
    cli = cli[cli["timestamp"] >= judged_from].reset_index(drop=True)
    assert len(stored) == len(cli) == len(hours[:-1]) * 12
    assert (stored["ts"].to_numpy() == cli["timestamp"].to_numpy()).all()
    assert stored["is_anomaly"].tolist() == cli["is_anomaly"].tolist()
    assert stored["is_anomaly"].sum() >= 2 and stored["cleaned"].sum() >= 2
    np.testing.assert_allclose(stored["expected"].to_numpy(), cli["expected"].to_numpy(), rtol=1e-9)
    assert (stored["detector"] == cli["detector"]).all()


def test_zscore_detector_flags_and_cleans_a_spike():
    y = level_series(n=900)
    y.iloc[600] = 25.0
    out = stream_detect(y, detector="zscore")
    assert out["is_anomaly"].iloc[600] and out["cleaned"].iloc[600]
    assert abs(out["clean_value"].iloc[600] - 10) < 1
    assert set(out["detector"].iloc[300:]) == {"zscore"}
    assert out["is_anomaly"].sum() <= 5


def test_false_alarm_budget_raises_the_alarm_threshold_on_a_heavy_tailed_history():
    from gpupool.detect.clean import fit_series_model

    rng = np.random.default_rng(4)
    y = level_series(n=2000)
    bursts = rng.choice(2000, 60, replace=False)
    y.iloc[bursts] += rng.exponential(4.0, 60)  # frequent ordinary bursts: a heavy upper tail
    off = fit_series_model(y, RouterConfig(alarms=AlarmRules(history_share=None)), detector="zscore")
    budget = fit_series_model(y, RouterConfig(alarms=AlarmRules(history_share=0.005)), detector="zscore")
    assert off.alarm_threshold_ == RouterConfig().alarms.tau_scale * RouterConfig().tau_multiplier
    assert budget.alarm_threshold_ > off.alarm_threshold_
    assert budget.threshold_ == off.threshold_, "the budget is for alarms; cleaning keeps τ"
    # a budget never lowers the alarm threshold below the τ scale's
    calm = fit_series_model(level_series(n=2000), RouterConfig(alarms=AlarmRules(history_share=0.005)), detector="zscore")
    assert calm.alarm_threshold_ >= off.alarm_threshold_


@pytest.mark.parametrize("seed", [7, 8])
def test_fallback_keeps_the_detector_that_alarms_at_the_smaller_deviation(seed):
    from gpupool.detect.clean import fit_series_model
    from gpupool.detect.model import alarm_size

    rng = np.random.default_rng(seed)
    idx = pd.date_range("2025-01-06", periods=2016, freq="5min", tz="UTC")
    # heavy-tailed noise around a slowly moving level: SVR and the z-score are close rivals
    y = pd.Series(50 + np.cumsum(rng.normal(0, 0.05, 2016)) + rng.standard_t(2, 2016), index=idx)
    cfg = RouterConfig(routing=RoutingRules(sr_min_noise_ratio=10.0, prophet_enabled=False))  # the features say SVR
    off = fit_series_model(y, cfg.model_copy(update={"fallback": False}))
    assert off.detector_name == "svr"
    zs = fit_series_model(y, cfg, detector="zscore")
    routed = fit_series_model(y, cfg)
    assert alarm_size(routed) == min(alarm_size(off), alarm_size(zs))
    assert routed.detector_name == ("zscore" if alarm_size(zs) < alarm_size(off) else "svr")
    assert ("fallback" in routed.reason) == (routed.detector_name == "zscore")


def test_a_counter_reset_is_cleaned_as_one_fault_a_lasting_fall_is_kept():
    y = level_series(n=1200, seed=5)
    y.iloc[500:520] = 10 * np.linspace(0.0, 1.0, 20, endpoint=False)  # exporter restart: zero, then a ramp back
    y.iloc[900:1100] = 0.0  # demand really went away for hours
    out = stream_detect(y, detector="svr")
    assert out["is_anomaly"].iloc[500]
    reset = out.iloc[500:520]
    assert reset["cleaned"].iloc[:15].all(), "the ramp's points far below the level are replaced"
    assert (reset["clean_value"].iloc[:15] > 8.5).all() and (reset["clean_value"].iloc[:15] < 11.5).all()
    assert out["is_anomaly"].iloc[900] and not out["cleaned"].iloc[900:1100].any()
    rule_off = stream_detect(y, RouterConfig(cleaning=CleaningRules(max_fault_run=0)), detector="svr")
    assert rule_off["cleaned"].iloc[500:515].sum() < 5


def test_a_spike_right_after_a_drop_does_not_pull_the_drops_line_up():
    y = level_series(n=1200, seed=5)
    y.iloc[701:704] = 0.0  # the exporter drops to zero ...
    y.iloc[704] = 60.0  # ... and its first reading back is a glitch
    out = stream_detect(y, detector="svr")
    assert out["cleaned"].iloc[701:705].all()
    # the drop's line stays at the level, not ramping up to the glitch
    assert (out["clean_value"].iloc[701:704] > 8.0).all() and (out["clean_value"].iloc[701:704] < 12.0).all()
    assert abs(out["clean_value"].iloc[704] - 10) < 2  # the glitch itself is a spike


def test_a_fall_to_zero_longer_than_a_spike_is_idle_not_a_fault_without_the_outage_rule():
    y = level_series(n=1200, seed=5)
    y.iloc[700:703] = 0.0  # the exporter read zero for three points: a fault
    y.iloc[900:912] = 0.0  # an hour with no demand at all: the series' own life
    out = stream_detect(y, RouterConfig(cleaning=CleaningRules(outage_max_idle_share=None)), detector="svr")
    assert out["cleaned"].iloc[700:703].all()
    assert not out["cleaned"].iloc[900:912].any()
    assert out["is_anomaly"].iloc[900]  # still an alarm: the series deviated
    # by default, on a series that never idled, that hour is an outage of the exporter; the
    # alarm is the same either way
    default = stream_detect(y, detector="svr")
    assert default["cleaned"].iloc[900:912].all()
    assert default["is_anomaly"].to_numpy().tolist() == out["is_anomaly"].to_numpy().tolist()


def test_a_counter_reset_ramp_is_cleaned_to_the_demand_it_climbs_back_to():
    truth = level_series(n=1200, seed=5) * 4.0  # around 40 GPUs
    truth.iloc[506:] += 8.0  # demand rose while the exporter was restarting
    y = truth.copy()
    k = 12  # the restarted exporter's reading climbs back over an hour, past τ below x̂
    y.iloc[500 : 500 + k] = truth.iloc[500 : 500 + k] * np.arange(k) / k
    out = stream_detect(y, detector="svr")
    assert out["cleaned"].iloc[500 : 500 + k].all(), "the whole ramp is the fault, not only its part far below x̂"
    assert not out["cleaned"].iloc[500 + k + 1 : 600].any()
    # scaled back, the ramp gives the demand as it moved, not a line to where it ended
    assert np.abs(out["clean_value"].iloc[503 : 500 + k] - truth.iloc[503 : 500 + k]).max() < 4.0


def test_a_fault_across_a_refit_is_cleaned_by_the_model_that_saw_it_begin():
    y = level_series(n=1200, seed=5)
    day = 864  # 2025-01-09 00:00: a daily refit
    k = 20
    y.iloc[day - 5 : day - 5 + k] = 10 * np.arange(k) / k
    out = stream_detect(y, detector="svr")
    assert out["cleaned"].iloc[day - 5 : day - 5 + k].all()
    assert (np.abs(out["clean_value"].iloc[day - 4 : day - 5 + k] - 10) < 2).all()


def test_a_surge_of_real_demand_is_kept_a_glitch_of_the_same_size_is_cleaned():
    rng = np.random.default_rng(3)
    idx = pd.date_range("2025-01-06", periods=2016, freq="5min", tz="UTC")
    # pending GPUs: a noisy count whose own short surges reach several times its spread
    y = pd.Series(30 + rng.normal(0, 3, idx.size), index=idx, name="gpu_pending")
    surge = [45.0, 70.0, 72.0, 68.0, 50.0]  # climbs and ebbs over five points
    y.iloc[1500:1505] = surge
    y.iloc[1700] = 100.0  # one point, straight up and back: an exporter glitch
    out = stream_detect(y, detector="svr")
    assert not out["cleaned"].iloc[1500:1505].any()
    assert out["cleaned"].iloc[1700] and abs(out["clean_value"].iloc[1700] - 30) < 8
    # the series' ordinary noise is never cleaned, though a few points exceed τ
    assert out["cleaned"].sum() <= 3
    # both rules are configuration
    loose_rules = CleaningRules(spike_max_shoulder=1.0, spike_height_factor=0.0)
    loose = stream_detect(y, RouterConfig(cleaning=loose_rules), detector="svr")
    assert loose["cleaned"].iloc[1500:1505].any()


def _week_with_two_anomalies(seed: int = 3) -> pd.Series:
    """Ten days at 5-minute steps: a large spike on day 3, a smaller one (clearly beyond τ) on day 6."""
    y = level_series(n=288 * 10, seed=seed)
    y.iloc[288 * 3 + 100] += 20.0  # 40 noise spreads
    y.iloc[288 * 6 + 100] += 6.0  # 12 noise spreads: well beyond the alarm τ (1.5 x 4)
    return y


def test_an_earlier_anomaly_in_the_history_does_not_hide_a_smaller_later_one():
    y = _week_with_two_anomalies()
    out = stream_detect(y, RouterConfig(alarms=AlarmRules(history_skip_per_day=1.0)), detector="zscore")
    assert out["is_anomaly"].iloc[288 * 3 + 100]
    assert out["is_anomaly"].iloc[288 * 6 + 100], "the day-3 spike must not raise the bar for the week after it"
    assert out["is_anomaly"].sum() <= 6
    # the whole history's largest deviation (the default budget, skip 0) hides it
    whole = stream_detect(y, detector="zscore")
    assert not whole["is_anomaly"].iloc[288 * 6 + 100]
    # alarms only: what is cleaned and its values are the same either way
    assert out["cleaned"].equals(whole["cleaned"])
    np.testing.assert_array_equal(out["clean_value"].to_numpy(), whole["clean_value"].to_numpy())


def test_a_history_with_many_large_excursions_keeps_its_raised_bar():
    from gpupool.detect.clean import fit_series_model

    rng = np.random.default_rng(5)
    y = level_series(n=288 * 7)
    bursts = rng.choice(y.size, 80, replace=False)
    y.iloc[bursts] += rng.uniform(5.0, 10.0, 80)  # ordinary bursts, about eleven a day
    cfg = RouterConfig(alarms=AlarmRules(history_skip_per_day=1.0))
    skipped = fit_series_model(y, cfg, detector="zscore")
    least = cfg.alarms.tau_scale * cfg.tau_multiplier
    assert skipped.alarm_threshold_ > 2 * least, "seven skipped excursions leave dozens as large"
    whole = fit_series_model(y, cfg.merged({"alarms": {"history_skip_per_day": 0.0}}), detector="zscore")
    assert least < skipped.alarm_threshold_ <= whole.alarm_threshold_


def test_excursions_join_points_as_alarms_do():
    from gpupool.detect.alarms import excursions

    # 1 and 4 are 3 points apart: one excursion; 4 and 9 are 5 apart, 9 and 13 are 4 apart: three in all
    norm = np.array([0, 9, 0, 0, 8, 0, 0, 0, 0, 7, np.nan, 0, 0, 5], dtype=float)
    events, peaks = excursions(norm, 4.0, merge_points=3)
    assert events.tolist() == [-1, 0, 0, 0, 0, -1, -1, -1, -1, 1, -1, -1, -1, 2]
    assert peaks.tolist() == [9.0, 7.0, 5.0]
    events, peaks = excursions(norm, 4.0, merge_points=4)
    assert events.tolist() == [-1, 0, 0, 0, 0, -1, -1, -1, -1, 1, 1, 1, 1, 1]
    assert peaks.tolist() == [9.0, 7.0]
    events, peaks = excursions(norm, 10.0, merge_points=3)
    assert (events == -1).all() and peaks.size == 0


def _minutes(days: float, seed: int = 4) -> pd.Series:
    """A series around 10 at 1-minute steps."""
    n = int(days * 1440)
    rng = np.random.default_rng(seed)
    idx = pd.date_range("2025-01-06", periods=n, freq="1min", tz="UTC")
    return pd.Series(10 + rng.normal(0, 0.5, n), index=idx, name="gpu_allocated")


def test_a_week_of_minute_points_leaves_three_excursions_out_of_the_budget_five_minute_points_none():
    from gpupool.detect.clean import fit_series_model

    cfg = RouterConfig()
    least = cfg.alarms.tau_scale * cfg.tau_multiplier
    minutes = _minutes(7)
    five = level_series(n=288 * 7, seed=4)
    for y in (minutes, five):
        for k, at in enumerate((0.2, 0.45, 0.7)):
            y.iloc[int(at * y.size)] += 20.0 - 2.0 * k  # three anomalies, 36-40 noise spreads
    # 10,080 points x 0.3 per 1,000: the three are left out and the bar is the noise's again
    fast = fit_series_model(minutes, cfg, detector="zscore")
    assert fast.alarm_threshold_ < 2 * least
    # 2,016 points x 0.3 per 1,000 rounds down to none: the bar stays at the largest
    slow = fit_series_model(five, cfg, detector="zscore")
    assert slow.alarm_threshold_ > 4 * least
    # without the per-point skip the minute series keeps its raised bar too
    whole = fit_series_model(minutes, cfg.merged({"alarms": {"history_skip_per_1000_points": 0.0}}),
                             detector="zscore")
    assert whole.alarm_threshold_ > 4 * least
    assert fast.budget.excursions["points"] == minutes.size


def test_on_a_minute_series_an_earlier_anomaly_does_not_hide_a_smaller_later_one_by_default():
    y = _minutes(9)
    y.iloc[1440 * 3 + 100] += 20.0  # 40 noise spreads
    y.iloc[1440 * 6 + 100] += 6.0  # 12 noise spreads: beyond the alarm τ (1.5 x 4)
    out = stream_detect(y, detector="zscore")
    assert out["is_anomaly"].iloc[1440 * 3 + 100]
    assert out["is_anomaly"].iloc[1440 * 6 + 100], "the day-3 spike must not raise the bar for the week after it"
    before = stream_detect(y, RouterConfig(alarms=AlarmRules(history_skip_per_1000_points=0.0)), detector="zscore")
    assert not before["is_anomaly"].iloc[1440 * 6 + 100]
    assert out["cleaned"].equals(before["cleaned"])


@pytest.mark.parametrize("detector", [None, "zscore"], ids=["defaults-router", "zscore"])
def test_a_small_level_shift_raises_one_alarm_from_its_run_of_deviations_by_default(detector):
    y = level_series(n=288 * 10, seed=1)
    start = 288 * 8
    y.iloc[start : start + 30] += 2.0  # 4 noise spreads: under the one-point alarm τ (6) at every point
    kw = {"detector": detector} if detector else {}
    out = stream_detect(y, **kw)  # `gpupool detect`'s defaults: the run alarm on
    alarms = np.flatnonzero(out["is_anomaly"].to_numpy())
    assert alarms.size == 1 and start <= alarms[0] < start + 7, "one alarm, within the shift's first points"
    # the run alarm is the only thing that sees it
    off = stream_detect(y, RouterConfig(alarms=AlarmRules(run_points=0)), **kw)
    assert not off["is_anomaly"].iloc[start : start + 30].any()
    # alarms only: what is cleaned, and the values, are the same
    assert out["cleaned"].equals(off["cleaned"])
    np.testing.assert_array_equal(out["clean_value"].to_numpy(), off["clean_value"].to_numpy())
    assert (out["is_anomaly"] != off["is_anomaly"]).sum() == 1


def test_runs_the_history_has_every_day_raise_no_run_alarm():
    from gpupool.detect.clean import fit_series_model

    y = level_series(n=288 * 7, seed=1)
    for day in range(7):
        y.iloc[288 * day + 100 : 288 * day + 130] += 2.0  # the same small shift every day: ordinary
    cfg = RouterConfig(alarms=AlarmRules(run_points=5))
    model = fit_series_model(y, cfg, detector="zscore")
    level = cfg.alarms.run_share * cfg.alarms.tau_scale * cfg.tau_multiplier
    assert model.run_threshold_ > level, "the history's own runs set the bar"
    quiet = fit_series_model(level_series(n=288 * 7, seed=1), cfg, detector="zscore")
    assert quiet.run_threshold_ == pytest.approx(level)
    # SR's score is no residual: no run alarms
    assert np.isnan(fit_series_model(y, cfg, detector="sr").run_threshold_)
    # 0 points: off
    off = RouterConfig(alarms=AlarmRules(run_points=0))
    assert np.isnan(fit_series_model(y, off, detector="zscore").run_threshold_)
