"""From a series to flags and a cleaned series: profile, route, fit, score, threshold, clean.

Two shapes of the same steps:

- `detect_and_clean(y)` for one series in one go (the CLI): the first part of the series
  (or everything before `score_from`) is history only; every later point is judged on the
  points before it.
- `fit_series_model(history)` once a day, then `score_window(model, y, start, end)` every
  hour: the fitted model (profile, detector, thresholds) is stored as data
  (`FittedSeriesModel.to_params()`, JSON; `from_params` rebuilds it, never unpickling) and
  reused, and each run scores only its window, with the history it needs as context.

Flagging: for SVR and Prophet a point is anomalous when |x_t - x̂_t| > τ, τ =
`tau_multiplier` x the robust spread (1.4826 MAD) of the history's residuals; for SR when
its score, normalised by the median and robust spread of the history's SR scores, exceeds
`sr_threshold` (and the point is also `sr_min_residual` spreads from x̂_t, so that a shape
blip of no size is not "cleaned"). The frame's `score` is always that normalised score,
comparable across series: the point is flagged when score > the model's `threshold_`.

Cleaning: a point anomaly is short. A flagged point t is replaced by x̂_t only when the
series comes back within τ of x̂_t in at most `max_anomaly_run` points; when the next
`max_anomaly_run` values all stay away from it, the departure is a level shift or a burst of
real demand (GPU demand rising for hours is workload, not a fault): its values are kept,
`is_anomaly` is false and `sustained` marks the flagged point. (Whether the later points are
flagged does not matter: SR flags only a burst's onset, and a regression follows a new
level after a few points.) Flagging stays causal, a point judged on its past only; only the
decision to replace waits for at most `max_anomaly_run` further points, and a flag too close
to the end of the data to tell counts as a point anomaly. For a non-negative metric (`nonnegative`, or
inferred: no negative value in the history) expected and clean values are never below zero,
and a zero-inflated history (`zero_inflated_share` of exact zeros) floors its residual spread
at its resolution, so a zero next to a small x̂_t is not an anomaly.

Gaps: runs of missing points no longer than
`max_fill_gap_points` are filled with x̂_t (or, where there is none, the last value seen)
and marked `filled`; longer gaps stay missing. Missing never becomes zero and a zero is a
value like any other.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from gpupool.detect._robust import ffill_array, robust_sigma
from gpupool.detect.base import ModelParamsError, _aligned, decode_floats, encode_floats, param, prepare
from gpupool.detect.features import profile_series
from gpupool.detect.prophet import ProphetDetector
from gpupool.detect.router import DETECTORS, RouterConfig, route
from gpupool.detect.sr import SpectralResidualDetector
from gpupool.detect.svr import SVRDetector

OUTPUT_COLUMNS = ["value", "expected", "score", "is_anomaly", "detector", "clean_value", "filled", "sustained"]
RESIDUAL_DETECTORS = ("svr", "prophet")
#: share of nonzero steps from which a series' typical step floors its residual spread
MIN_STEP_SHARE = 0.02


@dataclass
class FittedSeriesModel:
    """Everything an hourly run needs to score one series without refitting.

    Stored as data: `to_params()` gives a JSON-able dict, `from_params()` rebuilds the model.
    """

    profile: dict
    detector_name: str
    reason: str
    detector: object
    config: RouterConfig
    metric: str | None = None
    fitted_through: pd.Timestamp | None = None
    score_center_: float = 0.0
    score_scale_: float = 1.0
    residual_scale_: float = float("nan")
    threshold_: float = float("nan")
    tau_: float = float("nan")
    nonnegative_: bool = False
    extra: dict = field(default_factory=dict)

    PARAMS_FORMAT = 1
    _SCALARS = ("score_center_", "score_scale_", "residual_scale_", "threshold_", "tau_")

    def to_params(self) -> dict:
        """The fitted model as a JSON-able dict (numbers, strings, lists; no NaN or inf)."""
        to_params = getattr(self.detector, "to_params", None)
        if to_params is None:
            raise TypeError(f"detector {self.detector_name!r} cannot be stored as data")
        out = {
            "format": self.PARAMS_FORMAT,
            "profile": _jsonable(self.profile),
            "detector_name": self.detector_name,
            "reason": self.reason,
            "detector": to_params(),
            "config": self.config.to_params(),
            "metric": self.metric,
            "fitted_through": None if self.fitted_through is None else pd.Timestamp(self.fitted_through).isoformat(),
            "nonnegative": bool(self.nonnegative_),
            "extra": _jsonable(self.extra),
        }
        out.update({name.rstrip("_"): encode_floats([getattr(self, name)])[0] for name in self._SCALARS})
        return out

    @classmethod
    def from_params(cls, params: dict) -> "FittedSeriesModel":
        """The model `to_params` described; raises ModelParamsError when anything is malformed."""
        what = "model params"
        if not isinstance(params, dict) or params.get("format") != cls.PARAMS_FORMAT:
            got = params.get("format") if isinstance(params, dict) else type(params).__name__
            raise ModelParamsError(f"{what}: expected format {cls.PARAMS_FORMAT}, got {got!r}")
        name = param(params, "detector_name", str, what)
        if name not in DETECTOR_CLASSES:
            raise ModelParamsError(f"{what}.detector_name: unknown detector {name!r}; expected one of {DETECTORS}")
        config = RouterConfig.from_params(param(params, "config", dict, what))
        detector = DETECTOR_CLASSES[name].from_params(param(params, "detector", dict, what))
        through = param(params, "fitted_through", str, what, optional=True)
        try:
            fitted_through = None if through is None else pd.Timestamp(through)
        except ValueError:
            raise ModelParamsError(f"{what}.fitted_through: not a timestamp") from None
        model = cls(
            profile=param(params, "profile", dict, what),
            detector_name=name,
            reason=param(params, "reason", str, what),
            detector=detector,
            config=config,
            metric=param(params, "metric", str, what, optional=True),
            fitted_through=fitted_through,
            extra=param(params, "extra", dict, what),
        )
        model.nonnegative_ = param(params, "nonnegative", bool, what)
        for attr in cls._SCALARS:
            key = attr.rstrip("_")
            if key not in params:
                raise ModelParamsError(f"{what}: missing {key!r}")
            setattr(model, attr, float(decode_floats([params[key]], f"{what}.{key}")[0]))
        if not model.score_scale_ > 0:
            raise ModelParamsError(f"{what}.score_scale: must be positive")
        return model


def _jsonable(obj):
    """`obj` with numpy scalars as Python ones and non-finite floats as None (strict JSON)."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, np.ndarray)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not np.isfinite(obj):
        return None
    if isinstance(obj, pd.Timestamp):
        return obj.isoformat()
    return obj


