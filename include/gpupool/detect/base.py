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
