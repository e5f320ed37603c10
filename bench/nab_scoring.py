"""NAB's scoring rules (Lavin and Ahmad, "Evaluating Real-time Anomaly Detection
Algorithms", 2015; numenta/NAB `nab/sweeper.py`), for binary detections.

Per file, in row order:

- the probationary period, the first min(floor(0.15 n), 750) rows, is not scored;
- a row inside a labelled window [left, right] of width w = right - left + 1 rows scores
  sigma_A(p) = 2 / (1 + exp(5 p)) - 1 at p = -(right - i + 1) / w (from about 0.987 at
  the window's first row to 0 past its end), weighted by A_TP / sigma_A(-1): a detection
  at a window's first row is worth A_TP;
- only the best (the first) detection of a window counts; later ones in it are ignored;
  a window with no detection costs -A_FN;
- a detection outside every window is a false positive worth A_FP * sigma_A(p) with
  p = (i - right_prev) / (w_prev - 1) after the preceding window (sigma_A = -1 when
  p > 3 or when no window precedes it): a detection just after a window costs little;
- windows made only of probationary rows are not counted.

The corpus score for a profile is 100 (S - S_null) / (S_perfect - S_null), with S summed
over the files and the null (no detections) and perfect (one detection at each window's
first row) detectors scored by the same rules.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: NAB's config/profiles.json
PROFILES: dict[str, dict[str, float]] = {
    "standard": {"tp": 1.0, "fp": 0.11, "fn": 1.0},
    "reward_low_FP_rate": {"tp": 1.0, "fp": 0.22, "fn": 1.0},
    "reward_low_FN_rate": {"tp": 1.0, "fp": 0.11, "fn": 2.0},
}
PROBATION_SHARE = 0.15
PROBATION_MAX = 750


def scaled_sigmoid(p: np.ndarray | float) -> np.ndarray:
    """NAB's sigma_A: 2 sigmoid(-5 p) - 1, and -1 beyond p = 3."""
    p = np.asarray(p, dtype="float64")
    with np.errstate(over="ignore"):
        val = 2.0 / (1.0 + np.exp(5.0 * p)) - 1.0
    return np.where(p > 3.0, -1.0, val)


def probation_rows(n: int) -> int:
    return int(min(math.floor(PROBATION_SHARE * n), PROBATION_MAX))


@dataclass
class FileScorer:
    """Per-row scores of one file for one profile; `score(flags)` is fast for many flag sets."""

    n: int
    windows: list[tuple[int, int]]  # (left row, right row), inclusive, in time order
    profile: str = "standard"

    def __post_init__(self) -> None:
        w = PROFILES[self.profile]
        n = self.n
        self.probation = probation_rows(n)
        self.window_of = np.full(n, -1, dtype=np.int64)
        row_score = np.empty(n, dtype="float64")
        max_tp = float(scaled_sigmoid(-1.0))
        prev_right = prev_width = None
        cursor = 0
        for k, (left, right) in enumerate(self.windows):
            # rows before this window, after the previous one
            row_score[cursor:left] = self._fp_scores(np.arange(cursor, left), prev_right, prev_width) * w["fp"]
            width = float(right - left + 1)
            i = np.arange(left, right + 1)
            row_score[left : right + 1] = scaled_sigmoid(-(right - i + 1) / width) * w["tp"] / max_tp
            self.window_of[left : right + 1] = k
            prev_right, prev_width, cursor = right, width, right + 1
        row_score[cursor:n] = self._fp_scores(np.arange(cursor, n), prev_right, prev_width) * w["fp"]
        self.row_score = row_score
        scorable = np.arange(n) >= self.probation
        self.scorable = scorable
        counted = set(self.window_of[scorable & (self.window_of >= 0)].tolist())
        self.counted = np.array(sorted(counted), dtype=np.int64)
        self.fn_weight = w["fn"]
        self.tp_weight = w["tp"]

    @staticmethod
    def _fp_scores(rows: np.ndarray, prev_right: int | None, prev_width: float | None) -> np.ndarray:
        if prev_right is None:
            return np.full(rows.size, -1.0)
        if prev_width <= 1:
            return np.full(rows.size, -1.0)
        return scaled_sigmoid(np.abs(prev_right - rows) / (prev_width - 1.0))

    def score(self, flags: np.ndarray) -> dict:
        """Raw score and counts of a boolean detection array (row order)."""
        f = np.asarray(flags, dtype=bool) & self.scorable
        outside = f & (self.window_of < 0)
        fp_score = float(self.row_score[outside].sum())
        tp_by_window = np.full(len(self.windows), -self.fn_weight)
        inside = np.flatnonzero(f & (self.window_of >= 0))
        if inside.size:
            np.maximum.at(tp_by_window, self.window_of[inside], self.row_score[inside])
        counted = tp_by_window[self.counted] if self.counted.size else np.zeros(0)
        detected = int(np.count_nonzero(counted > -self.fn_weight))
        return {
            "raw": float(counted.sum()) + fp_score,
            "tp": detected,
            "fn": int(self.counted.size - detected),
            "fp": int(outside.sum()),
            "windows": int(self.counted.size),
        }

    def null(self) -> float:
        return -self.fn_weight * float(self.counted.size)

    def perfect(self) -> float:
        flags = np.zeros(self.n, dtype=bool)
        for left, _ in self.windows:
            flags[left] = True
        return self.score(flags)["raw"]


def normalised(raw: float, null: float, perfect: float) -> float:
    """NAB's normalised score: 0 for the null detector, 100 for the perfect one."""
    return 100.0 * (raw - null) / (perfect - null) if perfect != null else 0.0


def windowed_gaussian_z(values: np.ndarray, window: int = 6400, step: int = 100) -> np.ndarray:
    """|z| of each point against NAB's windowedGaussian detector's mean and std (its past only).

    The detector's anomaly score is 1 - Q(|z|), monotone in |z|: thresholding |z| is
    thresholding the score. The window grows to `window` points, then slides by `step`.
    """
    x = np.asarray(values, dtype="float64")
    n = x.size
    z = np.zeros(n)
    mean, std = 0.0, 1.0
    for i in range(n):
        if i > 0:
            z[i] = abs(x[i] - mean) / std
        if i < window:
            seen = x[: i + 1]
            mean, std = float(seen.mean()), float(seen.std()) or 1e-6
        elif (i - window + 1) % step == 0:
            seen = x[i + 1 - window : i + 1]
            mean, std = float(seen.mean()), float(seen.std()) or 1e-6
    return z
