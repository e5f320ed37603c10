"""The interface every detector follows, and the bookkeeping they share.

A detector is fitted on a history (`fit(y_history)`), then `score(y)` returns, for every
point of `y`, the expected value `x̂_t` and a raw anomaly score, where judging a point uses
only the points before it (the fitted history's tail serves as context for the first
points of `y`). Deciding what is anomalous is not the detector's job: clean.py turns raw
scores into flags with a per-series threshold.

Scores are NaN where a point is missing or where there is not yet enough past to judge it.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import pandas as pd

from gpupool.detect._robust import as_sorted_unique

SCORE_COLUMNS = ["expected", "score"]


class Detector(Protocol):
    """What clean.py needs from a detector."""

    name: str

    def fit(self, y_history: pd.Series) -> "Detector":
        """Learn from the history; returns self."""
        ...

    def score(self, y: pd.Series, start: pd.Timestamp | None = None) -> pd.DataFrame:
        """Expected value and raw score per point of `y` (only points >= start are judged)."""
        ...


class StreamingContext:
    """Holds the newest points of the fitted history so scoring can start right after it."""

    def __init__(self) -> None:
        self.tail_: pd.Series | None = None

    def remember(self, history: pd.Series, points: int) -> None:
        """Keep the newest `points` points of `history` as context."""
        self.tail_ = history.iloc[-points:].copy() if points > 0 else history.iloc[:0].copy()

    def with_context(self, y: pd.Series) -> tuple[pd.Series, int]:
        """`y` (sorted, one value per timestamp) preceded by remembered points older than it.

        Returns the joined series and how many context points were prepended.
        """
        if self.tail_ is None or len(self.tail_) == 0 or len(y) == 0:
            return y, 0
        older = self.tail_[self.tail_.index < y.index[0]]
        if len(older) == 0:
            return y, 0
        return pd.concat([older, y]), len(older)

    def to_params(self) -> dict:
        """The remembered points as JSON (see `encode_series`)."""
        return context_to_params(self)

    @classmethod
    def from_params(cls, params: dict) -> "StreamingContext":
        """A context remembering the points stored by `to_params`."""
        ctx = context_from_params(params, "context")
        if ctx is None:
            raise ModelParamsError("context: expected an object, got None")
        return ctx


def prepare(y: pd.Series) -> pd.Series:
    """The series as detectors see it: float, time-ordered, one value per timestamp."""
    return as_sorted_unique(y)


def judged_from(index: pd.DatetimeIndex, offset: int, start: pd.Timestamp | None) -> int:
    """Position of the first point to judge: past the prepended context and not before `start`."""
    first = offset
    if start is not None:
        first = max(first, int(index.searchsorted(_aligned(start, index), side="left")))
    return first


def _aligned(ts: pd.Timestamp, index: pd.DatetimeIndex) -> pd.Timestamp:
    """`ts` with the same tz-awareness as `index` so comparisons never raise."""
    ts = pd.Timestamp(ts)
    if index.tz is not None and ts.tz is None:
        return ts.tz_localize(index.tz)
    if index.tz is None and ts.tz is not None:
        return ts.tz_convert("UTC").tz_localize(None)
    return ts


def to_frame(y: pd.Series, work_index: pd.DatetimeIndex, expected: np.ndarray, score: np.ndarray) -> pd.DataFrame:
    """Map per-timestamp results back onto the caller's index (its order and duplicates)."""
    frame = pd.DataFrame({"expected": expected, "score": score}, index=work_index)
    pos = frame.index.get_indexer(pd.DatetimeIndex(y.index))
    out = pd.DataFrame(
        {
            "expected": np.where(pos >= 0, frame["expected"].to_numpy()[pos], np.nan),
            "score": np.where(pos >= 0, frame["score"].to_numpy()[pos], np.nan),
        },
        index=y.index,
    )
    return out


def past_median(x: np.ndarray, window: int) -> np.ndarray:
    """Median of the `window` finite values before each point (NaN where there are none)."""
    s = pd.Series(x)
    return s.rolling(window, min_periods=1).median().shift(1).to_numpy()