DETECTOR_CLASSES = {"sr": SpectralResidualDetector, "svr": SVRDetector, "prophet": ProphetDetector}


def make_detector(name: str, profile: dict, config: RouterConfig | None = None):
    """An unfitted detector of kind `name`, parametrised from the profile and config."""
    cfg = config or RouterConfig()
    if name == "sr":
        return SpectralResidualDetector(window=cfg.sr_window)
    if name == "svr":
        period = profile.get("period")
        acf_p = profile.get("acf_period")
        n_valid = profile.get("n_valid") or 0
        # a seasonal lag only helps when the season is real and the history covers it twice
        use = period if (period and acf_p is not None and acf_p >= 0.3 and n_valid >= 2 * period + 20) else None
        return SVRDetector(n_lags=cfg.svr_lags, period=use, max_train=cfg.svr_max_train)
    if name == "prophet":
        return ProphetDetector.from_profile(profile, max_train=cfg.prophet_max_train)
    raise ValueError(f"unknown detector {name!r}; expected one of {DETECTORS}")


def fit_series_model(
    y: pd.Series,
    config: RouterConfig | None = None,
    profile: dict | None = None,
    detector: str = "auto",
    metric: str | None = None,
) -> FittedSeriesModel:
    """Profile `y` (the history), route it, fit the chosen detector and its threshold.

    `detector` other than "auto" forces one; `metric` applies the config's per-metric
    overrides. Never raises on short, constant or gappy history.
    """
    cfg = (config or RouterConfig()).for_metric(metric)
    history = prepare(y)
    prof = profile if profile is not None else profile_series(history)
    if detector != "auto":
        name, reason = detector, f"forced by caller ({detector})"
    else:
        name, reason = route(prof, cfg)
    det = make_detector(name, prof, cfg).fit(history)
    model = FittedSeriesModel(
        profile=prof,
        detector_name=name,
        reason=reason,
        detector=det,
        config=cfg,
        metric=metric,
        fitted_through=history.index[-1] if len(history) else None,
    )
    _calibrate(model, history)
    return model


