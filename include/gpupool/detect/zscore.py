"""Rolling (robust) z-score detector: the simple baseline the router falls back to.

x̂_t is the median of the `window` points before t (a median, so that one spike does not
move x̂ for the next `window` points); the score is |x_t - x̂_t|, turned into a
flag by the same per-series τ as the other residual detectors (clean.py). It learns
nothing but its context, which makes it the fallback for a series whose own history
says the models predict it no better than its recent mean.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from gpupool.detect.base import (
    ModelParamsError,
    StreamingContext,
    check_kind,
    fitted_state_params,
    judged_from,
    param,
    prepare,
    restore_fitted_state,
    to_frame,
)


class ZScoreConfig(BaseModel):
    """The rolling z-score's settings (`RouterConfig.zscore`); its window chosen with
    bench/detect_nab.py."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    window: int = Field(288, ge=12, description="points in the rolling z-score's past median")

class ZScoreDetector:
    """Past-window median as x̂_t; score = |x_t - x̂_t|."""

    name = "zscore"
    PARAMS_FORMAT = 1

    def __init__(self, window: int = 288, min_points: int = 12) -> None:
        self.window = window
        self.min_points = min_points

    def fit(self, y_history: pd.Series) -> "ZScoreDetector":
        """Remember the newest `window` points as context; residuals of the history for τ."""
        h = prepare(y_history)
        self.context_ = StreamingContext()
        self.context_.remember(h, self.window)
        expected = self._expected(h.to_numpy(dtype="float64"), 0)
        self.history_residuals_ = h.to_numpy(dtype="float64") - expected
        self.history_scores_ = np.abs(self.history_residuals_)
        self.n_history_ = int(len(h))
        return self

    def score(self, y: pd.Series, start: pd.Timestamp | None = None) -> pd.DataFrame:
        """x̂_t and |x_t - x̂_t| for each point of `y` from its past (NaN before `start`)."""
        work = prepare(y)
        joined, offset = self.context_.with_context(work)
        first = judged_from(joined.index, offset, start)
        raw = joined.to_numpy(dtype="float64")
        expected = self._expected(raw, first)
        return to_frame(y, work.index, expected[offset:], np.abs(raw - expected)[offset:])

    def _expected(self, raw: np.ndarray, first: int) -> np.ndarray:
        mean = pd.Series(raw).rolling(self.window, min_periods=self.min_points).median().shift(1).to_numpy().copy()
        mean[:first] = np.nan
        return mean

    def to_params(self) -> dict:
        """The settings and remembered context as a JSON-able dict (see `from_params`).

        The history's residuals serve the per-series threshold at fit time only and are not kept.
        """
        return {
            "detector": self.name,
            "format": self.PARAMS_FORMAT,
            "window": self.window,
            "min_points": self.min_points,
            **fitted_state_params(self),
        }

    @classmethod
    def from_params(cls, params: dict) -> "ZScoreDetector":
        """The detector `to_params` described; raises ModelParamsError when malformed."""
        check_kind(params, cls.name, cls.PARAMS_FORMAT)
        what = "zscore params"
        window = param(params, "window", int, what)
        min_points = param(params, "min_points", int, what)
        if window < 1 or min_points < 1:
            raise ModelParamsError(f"{what}: window and min_points must be positive")
        det = cls(window=window, min_points=min_points)
        restore_fitted_state(det, params, what)
        return det
