"""The fast path's judge, one reading at a time, decides every point as the hourly detect task
does on the same history, and fits each refit anchor's model once (staging's model store)."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pandas as pd
import sqlalchemy as sa

from gpupool.jobs import fastpath as fp
from gpupool.config import parse_config
from gpupool.detect.stage import fit_detector, judge_series
from gpupool.sources.base import Pressure
from gpupool.staging import fastpath as store
from gpupool.staging.schema import pressure_sample, series_profile

STEP = pd.Timedelta("5min")
ROUTER = parse_config({"platforms": [{"name": "slurm", "kind": "simulator"}]}).detect.router_config()
#: the judged window crosses a daily refit anchor (midnight), so two anchors' models judge it
MIDNIGHT = pd.Timestamp("2026-06-04 00:00", tz="UTC")
WINDOW = pd.date_range(MIDNIGHT - pd.Timedelta("2h"), MIDNIGHT + pd.Timedelta("2h"), freq=STEP, inclusive="left")


def _readings() -> dict[str, pd.Series]:
    """Nine days of 5-minute readings with a daily rhythm; in the judged window a one-scrape
    spike of pending GPUs, a burst that persists, and a drop of allocation to zero."""
    idx = pd.date_range(WINDOW[0] - pd.Timedelta(days=9), WINDOW[-1], freq=STEP)
    rng = np.random.default_rng(7)
    day = np.sin(2 * np.pi * (idx.hour * 60 + idx.minute) / 1440.0)
    pending = np.clip(np.round(3 + 2 * day + rng.normal(0, 0.7, len(idx))), 0, None)
    allocated = np.clip(np.round(50 + 6 * day + rng.normal(0, 1.0, len(idx))), 0, None)
    pending = pd.Series(pending, index=idx)
    allocated = pd.Series(allocated, index=idx)
    pending[MIDNIGHT - pd.Timedelta("70min")] = 40.0
    burst = (idx >= MIDNIGHT + pd.Timedelta("25min")) & (idx < MIDNIGHT + pd.Timedelta("85min"))
    pending[burst] += 30.0
    allocated[MIDNIGHT - pd.Timedelta("30min")] = 0.0
    return {"gpu_pending_now": pending, "gpu_allocated_now": allocated}


def test_the_judge_decides_each_point_as_the_detect_task_and_fits_once_per_anchor(engine):
    series = _readings()
    before = [{"platform": "slurm", "metric": m, "at": t.to_pydatetime(), "value": float(v)}
              for m, s in series.items() for t, v in s[s.index < WINDOW[0]].items()]
    with engine.begin() as conn:
        conn.execute(pressure_sample.insert(), before)

    fast, refits = {m: [] for m in series}, 0
    for at in WINDOW:
        pending, allocated = series["gpu_pending_now"][at], series["gpu_allocated_now"][at]
        p = Pressure("slurm", at.to_pydatetime(), allocated, pending, 96.0, (), {}, 12)
        # the tick stages the reading, then judges it on the readings before it
        store.record_pressure(engine, "slurm", at, {"gpu_pending_now": pending, "gpu_allocated_now": allocated})
        judged, fitted = fp._judge_counted(engine, p, ROUTER, STEP)
        refits += fitted
        fast["gpu_pending_now"].append(any(a.startswith("gpus_pending") for a in judged.anomalous))
        fast["gpu_allocated_now"].append(any(a.startswith("gpus_allocated") for a in judged.anomalous))

    # the hourly detect task's judgement of the whole window at once, with its own fits
    hourly = {}
    for metric, canonical in fp.JUDGED.items():
        models = {}

        def model_for(anchor, h, canonical=canonical, models=models):
            if anchor not in models:
                models[anchor] = fit_detector(h, ROUTER, canonical)
            return models[anchor]

        scored = judge_series(series[metric], ROUTER, canonical, WINDOW[0], WINDOW[-1] + STEP, model_for)
        hourly[metric] = scored["is_anomaly"].to_numpy(dtype=bool)
        assert len(models) == 2, "the window must cross a refit anchor"
        np.testing.assert_array_equal(np.array(fast[metric]), hourly[metric], err_msg=metric)
    assert hourly["gpu_pending_now"].sum() >= 2  # the spike and the burst were judged, not just quiet points
    assert hourly["gpu_allocated_now"].any()
    # one fit per anchor and metric, all the window's other ticks rebuilt the stored models
    assert refits == 4
    with engine.connect() as conn:
        stored = conn.execute(sa.select(series_profile.c.metric, series_profile.c.computed_at)
                              .where(series_profile.c.platform == "slurm")).all()
    assert sorted(r.metric for r in stored) == ["gpu_allocated_now"] * 2 + ["gpu_pending_now"] * 2
    assert {fp.reading_key("slurm", r.metric) for r in stored} == {fp.reading_key("slurm", m) for m in series}


def test_a_stored_model_is_reused_not_refitted(engine):
    """A second judge at the same anchor fits nothing: the tick after an anchor's first is cheap."""
    series = _readings()
    at = WINDOW[-1]
    rows = [{"platform": "slurm", "metric": m, "at": t.to_pydatetime(), "value": float(v)}
            for m, s in series.items() for t, v in s[s.index < at].items()]
    with engine.begin() as conn:
        conn.execute(pressure_sample.insert(), rows)
    p = Pressure("slurm", at.to_pydatetime(), series["gpu_allocated_now"][at], series["gpu_pending_now"][at], 96.0)
    first, fitted_first = fp._judge_counted(engine, p, ROUTER, STEP)
    again, fitted_again = fp._judge_counted(engine, p, ROUTER, STEP)
    later = Pressure("slurm", (at + timedelta(minutes=5)).to_pydatetime(), p.gpus_allocated, p.gpus_pending, 96.0)
    _, fitted_later = fp._judge_counted(engine, later, ROUTER, STEP)
    assert (fitted_first, fitted_again, fitted_later) == (2, 0, 0)
    assert first.anomalous == again.anomalous