def _calibrate(model: FittedSeriesModel, history: pd.Series) -> None:
    """Per-series score normalisation and thresholds from the history's residuals and scores."""
    cfg = model.config
    det = model.detector
    values = history.to_numpy(dtype="float64")
    finite = values[np.isfinite(values)]
    model.nonnegative_ = bool(cfg.nonnegative) if cfg.nonnegative is not None else bool(finite.size and finite.min() >= 0.0)
    zero_inflated = bool(model.nonnegative_ and finite.size and np.mean(finite == 0.0) >= cfg.zero_inflated_share)
    magnitude = max(float(np.median(np.abs(finite))), float(np.ptp(finite))) if finite.size else 0.0
    # a constant or perfectly predicted history has no residual spread at all: a change then
    # counts, but one below `min_relative_deviation` of the series' magnitude never does
    floor = max(1e-12, cfg.min_relative_deviation * magnitude)
    # counts (GPUs allocated, pending) move in whole steps and are mostly flat, so their
    # residuals are mostly exactly zero; without a floor at the series' resolution every
    # ordinary one-GPU step would be an anomaly. Only a series that steps often has a
    # resolution to speak of: in a flat series the rare steps are the anomalies themselves.
    # A zero-inflated count (GPUs pending: mostly 0, now and then a few) is the exception:
    # its rare steps are its ordinary life, and without the floor a zero next to an x̂ of
    # 0.1 would be "cleaned".
    diffs = np.abs(np.diff(finite))
    steps = diffs[diffs > 0]
    if diffs.size and steps.size and (steps.size >= MIN_STEP_SHARE * diffs.size or zero_inflated):
        floor = max(floor, cfg.resolution_floor * float(np.median(steps)))
    resid = np.asarray(getattr(det, "history_residuals_", np.array([])), dtype="float64")
    model.residual_scale_ = robust_sigma(resid, floor=floor)
    if model.detector_name in RESIDUAL_DETECTORS:
        model.score_center_ = 0.0
        model.score_scale_ = model.residual_scale_
        model.threshold_ = cfg.tau_multiplier
        model.tau_ = cfg.tau_multiplier * model.residual_scale_
    else:
        scores = np.asarray(getattr(det, "history_scores_", np.array([])), dtype="float64")
        scores = scores[np.isfinite(scores)]
        model.score_center_ = float(np.median(scores)) if scores.size else 0.0
        model.score_scale_ = robust_sigma(scores, floor=1e-6) if scores.size else 1.0
        model.threshold_ = cfg.sr_threshold
        model.tau_ = cfg.sr_min_residual * model.residual_scale_