# --- fitted models as data -------------------------------------------------------------
#
# A fitted model is stored in staging as JSON (numbers, strings, lists), never pickled:
# whoever can write a staging table must not be able to run code in a worker. Every
# detector has `to_params()` -> a JSON-able dict and `from_params(params)`, which rebuilds
# an equivalent fitted detector and raises `ModelParamsError` on anything malformed.


class ModelParamsError(ValueError):
    """Stored model parameters that cannot rebuild a model (malformed, wrong kind or version)."""


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


def param(params: dict, key: str, kind, what: str, optional: bool = False):
    """`params[key]` checked to be of `kind` (a type or tuple of types); bools are not numbers."""
    if not isinstance(params, dict):
        raise ModelParamsError(f"{what}: expected an object, got {type(params).__name__}")
    if key not in params:
        raise ModelParamsError(f"{what}: missing {key!r}")
    value = params[key]
    if value is None and optional:
        return None
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds:
        raise ModelParamsError(f"{what}.{key}: expected {'/'.join(k.__name__ for k in kinds)}, got bool")
    if not isinstance(value, kinds):
        raise ModelParamsError(f"{what}.{key}: expected {'/'.join(k.__name__ for k in kinds)}, got {type(value).__name__}")
    if isinstance(value, float) and not np.isfinite(value):
        raise ModelParamsError(f"{what}.{key}: not a finite number")
    return value


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


def decode_series(params, what: str) -> pd.Series | None:
    """The inverse of `encode_series`."""
    if params is None:
        return None
    stamps = param(params, "ts_ns", list, what)
    values = decode_floats(param(params, "values", list, what), f"{what}.values")
    tz = param(params, "tz", str, what, optional=True)
    unit = param(params, "unit", str, what)
    if unit not in ("s", "ms", "us", "ns"):
        raise ModelParamsError(f"{what}.unit: expected s, ms, us or ns, got {unit!r}")
    if len(stamps) != values.size or not all(isinstance(t, int) and not isinstance(t, bool) for t in stamps):
        raise ModelParamsError(f"{what}: ts_ns must be integers, one per value")
    try:
        idx = pd.DatetimeIndex(np.asarray(stamps, dtype="int64").view("datetime64[ns]")).as_unit(unit)
        if tz is not None:
            idx = idx.tz_localize("UTC").tz_convert(tz)
    except (ValueError, TypeError, OverflowError, KeyError) as exc:
        raise ModelParamsError(f"{what}: bad timestamps or zone ({exc})") from None
    return pd.Series(values, index=idx)


def context_to_params(ctx: "StreamingContext | None") -> dict | None:
    """A StreamingContext as JSON (its remembered points)."""
    return None if ctx is None else {"tail": encode_series(ctx.tail_)}


def context_from_params(params, what: str) -> "StreamingContext | None":
    """The inverse of `context_to_params`."""
    if params is None:
        return None
    ctx = StreamingContext()
    ctx.tail_ = decode_series(param(params, "tail", dict, what, optional=True), f"{what}.tail")
    return ctx


def fitted_state_params(det) -> dict:
    """What every streaming detector remembers after `fit`, as JSON: history length and context."""
    return {
        "n_history": getattr(det, "n_history_", None),
        "context": context_to_params(getattr(det, "context_", None)),
    }


def restore_fitted_state(det, params: dict, what: str, context_required: bool = False) -> None:
    """Set on `det` what `fitted_state_params` stored; raises ModelParamsError when malformed."""
    n = param(params, "n_history", int, what, optional=True)
    if n is not None:
        det.n_history_ = n
    ctx = context_from_params(
        param(params, "context", dict, what, optional=not context_required), f"{what}.context"
    )
    if ctx is not None:
        det.context_ = ctx


def check_kind(params, name: str, version: int) -> None:
    """Raise unless `params` is an object for detector `name` in format `version`."""
    if not isinstance(params, dict):
        raise ModelParamsError(f"{name} params: expected an object, got {type(params).__name__}")
    if params.get("detector") != name or params.get("format") != version:
        raise ModelParamsError(
            f"{name} params: expected detector {name!r} format {version}, "
            f"got {params.get('detector')!r} format {params.get('format')!r}"
        )
