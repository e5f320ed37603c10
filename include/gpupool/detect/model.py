"""A fitted series model: the detector routed to, its thresholds, stored as data.

`fit_series_model(history)` profiles a history, routes it (`gpupool.detect.router`), fits the
chosen detector and calibrates its per-series thresholds (`_calibrate`: τ, the alarm threshold
under the false-alarm budget of `gpupool.detect.alarms`, and the statistics the cleaning rules
of `gpupool.detect.rules` read). `FittedSeriesModel.to_params()` stores it as JSON;
`from_params` rebuilds it, never unpickling.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from gpupool.values import jsonable
from gpupool.detect._robust import robust_sigma
from gpupool.detect.alarms import (
    MAX_KEPT_PEAKS, budget_threshold, calibrate_runs, excursions, span_days, tail_quantiles,
)
from gpupool.detect.base import ModelParamsError, decode_floats, encode_floats, param, prepare
from gpupool.detect.features import profile_series
from gpupool.detect.prophet import ProphetDetector
from gpupool.detect.router import DETECTORS, RouterConfig, route
from gpupool.detect.rules.faults import FAULT_DROP_SHARE, fault_shaped
from gpupool.detect.rules.outages import idle_share
from gpupool.detect.rules.spikes import SPIKE_HEIGHT_QUANTILE, peak_height, step_height
from gpupool.detect.rules.stuck import repeat_levels, repeats
from gpupool.detect.sr import SpectralResidualDetector
from gpupool.detect.svr import SVRDetector
from gpupool.detect.zscore import ZScoreDetector

RESIDUAL_DETECTORS = ("svr", "prophet", "zscore")
#: detectors whose fit needs no profile (they keep only context)
CONTEXT_ONLY = ("sr", "zscore")
#: share of nonzero steps from which a series' typical step floors its residual spread
MIN_STEP_SHARE = 0.02
#: the residual spread is at least this x the typical nonzero step of the history (its resolution)
#: and at least `MIN_RELATIVE_DEVIATION` x its magnitude (median |x| or range); set with
#: bench/detect_nab.py and bench/detect_cleaning.py
RESOLUTION_FLOOR = 0.5
MIN_RELATIVE_DEVIATION = 1e-3
#: share of exact zeros from which a non-negative history is zero-inflated: its residual spread is
#: floored at its resolution even when it steps rarely, so a zero next to a small x̂ is not an
#: anomaly (bench/detect_nab.py)
ZERO_INFLATED_SHARE = 0.3


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
    alarm_threshold_: float = float("nan")
    nonnegative_: bool = False
    #: share of the history's steps that repeat the value before exactly (NaN: not measured)
    repeat_share_: float = float("nan")
    #: 0.99 quantile of the lengths of the history's runs of one exact value (points)
    repeat_run_: float = float("nan")
    #: `SPIKE_HEIGHT_QUANTILE` of the history's local-peak heights (how far a point stands above or
    #: below both neighbours; NaN: not measured)
    excursion_scale_: float = float("nan")
    #: share of the history's points in idle spells: runs of more than `cleaning.max_anomaly_run` points at or
    #: below `FAULT_DROP_SHARE` x its median (NaN: not measured)
    idle_share_: float = float("nan")
    #: the smallest deviation (in residual spreads) that all of a run of `alarms.run_points` points must
    #: exceed, on one side, to raise an alarm (NaN: no run alarms)
    run_threshold_: float = float("nan")
    #: `SPIKE_HEIGHT_QUANTILE` of the history's one-step changes |x_t - x_t-1|, faults' shapes left
    #: out (NaN: not measured): how far the series ordinarily moves in one step
    step_scale_: float = float("nan")
    extra: dict = field(default_factory=dict)

    PARAMS_FORMAT = 1
    _SCALARS = ("score_center_", "score_scale_", "residual_scale_", "threshold_", "tau_", "alarm_threshold_")
    #: scalars a model stored before they existed lacks: read back as NaN (the rule they feed is off)
    _OPTIONAL_SCALARS = ("repeat_share_", "repeat_run_", "excursion_scale_", "idle_share_", "run_threshold_",
                         "step_scale_")

    def to_params(self) -> dict:
        """The fitted model as a JSON-able dict (numbers, strings, lists; no NaN or inf)."""
        to_params = getattr(self.detector, "to_params", None)
        if to_params is None:
            raise TypeError(f"detector {self.detector_name!r} cannot be stored as data")
        out = {
            "format": self.PARAMS_FORMAT,
            "profile": jsonable(self.profile),
            "detector_name": self.detector_name,
            "reason": self.reason,
            "detector": to_params(),
            "config": self.config.to_params(),
            "metric": self.metric,
            "fitted_through": None if self.fitted_through is None else pd.Timestamp(self.fitted_through).isoformat(),
            "nonnegative": bool(self.nonnegative_),
            "extra": jsonable(self.extra),
        }
        out.update({name.rstrip("_"): encode_floats([getattr(self, name)])[0]
                    for name in self._SCALARS + self._OPTIONAL_SCALARS})
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
        for attr in cls._OPTIONAL_SCALARS:
            key = attr.rstrip("_")
            if key in params:
                setattr(model, attr, float(decode_floats([params[key]], f"{what}.{key}")[0]))
        if not model.score_scale_ > 0:
            raise ModelParamsError(f"{what}.score_scale: must be positive")
        return model


DETECTOR_CLASSES = {
    "sr": SpectralResidualDetector,
    "svr": SVRDetector,
    "prophet": ProphetDetector,
    "zscore": ZScoreDetector,
}


def make_detector(name: str, profile: dict, config: RouterConfig | None = None):
    """An unfitted detector of kind `name`, parametrised from the profile and config."""
    cfg = config or RouterConfig()
    if name == "sr":
        return SpectralResidualDetector(window=cfg.sr.window)
    if name == "svr":
        period = profile.get("period")
        acf_p = profile.get("acf_period")
        n_valid = profile.get("n_valid") or 0
        # a seasonal lag only helps when the season is real and the history covers it twice
        use = period if (period and acf_p is not None and acf_p >= 0.3 and n_valid >= 2 * period + 20) else None
        return SVRDetector(n_lags=cfg.svr.lags, period=use, max_train=cfg.svr.max_train)
    if name == "prophet":
        return ProphetDetector.from_profile(profile, max_train=cfg.prophet.max_train)
    if name == "zscore":
        return ZScoreDetector(window=cfg.zscore.window)
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
    if profile is not None:
        prof = profile
    elif detector in CONTEXT_ONLY:
        # a forced detector that learns nothing but context needs no profile: the refit of
        # a thousand series stays cheap; only the counts are kept
        prof = _counts_only(history)
    else:
        prof = profile_series(history)
    if detector != "auto":
        name, reason = detector, f"forced by caller ({detector})"
    else:
        name, reason = route(prof, cfg)
    model = _fitted(name, reason, prof, cfg, metric, history)
    if detector == "auto" and cfg.fallback and name in ("svr", "prophet"):
        baseline = _fitted("zscore", "", prof, cfg, metric, history)
        if alarm_size(baseline) < alarm_size(model):
            baseline.reason = (
                f"{reason}; fallback: the rolling z-score alarms at a smaller deviation on this history "
                f"({alarm_size(baseline):.4g} < {alarm_size(model):.4g} for {name})"
            )
            return baseline
    return model


def _fitted(name: str, reason: str, prof: dict, cfg: RouterConfig, metric: str | None, history: pd.Series) -> FittedSeriesModel:
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


def alarm_size(model: FittedSeriesModel) -> float:
    """The smallest deviation |x - x̂| (in the series' units) that raises an alarm under the whole history's budget."""
    return model.extra.get("selection_threshold", model.alarm_threshold_) * model.residual_scale_


def _counts_only(history: pd.Series) -> dict:
    values = history.to_numpy(dtype="float64")
    return {"n": int(values.size), "n_valid": int(np.isfinite(values).sum()), "profiled": False}


def _calibrate(model: FittedSeriesModel, history: pd.Series) -> None:
    """Per-series score normalisation and thresholds from the history's residuals and scores."""
    cfg = model.config
    det = model.detector
    values = history.to_numpy(dtype="float64")
    finite = values[np.isfinite(values)]
    model.nonnegative_ = bool(cfg.nonnegative) if cfg.nonnegative is not None else bool(finite.size and finite.min() >= 0.0)
    zero_inflated = bool(model.nonnegative_ and finite.size and np.mean(finite == 0.0) >= ZERO_INFLATED_SHARE)
    magnitude = max(float(np.median(np.abs(finite))), float(np.ptp(finite))) if finite.size else 0.0
    # a constant or perfectly predicted history has no residual spread at all: a change then
    # counts, but one below `MIN_RELATIVE_DEVIATION` of the series' magnitude never does
    floor = max(1e-12, MIN_RELATIVE_DEVIATION * magnitude)
    # counts (GPUs allocated, pending) move in whole steps and are mostly flat, so their
    # residuals are mostly exactly zero; without a floor at the series' resolution every
    # ordinary one-GPU step would be an anomaly. Only a series that steps often has a
    # resolution to speak of: in a flat series the rare steps are the anomalies themselves.
    # A zero-inflated count (GPUs pending: mostly 0, now and then a few) is the exception:
    # its rare steps are its ordinary life, and without the floor a zero next to an x̂ of
    # 0.1 would be "cleaned".
    # with `scales_without_fault_shapes`, the history's own exporter faults (falls to zero, towering
    # one-point spikes) are no part of its resolution or of its ordinary excursions: at faults on a
    # few % of the steps of a flat count, the typical step and the 0.99 quantile of peak heights
    # would otherwise be the faults' own sizes, and τ and the spike bar would let the next ones pass
    typical = values
    if cfg.cleaning.scales_without_fault_shapes:
        shaped = fault_shaped(values, FAULT_DROP_SHARE, cfg.cleaning.max_anomaly_run, cfg.cleaning.spike_height_factor)
        typical = np.where(shaped, np.nan, values)
    kept = typical[np.isfinite(typical)]
    diffs = np.abs(np.diff(kept))
    steps = diffs[diffs > 0]
    if diffs.size and steps.size and (steps.size >= MIN_STEP_SHARE * diffs.size or zero_inflated):
        floor = max(floor, RESOLUTION_FLOOR * float(np.median(steps)))
    resid = np.asarray(getattr(det, "history_residuals_", np.array([])), dtype="float64")
    model.residual_scale_ = robust_sigma(resid, floor=floor)
    if model.detector_name in RESIDUAL_DETECTORS:
        model.score_center_ = 0.0
        model.score_scale_ = model.residual_scale_
        history_norm = np.abs(resid) / model.residual_scale_
        base = cfg.tau_multiplier
    else:
        scores = np.asarray(getattr(det, "history_scores_", np.array([])), dtype="float64")
        finite_scores = scores[np.isfinite(scores)]
        model.score_center_ = float(np.median(finite_scores)) if finite_scores.size else 0.0
        model.score_scale_ = robust_sigma(finite_scores, floor=1e-6) if finite_scores.size else 1.0
        history_norm = (scores - model.score_center_) / model.score_scale_
        base = cfg.sr.threshold
    model.extra["history_quantiles"] = tail_quantiles(history_norm)
    model.repeat_share_, model.repeat_run_ = repeats(values)
    model.extra["repeat_levels"] = repeat_levels(values)
    model.excursion_scale_ = peak_height(typical, SPIKE_HEIGHT_QUANTILE)
    model.step_scale_ = step_height(typical, SPIKE_HEIGHT_QUANTILE)
    model.idle_share_ = idle_share(values, FAULT_DROP_SHARE, cfg.cleaning.max_anomaly_run)
    model.threshold_ = base
    least = cfg.alarms.tau_scale * base
    # the detector choice (`fallback`) compares alarm sizes under the whole history's budget
    model.extra["selection_threshold"] = max(least, budget_threshold(history_norm, cfg.alarms.history_share))
    events, peaks = excursions(history_norm, base, cfg.alarms.merge_points)
    skip = int(cfg.alarms.history_skip_per_day * span_days(history)
               + cfg.alarms.history_skip_per_1000_points * len(history) / 1000.0)
    order = np.argsort(-peaks, kind="stable")
    budget_norm = np.where(np.isin(events, order[:skip]), np.nan, history_norm) if skip and peaks.size else history_norm
    model.alarm_threshold_ = max(least, budget_threshold(budget_norm, cfg.alarms.history_share))
    # what the bench needs to read the budget for another skip: the largest excursions' peaks,
    # the largest score outside any excursion, and the history's span
    rest = history_norm[(events < 0) & np.isfinite(history_norm)]
    model.extra["excursions"] = {
        "peaks": [float(p) for p in peaks[order[:MAX_KEPT_PEAKS]]],
        "rest": float(rest.max()) if rest.size else None,
        "days": span_days(history),
        "points": int(len(history)),
    }
    if model.detector_name in RESIDUAL_DETECTORS:
        calibrate_runs(model, resid / model.residual_scale_, least, skip)
    if model.detector_name in RESIDUAL_DETECTORS:
        model.tau_ = model.threshold_ * model.residual_scale_
    else:
        model.tau_ = cfg.sr.min_residual * model.residual_scale_
