"""Spectral Residual detector (Ren et al., "Time-Series Anomaly Detection Service at
Microsoft", KDD 2019), run as a sliding window so that a point is judged on its past only.

For the point x_n and the `window` points ending at it:

1. extend the window by m copies of an estimated point (the paper's eq. 5-6 applied one
   step back, as the authors' reference code does): x̃ = x_{n-m} + g * m, with g the mean
   gradient between x_{n-1} and each of the m points before it. The point under test then
   sits inside the window instead of on its edge, where the transform is least reliable,
   and its own value does not shape the extension;
2. A = |F(x)|, P = phase(F(x)), L = log A; spectral residual R = L - h_q * L with h_q the
   q-point moving average (q = 3);
3. saliency map S = |F^-1(exp(R + iP))|;
4. score O(x_n) = (S(x_n) - mean(S of the z = 21 points before x_n)) / that mean.

All windows of a series are transformed at once (batched FFTs), chunk by chunk.
The expected value used for cleaning is the median of the points just before x_n: a
robust local estimate that one bad point cannot drag.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from numpy.lib.stride_tricks import sliding_window_view

from gpupool.detect._robust import ffill_array
from gpupool.detect.base import StreamingContext, judged_from, past_median, prepare, to_frame

_EPS = 1e-8
_CHUNK = 4096



class SpectralResidualDetector:
    """Streaming Spectral Residual scores; expected value from a past-only rolling median."""

    name = "sr"

    def __init__(self, window: int = 123, q: int = 3, z: int = 21, m: int = 5, expected_window: int = 12) -> None:
        if window < z + 2:
            raise ValueError(f"window ({window}) must exceed z + 1 ({z + 1})")
        self.window = window
        self.q = q
        self.z = z
        self.m = m
        self.expected_window = expected_window

    def fit(self, y_history: pd.Series) -> "SpectralResidualDetector":
        """Remember the history's newest points as context and score the history itself.

        SR learns nothing from the history but context; `history_scores_` and
        `history_residuals_` (value minus expected, streaming) let the caller set a
        per-series threshold.
        """
        h = prepare(y_history)
        self.context_ = StreamingContext()
        self.context_.remember(h, self.window + self.expected_window)
        hs = self._score_prepared(h, 0, None)
        self.history_scores_ = hs["score"].to_numpy()
        self.history_residuals_ = (h.to_numpy() - hs["expected"].to_numpy())
        self.n_history_ = int(len(h))
        return self

    def score(self, y: pd.Series, start: pd.Timestamp | None = None) -> pd.DataFrame:
        """Expected value and SR score for each point of `y`, judged on its past only.

        Points before `start` (and missing points) get NaN; the fitted history's tail is
        used as context before `y`'s first point.
        """
        work = prepare(y)
        joined, offset = self.context_.with_context(work) if hasattr(self, "context_") else (work, 0)
        res = self._score_prepared(joined, offset, start)
        res = res.iloc[offset:]
        return to_frame(y, work.index, res["expected"].to_numpy(), res["score"].to_numpy())

    def _score_prepared(self, s: pd.Series, offset: int, start: pd.Timestamp | None) -> pd.DataFrame:
        raw = s.to_numpy(dtype="float64")
        n = raw.size
        expected = np.full(n, np.nan)
        score = np.full(n, np.nan)
        first = judged_from(s.index, offset, start)
        if n == 0 or first >= n or not np.isfinite(raw).any():
            return pd.DataFrame({"expected": expected, "score": score}, index=s.index)
        x = ffill_array(raw)
        # a point needs z earlier saliency values to be judged
        first_scored = max(first, self.z + 1)
        if first_scored < n:
            score[first_scored:] = self._saliency_scores(x, first_scored)
        med = past_median(raw, self.expected_window)
        expected[first:] = med[first:]
        missing = ~np.isfinite(raw)
        score[missing] = np.nan
        return pd.DataFrame({"expected": expected, "score": score}, index=s.index)

    def _saliency_scores(self, x: np.ndarray, first: int) -> np.ndarray:
        """O(x_e) for every e >= first, each from the `window` points ending at e."""
        # imported here: SciPy is slow to import, and most series are never judged by SR
        from scipy.ndimage import uniform_filter1d

        w, m, z = self.window, self.m, self.z
        # points too early for a full window see it padded with the first value
        xp = np.concatenate([np.full(w - 1, x[0]), x])
        views = sliding_window_view(xp, w)  # row e is the window ending at x[e]
        out = np.empty(x.size - first)
        gaps = np.arange(1, m + 1, dtype="float64")
        for lo in range(first, x.size, _CHUNK):
            hi = min(lo + _CHUNK, x.size)
            win = views[lo:hi]
            # estimate from the m + 1 points before x_n, never from x_n itself: a spike must
            # not drag its own extension up and hide as a step
            last = win[:, -2:-1]
            g = np.mean((last - win[:, -2 - m : -2][:, ::-1]) / gaps, axis=1)
            est = win[:, w - 1 - m] + g * m
            ext = np.concatenate([win, np.repeat(est[:, None], m, axis=1)], axis=1)
            spec = np.fft.rfft(ext, axis=1)
            amp = np.abs(spec)
            log_amp = np.log(amp + _EPS)
            resid = log_amp - uniform_filter1d(log_amp, size=self.q, axis=1, mode="nearest")
            phase = spec / np.maximum(amp, _EPS)
            sal = np.abs(np.fft.irfft(np.exp(resid) * phase, n=w + m, axis=1))
            s_n = sal[:, w - 1]
            local = sal[:, w - 1 - z : w - 1].mean(axis=1)
            out[lo - first : hi - first] = (s_n - local) / (local + _EPS)
        return out
