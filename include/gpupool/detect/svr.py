"""SVR detector: `sklearn.svm.SVR` predicts x̂_t from the points before t and the calendar.

Features for the point at t, all from before t:

- the last `n_lags` values, each minus the local level (median of those lags), in units
  of the history's robust spread; the target is x_t minus the same local level. Working
  relative to the local level lets an RBF model follow a series to levels it never saw
  in training (after a level shift) instead of predicting the nearest training level;
- the value one seasonal period earlier and the one after it (relative to the level too),
  when the profile found a period;
- hour of day and day of week as sine/cosine pairs, when the step is under a day.

The fit uses at most `max_train` of the newest history points: SVR's cost grows with
the square of the training size.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpupool.detect._robust import ffill_array, robust_sigma, step_seconds
from gpupool.detect.base import StreamingContext, judged_from, prepare, to_frame



class RBFSupportVectors:
    """The decision function of a fitted RBF-kernel SVR, from its stored arrays.

    f(x) = Σ_i α_i exp(-γ ||x - s_i||²) + b over the support vectors s_i with dual
    coefficients α_i: what `SVR.predict` computes, rebuilt from data alone.
    """

    def __init__(self, support_vectors: np.ndarray, dual_coef: np.ndarray, intercept: float, gamma: float) -> None:
        self.support_vectors_ = np.asarray(support_vectors, dtype="float64")
        self.dual_coef_ = np.asarray(dual_coef, dtype="float64").ravel()
        self.intercept_ = float(intercept)
        self.gamma_ = float(gamma)

    @classmethod
    def of(cls, model) -> "RBFSupportVectors":
        """The arrays of a fitted `sklearn.svm.SVR` (RBF kernel) or of another instance."""
        if isinstance(model, cls):
            return model
        if getattr(model, "kernel", None) != "rbf":
            raise ValueError(f"only RBF-kernel SVR models can be stored, not {getattr(model, 'kernel', model)!r}")
        return cls(model.support_vectors_, model.dual_coef_, float(np.ravel(model.intercept_)[0]), float(model._gamma))

    def predict(self, X: np.ndarray) -> np.ndarray:
        X = np.asarray(X, dtype="float64")
        out = np.empty(X.shape[0])
        sv_sq = np.einsum("ij,ij->i", self.support_vectors_, self.support_vectors_)
        for lo in range(0, X.shape[0], 2048):  # bounded memory: rows x support vectors
            chunk = X[lo : lo + 2048]
            sq = np.einsum("ij,ij->i", chunk, chunk)[:, None] + sv_sq[None, :] - 2.0 * chunk @ self.support_vectors_.T
            out[lo : lo + 2048] = np.exp(-self.gamma_ * np.maximum(sq, 0.0)) @ self.dual_coef_ + self.intercept_
        return out


class SVRDetector:
    """Support-vector regression on lags and calendar features; score = |x_t - x̂_t|."""

    name = "svr"

    def __init__(
        self,
        n_lags: int = 12,
        period: int | None = None,
        calendar: bool = True,
        C: float = 1.0,
        epsilon: float = 0.1,
        gamma: str | float = "scale",
        max_train: int = 1500,
    ) -> None:
        self.n_lags = n_lags
        # a period of one point would make "the point after x_{t-p}" x_t itself
        self.period = period if period is not None and period >= 2 else None
        self.calendar = calendar
        self.C = C
        self.epsilon = epsilon
        self.gamma = gamma
        self.max_train = max_train

    def _context_points(self) -> int:
        return self.n_lags + (self.period + 1 if self.period else 0)

    def fit(self, y_history: pd.Series) -> "SVRDetector":
        """Fit the regression on the history's newest `max_train` judgeable points."""
        h = prepare(y_history)
        raw = h.to_numpy(dtype="float64")
        finite = raw[np.isfinite(raw)]
        self.scale_ = robust_sigma(np.diff(finite), floor=0.0) if finite.size > 2 else 0.0
        if self.scale_ <= 0:
            self.scale_ = robust_sigma(finite, floor=0.0) if finite.size else 0.0
        if self.scale_ <= 0:
            self.scale_ = max(abs(float(np.median(finite))) * 1e-3, 1e-9) if finite.size else 1.0
        # the calendar features need a step under a day to mean anything
        step = step_seconds(h.index)
        self.use_calendar_ = bool(self.calendar and step is not None and step < 86400.0)
        self.context_ = StreamingContext()
        self.context_.remember(h, self._context_points())
        X, target, level, ok = self._design(h, 0)
        rows = np.flatnonzero(ok & np.isfinite(raw))
        rows = rows[-self.max_train :]
        self.model_: SVR | RBFSupportVectors | None = None
        self.offset_ = 0.0
        self.constant_ = rows.size < 10 or float(np.ptp(target[rows])) == 0.0
        # residuals for the threshold must be out of sample: in-sample SVR residuals are
        # about half as wide and would flag ordinary noise. A first model fitted on the
        # older 70% of the rows is judged on the newer 30%; the final model sees all rows.
        self.history_residuals_ = np.full(raw.size, np.nan)
        if not self.constant_ and rows.size >= 60:
            cut = int(rows.size * 0.7)
            early = rows[:cut]
            if float(np.ptp(target[early])) > 0.0:
                self._fit_rows(X, target, early)
                late_ok = np.zeros_like(ok)
                late_ok[rows[cut:]] = True
                pred = self._predict(X, level, late_ok)
                self.history_residuals_[rows[cut:]] = (raw - pred)[rows[cut:]]
        if not self.constant_:
            self._fit_rows(X, target, rows)
        if not np.isfinite(self.history_residuals_).any():
            self.history_residuals_ = raw - self._predict(X, level, ok)
        self.history_scores_ = np.abs(self.history_residuals_)
        self.n_history_ = int(len(h))
        return self

    def score(self, y: pd.Series, start: pd.Timestamp | None = None) -> pd.DataFrame:
        """x̂_t and |x_t - x̂_t| for each point of `y` from its past (NaN before `start`)."""
        work = prepare(y)
        joined, offset = self.context_.with_context(work)
        first = judged_from(joined.index, offset, start)
        n = len(joined)
        expected = np.full(n, np.nan)
        if first < n:
            # build features only for the judged rows plus the lags they need
            lo = max(0, first - self._context_points())
            X, _, level, ok = self._design(joined.iloc[lo:], first - lo)
            pred = self._predict(X, level, ok)
            expected[first:] = pred[first - lo :]
        raw = joined.to_numpy(dtype="float64")
        score = np.abs(raw - expected)
        return to_frame(y, work.index, expected[offset:], score[offset:])

    def _fit_rows(self, X: np.ndarray, target: np.ndarray, rows: np.ndarray) -> None:
        # imported here: scikit-learn is slow to import, and a stored model is rebuilt without it
        from sklearn.svm import SVR

        self.model_ = SVR(C=self.C, epsilon=self.epsilon, gamma=self.gamma, cache_size=200)
        self.model_.fit(X[rows], target[rows])
        # the epsilon tube leaves the intercept free by up to epsilon; on a series that is
        # mostly one value that slack becomes a constant error, so centre the fit on the
        # median training residual
        self.offset_ = float(np.median(target[rows] - self.model_.predict(X[rows])))

    def _predict(self, X: np.ndarray, level: np.ndarray, ok: np.ndarray) -> np.ndarray:
        pred = np.full(level.size, np.nan)
        rows = np.flatnonzero(ok)
        if rows.size == 0:
            return pred
        if self.model_ is None:
            pred[rows] = level[rows]
        else:
            pred[rows] = level[rows] + (self.model_.predict(X[rows]) + self.offset_) * self.scale_
        return pred

    def _design(self, s: pd.Series, first: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Features, scaled target and local level per point; `ok` marks rows >= first with a full past."""
        raw = s.to_numpy(dtype="float64")
        x = ffill_array(raw)
        n = x.size
        L = self.n_lags
        ok = np.zeros(n, dtype=bool)
        if n == 0 or not np.isfinite(x).any():
            return np.zeros((n, 0)), np.full(n, np.nan), np.full(n, np.nan), ok
        xp = np.concatenate([np.full(L, x[0]), x])
        lags = np.lib.stride_tricks.sliding_window_view(xp, L)[:n]  # row t: x[t-L .. t-1]
        level = np.median(lags, axis=1)
        cols = [(lags - level[:, None]) / self.scale_]
        start_ok = L
        if self.period:
            p = self.period
            prev = np.concatenate([np.full(p + 1, x[0]), x])
            seasonal = np.stack([prev[1 : n + 1], prev[2 : n + 2]], axis=1)  # row t: x[t-p], x[t-p+1]
            cols.append((seasonal - level[:, None]) / self.scale_)
            start_ok = max(start_ok, p + 1)
        if self.use_calendar_:
            idx = s.index
            hour = (idx.hour.to_numpy() + idx.minute.to_numpy() / 60.0) / 24.0
            dow = (idx.dayofweek.to_numpy() + hour) / 7.0
            cols.append(
                np.stack(
                    [np.sin(2 * np.pi * hour), np.cos(2 * np.pi * hour), np.sin(2 * np.pi * dow), np.cos(2 * np.pi * dow)],
                    axis=1,
                )
            )
        X = np.concatenate(cols, axis=1)
        target = (raw - level) / self.scale_
        ok[max(first, min(start_ok, n)) :] = True
        if first == 0:
            # in the history, rows without a full past are not trained on
            ok[: min(start_ok, n)] = False
        return X, target, level, ok
