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

from gpupool.detect.base import StreamingContext, judged_from, prepare, to_frame



class ZScoreDetector:
    """Past-window median as x̂_t; score = |x_t - x̂_t|."""

    name = "zscore"

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
