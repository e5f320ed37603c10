"""The detect stage's decisions on one series, called by the detect task and by the what-if.

``gpupool.pipeline.detect`` (the DAG task) and ``gpupool.sim.study`` (``gpupool simulate``) both
judge a series here, so what a what-if shows is what production would have flagged and cleaned:
the look-back a window needs, the model fitted at a refit anchor, and the streaming judgement.
Where the models are kept differs (staging's model store, or memory); the decisions do not.
"""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from typing import Any

import pandas as pd

from gpupool.canonical import SERIES_KEY
from gpupool.detect.clean import fit_series_model, stream_detect
from gpupool.detect.provenance import judge_known_faults
from gpupool.staging import models as model_store
from gpupool.values import jsonable

log = logging.getLogger(__name__)

#: points judged before a window so an event running into it raises no second alarm (above
#: the router's `alarms.merge_points` at the pipeline's 5-minute step)
DETECT_ALARM_LOOKBACK = timedelta(hours=6)


def detect_lookback(router) -> timedelta:
    """How far before a window the detect stage reads: the oldest refit its points can need."""
    return timedelta(hours=24.0 * router.history_days + router.refit_every_hours) + DETECT_ALARM_LOOKBACK


def fit_detector(history: pd.Series, router, metric: str | None):
    """The detect stage's model of one series at a refit anchor, fitted on ``history``.

    Pure: the pipeline stores it per anchor in staging (:func:`model_for`); ``gpupool simulate``
    keeps it in memory per anchor.
    """
    return fit_series_model(history, router, metric=metric)


def model_for(engine, key: tuple, anchor, history: pd.Series, fit) -> tuple[Any, bool]:
    """The model of series ``key`` fitted at refit ``anchor``, and whether it was fitted now.

    The model stored in staging's model store for that series and anchor (by an earlier run)
    is rebuilt and reused; else ``fit(history)`` fits one, which is stored (replacing the row)
    for the windows after this one. Models are stored as JSON parameters
    (``FittedSeriesModel.to_params``) and rebuilt with ``from_params``, never unpickled: a
    staging row is data, not code. A stored model holds the numbers its history gave, not the
    router's settings: it is judged under the settings the run is given (one stored by the
    layout before, with the settings inside, is read and its settings ignored). A stored row
    that does not rebuild (malformed, or a layout this code does not read) is logged and
    replaced by a refit.
    """
    at = pd.Timestamp(anchor).to_pydatetime()
    text = model_store.model_text(engine, key, at)
    if text is not None:
        stored = _stored_model(text, key, pd.Timestamp(at))
        if stored is not None:
            return stored, False
    model = fit(history)
    model_store.replace_model(
        engine, key, at,
        features=jsonable(model.profile),
        detector=model.detector_name,
        reason=model.reason,
        model=json.dumps(model.to_params(), allow_nan=False, separators=(",", ":")),
    )
    return model, True


def _stored_model(text: Any, key: tuple, computed: pd.Timestamp):
    """The model stored as JSON text in the model store, or None (logged) when it does not rebuild."""
    from gpupool.detect.params import ModelParamsError
    from gpupool.detect.clean import FittedSeriesModel

    series = "/".join(str(v) for v in key)
    try:
        if not isinstance(text, str):
            raise ModelParamsError(f"expected JSON text, got {type(text).__name__}")
        return FittedSeriesModel.from_params(json.loads(text))
    except (ModelParamsError, ValueError, RecursionError) as exc:  # json's decode error is a ValueError
        log.warning(
            "series_profile model for series %s computed at %s is not valid model parameters (%s): refitting",
            series,
            computed.isoformat(),
            str(exc)[:200],
        )
        return None


def judge_series(series: pd.Series, router, metric: str | None, start, end, model_for, known_faults=None) -> pd.DataFrame:
    """The detect stage's streaming judgement of the points of ``series`` in ``[start, end)``.

    ``series`` holds the window and :func:`detect_lookback` before it; ``model_for(anchor,
    history)`` gives each refit anchor's model. ``known_faults`` (optional, a mask over the rows
    of ``series``) marks the readings the source says are no measurement
    (:func:`gpupool.detect.provenance.provenance_faults`): they are judged as faults by
    provenance (cleaned, never alarms) and kept out of the models. Pure: the pipeline writes
    the result to ``clean_sample``; the simulator feeds its ``clean_value`` on to the forecast.
    """
    def judge(s: pd.Series) -> pd.DataFrame:
        return stream_detect(s, router, metric=metric, start=start, end=end, model_for=model_for)

    if known_faults is None:
        return judge(series)
    return judge_known_faults(series, known_faults, judge)


def grid_series(frame: pd.DataFrame, key: tuple, freq: pd.Timedelta) -> pd.Series:
    mask = pd.Series(True, index=frame.index)
    for col, val in zip(SERIES_KEY, key):
        mask &= frame[col] == val
    s = frame.loc[mask].set_index("ts")["value"].sort_index()
    # a regular grid: missing points become NaN (a gap), never zero
    grid = pd.date_range(s.index.min().floor(freq), s.index.max(), freq=freq)
    return s.reindex(s.index.union(grid)).astype("float64")
