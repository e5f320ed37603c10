"""From a series to flags and a cleaned series: profile, route, fit, score, threshold, clean.

Two shapes of the same steps:

- `detect_and_clean(y)` for one series in one go (the CLI): the first part of the series
  (or everything before `score_from`) is history only; every later point is judged on the
  points before it.
- `fit_series_model(history, config)` once a day, then `score_window(model, y, start, end,
  config)` every hour: the fitted model (profile, detector, thresholds) is stored as data
  (`FittedSeriesModel.to_params()`, JSON; `from_params` rebuilds it, never unpickling) and
  reused, and each run scores only its window, with the history it needs as context. The
  model holds numbers, not settings: the alarm and cleaning settings are those of the config
  the judgement is given (`gpupool.detect.settings`).

Flagging: for SVR and Prophet a point is anomalous when |x_t - x̂_t| > τ, τ =
`tau_multiplier` x the robust spread (1.4826 MAD) of the history's residuals; for SR when
its score, normalised by the median and robust spread of the history's SR scores, exceeds
`sr.threshold` (and the point is also `sr.min_residual` spreads from x̂_t, so that a shape
blip of no size is not "cleaned"). The frame's `score` is always that normalised score,
comparable across series: the point is flagged when score > the model's `threshold_`.

Cleaning replaces only what looks like an exporter fault (`transients`, `collapses`,
`stuck_runs`): a spike that comes back within `cleaning.max_anomaly_run` points and towers over the
series' own excursions (`cleaning.spike_height_factor` x the history's peak height) and over the
values on both sides of it (`cleaning.spike_max_shoulder`); a fall to zero as short as a spike (or
up to `cleaning.max_fault_run` on a series whose history hardly idles: an outage); a counter
reset's ramp back (scaled back to the demand; told by its shape where no flag caught its
fall); a stuck run. A spike or a fall is replaced by the line between the readings on both
sides of it. Everything else the
series does is kept, however unusual: a burst or level shift, a surge that climbs and ebbs,
an idle hour (GPU demand rising for hours is workload, not a fault); flagged but kept is
marked `sustained`. Flagging stays causal, a point judged on its past only; only the
decision to replace waits for a few further points, and a flag too close to the end of
the data to tell counts as a point anomaly. For a non-negative metric (`nonnegative`, or
inferred: no negative value in the history) expected and clean values are never below zero,
and a zero-inflated history (`ZERO_INFLATED_SHARE` of exact zeros) floors its residual spread
at its resolution, so a zero next to a small x̂_t is not an anomaly.

Gaps: runs of missing points no longer than
`MAX_FILL_GAP_POINTS` are filled with a straight line between the (clean) values on both
sides, or, where the data ends on either side, with x̂_t (where there is none, the last value
seen), and marked `filled`; longer gaps stay missing. Missing never becomes zero and a zero is a
value like any other.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pandas as pd

from gpupool.detect._robust import ffill_array
from gpupool.detect.alarms import alarm_flags, alarms, run_scores
from gpupool.detect.base import _aligned, prepare
# FittedSeriesModel and fit_series_model are also imported from here by the pipeline, the detect
# stage and the what-if: this module is the stream's front door
from gpupool.detect.model import RESIDUAL_DETECTORS, FittedSeriesModel, fit_series_model
from gpupool.detect.router import MIN_MODEL_POINTS
from gpupool.detect.rules.faults import FAULT_DROP_SHARE, collapses, resets_by_shape
from gpupool.detect.rules.gaps import MAX_FILL_GAP_POINTS, bridge, short_gaps
from gpupool.detect.rules.outages import longest_drop
from gpupool.detect.rules.spikes import transients
from gpupool.detect.rules.stuck import stuck_runs
from gpupool.detect.settings import RouterConfig

__all__ = [
    "OUTPUT_COLUMNS", "FittedSeriesModel", "detect_and_clean", "fit_series_model", "refit_anchors",
    "score_window", "stream_detect",
]

OUTPUT_COLUMNS = [
    "value", "expected", "score", "is_anomaly", "cleaned", "detector", "clean_value", "filled", "sustained"
]
#: share of a series used as history only by `detect_and_clean` when no `score_from` is given, and
#: the fewest such points (set with the NAB bench, bench/detect_nab.py, for one-go judging)
WARMUP_SHARE = 0.15
MIN_WARMUP_POINTS = 48
#: streaming: while the history before the regular refit is under `MIN_MODEL_POINTS`, refit this
#: often (hours), so a new or short series is judged as soon as it has `MIN_HISTORY_POINTS`
#: (the stream's cost at this cadence is bench/detect_scale.py's)
WARMUP_REFIT_HOURS = 1.0
#: streaming: fewest history points a model is fitted on
MIN_HISTORY_POINTS = 24


def score_window(
    model: FittedSeriesModel,
    y_with_history: pd.Series,
    start: pd.Timestamp | None,
    end: pd.Timestamp | None,
    config: RouterConfig | None = None,
) -> pd.DataFrame:
    """Flags and clean values for the rows of `y_with_history` in [start, end).

    Points before `start` are context only (the detector's past); points at or after `end`
    are ignored, so a run never sees beyond its window. The alarm and cleaning settings are
    `config`'s (default `RouterConfig()`) for the model's metric. Returns the frame described
    in `detect_and_clean`, for the window's rows only.
    """
    cfg = (config or RouterConfig()).for_metric(model.metric)
    idx = pd.DatetimeIndex(y_with_history.index)
    keep = np.ones(len(idx), dtype=bool)
    if end is not None:
        keep &= idx < _aligned(end, idx)
    y = y_with_history[keep]
    frame = _judge(model, y, start, cfg)
    if start is not None:
        frame = frame[pd.DatetimeIndex(frame.index) >= _aligned(start, pd.DatetimeIndex(frame.index))]
    frame["is_anomaly"] = alarms(frame, cfg.alarms.merge_points)
    return frame


def detect_and_clean(
    y: pd.Series,
    detector: str = "auto",
    config: RouterConfig | None = None,
    profile: dict | None = None,
    score_from: pd.Timestamp | None = None,
    metric: str | None = None,
) -> pd.DataFrame:
    """Detect and clean one series; one output row per input row, in input order.

    Points before `score_from` are history only (the model is profiled and fitted on them);
    without it, the first `WARMUP_SHARE` of the points (at least `MIN_WARMUP_POINTS`) are.
    Returns a DataFrame indexed like `y` with columns value, expected, score, is_anomaly,
    detector, clean_value, filled, sustained (flagged, but in a run longer than
    `cleaning.max_anomaly_run`: a level shift or burst whose values are kept). History-only rows have no expected value or score and
    are never flagged; their short gaps are still filled (bridged between their neighbours, or
    from the last value seen).
    """
    cfg = config or RouterConfig()
    work = prepare(y)
    if score_from is None:
        n = len(work)
        n_warm = min(n, max(int(round(WARMUP_SHARE * n)), MIN_WARMUP_POINTS))
        score_from = work.index[n_warm] if n_warm < n else None
    if score_from is None:
        history = work
    else:
        history = work[work.index < _aligned(score_from, work.index)]
    model = fit_series_model(history, cfg, profile=profile, detector=detector, metric=metric)
    start = score_from if score_from is not None else (work.index[-1] + pd.Timedelta(1, "ns") if len(work) else None)
    frame = _judge(model, y, start, cfg.for_metric(metric))
    frame["is_anomaly"] = alarms(frame, cfg.for_metric(metric).alarms.merge_points)
    frame.attrs["reason"] = model.reason
    frame.attrs["profile"] = model.profile
    return frame


def _judge(model: FittedSeriesModel, y: pd.Series, start: pd.Timestamp | None, cfg: RouterConfig) -> pd.DataFrame:
    """Score, flag and clean every row of `y` (rows before `start` are context only) under the
    alarm and cleaning settings of `cfg`.

    `is_anomaly` here is every deviating point; `alarms` collapses runs into events.
    """
    work = prepare(y)
    ts_cols = _judge_timestamps(model, work, start, cfg)
    return _to_rows(pd.DataFrame(ts_cols, index=work.index), y, model)


def _judge_timestamps(model: FittedSeriesModel, work: pd.Series, start: pd.Timestamp | None,
                      cfg: RouterConfig) -> dict[str, np.ndarray]:
    """`_judge`'s per-timestamp columns of a prepared series (`prepare`: sorted, one row per timestamp)."""
    raw = work.to_numpy(dtype="float64")
    if len(work) and (start is None or _aligned(start, work.index) <= work.index[-1]):
        det = model.detector.score(work, start=start)
        expected = det["expected"].to_numpy()
        raw_score = det["score"].to_numpy()
    else:
        expected = np.full(len(work), np.nan)
        raw_score = np.full(len(work), np.nan)
    if model.nonnegative_:
        expected = np.where(np.isfinite(expected), np.maximum(expected, 0.0), expected)
    norm = (raw_score - model.score_center_) / model.score_scale_
    resid = np.abs(raw - expected)
    with np.errstate(invalid="ignore"):
        judged = np.isfinite(norm) & np.isfinite(expected) & np.isfinite(raw)
        if model.detector_name not in RESIDUAL_DETECTORS:
            judged &= resid > model.tau_
        flag = judged & (norm > model.threshold_)
        alarm = judged & (norm > model.alarm_threshold_)
    if cfg.alarms.run_points > 0 and np.isfinite(model.run_threshold_) and model.detector_name in RESIDUAL_DETECTORS:
        # a level shift or burst under the one-point alarm: a run of deviations on one side
        signed = np.where(judged, (raw - expected) / model.residual_scale_, np.nan)
        alarm = alarm | (judged & (run_scores(signed, cfg.alarms.run_points) > model.run_threshold_))
    min_height = cfg.cleaning.spike_height_factor * model.excursion_scale_ if np.isfinite(model.excursion_scale_) else 0.0
    # a move still open at the end of the data cannot be told from a step of the demand yet
    min_open = cfg.cleaning.open_move_factor * model.step_scale_ if np.isfinite(model.step_scale_) else 0.0
    transient = transients(
        flag, raw, expected, model.tau_, cfg.cleaning.max_anomaly_run, min_height, cfg.cleaning.spike_max_shoulder, min_open
    )
    sustained = flag & ~transient
    fault, fault_value = collapses(
        flag, raw, expected, model.tau_, cfg.cleaning.max_fault_run, FAULT_DROP_SHARE,
        longest_drop(model.idle_share_, cfg.cleaning),
    )
    sustained &= ~fault
    reset, reset_value = resets_by_shape(
        raw, np.isfinite(expected) & ~(flag & transient) & ~fault, model.tau_, cfg.cleaning.max_fault_run, FAULT_DROP_SHARE
    )
    if reset.any():
        sustained &= ~reset
        fault = fault | reset
        fault_value = np.where(reset, reset_value, fault_value)
    # a stuck run's line ends at the value after it as cleaning sees it: a drop or spike right
    # after the run must not pull the line towards itself
    known = np.where(fault, fault_value, np.where(flag & transient, expected, raw))
    stuck, stuck_value = stuck_runs(raw, expected, model.repeats, cfg.cleaning, model.tau_, model.nonnegative_, known)
    stuck &= np.isfinite(expected) & ~fault
    if stuck.any():
        # every repeat deviates: `alarms` keeps one alarm per run, and the jump back to the
        # real value (judged on an x̂ the repeats shaped) falls in the same event
        alarm = alarm | stuck
        flag = flag | stuck
        sustained &= ~stuck
        fault = fault | stuck
        fault_value = np.where(stuck, stuck_value, fault_value)
    cleaned = (flag & transient) | fault
    spikes = flag & transient & ~fault
    kept = np.where(fault, fault_value, raw)
    clean = np.where(fault, fault_value, np.where(spikes, bridge(kept, spikes, expected), raw))
    filled = np.zeros(len(work), dtype=bool)
    gaps = short_gaps(raw, MAX_FILL_GAP_POINTS)
    if gaps.any():
        carried = ffill_array(np.where(np.isfinite(clean), clean, np.nan))
        # a leading gap has no past to carry: ffill_array would back-fill it, so it stays missing
        has_past = np.maximum.accumulate(np.isfinite(raw))
        fill_value = np.where(np.isfinite(expected), expected, np.where(has_past, carried, np.nan))
        fill_value = np.where(gaps, bridge(clean, gaps, fill_value), fill_value)
        fill_at = gaps & np.isfinite(fill_value)
        clean = np.where(fill_at, fill_value, clean)
        filled = fill_at
    return {
        "expected": expected,
        "score": norm,
        "is_anomaly": alarm,
        "cleaned": cleaned,
        "clean_value": clean,
        "filled": filled,
        "sustained": sustained & flag,
    }


def _to_rows(ts_frame: pd.DataFrame, y: pd.Series, model: FittedSeriesModel) -> pd.DataFrame:
    """Per-timestamp results mapped back onto the rows of `y` (its order and duplicates)."""
    pos = ts_frame.index.get_indexer(pd.DatetimeIndex(y.index))
    values = pd.to_numeric(pd.Series(y), errors="coerce").to_numpy(dtype="float64")
    cols = _row_columns({c: ts_frame[c].to_numpy() for c in ts_frame.columns}, pos, values, model)
    cols["detector"] = model.detector_name
    out = pd.DataFrame(cols, index=y.index)
    return out[OUTPUT_COLUMNS]


def _row_columns(ts_cols: dict[str, np.ndarray], pos: np.ndarray, values: np.ndarray,
                 model: FittedSeriesModel) -> dict[str, np.ndarray]:
    """The output columns (but `detector`) of rows at timestamp positions `pos` (-1: none)
    with raw `values`, from `_judge_timestamps`' per-timestamp columns."""
    ok = pos >= 0

    def take(col: str, default):
        arr = ts_cols[col]
        if arr.size == 0:  # no usable timestamp at all
            return np.full(len(pos), default)
        return np.where(ok, arr[np.where(ok, pos, 0)], default)

    cleaned = take("cleaned", False).astype(bool)
    filled_rows = take("filled", False).astype(bool) & ~np.isfinite(values)
    clean_rows = np.where(cleaned, take("clean_value", np.nan), values)
    clean_rows = np.where(filled_rows, take("clean_value", np.nan), clean_rows)
    if model.nonnegative_:
        # x̂ and fills of a non-negative metric are clipped already; a raw negative value
        # (a broken counter) is left for the flag to judge, never invented by cleaning
        clean_rows = np.where(cleaned | filled_rows, np.maximum(clean_rows, 0.0), clean_rows)
    return {
        "value": values,
        "expected": take("expected", np.nan).astype("float64"),
        "score": take("score", np.nan).astype("float64"),
        "is_anomaly": take("is_anomaly", False).astype(bool),
        "cleaned": cleaned,
        "clean_value": clean_rows.astype("float64"),
        "filled": filled_rows,
        "sustained": take("sustained", False).astype(bool),
    }


# --- streaming: the same judgement over a file (CLI) and hour by hour (pipeline) -------------

ModelFor = Callable[[pd.Timestamp, pd.Series], FittedSeriesModel]


def refit_anchors(index: pd.DatetimeIndex, valid: np.ndarray, config: RouterConfig) -> pd.DatetimeIndex:
    """For each timestamp of `index` (sorted), the time its model was fitted at (NaT: none yet).

    A point at t is judged by the model fitted on the history in [a - history_days, a),
    a = t floored to `refit_every_hours` (counted from the Unix epoch, so the pipeline and
    the CLI agree on it), when that history holds at least `MIN_MODEL_POINTS` valid points;
    otherwise (a new or short series) a = t floored to `WARMUP_REFIT_HOURS`, when that
    history holds at least `MIN_HISTORY_POINTS`; otherwise the point is not judged.
    `valid` marks the timestamps with a finite value.
    """
    idx = pd.DatetimeIndex(index)
    if len(idx) == 0:
        return idx
    span = pd.Timedelta(hours=24.0 * config.history_days)
    vt = idx[np.asarray(valid, dtype=bool)].asi8

    def count(anchor: pd.DatetimeIndex) -> np.ndarray:
        a = anchor.asi8
        return np.searchsorted(vt, a, side="left") - np.searchsorted(vt, (anchor - span).asi8, side="left")

    regular = _floor(idx, config.refit_every_hours)
    warm = _floor(idx, WARMUP_REFIT_HOURS)
    use_regular = count(regular) >= MIN_MODEL_POINTS
    use_warm = ~use_regular & (count(warm) >= MIN_HISTORY_POINTS)
    out = np.where(use_regular, regular.asi8, np.where(use_warm, warm.asi8, np.iinfo("int64").min))
    return _from_i8(out, idx)


def _from_i8(values: np.ndarray, like: pd.DatetimeIndex) -> pd.DatetimeIndex:
    nat = values == np.iinfo("int64").min
    arr = values.astype(f"datetime64[{like.unit}]")
    arr[nat] = np.datetime64("NaT")
    out = pd.DatetimeIndex(arr)
    return out.tz_localize("UTC").tz_convert(like.tz) if like.tz is not None else out


def _floor(idx: pd.DatetimeIndex, hours: float) -> pd.DatetimeIndex:
    """`idx` floored to multiples of `hours` counted from the Unix epoch (UTC)."""
    step = int(round(hours * 3600 * 1e9))
    ns = idx.as_unit("ns").asi8 if idx.tz is None else idx.tz_convert("UTC").as_unit("ns").asi8
    floored = (ns // step) * step
    out = pd.DatetimeIndex(floored.astype("datetime64[ns]"))
    if idx.tz is not None:
        out = out.tz_localize("UTC").tz_convert(idx.tz)
    return out.as_unit(idx.unit)


def stream_detect(
    y: pd.Series,
    config: RouterConfig | None = None,
    detector: str = "auto",
    metric: str | None = None,
    start: pd.Timestamp | None = None,
    end: pd.Timestamp | None = None,
    model_for: ModelFor | None = None,
) -> pd.DataFrame:
    """Detect and clean `y` as time passes: the rows in [start, end), one per input row.

    Every point is judged on its past only, by the model fitted at its refit anchor (see
    `refit_anchors`): refitted every `refit_every_hours` on the newest `history_days` of
    history, with routing re-decided at each refit. `model_for(anchor, history)` returns
    the model for an anchor (the pipeline's stored one, or a fit); by default each anchor's
    model is fitted here. Alarms (`is_anomaly`) are collapsed per event over the
    `alarms.merge_points` before `start` too, so judging a file in one go and judging it
    window by window raise the same alarms. The decision to clean a deviating point looks
    at up to `cleaning.max_anomaly_run` later points (a collapse: `cleaning.max_fault_run` + 2) that are in `y`
    before `end`; a fault that began before a refit and runs on past it is cleaned as the
    model that saw it begin decided. Every model judges under the alarm and cleaning settings
    of `config` (for `metric`).

    Returns the columns of OUTPUT_COLUMNS indexed like the selected rows of `y`; attrs
    hold `models` (anchor -> (detector, reason)) and the newest model's `reason`/`profile`.
    """
    cfg = (config or RouterConfig()).for_metric(metric)
    rows_idx = pd.DatetimeIndex(y.index)
    select = np.ones(len(y), dtype=bool)
    if start is not None:
        select &= rows_idx >= _aligned(start, rows_idx)
    if end is not None:
        select &= rows_idx < _aligned(end, rows_idx)
    work = prepare(y)
    if end is not None:
        work = work[work.index < _aligned(end, work.index)]
    # judged from `alarms.merge_points` before start, so an event running into the window is known
    first = 0
    if start is not None:
        first = max(0, int(work.index.searchsorted(_aligned(start, work.index), side="left")) - cfg.alarms.merge_points)
    fits: dict[pd.Timestamp, FittedSeriesModel] = {}

    def fitted(anchor: pd.Timestamp) -> FittedSeriesModel:
        if anchor not in fits:
            span = pd.Timedelta(hours=24.0 * cfg.history_days)
            history = work[(work.index >= anchor - span) & (work.index < anchor)]
            if model_for is not None:
                fits[anchor] = model_for(anchor, history)
            else:
                fits[anchor] = fit_series_model(history, cfg, detector=detector)
        return fits[anchor]

    parts = _judge_segments(work, first, cfg, fitted)
    judged = {c: np.concatenate([pt[c] for pt in parts]) for c in OUTPUT_COLUMNS} if parts else {}
    judged_index = work.index[first:] if parts else work.index[:0]
    if parts:
        judged["is_anomaly"] = alarm_flags(judged["is_anomaly"].astype(bool), judged_index, cfg.alarms.merge_points)
    out = _onto_rows(judged, judged_index, y[select])
    newest = fits[max(fits)] if fits else None
    out.attrs["models"] = {str(a): (m.detector_name, m.reason) for a, m in sorted(fits.items())}
    out.attrs["reason"] = newest.reason if newest else "history too short to judge any point"
    out.attrs["profile"] = newest.profile if newest else {}
    out.attrs["refits"] = len(fits)
    return out[OUTPUT_COLUMNS]


def _judge_segments(
    work: pd.Series, first: int, cfg: RouterConfig, fitted: Callable[[pd.Timestamp], FittedSeriesModel],
) -> list[dict[str, np.ndarray]]:
    """`stream_detect`'s columns of the prepared series `work` from row `first` on, one part per
    run of rows with one refit anchor (`fitted(anchor)` gives its model), judged under `cfg`."""
    anchors = refit_anchors(work.index, np.isfinite(work.to_numpy()), cfg)
    # the segments' columns as arrays (pandas frames per hourly window cost more than the judging)
    parts: list[dict[str, np.ndarray]] = []
    pos = first
    n = len(work)
    a_i8 = anchors.asi8
    work_values = work.to_numpy(dtype="float64")
    span = pd.Timedelta(hours=24.0 * cfg.history_days)
    # the cleaning decision's look at what follows: a spike's return, or a collapse's whole run
    ahead = max(cfg.cleaning.max_anomaly_run, cfg.cleaning.max_fault_run + 2)
    # clean values of a fault that runs on past its segment's last row, for the next segment's first rows
    carry = np.array([])
    while pos < n:
        stop = pos + 1
        while stop < n and a_i8[stop] == a_i8[pos]:
            stop += 1
        if pd.isna(anchors[pos]):
            parts.append(_unjudged(work_values[pos:stop]))
            carry = np.array([])
            pos = stop
            continue
        model = fitted(anchors[pos])
        lo = int(work.index.searchsorted(anchors[pos] - span, side="left"))
        hi = min(n, stop + ahead)
        # `_judge` of the prepared slice: its rows are its timestamps
        ts_cols = _judge_timestamps(model, work.iloc[lo:hi], work.index[pos], cfg)
        full = _row_columns(ts_cols, np.arange(hi - lo), work_values[lo:hi], model)
        part = {c: v[pos - lo : stop - lo].copy() for c, v in full.items()}
        part["detector"] = np.full(stop - pos, model.detector_name, dtype=object)
        if carry.size:
            # a fault that began before the refit is the earlier model's to judge: the new one
            # has no x̂ from before its first point to see the fault start
            k = min(carry.size, stop - pos)
            part["cleaned"][:k] = True
            part["clean_value"][:k] = carry[:k]
            part["sustained"][:k] = False
        carry = np.array([])
        if stop > pos and part["cleaned"][-1] and hi > stop:
            cleaned_ahead = full["cleaned"][stop - lo :].astype(bool)
            k = len(cleaned_ahead) if cleaned_ahead.all() else int(np.argmin(cleaned_ahead))
            carry = full["clean_value"][stop - lo :].astype("float64")[:k]
        parts.append(part)
        pos = stop
    return parts


def _unjudged(values: np.ndarray) -> dict[str, np.ndarray]:
    """The columns of rows no model judges yet (too little history): their values, unflagged."""
    m = values.size
    return {
        "value": values.copy(),
        "expected": np.full(m, np.nan),
        "score": np.full(m, np.nan),
        "is_anomaly": np.zeros(m, dtype=bool),
        "cleaned": np.zeros(m, dtype=bool),
        "detector": np.full(m, "", dtype=object),
        "clean_value": values.copy(),
        "filled": np.zeros(m, dtype=bool),
        "sustained": np.zeros(m, dtype=bool),
    }


def _onto_rows(judged: dict[str, np.ndarray], judged_index: pd.DatetimeIndex, sel: pd.Series) -> pd.DataFrame:
    """The judged per-timestamp columns back onto the caller's rows `sel` (order and duplicate
    timestamps), like `_judge` does."""
    parts = bool(judged)
    pos_rows = judged_index.get_indexer(pd.DatetimeIndex(sel.index)) if parts else np.full(len(sel), -1)
    values = pd.to_numeric(pd.Series(sel), errors="coerce").to_numpy(dtype="float64")
    ok = pos_rows >= 0
    defaults = {"is_anomaly": False, "cleaned": False, "filled": False, "sustained": False, "detector": ""}
    cols = {}
    for col in OUTPUT_COLUMNS:
        default = defaults.get(col, np.nan)
        if parts:
            cols[col] = np.where(ok, judged[col][np.where(ok, pos_rows, 0)], default)
        else:
            cols[col] = np.full(len(sel), default, dtype=object if col == "detector" else None)
    # a duplicate timestamp's other rows keep their own value unless cleaned or filled
    cleaned = cols["cleaned"].astype(bool)
    filled = cols["filled"].astype(bool)
    cols["value"] = values
    cols["clean_value"] = np.where(~(cleaned | filled), values, cols["clean_value"].astype("float64"))
    cols["filled"] = filled & ~np.isfinite(values)
    for col in ("is_anomaly", "cleaned", "sustained"):
        cols[col] = cols[col].astype(bool)
    for col in ("expected", "score"):
        cols[col] = cols[col].astype("float64")
    return pd.DataFrame(cols, index=sel.index)
