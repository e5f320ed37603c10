"""The three detectors: same interface, injected spikes found, no look-ahead."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from gpupool.detect.params import decode, encode
from gpupool.detect.prophet import ProphetDetector
from gpupool.detect.sr import SpectralResidualDetector
from gpupool.detect.svr import SVRDetector

FAST = {"sr": lambda: SpectralResidualDetector(), "svr": lambda: SVRDetector(period=288)}


def _all():
    return [pytest.param(k, id=k) for k in FAST] + [pytest.param("prophet", id="prophet", marks=pytest.mark.slow)]


def _make(name):
    return ProphetDetector(daily=True) if name == "prophet" else FAST[name]()


@pytest.fixture(scope="module")
def fitted_prophet(make_seasonal):
    # one Prophet fit shared by the tests that need it: it is the slow one
    y = make_seasonal(seed=1)
    return ProphetDetector(daily=True).fit(y.iloc[:600])


def _fitted(name, history, fitted_prophet=None):
    if name == "prophet":
        return fitted_prophet
    return _make(name).fit(history)


@pytest.mark.parametrize("name", _all())
def test_interface_and_spikes_rank_highest(name, spiky, request):
    y, where = spiky
    det = _fitted(name, y.iloc[:600], request.getfixturevalue("fitted_prophet") if name == "prophet" else None)
    out = det.score(y.iloc[600:])
    assert list(out.columns) == ["expected", "score"]
    assert out.index.equals(y.iloc[600:].index)
    top = set(out["score"].nlargest(len(where)).index)
    assert top == set(y.index[where])


@pytest.mark.parametrize("name", _all())
def test_no_look_ahead(name, spiky, request):
    y, _ = spiky
    det = _fitted(name, y.iloc[:600], request.getfixturevalue("fitted_prophet") if name == "prophet" else None)
    base = det.score(y.iloc[600:])
    changed = y.copy()
    changed.iloc[1300:] = changed.iloc[1300:] * 5 + 100  # rewrite the future
    other = det.score(changed.iloc[600:])
    pd.testing.assert_frame_equal(base.iloc[: 1300 - 600], other.iloc[: 1300 - 600])
    assert not base.iloc[1300 - 600 :].equals(other.iloc[1300 - 600 :])


@pytest.mark.parametrize("name", list(FAST))
def test_start_scores_only_the_window_and_matches_full_scoring(name, spiky):
    y, _ = spiky
    det = _make(name).fit(y.iloc[:600])
    full = det.score(y.iloc[600:])
    start = y.index[1500]
    part = det.score(y.iloc[600:], start=start)
    assert part.loc[: y.index[1499]].isna().all().all()
    pd.testing.assert_frame_equal(part.loc[start:], full.loc[start:])


@pytest.mark.parametrize("name", list(FAST))
def test_gaps_constant_and_short_input(name, make_seasonal):
    y = make_seasonal(n=800)
    y.iloc[650:660] = np.nan
    det = _make(name).fit(y.iloc[:500])
    out = det.score(y.iloc[500:])
    assert out.loc[y.index[650:660], "score"].isna().all()
    assert out["score"].iloc[200:].notna().all()  # scoring resumes after the gap
    const = pd.Series(3.0, index=y.index)
    out = _make(name).fit(const.iloc[:500]).score(const.iloc[500:])
    assert np.isfinite(out["expected"].iloc[50:]).all()
    short = y.iloc[:5]
    out = _make(name).fit(short.iloc[:2]).score(short.iloc[2:])
    assert len(out) == 3
    empty = _make(name).fit(y.iloc[:0]).score(y.iloc[:0])
    assert empty.empty


@pytest.mark.parametrize("name", list(FAST))
def test_fitted_detector_round_trips_as_json_and_input_is_not_mutated(name, spiky):
    y, _ = spiky
    before = y.copy()
    det = _make(name).fit(y.iloc[:600])
    again = decode(json.loads(json.dumps(encode(det), allow_nan=False)), det.name)
    pd.testing.assert_frame_equal(det.score(y.iloc[600:900]), again.score(y.iloc[600:900]))
    pd.testing.assert_series_equal(y, before)


def test_sr_follows_the_paper_window_parameters():
    det = SpectralResidualDetector()
    assert (det.q, det.z, det.m) == (3, 21, 5)
    with pytest.raises(ValueError):
        SpectralResidualDetector(window=10)
