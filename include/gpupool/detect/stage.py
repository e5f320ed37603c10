"""The detect stage's decisions on one series, called by the detect task and by the what-if.

``gpupool.pipeline.detect`` (the DAG task) and ``gpupool.sim.study`` (``gpupool simulate``) both
judge a series here, so what a what-if shows is what production would have flagged and cleaned:
the look-back a window needs, the model fitted at a refit anchor, and the streaming judgement.
Where the models are kept differs (staging's model store, or memory); the decisions do not.
"""

from __future__ import annotations

from datetime import timedelta

import pandas as pd

from gpupool.canonical import SERIES_KEY
from gpupool.detect.clean import fit_series_model, stream_detect

#: points judged before a window so an event running into it raises no second alarm (above
#: the router's `alarm_merge_points` at the pipeline's 5-minute step)
DETECT_ALARM_LOOKBACK = timedelta(hours=6)


def detect_lookback(router) -> timedelta:
    """How far before a window the detect stage reads: the oldest refit its points can need."""
    return timedelta(hours=24.0 * router.history_days + router.refit_every_hours) + DETECT_ALARM_LOOKBACK


def fit_detector(history: pd.Series, router, metric: str | None):
    """The detect stage's model of one series at a refit anchor, fitted on ``history``.

    Pure: the pipeline stores it per anchor in ``series_profile``; ``gpupool simulate`` keeps it
    in memory per anchor.
    """
    return fit_series_model(history, router, metric=metric)


def judge_series(series: pd.Series, router, metric: str | None, start, end, model_for) -> pd.DataFrame:
    """The detect stage's streaming judgement of the points of ``series`` in ``[start, end)``.

    ``series`` holds the window and :func:`detect_lookback` before it; ``model_for(anchor,
    history)`` gives each refit anchor's model. Pure: the pipeline writes the result to
    ``clean_sample``; the simulator feeds its ``clean_value`` on to the forecast.
    """
    return stream_detect(series, router, metric=metric, start=start, end=end, model_for=model_for)


def grid_series(frame: pd.DataFrame, key: tuple, freq: pd.Timedelta) -> pd.Series:
    mask = pd.Series(True, index=frame.index)
    for col, val in zip(SERIES_KEY, key):
        mask &= frame[col] == val
    s = frame.loc[mask].set_index("ts")["value"].sort_index()
    # a regular grid: missing points become NaN (a gap), never zero
    grid = pd.date_range(s.index.min().floor(freq), s.index.max(), freq=freq)
    return s.reindex(s.index.union(grid)).astype("float64")
