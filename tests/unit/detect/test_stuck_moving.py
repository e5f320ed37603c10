"""The stuck rule given a co-moving series through the stream (`stream_detect(..., moving=)`): a
count that repeats its value at most steps is judged by whether the series beside it moves."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from gpupool.detect.clean import stream_detect
from gpupool.detect.router import RouterConfig

BUSY, HELD, FULL = 150, 50, 64.0
CYCLES = 22
#: a point in a busy spell of the last (judged) days
AT = 20 * (BUSY + HELD) + 60
RUN = 30


def _platform(seed: int = 3) -> pd.Series:
    """A GPU count that moves at most steps while busy and sits at capacity between busy spells:
    its history repeats the value before at far more steps than `stuck_max_repeat_share`."""
    rng = np.random.default_rng(seed)
    parts, level = [], 30.0
    for _ in range(CYCLES):
        busy = np.empty(BUSY)
        for i in range(BUSY):
            if rng.random() < 0.85:
                step = float(rng.choice([-3, -2, -1, 1, 2, 3]))
                level += step if 5 <= level + step <= 55 else -step
            busy[i] = level
        parts += [busy, np.full(HELD, FULL)]
    values = np.concatenate(parts)
    return pd.Series(values, index=pd.date_range("2025-01-06", periods=values.size, freq="5min", tz="UTC"))


#: GPUs per job
PER_JOB = 2.0


def _jobs(truth: pd.Series) -> pd.Series:
    """A job count that moves whenever the GPU count really does (another exporter's series)."""
    return truth / PER_JOB


def _stuck(truth: pd.Series) -> pd.Series:
    v = truth.to_numpy().copy()
    v[AT + 1 : AT + 1 + RUN] = v[AT]
    return pd.Series(v, index=truth.index)


@pytest.fixture(scope="module")
def truth() -> pd.Series:
    return _platform()


@pytest.fixture(scope="module")
def alone(truth) -> pd.DataFrame:
    return stream_detect(_stuck(truth), RouterConfig(), detector="zscore")


def _run_end(raw: pd.Series) -> int:
    v = raw.to_numpy()
    return AT + 1 + int(np.argmax(v[AT + 1 :] != v[AT]))


def test_without_a_co_moving_series_the_repeat_share_gate_keeps_the_run(truth, alone):
    raw = _stuck(truth)
    again = stream_detect(raw, RouterConfig(), detector="zscore", moving=None)
    pd.testing.assert_frame_equal(again, alone)
    assert not alone["cleaned"].to_numpy()[AT + 1 : _run_end(raw)].any()


def test_a_stuck_run_while_the_jobs_move_is_cleaned(truth, alone):
    raw = _stuck(truth)
    out = stream_detect(raw, RouterConfig(), detector="zscore", moving=_jobs(truth))
    end = _run_end(raw)
    assert out["is_anomaly"].to_numpy()[AT + 1 : end].any()
    # replaced from the first repeat at which the jobs stand a whole job from where they were,
    # following the jobs: here the GPU count exactly
    t = truth.to_numpy()
    first = AT + 1 + int(np.argmax(np.abs(t[AT + 1 :] - t[AT]) >= PER_JOB))
    assert not out["cleaned"].to_numpy()[AT + 1 : first].any()
    assert out["cleaned"].to_numpy()[first:end].all()
    assert out["clean_value"].to_numpy()[first:end] == pytest.approx(t[first:end])
    assert np.abs(out["clean_value"].to_numpy() - t)[AT + 1 : end].sum() < 0.2 * np.abs(raw.to_numpy() - t)[AT + 1 : end].sum()


def test_a_flat_run_with_flat_jobs_is_kept(truth):
    flat = truth.copy()
    flat.iloc[AT + 1 : AT + 1 + RUN] = flat.iloc[AT]  # the demand itself stands still
    out = stream_detect(flat, RouterConfig(), detector="zscore", moving=_jobs(flat))
    assert not out["cleaned"].to_numpy()[AT + 1 : _run_end(flat)].any()


def test_the_co_moving_series_is_read_on_the_series_timestamps(truth):
    raw = _stuck(truth)
    jobs = _jobs(truth)
    # shuffled, with a timestamp the series lacks: read by timestamp, not by position
    extra = pd.Series([1.0], index=[truth.index[-1] + pd.Timedelta("5min")])
    shuffled = pd.concat([jobs, extra]).sample(frac=1.0, random_state=0)
    start, end = truth.index[AT - 20], truth.index[AT + 60]
    window = stream_detect(raw, RouterConfig(), detector="zscore", moving=shuffled, start=start, end=end)
    whole = stream_detect(raw, RouterConfig(), detector="zscore", moving=jobs)
    pd.testing.assert_frame_equal(window, whole.loc[window.index])
    assert window["cleaned"].to_numpy()[21 : _run_end(raw) - AT + 20].sum() >= RUN // 2
    with pytest.raises(ValueError, match="time zone"):
        stream_detect(raw, RouterConfig(), detector="zscore", moving=jobs.tz_localize(None))