def score_window(
    model: FittedSeriesModel,
    y_with_history: pd.Series,
    start: pd.Timestamp | None,
    end: pd.Timestamp | None,
) -> pd.DataFrame:
    """Flags and clean values for the rows of `y_with_history` in [start, end).

    Points before `start` are context only (the detector's past); points at or after `end`
    are ignored, so a run never sees beyond its window. Returns the frame described in
    `detect_and_clean`, for the window's rows only.
    """
    idx = pd.DatetimeIndex(y_with_history.index)
    keep = np.ones(len(idx), dtype=bool)
    if end is not None:
        keep &= idx < _aligned(end, idx)
    y = y_with_history[keep]
    frame = _judge(model, y, start)
    if start is not None:
        frame = frame[pd.DatetimeIndex(frame.index) >= _aligned(start, pd.DatetimeIndex(frame.index))]
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
    without it, the first `warmup_share` of the points (at least `min_warmup_points`) are.
    Returns a DataFrame indexed like `y` with columns value, expected, score, is_anomaly,
    detector, clean_value, filled, sustained (flagged, but in a run longer than
    `max_anomaly_run`: a level shift or burst whose values are kept). History-only rows have no expected value or score and
    are never flagged; their short gaps are still filled from the last value seen.
    """
    cfg = config or RouterConfig()
    work = prepare(y)
    if score_from is None:
        n = len(work)
        n_warm = min(n, max(int(round(cfg.warmup_share * n)), cfg.min_warmup_points))
        score_from = work.index[n_warm] if n_warm < n else None
    if score_from is None:
        history = work
    else:
        history = work[work.index < _aligned(score_from, work.index)]
    model = fit_series_model(history, cfg, profile=profile, detector=detector, metric=metric)
    start = score_from if score_from is not None else (work.index[-1] + pd.Timedelta(1, "ns") if len(work) else None)
    frame = _judge(model, y, start)
    frame.attrs["reason"] = model.reason
    frame.attrs["profile"] = model.profile
    return frame


def _judge(model: FittedSeriesModel, y: pd.Series, start: pd.Timestamp | None) -> pd.DataFrame:
    """Score, flag and clean every row of `y` (rows before `start` are context only)."""
    cfg = model.config
    work = prepare(y)
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
        flag = np.isfinite(norm) & np.isfinite(expected) & np.isfinite(raw) & (norm > model.threshold_)
        if model.detector_name not in RESIDUAL_DETECTORS:
            flag &= resid > model.tau_
    sustained = _sustained(flag, raw, expected, model.tau_, cfg.max_anomaly_run)
    flag = flag & ~sustained
    clean = np.where(flag, expected, raw)
    filled = np.zeros(len(work), dtype=bool)
    gaps = _short_gaps(raw, cfg.max_fill_gap_points)
    if gaps.any():
        carried = ffill_array(np.where(np.isfinite(clean), clean, np.nan))
        # a leading gap has no past to carry: ffill_array would back-fill it, so it stays missing
        has_past = np.maximum.accumulate(np.isfinite(raw))
        fill_value = np.where(np.isfinite(expected), expected, np.where(has_past, carried, np.nan))
        fill_at = gaps & np.isfinite(fill_value)
        clean = np.where(fill_at, fill_value, clean)
        filled = fill_at
    ts_frame = pd.DataFrame(
        {
            "expected": expected,
            "score": norm,
            "is_anomaly": flag,
            "clean_value": clean,
            "filled": filled,
            "sustained": sustained,
        },
        index=work.index,
    )
    pos = ts_frame.index.get_indexer(pd.DatetimeIndex(y.index))
    values = pd.to_numeric(pd.Series(y), errors="coerce").to_numpy(dtype="float64")
    ok = pos >= 0

    def take(col: str, default):
        arr = ts_frame[col].to_numpy()
        if arr.size == 0:  # no usable timestamp at all
            return np.full(len(pos), default)
        return np.where(ok, arr[np.where(ok, pos, 0)], default)

    is_anom = take("is_anomaly", False).astype(bool)
    filled_rows = take("filled", False).astype(bool) & ~np.isfinite(values)
    clean_rows = np.where(is_anom, take("expected", np.nan), values)
    clean_rows = np.where(filled_rows, take("clean_value", np.nan), clean_rows)
    if model.nonnegative_:
        # x̂ and fills of a non-negative metric are clipped already; a raw negative value
        # (a broken counter) is left for the flag to judge, never invented by cleaning
        clean_rows = np.where(is_anom | filled_rows, np.maximum(clean_rows, 0.0), clean_rows)
    out = pd.DataFrame(
        {
            "value": values,
            "expected": take("expected", np.nan).astype("float64"),
            "score": take("score", np.nan).astype("float64"),
            "is_anomaly": is_anom,
            "detector": model.detector_name,
            "clean_value": clean_rows.astype("float64"),
            "filled": filled_rows,
            "sustained": take("sustained", False).astype(bool),
        },
        index=y.index,
    )
    return out[OUTPUT_COLUMNS]


def _sustained(flag: np.ndarray, raw: np.ndarray, expected: np.ndarray, tau: float, max_run: int) -> np.ndarray:
    """Flagged points after which the series stays more than τ from x̂_t for `max_run` points.

    Those are level shifts or bursts, not point anomalies. A missing value counts as
    coming back (it is no evidence of a new level); a flag with fewer than `max_run`
    points after it is not sustained (yet). `max_run` 0 disables the rule.
    """
    out = np.zeros(flag.size, dtype=bool)
    if max_run <= 0 or not flag.any():
        return out
    for t in np.flatnonzero(flag):
        after = raw[t + 1 : t + 1 + max_run]
        if after.size < max_run:
            continue
        with np.errstate(invalid="ignore"):
            away = np.isfinite(after) & (np.abs(after - expected[t]) > tau)
        out[t] = bool(away.all())
    return out


def _short_gaps(raw: np.ndarray, max_len: int) -> np.ndarray:
    """Mask of missing points in runs of at most `max_len` (runs touching the end included)."""
    miss = ~np.isfinite(raw)
    if max_len <= 0 or not miss.any():
        return np.zeros(raw.size, dtype=bool)
    edges = np.diff(np.concatenate([[0], miss.astype(np.int8), [0]]))
    starts = np.flatnonzero(edges == 1)
    stops = np.flatnonzero(edges == -1)
    mask = np.zeros(raw.size, dtype=bool)
    for a, b in zip(starts, stops):
        if b - a <= max_len:
            mask[a:b] = True
    return mask
