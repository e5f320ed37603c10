"""The stuck rule judged from values alone: a run is measured against the history's own runs at
its level."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from gpupool.detect.clean import FittedSeriesModel, fit_series_model
from gpupool.detect.rules.stuck import RepeatStats, repeat_levels, stuck_runs, typical_run
from gpupool.detect.settings import CleaningRules, RouterConfig

FULL = 64.0
BUSY, HELD = 150, 50  # points of each busy spell, and of each spell held full at capacity


def _platform(cycles: int = 25, seed: int = 3) -> pd.Series:
    """A GPU count that moves while busy (an integer walk, changing at most steps) and sits at
    capacity for `HELD` points between busy spells: a series that repeats its value at most of
    its steps, yet never for long below capacity."""
    rng = np.random.default_rng(seed)
    parts = []
    level = 30.0
    for _ in range(cycles):
        busy = np.empty(BUSY)
        for i in range(BUSY):
            if rng.random() < 0.85:
                step = float(rng.choice([-3, -2, -1, 1, 2, 3]))
                level += step if 5 <= level + step <= 55 else -step  # bounce off the bounds
            busy[i] = level
        parts += [busy, np.full(HELD, FULL)]
    values = np.concatenate(parts)
    idx = pd.date_range("2025-01-06", periods=values.size, freq="5min", tz="UTC")
    return pd.Series(values, index=idx, name="gpus")


@pytest.fixture(scope="module")
def fitted() -> tuple[pd.Series, FittedSeriesModel]:
    y = _platform()
    return y, fit_series_model(y.iloc[: 20 * (BUSY + HELD)], RouterConfig(cleaning=OPEN_GATE), detector="zscore")


#: a count that repeats at most steps is judged only with the repeat-share gate opened
OPEN_GATE = CleaningRules(stuck_max_repeat_share=1.0)


def _judged(raw: np.ndarray, model: FittedSeriesModel, rules: CleaningRules = OPEN_GATE):
    """The stuck rule on `raw` with the numbers `model` read from its history."""
    return stuck_runs(raw, np.full(raw.size, np.nan), model.repeats, rules, model.tau_, model.nonnegative_)


def _stuck(y: pd.Series, at: int, points: int) -> np.ndarray:
    v = y.to_numpy(dtype="float64").copy()
    v[at + 1 : at + 1 + points] = v[at]
    return v


def test_the_history_holds_long_runs_at_capacity_only(fitted):
    _, model = fitted
    assert model.repeats.share > 0.3  # the series stands still at many of its steps
    assert typical_run(model.repeats, FULL) >= HELD
    assert typical_run(model.repeats, 20.0) < HELD / 3


def test_a_run_far_longer_than_the_runs_at_its_level_is_cleaned(fitted):
    y, model = fitted
    at = 20 * (BUSY + HELD) + 60  # inside a busy spell after the history
    raw = _stuck(y, at, 30)
    end = at + 1 + int(np.argmax(raw[at + 1 :] != raw[at]))  # the walk may hold the value a step or two more
    mask, values = _judged(raw, model)
    assert end - at - 1 >= 30 and mask[at + 1 : end].all() and mask.sum() == end - at - 1
    # a line from the last value read to the first one after the run
    k = end - at
    line = raw[at] + (raw[end] - raw[at]) * np.arange(1, k) / k
    assert values[at + 1 : end] == pytest.approx(line)


def test_a_series_sitting_at_capacity_as_its_history_does_is_kept(fitted):
    y, model = fitted
    raw = y.to_numpy(dtype="float64").copy()
    # the judged part's spells at capacity, one of them longer than any before (still within
    # the band's runs x the factor)
    start = 22 * (BUSY + HELD) + BUSY
    raw[start : start + HELD + 20] = FULL
    assert not _judged(raw, model)[0].any()
    # an idle platform at zero holding it for hours is idle, not stuck
    idle = raw.copy()
    idle[start - 60 : start] = 0.0
    assert not _judged(idle, model)[0][start - 60 : start].any()


def test_level_bands_round_trip_and_an_older_model_uses_the_whole_history(fitted):
    y, model = fitted
    params = json.loads(json.dumps(model.to_params(), allow_nan=False))
    again = FittedSeriesModel.from_params(params)
    assert again.repeats == model.repeats and model.repeats.runs
    # a model stored before the bands existed is judged on the whole history's runs
    del params["repeat_levels"]
    old = FittedSeriesModel.from_params(params)
    assert typical_run(old.repeats, 20.0) == old.repeats.run == model.repeats.run
    assert repeat_levels(np.arange(10.0)) == {}
    assert np.isnan(typical_run(RepeatStats(), 20.0))


def test_by_default_a_series_that_repeats_at_most_steps_is_never_stuck(fitted):
    y, _ = fitted
    model = fit_series_model(y.iloc[: 20 * (BUSY + HELD)], detector="zscore")
    at = 20 * (BUSY + HELD) + 60
    raw = _stuck(y, at, 30)
    assert not _judged(raw, model, CleaningRules())[0].any()
