"""Faults by provenance: health rows say a reading is no measurement; the detect stage cleans it
as a fault whatever its value and raises no alarm for it."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from gpupool.canonical import HEALTH_ENTITY_KIND, health_target
from gpupool.detect.provenance import health_rows, judge_known_faults, provenance_faults
from gpupool.detect.router import RouterConfig
from gpupool.detect.stage import judge_series

from .conftest import seasonal_series

STEP = pd.Timedelta("5min")


def _health(index: pd.DatetimeIndex, up=None, sampled=None, scraped=None) -> pd.DataFrame:
    """Health rows at ``index``: ``up`` flags, the samples' own times (unix seconds), scrape counts."""
    rows = []
    t = index.as_unit("ns").asi8 / 1e9
    if up is not None:
        rows.append(pd.DataFrame({"metric": "health_up", "ts": index, "value": np.asarray(up, float)}))
    if sampled is not None:
        rows.append(pd.DataFrame({"metric": "health_sample_age_seconds", "ts": index, "value": t - np.asarray(sampled)}))
    if scraped is not None:
        rows.append(pd.DataFrame({"metric": "health_samples_scraped", "ts": index, "value": np.asarray(scraped, float)}))
    return pd.concat(rows, ignore_index=True)


def test_down_stale_frozen_and_empty_scrapes_are_faults_and_nothing_else():
    idx = pd.date_range("2025-01-06", periods=40, freq=STEP, tz="UTC")
    t = idx.as_unit("ns").asi8 / 1e9
    up = np.ones(40)
    up[5] = 0
    sampled = t.copy()
    sampled[10:16] = t[10]  # a stuck exporter: its sample time stops at step 10
    sampled[20] = t[20] - 900  # a stale sample, 15 minutes old
    sampled[30] = t[30] - 60  # a scrape a minute before the grid point: fresh
    scraped = np.full(40, 12.0)
    scraped[25] = 0
    mask = provenance_faults(idx, _health(idx, up, sampled, scraped), STEP)
    assert np.flatnonzero(mask).tolist() == [5, 11, 12, 13, 14, 15, 20, 25]


def test_a_slow_scrape_that_repeats_a_fresh_sample_is_no_fault():
    idx = pd.date_range("2025-01-06", periods=10, freq="1min", tz="UTC")
    t = idx.as_unit("ns").asi8 / 1e9
    sampled = t - (t % 120)  # a 2-minute scrape read on a 1-minute grid
    assert not provenance_faults(idx, _health(idx, sampled=sampled), pd.Timedelta("1min")).any()


def test_no_health_rows_is_no_evidence():
    idx = pd.date_range("2025-01-06", periods=10, freq=STEP, tz="UTC")
    empty = pd.DataFrame(columns=["metric", "ts", "value"])
    assert not provenance_faults(idx, empty, STEP).any()
    some = _health(idx[:3], up=[0, 0, 0])
    assert np.flatnonzero(provenance_faults(idx, some, STEP)).tolist() == [0, 1, 2]


def test_health_rows_are_those_of_the_target_that_vouches_for_the_metric():
    frame = pd.DataFrame({
        "platform": ["s", "s", "s", "k"], "cluster": "", "entity_kind": [HEALTH_ENTITY_KIND] * 3 + ["target"],
        "entity_id": [health_target("gpu_allocated"), health_target("gpu_pending"), health_target("gpu_allocated"),
                      health_target("gpu_allocated")],
        "metric": ["health_up"] * 4, "ts": pd.Timestamp("2025-01-06", tz="UTC"), "value": [1.0, 0.0, 1.0, 0.0],
    })
    got = health_rows(frame, ("s", "", "platform", "", "gpu_allocated"))
    assert len(got) == 2 and (got["value"] == 1.0).all()


def _judge(y, start, end, known=None):
    router = RouterConfig()
    return judge_series(y, router, "gpu_allocated", start, end, None, known_faults=known)


def test_a_stuck_run_known_from_the_source_is_cleaned_and_raises_no_alarm():
    y = seasonal_series(n=2016, seed=4)
    truth = y.copy()
    a, b = 1700, 1724  # two hours frozen while the cycle moves
    y.iloc[a:b] = y.iloc[a - 1]
    y.iloc[1800] = 0.0  # a drop the target was down for
    known = np.zeros(len(y), dtype=bool)
    known[a:b] = True
    known[1800] = True
    start, end = y.index[1600], y.index[1900]
    out = _judge(y, start, end, known)
    window = out.index
    at = known[y.index.get_indexer(window)]
    assert out.loc[at, "cleaned"].all() and not out.loc[at, "is_anomaly"].any()
    assert (out.loc[at, "value"].to_numpy() == y.reindex(window)[at].to_numpy()).all(), "the reading itself is kept"
    err = np.abs(out.loc[at, "clean_value"].to_numpy() - truth.reindex(window)[at].to_numpy())
    left = err.sum() / np.abs(y.reindex(window)[at].to_numpy() - truth.reindex(window)[at].to_numpy()).sum()
    assert left < 0.35, left
    # the points the source vouched for are judged as without provenance (no fault there)
    plain = _judge(truth, start, end)
    assert out.loc[~at, "is_anomaly"].sum() <= plain["is_anomaly"].sum() + 1


def test_without_known_faults_the_judgement_is_unchanged():
    y = seasonal_series(n=1200, seed=5)
    y.iloc[1100] += 15
    start, end = y.index[1000], y.index[1200 - 1]
    base = _judge(y, start, end)
    none = _judge(y, start, end, np.zeros(len(y), dtype=bool))
    pd.testing.assert_frame_equal(base, none)


def test_a_mask_of_the_wrong_length_is_refused():
    y = seasonal_series(n=100)
    with pytest.raises(ValueError, match="provenance mask"):
        judge_known_faults(y, np.zeros(3, dtype=bool), lambda s: s.to_frame("value"))
