"""Faults known from the source: a reading whose target was down, stale, or whose sample time
stopped advancing is a fault by provenance, whatever its value.

A source that can say how a reading was made stages a health series per target beside the
samples (`gpupool.canonical.HEALTH_METRICS`, entity kind `HEALTH_ENTITY_KIND`, entity id the
metric it vouches for). The detect stage reads them here:

- `provenance_faults` turns a target's health rows into a mask over a series' timestamps;
- `judge_known_faults` judges the series with those points taken out (the detector neither
  scores them nor learns from them) and then writes them back as cleaned, never as alarms:
  the source said the reading is not a measurement, so it is no anomaly of the demand either.

Where a timestamp has no health row the source gave no evidence, and the value rules decide
alone (`gpupool.detect.rules`).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pandas as pd

from gpupool.canonical import HEALTH_ENTITY_KIND, health_target
from gpupool.detect._robust import ffill_array
from gpupool.detect.rules.gaps import bridge

__all__ = ["STALE_AFTER_S", "health_rows", "judge_known_faults", "provenance_faults"]

#: a sample older than this (seconds) at the evaluation time is stale: Prometheus' default
#: lookback, after which it no longer answers with the sample at all
STALE_AFTER_S = 300.0


def health_rows(frame: pd.DataFrame, key: tuple) -> pd.DataFrame:
    """The health rows (``metric``, ``ts``, ``value``) of the target that vouches for the series
    ``key`` = (platform, cluster, entity_kind, entity_id, metric), from a canonical frame."""
    platform, cluster, _, _, metric = key
    mask = (
        (frame["entity_kind"] == HEALTH_ENTITY_KIND)
        & (frame["entity_id"] == health_target(metric))
        & (frame["platform"] == platform)
        & (frame["cluster"] == cluster)
    )
    return frame.loc[mask, ["metric", "ts", "value"]]


def provenance_faults(index: pd.DatetimeIndex, health: pd.DataFrame, step: pd.Timedelta) -> np.ndarray:
    """Per timestamp of ``index``: whether the target's health rows say the reading there is no
    measurement.

    A reading is a fault when its target was down (``health_up`` 0), scraped nothing
    (``health_samples_scraped`` 0), answered with a stale sample (``health_sample_age_seconds``
    over `STALE_AFTER_S` and over one ``step``), or with a sample whose own time did not
    advance since the timestamp before although a new one was due (a frozen exporter keeps
    answering with its last sample; a sample younger than the target's usual scrape interval,
    the median advance of its sample times, is a scrape slower than the grid, not a fault).
    A timestamp with no health row is no evidence either way.
    """
    idx = pd.DatetimeIndex(index)
    out = np.zeros(len(idx), dtype=bool)
    if health is None or health.empty or not len(idx):
        return out
    wide = health.pivot_table(index="ts", columns="metric", values="value", aggfunc="min")
    wide.index = pd.DatetimeIndex(wide.index)
    wide = wide.reindex(idx)
    step_s = pd.Timedelta(step).total_seconds()
    with np.errstate(invalid="ignore"):
        if "health_up" in wide:
            out |= wide["health_up"].to_numpy(float) == 0
        if "health_samples_scraped" in wide:
            out |= wide["health_samples_scraped"].to_numpy(float) == 0
        if "health_sample_age_seconds" in wide:
            age = wide["health_sample_age_seconds"].to_numpy(float)
            out |= age > max(STALE_AFTER_S, step_s)
            sampled = idx.as_unit("ns").asi8 / 1e9 - age  # the sample's own time, NaN where unknown
            known = np.isfinite(sampled)
            prev = np.full(len(idx), np.nan)
            prev[1:] = ffill_array(np.where(known, sampled, np.nan))[:-1]
            moved = np.diff(sampled[known])
            moved = moved[moved > 0]
            # the target's own scrape interval: a sample is due once the last is that old
            interval = float(np.median(moved)) if moved.size else step_s
            out |= known & np.isfinite(prev) & (sampled <= prev) & (age >= interval - 1e-6)
    return out


def judge_known_faults(
    series: pd.Series,
    faults: np.ndarray,
    judge: Callable[[pd.Series], pd.DataFrame],
) -> pd.DataFrame:
    """``judge`` of ``series`` with the points of ``faults`` (a mask over its rows) taken out,
    and those points written back as faults by provenance: their own value, cleaned, no alarm.

    A faulted point's clean value is the line from the clean value before its run to the one
    after it (the readings around a fault are the demand's own); where the run is open at
    either end of what is judged, x̂, or else the last clean value.
    """
    faults = np.asarray(faults, dtype=bool)
    if faults.size != len(series):
        raise ValueError(f"provenance mask has {faults.size} points, the series {len(series)}")
    if not faults.any():
        return judge(series)
    raw = series.to_numpy(dtype="float64")
    scored = judge(series.where(~faults))
    idx = pd.DatetimeIndex(series.index)
    pos = idx.get_indexer(pd.DatetimeIndex(scored.index))
    ok = pos >= 0
    # the series as cleaning keeps it: history before the window as read (less its faults),
    # the judged rows as cleaned
    kept = np.where(faults, np.nan, raw)
    kept[pos[ok]] = np.where(faults[pos[ok]], np.nan, scored["clean_value"].to_numpy(float)[ok])
    expected = np.full(len(series), np.nan)
    expected[pos[ok]] = scored["expected"].to_numpy(float)[ok]
    carried = ffill_array(kept)
    has_past = np.maximum.accumulate(np.isfinite(kept))
    fallback = np.where(np.isfinite(expected), expected, np.where(has_past, carried, np.nan))
    line = bridge(kept, faults, fallback)
    out = scored.copy()
    at = ok & faults[np.where(ok, pos, 0)]
    where = pos[at]
    out.loc[at, "value"] = raw[where]
    out.loc[at, "cleaned"] = np.isfinite(raw[where])
    out.loc[at, "filled"] = ~np.isfinite(raw[where]) & np.isfinite(line[where])
    out.loc[at, "clean_value"] = line[where]
    out.loc[at, "is_anomaly"] = False
    if "sustained" in out:
        out.loc[at, "sustained"] = False
    out.attrs.update(scored.attrs)
    out.attrs["provenance_faults"] = int(at.sum())
    return out
