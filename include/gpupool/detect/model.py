"""A fitted series model: the detector routed to and the numbers its history gave, as data.

`fit_series_model(history, config)` profiles a history, routes it (`gpupool.detect.router`),
fits the chosen detector and reads from the history every number a judgement needs
(`_calibrate`: τ, the alarm thresholds under the false-alarm budget of `gpupool.detect.alarms`,
and the statistics the cleaning rules of `gpupool.detect.rules` read). The model holds no
settings: a judgement reads the alarm and cleaning settings of the config it is given
(`gpupool.detect.settings`), so a stored model does not change when a setting is renamed.

`FittedSeriesModel.to_params()` stores it as JSON (its detector through the one codec of
`gpupool.detect.params`); `from_params` rebuilds it, never unpickling, and also reads the layout
before (format 1, which kept the router's settings and an ``extra`` dict inside: the settings
are read and ignored).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Annotated

import numpy as np
import pandas as pd
from pydantic import (
    BaseModel, BeforeValidator, PlainSerializer, StrictBool, StrictStr, ValidationError, field_validator, model_validator,
)

from gpupool.values import jsonable
from gpupool.detect._robust import robust_sigma
from gpupool.detect.alarms import (
    MAX_KEPT_PEAKS, BudgetHistory, budget_threshold, calibrate_runs, excursions, span_days, tail_quantiles,
)
from gpupool.detect.base import prepare
from gpupool.detect.features import profile_series
from gpupool.detect.params import ModelParamsError, decode, decode_floats, encode, encode_floats, validation_message
from gpupool.detect.prophet import ProphetDetector
from gpupool.detect.router import route
from gpupool.detect.rules.faults import FAULT_DROP_SHARE, fault_shaped
from gpupool.detect.rules.outages import idle_share
from gpupool.detect.rules.spikes import SPIKE_HEIGHT_QUANTILE, peak_height, step_height
from gpupool.detect.rules.stuck import RepeatStats, repeat_stats
from gpupool.detect.settings import DETECTORS, RouterConfig
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

NAN = float("nan")


@dataclass(frozen=True)
class FittedSeriesModel:
    """Everything an hourly run needs to score one series without refitting: the fitted
    detector and the numbers read from its history, no settings.

    Stored as data: `to_params()` gives a JSON-able dict, `from_params()` rebuilds the model.
    """

    profile: dict
    detector_name: str
    reason: str
    detector: object
    metric: str | None = None
    fitted_through: pd.Timestamp | None = None
    #: the metric is never negative (x̂ and clean values are clipped at 0)
    nonnegative_: bool = False
    score_center_: float = 0.0
    score_scale_: float = 1.0
    residual_scale_: float = NAN
    #: a point is flagged when its normalised score exceeds this
    threshold_: float = NAN
    #: the cleaning threshold |x - x̂| in the series' units
    tau_: float = NAN
    #: a point is an alarm when its normalised score exceeds this (the false-alarm budget's bar)
    alarm_threshold_: float = NAN
    #: the smallest deviation (in residual spreads) that all of a run of `alarms.run_points` points must
    #: exceed, on one side, to raise an alarm (NaN: no run alarms)
    run_threshold_: float = NAN
    #: the alarm threshold under the whole history's budget, which the detector choice (`fallback`) compares
    selection_threshold_: float = NAN
    #: the history's runs of one exact value, which the stuck rule reads
    repeats: RepeatStats = RepeatStats()
    #: `SPIKE_HEIGHT_QUANTILE` of the history's local-peak heights (how far a point stands above or
    #: below both neighbours; NaN: not measured)
    excursion_scale_: float = NAN
    #: share of the history's points in idle spells: runs of more than `cleaning.max_anomaly_run` points at or
    #: below `FAULT_DROP_SHARE` x its median (NaN: not measured)
    idle_share_: float = NAN
    #: `SPIKE_HEIGHT_QUANTILE` of the history's one-step changes |x_t - x_t-1|, faults' shapes left
    #: out (NaN: not measured): how far the series ordinarily moves in one step
    step_scale_: float = NAN
    #: what a bench reads to derive the alarm thresholds under other settings (None once stored)
    budget: BudgetHistory | None = None

    def to_params(self) -> dict:
        """The fitted model as a JSON-able dict (numbers, strings, lists; no NaN or inf)."""
        reps = self.repeats
        return _StoredModel.model_construct(
            format=PARAMS_FORMAT,
            profile=jsonable(self.profile),
            detector_name=self.detector_name,
            reason=self.reason,
            detector=encode(self.detector),
            metric=self.metric,
            fitted_through=None if self.fitted_through is None else pd.Timestamp(self.fitted_through).isoformat(),
            nonnegative=bool(self.nonnegative_),
            **{key: getattr(self, key + "_") for key in _SCALARS + _OPTIONAL_SCALARS},
            repeat_share=reps.share,
            repeat_run=reps.run,
            repeat_levels=_RepeatLevels(edges=list(reps.edges), runs=list(reps.runs)) if reps.runs else None,
        ).model_dump(mode="json")

    @classmethod
    def from_params(cls, params: dict) -> "FittedSeriesModel":
        """The model `to_params` described (or one stored in format 1: its settings are ignored);
        raises ModelParamsError when anything is malformed."""
        what = "model params"
        fmt = params.get("format") if isinstance(params, dict) else None
        if type(fmt) is not int or fmt not in (1, PARAMS_FORMAT):
            got = fmt if isinstance(params, dict) else type(params).__name__
            raise ModelParamsError(f"{what}: expected format 1 or {PARAMS_FORMAT}, got {str(got)[:40]!r}")
        if fmt == 1:
            params = _from_format_1(params)
        try:
            stored = _StoredModel.model_validate(params)
        except ValidationError as exc:
            raise ModelParamsError(f"{what}: {validation_message(exc)}") from None
        try:
            fitted_through = None if stored.fitted_through is None else pd.Timestamp(stored.fitted_through)
        except ValueError:
            raise ModelParamsError(f"{what}.fitted_through: not a timestamp") from None
        levels = stored.repeat_levels
        return cls(
            profile=stored.profile,
            detector_name=stored.detector_name,
            reason=stored.reason,
            detector=decode(stored.detector, stored.detector_name),
            metric=stored.metric,
            fitted_through=fitted_through,
            nonnegative_=stored.nonnegative,
            **{key + "_": getattr(stored, key) for key in _SCALARS + _OPTIONAL_SCALARS},
            repeats=RepeatStats(
                stored.repeat_share, stored.repeat_run,
                () if levels is None else tuple(levels.edges), () if levels is None else tuple(levels.runs),
            ),
        )


#: the layout `to_params` writes (1: the router's settings and an ``extra`` dict inside)
PARAMS_FORMAT = 2
_SCALARS = ("score_center", "score_scale", "residual_scale", "threshold", "tau", "alarm_threshold")
#: scalars a model stored before they existed lacks: read back as NaN (the rule they feed is off)
_OPTIONAL_SCALARS = ("run_threshold", "selection_threshold", "excursion_scale", "idle_share", "step_scale")


def _stored_float(value) -> float:
    return float(decode_floats([value], "value")[0])


#: a float as stored: a number, None (NaN) or "inf"/"-inf"
StoredFloat = Annotated[float, BeforeValidator(_stored_float), PlainSerializer(lambda v: encode_floats([v])[0])]


class _RepeatLevels(BaseModel):
    edges: list[StoredFloat]
    runs: list[StoredFloat]


class _StoredModel(BaseModel):
    """The stored layout of a `FittedSeriesModel` (format 2)."""

    format: int
    profile: dict
    detector_name: StrictStr
    reason: StrictStr
    detector: dict
    metric: StrictStr | None
    fitted_through: StrictStr | None
    nonnegative: StrictBool
    score_center: StoredFloat
    score_scale: StoredFloat
    residual_scale: StoredFloat
    threshold: StoredFloat
    tau: StoredFloat
    alarm_threshold: StoredFloat
    run_threshold: StoredFloat = NAN
    selection_threshold: StoredFloat = NAN
    excursion_scale: StoredFloat = NAN
    idle_share: StoredFloat = NAN
    step_scale: StoredFloat = NAN
    repeat_share: StoredFloat = NAN
    repeat_run: StoredFloat = NAN
    repeat_levels: _RepeatLevels | None = None

    @field_validator("detector_name")
    @classmethod
    def _known(cls, name: str) -> str:
        if name not in DETECTOR_CLASSES:
            raise ValueError(f"unknown detector {name[:40]!r}; expected one of {DETECTORS}")
        return name

    @model_validator(mode="after")
    def _check(self):
        if not self.score_scale > 0:
            raise ValueError("score_scale: must be positive")
        return self


def _from_format_1(params: dict) -> dict:
    """A format-1 model's parameters in format 2's layout: its router settings (``config``) are
    dropped unread, and of its ``extra`` dict only what a judgement reads is kept."""
    extra = params.get("extra")
    if not isinstance(extra, dict):
        raise ModelParamsError(f"model params: format 1 needs an 'extra' object, got {type(extra).__name__}")
    out = {k: v for k, v in params.items() if k not in ("config", "extra", "format")}
    out["format"] = PARAMS_FORMAT
    if extra.get("repeat_levels"):
        out["repeat_levels"] = extra["repeat_levels"]
    if "selection_threshold" in extra:
        out["selection_threshold"] = extra["selection_threshold"]
    return out


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
            return dataclasses.replace(baseline, reason=(
                f"{reason}; fallback: the rolling z-score alarms at a smaller deviation on this history "
                f"({alarm_size(baseline):.4g} < {alarm_size(model):.4g} for {name})"
            ))
    return model


def _fitted(name: str, reason: str, prof: dict, cfg: RouterConfig, metric: str | None, history: pd.Series) -> FittedSeriesModel:
    det = make_detector(name, prof, cfg).fit(history)
    return FittedSeriesModel(
        profile=prof,
        detector_name=name,
        reason=reason,
        detector=det,
        metric=metric,
        fitted_through=history.index[-1] if len(history) else None,
        **_calibrate(name, det, history, cfg),
    )


def alarm_size(model: FittedSeriesModel) -> float:
    """The smallest deviation |x - x̂| (in the series' units) that raises an alarm under the whole history's budget."""
    selection = model.selection_threshold_
    return (selection if np.isfinite(selection) else model.alarm_threshold_) * model.residual_scale_


def _counts_only(history: pd.Series) -> dict:
    values = history.to_numpy(dtype="float64")
    return {"n": int(values.size), "n_valid": int(np.isfinite(values).sum()), "profiled": False}


def _calibrate(name: str, det, history: pd.Series, cfg: RouterConfig) -> dict:
    """Per-series score normalisation, thresholds and rule statistics from the history's
    residuals, scores and values: the fields of `FittedSeriesModel` a fit reads."""
    values = history.to_numpy(dtype="float64")
    finite = values[np.isfinite(values)]
    nonnegative = bool(cfg.nonnegative) if cfg.nonnegative is not None else bool(finite.size and finite.min() >= 0.0)
    zero_inflated = bool(nonnegative and finite.size and np.mean(finite == 0.0) >= ZERO_INFLATED_SHARE)
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
    residual_scale = robust_sigma(resid, floor=floor)
    if name in RESIDUAL_DETECTORS:
        score_center = 0.0
        score_scale = residual_scale
        history_norm = np.abs(resid) / residual_scale
        base = cfg.tau_multiplier
    else:
        scores = np.asarray(getattr(det, "history_scores_", np.array([])), dtype="float64")
        finite_scores = scores[np.isfinite(scores)]
        score_center = float(np.median(finite_scores)) if finite_scores.size else 0.0
        score_scale = robust_sigma(finite_scores, floor=1e-6) if finite_scores.size else 1.0
        history_norm = (scores - score_center) / score_scale
        base = cfg.sr.threshold
    alarms = cfg.alarms
    least = alarms.tau_scale * base
    events, peaks = excursions(history_norm, base, alarms.merge_points)
    skip = int(alarms.history_skip_per_day * span_days(history)
               + alarms.history_skip_per_1000_points * len(history) / 1000.0)
    order = np.argsort(-peaks, kind="stable")
    budget_norm = np.where(np.isin(events, order[:skip]), np.nan, history_norm) if skip and peaks.size else history_norm
    # what the bench needs to read the budget for another skip: the largest excursions' peaks,
    # the largest score outside any excursion, and the history's span
    rest = history_norm[(events < 0) & np.isfinite(history_norm)]
    kept_excursions = {
        "peaks": [float(p) for p in peaks[order[:MAX_KEPT_PEAKS]]],
        "rest": float(rest.max()) if rest.size else None,
        "days": span_days(history),
        "points": int(len(history)),
    }
    run_threshold, run_excursions = NAN, None
    if name in RESIDUAL_DETECTORS:
        run_threshold, run_excursions = calibrate_runs(resid / residual_scale, least, skip, alarms)
        tau = base * residual_scale
    else:
        tau = cfg.sr.min_residual * residual_scale
    return {
        "nonnegative_": nonnegative,
        "score_center_": score_center,
        "score_scale_": score_scale,
        "residual_scale_": residual_scale,
        "threshold_": base,
        "tau_": tau,
        "alarm_threshold_": max(least, budget_threshold(budget_norm, alarms.history_share)),
        "run_threshold_": run_threshold,
        # the detector choice (`fallback`) compares alarm sizes under the whole history's budget
        "selection_threshold_": max(least, budget_threshold(history_norm, alarms.history_share)),
        "repeats": repeat_stats(values),
        "excursion_scale_": peak_height(typical, SPIKE_HEIGHT_QUANTILE),
        "step_scale_": step_height(typical, SPIKE_HEIGHT_QUANTILE),
        "idle_share_": idle_share(values, FAULT_DROP_SHARE, cfg.cleaning.max_anomaly_run),
        "budget": BudgetHistory(tail_quantiles(history_norm), kept_excursions, run_excursions),
    }
