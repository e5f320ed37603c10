"""Fitted detectors as data: one codec for every detector's stored parameters.

A fitted model is stored in staging as JSON (numbers, strings, lists), never pickled: whoever
can write a staging table must not be able to run code in a worker. Each detector's stored
parameters are declared once, as a pydantic model below (`SRParams`, `SVRParams`,
`ProphetParams`, `ZScoreParams`): its settings (the constructor's arguments, stored under their
names) and what its fit remembers (attribute ``name_``, stored as ``name``). `encode(detector)`
gives the JSON-able dict; `decode(params, name)` validates it and rebuilds an equivalent fitted
detector, raising `ModelParamsError` on anything malformed. The shared pieces (float arrays
with NaN and infinities, a time-indexed series, the streaming context) are field types of
their own, so every detector reads and writes them alike.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

import numpy as np
import pandas as pd
from pydantic import (
    BaseModel, BeforeValidator, ConfigDict, PlainSerializer, PrivateAttr, StrictBool, StrictInt, StrictStr,
    ValidationError, model_validator,
)

from gpupool.detect.base import StreamingContext
from gpupool.detect.prophet import ProphetDetector, quiet_prophet
from gpupool.detect.sr import SpectralResidualDetector
from gpupool.detect.svr import RBFSupportVectors, SVRDetector
from gpupool.detect.zscore import ZScoreDetector

__all__ = ["ModelParamsError", "decode", "decode_floats", "encode", "encode_floats"]

#: the layout of every detector's parameters (the key ``format``)
FORMAT = 1


class ModelParamsError(ValueError):
    """Stored model parameters that cannot rebuild a model (malformed, wrong kind or version)."""


# --- shared field types ------------------------------------------------------------------------


def encode_floats(values) -> list:
    """A float array as a strict-JSON list: NaN -> None, ±inf -> "inf"/"-inf"."""
    out = []
    for v in np.asarray(values, dtype="float64").ravel().tolist():
        if v != v:
            out.append(None)
        elif v in (float("inf"), float("-inf")):
            out.append("inf" if v > 0 else "-inf")
        else:
            out.append(v)
    return out


def decode_floats(values, what: str) -> np.ndarray:
    """The inverse of `encode_floats`; raises ModelParamsError on anything else."""
    if not isinstance(values, list):
        raise ModelParamsError(f"{what}: expected a list of numbers, got {type(values).__name__}")
    if set(map(type, values)) <= {float, int}:  # the common case, converted in one go
        try:
            return np.array(values, dtype="float64")
        except OverflowError:
            raise ModelParamsError(f"{what}: a number out of float range") from None
    out = np.empty(len(values), dtype="float64")
    for i, v in enumerate(values):
        if v is None:
            out[i] = np.nan
        elif v == "inf":
            out[i] = np.inf
        elif v == "-inf":
            out[i] = -np.inf
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            try:
                out[i] = float(v)
            except OverflowError:
                raise ModelParamsError(f"{what}[{i}]: out of float range") from None
        else:
            raise ModelParamsError(f"{what}[{i}]: expected a number, got {type(v).__name__}")
    return out


def _floats_in(value):
    return value if isinstance(value, np.ndarray) else decode_floats(value, "list")


def _number(value) -> float:
    """A JSON number as a float: an int or a finite float, never a bool (Python's bool is an int)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"expected a number, got {type(value).__name__}")
    try:
        out = float(value)
    except OverflowError:
        raise ValueError("a number out of float range") from None
    if not np.isfinite(out):
        raise ValueError("not a finite number")
    return out


def _number_or_none(value):
    return None if value is None else _number(value)


def _nan_out(value):
    return None if value is None or not np.isfinite(value) else float(value)


def encode_series(s: pd.Series | None) -> dict | None:
    """A time-indexed float series as JSON: epoch nanoseconds, values and the index's zone."""
    if s is None:
        return None
    idx = pd.DatetimeIndex(s.index)
    return {
        "ts_ns": idx.as_unit("ns").asi8.tolist(),
        "unit": idx.unit,
        "values": encode_floats(s.to_numpy()),
        "tz": str(idx.tz) if idx.tz is not None else None,
    }


Floats = Annotated[np.ndarray, BeforeValidator(_floats_in), PlainSerializer(encode_floats)]
Number = Annotated[float, BeforeValidator(_number)]
OptionalNumber = Annotated[float | None, BeforeValidator(_number_or_none)]
#: a number that may be missing: None in JSON, NaN in memory
NanNumber = Annotated[float | None, BeforeValidator(_number_or_none), PlainSerializer(_nan_out)]


class _Model(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)


class _SeriesParams(_Model):
    """`encode_series`' layout."""

    ts_ns: list[StrictInt]
    unit: Literal["s", "ms", "us", "ns"]
    values: Floats
    tz: StrictStr | None

    _series: pd.Series | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _check(self):
        if len(self.ts_ns) != self.values.size:
            raise ValueError("ts_ns must be integers, one per value")
        try:
            idx = pd.DatetimeIndex(np.asarray(self.ts_ns, dtype="int64").view("datetime64[ns]")).as_unit(self.unit)
            if self.tz is not None:
                idx = idx.tz_localize("UTC").tz_convert(self.tz)
        except (ValueError, TypeError, OverflowError, KeyError) as exc:
            raise ValueError(f"bad timestamps or zone ({exc})") from None
        self._series = pd.Series(self.values, index=idx)
        return self

    def series(self) -> pd.Series:
        return self._series


def _context_out(ctx):
    if ctx is None or isinstance(ctx, _ContextParams):
        return None if ctx is None else ctx.model_dump(mode="json")
    return {"tail": encode_series(ctx.tail_)}


class _ContextParams(_Model):
    """A `StreamingContext`: its remembered points."""

    tail: _SeriesParams | None

    def context(self) -> StreamingContext:
        ctx = StreamingContext()
        ctx.tail_ = None if self.tail is None else self.tail.series()
        return ctx


Context = Annotated[_ContextParams | None, PlainSerializer(_context_out)]


# --- one model per detector --------------------------------------------------------------------


class DetectorParams(_Model):
    """What every detector stores: its kind, the layout's version, the history's length and
    the remembered context. A subclass names its detector class, its settings and its fitted
    state (the JSON key -> the attribute `fit` sets).

    A validated instance holds JSON's shapes (`restored` turns one into the detector's own);
    one made by `model_construct` from a detector's attributes (`encode`) holds the detector's
    own objects, which the fields' serializers write as JSON.
    """

    detector: StrictStr
    format: StrictInt
    n_history: StrictInt | None
    context: Context

    DETECTOR: ClassVar[type]
    SETTINGS: ClassVar[tuple[str, ...]]
    FITTED: ClassVar[dict[str, str]] = {"n_history": "n_history_", "context": "context_"}
    #: fitted state a rebuilt detector goes without when it is None (`hasattr` tells it unfitted)
    OPTIONAL: ClassVar[tuple[str, ...]] = ("n_history", "context")

    @classmethod
    def values_of(cls, det) -> dict:
        """The values of the fields, as the detector holds them."""
        values = {"detector": det.name, "format": FORMAT}
        values.update({k: getattr(det, k) for k in cls.SETTINGS})
        values.update({k: getattr(det, attr, None) for k, attr in cls.FITTED.items()})
        return values

    def is_fitted(self) -> bool:
        """Whether the stored detector was fitted (else its fitted state is not restored)."""
        return True

    def restored(self, key: str):
        """The detector's own value of fitted state `key`."""
        value = getattr(self, key)
        return value.context() if isinstance(value, _ContextParams) else value

    def build(self):
        """The detector these parameters describe."""
        try:
            det = self.DETECTOR(**{k: getattr(self, k) for k in self.SETTINGS})
        except ValueError as exc:
            raise ModelParamsError(f"{self.detector} params: {exc}") from None
        if self.is_fitted():
            for key, attr in self.FITTED.items():
                value = self.restored(key)
                if value is not None or key not in self.OPTIONAL:
                    setattr(det, attr, value)
        return det


def _positive(params: BaseModel, names: tuple[str, ...], message: str) -> None:
    if min(getattr(params, n) for n in names) < 1:
        raise ValueError(message)


class SRParams(DetectorParams):
    """Spectral Residual: its settings and context (the history's scores and residuals serve the
    per-series threshold at fit time only and are not kept)."""

    DETECTOR = SpectralResidualDetector
    SETTINGS = ("window", "q", "z", "m", "expected_window")

    window: StrictInt
    q: StrictInt
    z: StrictInt
    m: StrictInt
    expected_window: StrictInt

    @model_validator(mode="after")
    def _check(self):
        _positive(self, self.SETTINGS, "window, q, z, m and expected_window must be positive")
        return self


class ZScoreParams(DetectorParams):
    """The rolling z-score: its settings and context."""

    DETECTOR = ZScoreDetector
    SETTINGS = ("window", "min_points")

    window: StrictInt
    min_points: StrictInt

    @model_validator(mode="after")
    def _check(self):
        _positive(self, self.SETTINGS, "window and min_points must be positive")
        return self


class _SVMParams(_Model):
    """An RBF support-vector regression's arrays (`svr.RBFSupportVectors`)."""

    n_features: StrictInt
    support_vectors: Floats  # row-major, n_features a row
    dual_coef: Floats
    intercept: Number
    gamma: Number


def _svm_out(svm):
    if svm is None or isinstance(svm, _SVMParams):
        return None if svm is None else svm.model_dump(mode="json")
    rbf = RBFSupportVectors.of(svm)  # a fitted scikit-learn SVR, or its arrays
    return {
        "n_features": int(rbf.support_vectors_.shape[1]),
        "support_vectors": encode_floats(rbf.support_vectors_),
        "dual_coef": encode_floats(rbf.dual_coef_),
        "intercept": rbf.intercept_,
        "gamma": rbf.gamma_,
    }


def _gamma(value):
    if isinstance(value, str):
        if value not in ("scale", "auto"):
            raise ValueError(f"expected 'scale', 'auto' or a number, got {value[:40]!r}")
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return _number(value)


class SVRParams(DetectorParams):
    """SVR: its settings, the scale and offset of its fit and the regression's support vectors
    (rebuilt as `RBFSupportVectors`, numpy, never by unpickling). The history's residuals serve
    the per-series threshold at fit time only and are not kept."""

    DETECTOR = SVRDetector
    SETTINGS = ("n_lags", "period", "calendar", "C", "epsilon", "gamma", "max_train")
    FITTED = {"scale": "scale_", "use_calendar": "use_calendar_", "constant": "constant_", "offset": "offset_",
              "svm": "model_", **DetectorParams.FITTED}

    n_lags: StrictInt
    period: StrictInt | None
    calendar: StrictBool
    C: Number
    epsilon: Number
    gamma: Annotated[str | int | float, BeforeValidator(_gamma)]
    max_train: StrictInt
    scale: OptionalNumber
    use_calendar: StrictBool | None
    constant: StrictBool | None
    offset: OptionalNumber
    svm: Annotated[_SVMParams | None, PlainSerializer(_svm_out)]

    def is_fitted(self) -> bool:
        return self.scale is not None  # never fitted: no scale

    def restored(self, key: str):
        if key == "svm" and self.svm is not None:
            p = self.svm
            return RBFSupportVectors(p.support_vectors.reshape(-1, p.n_features), p.dual_coef, p.intercept, p.gamma)
        return super().restored(key)

    @model_validator(mode="after")
    def _check(self):
        if self.n_lags < 1 or (self.period is not None and self.period < 2):
            raise ValueError("n_lags must be >= 1 and period >= 2")
        if not self.is_fitted():
            return self
        if self.scale <= 0:
            raise ValueError("scale: must be positive")
        if self.use_calendar is None or self.constant is None or self.offset is None:
            raise ValueError("a fitted SVR needs use_calendar, constant and offset")
        if self.context is None:
            raise ValueError("context: a fitted SVR needs its context")
        svm = self.svm
        if svm is None:
            if not self.constant:
                raise ValueError("a non-constant fit needs its support vectors")
            return self
        width = self.n_lags + (2 if self.period else 0) + (4 if self.use_calendar else 0)
        if svm.n_features != width:
            raise ValueError(f"svm.n_features: expected {width} features")
        if svm.support_vectors.size == 0 or svm.support_vectors.size % width:
            raise ValueError(f"svm.support_vectors: expected rows of {width} features")
        if svm.dual_coef.size != svm.support_vectors.size // width:
            raise ValueError("svm.dual_coef: expected one coefficient per support vector")
        if not (np.isfinite(svm.support_vectors).all() and np.isfinite(svm.dual_coef).all()):
            raise ValueError("svm: support vectors and coefficients must be finite")
        if svm.gamma <= 0:
            raise ValueError("svm.gamma: must be positive")
        return self


def _prophet_out(fitted):
    if fitted is None or isinstance(fitted, dict):
        return fitted
    import copy

    quiet_prophet()
    from prophet.serialize import model_to_dict

    # predict() on given dates never reads the training frame (only its presence, as "fitted"):
    # keeping its newest row makes the stored state and its rebuild, done every hour, a
    # fraction of the size and time
    light = copy.copy(fitted)
    light.history = fitted.history.tail(1)
    light.history_dates = fitted.history_dates.tail(1)
    return model_to_dict(light)


class ProphetParams(DetectorParams):
    """Prophet: its settings, the level and interval of its fit and Prophet's fitted state
    (`prophet.serialize.model_to_dict`, plain JSON; rebuilt with `model_from_dict`, no pickle).
    The history's residuals serve the per-series threshold at fit time only and are not kept."""

    DETECTOR = ProphetDetector
    SETTINGS = ("daily", "weekly", "extra_period_days", "max_train", "bias_window", "interval_width")
    FITTED = {"fallback_level": "fallback_level_", "interval_halfwidth": "interval_halfwidth_",
              "prophet": "model_", **DetectorParams.FITTED}

    daily: StrictBool
    weekly: StrictBool
    extra_period_days: OptionalNumber
    max_train: StrictInt
    bias_window: StrictInt
    interval_width: Number
    fallback_level: NanNumber
    interval_halfwidth: NanNumber
    fitted: StrictBool
    prophet: Annotated[dict | None, PlainSerializer(_prophet_out)]

    @classmethod
    def values_of(cls, det) -> dict:
        return {**super().values_of(det), "fitted": hasattr(det, "context_")}

    def is_fitted(self) -> bool:
        return self.fitted

    def restored(self, key: str):
        if key in ("fallback_level", "interval_halfwidth"):
            value = getattr(self, key)
            return np.nan if value is None else value
        if key == "prophet" and self.prophet is not None:
            quiet_prophet()
            from prophet.serialize import model_from_dict

            quiet_prophet()
            try:
                return model_from_dict(dict(self.prophet))
            except Exception as exc:  # any malformed field: pandas, numpy or KeyError from Prophet
                raise ModelParamsError(
                    f"prophet params.prophet: cannot rebuild the fitted model ({type(exc).__name__}: {str(exc)[:200]})"
                ) from None
        return super().restored(key)

    @model_validator(mode="after")
    def _check(self):
        if self.bias_window < 1:
            raise ValueError("bias_window: must be positive")
        if self.fitted and self.context is None:
            raise ValueError("context: a fitted Prophet needs its context")
        return self


PARAMS: dict[str, type[DetectorParams]] = {
    "sr": SRParams,
    "svr": SVRParams,
    "prophet": ProphetParams,
    "zscore": ZScoreParams,
}


def encode(det) -> dict:
    """A fitted (or unfitted) detector's parameters as a JSON-able dict (numbers, strings,
    lists; no NaN or inf): its settings and what its fit remembers."""
    spec = PARAMS.get(getattr(det, "name", None))
    if spec is None:
        raise TypeError(f"detector {getattr(det, 'name', type(det).__name__)!r} cannot be stored as data")
    return spec.model_construct(**spec.values_of(det)).model_dump(mode="json")


def decode(params, name: str):
    """The detector of kind `name` that `encode` described; raises ModelParamsError when
    `params` is malformed, of another kind or of another layout."""
    spec = PARAMS.get(name)
    if spec is None:
        raise ModelParamsError(f"unknown detector {name!r}; expected one of {tuple(PARAMS)}")
    if not isinstance(params, dict):
        raise ModelParamsError(f"{name} params: expected an object, got {type(params).__name__}")
    if params.get("detector") != name or params.get("format") != FORMAT:
        raise ModelParamsError(
            f"{name} params: expected detector {name!r} format {FORMAT}, "
            f"got {str(params.get('detector'))[:40]!r} format {str(params.get('format'))[:20]!r}"
        )
    try:
        validated = spec.model_validate(params)
    except ValidationError as exc:
        raise ModelParamsError(f"{name} params: {validation_message(exc)}") from None
    return validated.build()


def validation_message(exc: ValidationError) -> str:
    """A pydantic error as one short line: where and what, never the value itself."""
    parts = []
    for err in exc.errors(include_input=False, include_url=False)[:3]:
        where = ".".join(str(p) for p in err["loc"])
        parts.append(f"{where}: {err['msg']}" if where else err["msg"])
    more = exc.error_count() - len(parts)
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")
