"""Demand forecasting by the ARIMA procedure of the design.

1. Regularise the series (hourly grid, gaps interpolated and counted) and handle degenerate
   inputs with a defined fallback (seasonal naive or mean) whose reason is recorded.
2. Seasonality: the daily period (and the weekly one when the series holds enough weeks) is
   detected from the sampling step and the series' seasonal strength; it is modelled by Fourier
   terms as exogenous regressors, the number of terms per period chosen by the information
   criterion, and by a seasonal difference when the daily cycle is strong (see ``seasonal``).
3. Differencing: ADF on the deseasonalised series with KPSS as the second opinion, differencing
   until stationary, recording ``d`` and every p-value.
4. Ljung-Box on the differenced series: white noise means no ARMA terms (the mean or the last
   level is the forecast).
5. Otherwise ``p`` and ``q`` by AIC/BIC with a stepwise search (Hyndman-Khandakar style),
   warm-started from last run's orders when given. With ``keep_orders_for``, a warm start whose
   orders were searched less than that long before the end of the history skips the search:
   its orders are kept and only their coefficients re-estimated (the search runs when they no
   longer fit or no longer pass the residual check they passed when searched).
6. Ljung-Box on the residuals; when they are not white noise the search is widened once and the
   failed check is recorded.

Estimation is conditional sum of squares with the regression coefficients concentrated out
(:mod:`gpupool.forecast._arma`), which keeps a daily refit of ~700 hourly points well under a second
and an hourly :meth:`ArimaForecaster.update` (filtering, no re-estimation) at about a millisecond.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from gpupool.forecast import _arma
from gpupool.forecast._arma import ArmaFit, ArmaSpec
from gpupool.forecast._series import (
    RegularSeries,
    candidate_periods,
    forecast_frame,
    regularize,
    seasonal_strength,
)
from gpupool.forecast.baselines import MeanForecaster, SeasonalNaiveForecaster
from gpupool.forecast.stattests import adf_pvalue, kpss_pvalue, ljung_box_pvalue

_ALPHA = 0.05
_MIN_OBS = 16  # below this no test or ARMA fit means anything: mean / seasonal naive
_MAX_MISSING = 0.2  # more interpolated points than this and the ARMA fit would model the interpolation


def fourier_terms(positions: np.ndarray, terms: list[tuple[int, int]]) -> np.ndarray:
    """Fourier regressors ``sin/cos(2 pi k t / P)`` for each ``(P, K)`` in ``terms``, k = 1..K.

    Harmonics that coincide with an earlier period's (weekly k = 7j against daily j) and the
    identically zero ``sin(pi t)`` are skipped, so the design never has duplicate columns.
    """
    t = np.asarray(positions, dtype=float)
    cols = []
    seen: set[tuple[int, int]] = set()
    for period, k_max in terms:
        for k in range(1, int(k_max) + 1):
            # Reduce k/P to lowest terms to find harmonics shared between periods.
            g = math.gcd(k, period)
            key = (k // g, period // g)
            if key in seen:
                continue
            seen.add(key)
            angle = 2 * np.pi * k * t / period
            if 2 * k != period:
                cols.append(np.sin(angle))
            cols.append(np.cos(angle))
    if not cols:
        return np.zeros((len(t), 0))
    return np.column_stack(cols)


def _max_terms(period: int) -> int:
    # Daily cycles need up to ~10 harmonics for sharp working-hour edges; weekly ones few.
    return int(min(period // 2, 10 if period <= 48 else 5))


class ArimaForecaster:
    """ARIMA forecaster of a demand series, by the procedure in the module docstring.

    Parameters
    ----------
    level:
        Default central prediction-interval level, in percent.
    season:
        Period hint in steps (24 for hourly data); without it the daily period (and the weekly
        one) comes from the sampling step. ``season=1`` switches seasonality off.
    criterion:
        ``"aic"``, ``"aicc"`` or ``"bic"``: chooses p, q and the number of Fourier terms.
    lower_bound, upper_bound:
        Physical bounds (0 and capacity for GPU demand); forecasts and intervals are clipped to
        them and the clipping is recorded. ``None`` disables a bound.
    orders:
        Warm start: last run's ``summary_`` (or a dict with ``d``, ``D``, ``p``, ``q``, ``Q``,
        ``constant`` and ``fourier``). Differencing and Fourier terms are reused and the order
        search starts from the given ``p, q``.
    seasonal:
        ``"auto"`` (default): a seasonal difference (with a seasonal MA term the search may keep)
        when the daily cycle's strength is at least ``strong_season``, else Fourier terms; the
        weekly cycle is always Fourier terms. ``"fourier"`` or ``"diff"`` force one way. On the
        benchmarks Fourier-only loses on M4's strongly periodic series and seasonal differencing
        loses on Helios' weakly periodic demand; ``auto`` takes the better of both.
    max_p, max_q, max_d:
        Bounds of the first order search; the widened search adds 2 to ``max_p`` and ``max_q``.
    maxiter:
        Optimiser iterations per candidate model (CSS, Levenberg-Marquardt).
    keep_orders_for:
        With a warm start whose orders were searched (``orders_searched_through`` of its
        summary: the end of the history the search saw) less than this before the end of the
        history, the orders, differencing and Fourier terms are kept and only the coefficients
        re-estimated: no order search, no stationarity tests. The search (warm-started) runs
        instead when the kept orders cannot be fitted, do not converge, or fail the residual
        Ljung-Box check they passed when searched. ``None`` (default): every fit searches.
    """

    def __init__(
        self,
        level: float = 90,
        season: int | None = None,
        criterion: str = "aic",
        lower_bound: float | None = 0.0,
        upper_bound: float | None = None,
        orders: dict[str, Any] | None = None,
        seasonal: str = "auto",
        strong_season: float = 0.64,
        max_p: int = 3,
        max_q: int = 3,
        max_d: int = 2,
        maxiter: int = 50,
        keep_orders_for: str | pd.Timedelta | None = None,
    ):
        if criterion not in ("aic", "aicc", "bic"):
            raise ValueError("criterion must be 'aic', 'aicc' or 'bic'")
        if seasonal not in ("auto", "fourier", "diff"):
            raise ValueError("seasonal must be 'auto', 'fourier' or 'diff'")
        self.level = level
        self.season = season
        self.criterion = criterion
        self.lower_bound = lower_bound
        self.upper_bound = upper_bound
        self.orders = orders
        self.seasonal = seasonal
        self.strong_season = strong_season
        self.max_p = max_p
        self.max_q = max_q
        self.max_d = max_d
        self.maxiter = maxiter
        self.keep_orders_for = None if keep_orders_for is None else pd.Timedelta(keep_orders_for)

    # ------------------------------------------------------------------ public interface

    def fit(self, y: pd.Series) -> "ArimaForecaster":
        """Run the whole procedure on ``y`` (a Series with a DatetimeIndex; not modified)."""
        self.series_ = regularize(y)
        self.fit_ = None
        self.fallback_ = None
        self.resid_ = None
        series = self.series_
        values = series.values
        summary: dict[str, Any] = {
            "model": None,
            "n_obs": int(len(values)),
            "step_seconds": float(series.step.total_seconds()),
            "start": series.start.isoformat(),
            "missing_filled": int(series.n_missing),
            "criterion": self.criterion,
            "level": self.level,
            "fallback": None,
            "clipped": False,
            "warm_start": bool(self.orders),
        }
        self.summary_ = summary
        periods = candidate_periods(series.step, self.season)
        summary["periods_considered"] = periods
        primary = periods[0] if periods else None
        reason = self._degenerate_reason(values, series, primary)
        if reason is not None:
            return self._use_fallback(reason, primary)
        try:
            self._procedure(values, periods)
        except Exception as exc:  # noqa: BLE001 - a forecast must come back; the reason is kept
            return self._use_fallback(f"estimation failed: {type(exc).__name__}: {exc}", primary)
        if not self.fit_.converged:
            return self._use_fallback("optimiser did not converge", primary)
        self.resid_ = _arma.innovations(self.fit_, values, self._exog(0, len(values)))
        self.summary_ = jsonable(self.summary_)
        return self

    def update(self, y_new: pd.Series) -> "ArimaForecaster":
        """Append newly arrived points and filter them with the fitted coefficients.

        Nothing is re-estimated (that is the daily :meth:`fit`); the one-step residuals are
        recomputed so the next :meth:`predict` starts from the new last state. Points whose
        timestamps are already known replace the old values. ``y_new`` is not modified.
        """
        self._check_fitted()
        if self.fallback_ is not None:
            self.fallback_.update(y_new)
            self.series_ = self.fallback_.series_
            return self
        combined = pd.concat([self.series_.to_series(), y_new])
        combined = combined[~combined.index.duplicated(keep="last")]
        self.series_ = regularize(combined, step=self.series_.step)
        values = self.series_.values
        self.resid_ = _arma.innovations(self.fit_, values, self._exog(0, len(values)))
        self.summary_["n_obs_filtered"] = int(len(values))
        return self

    def predict(self, h: int, level: float | None = None) -> pd.DataFrame:
        """Forecast ``h`` steps after the last point: ``ts, yhat, yhat_lower, yhat_upper``.

        Values are clipped to ``[lower_bound, upper_bound]``; ``summary_["clipped"]`` and the
        frame's ``attrs["clipped"]`` say whether anything was.
        """
        self._check_fitted()
        if h < 1:
            raise ValueError("h must be at least 1")
        h = int(h)
        level = self.level if level is None else level
        if self.fallback_ is not None:
            frame = self.fallback_.predict(h, level)
            self.summary_["clipped"] = bool(frame.attrs.get("clipped", False))
            return frame
        n = len(self.series_.values)
        mean, se = _arma.forecast(
            self.fit_, self.series_.values, self._exog(0, n), self._exog(n, h), h, resid=self.resid_
        )
        if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(se))):
            # A numerically exploding model must not leak NaN: answer with the fallback instead.
            self._use_fallback("non-finite forecast", self.summary_.get("season"))
            return self.predict(h, level)
        frame, clipped = forecast_frame(
            self.series_.future_index(h), mean, se, level, self.lower_bound, self.upper_bound
        )
        self.summary_["clipped"] = clipped
        return frame

    # ------------------------------------------------------------------ the procedure

    def _procedure(self, y: np.ndarray, periods: list[int]) -> None:
        summary = self.summary_
        n = len(y)
        warm = _warm_orders(self.orders)
        usable = [p for p in periods if n >= 2 * p]
        summary["periods"] = usable
        strengths = {str(p): round(seasonal_strength(y, p), 4) for p in usable}
        summary["seasonal_strength"] = strengths
        primary = usable[0] if usable else None
        summary["season"] = primary

        # Seasonal difference or Fourier terms for the daily cycle.
        if warm is not None:
            D = warm["D"] if primary else 0
        elif primary is None or self.seasonal == "fourier":
            D = 0
        elif self.seasonal == "diff":
            D = 1
        else:
            D = int(strengths[str(primary)] >= self.strong_season)
        summary["D"] = D
        fourier_periods = [p for p in usable if not (D and p == primary)]
        season = primary if D else 0
        summary["orders_searched_through"] = self._end().isoformat()
        summary["orders_kept"] = False
        if warm is not None and self._orders_fresh(warm) and self._keep_orders(y, warm, D, season, fourier_periods):
            return

        # Stationarity of the deseasonalised series: ADF first, KPSS as second opinion.
        base = _arma.difference(y, ArmaSpec(D=D, season=season)) if D else y
        pos = np.arange(n - len(base), n)
        full_terms = [(p, _max_terms(p)) for p in fourier_periods]
        x_full = fourier_terms(pos, full_terms)
        deseason = _ols_residual(base, x_full)
        d, adf_p, kpss_p = self._choose_d(deseason)
        if warm is not None:
            d = warm["d"]
        summary["d"] = d
        summary["adf_pvalues"] = adf_p
        summary["kpss_pvalues"] = kpss_p
        summary["adf_pvalue"] = adf_p[min(d, len(adf_p) - 1)]
        summary["kpss_pvalue"] = kpss_p[min(d, len(kpss_p) - 1)]

        # White-noise shortcut on the differenced deseasonalised series.
        diffed = np.diff(deseason, n=d) if d else deseason
        wn_lags = int(min(10, max(len(diffed) // 5, 1)))
        wn_p = ljung_box_pvalue(diffed, wn_lags)
        white = wn_p > _ALPHA and not D  # a seasonal difference always keeps its seasonal MA term
        summary["ljungbox_pvalue"] = wn_p
        summary["white_noise"] = bool(wn_p > _ALPHA)

        allow_const = d + D <= 1
        # Every candidate sums over the same residuals (those after the widest search's max p).
        self._condition = max(self.max_p + 2, warm["p"] if warm is not None else 0)
        self._trace: dict[tuple, float] = {}
        self._fits: dict[tuple, ArmaFit] = {}
        self._n_fitted = 0

        # Number of Fourier terms per period, by the criterion, with a simple ARMA proxy.
        if warm is not None:
            terms = [(p, k) for p, k in warm["fourier"] if p in fourier_periods]
        else:
            proxy = ArmaSpec(p=0 if white else 2, q=0, d=d, D=D, Q=D, season=season, constant=allow_const)
            terms = self._choose_fourier(y, proxy, fourier_periods)
        self.terms_ = terms
        summary["fourier"] = [{"period": p, "terms": k} for p, k in terms]
        exog = self._exog(0, n)

        if white:
            self._condition = 0  # nothing to compare against: use every point for the mean
            spec = ArmaSpec(0, 0, d, D, 0, season, allow_const)
            best = self._evaluate(spec, y, exog)
            if best is None:
                raise ValueError("white-noise model could not be fitted")
            summary["search"] = "white noise: no ARMA terms"
        else:
            if warm is not None:
                start = ArmaSpec(warm["p"], warm["q"], d, D, warm["Q"] if D else 0, season,
                                 warm["constant"] and allow_const)
            else:
                start = None
            best = self._stepwise(y, exog, d, D, season, allow_const, self.max_p, self.max_q, start)
            summary["search"] = "stepwise"
        resid = _arma.innovations(best, y, exog)[best.spec.p :]
        lb_lags = int(min(max(10, 2 * (season or 0)), max(len(resid) // 5, 1)))
        n_arma = best.spec.p + best.spec.q + best.spec.Q
        resid_p = ljung_box_pvalue(resid, lb_lags, dof=n_arma)
        summary["residual_ljungbox_pvalue_first"] = resid_p
        summary["widened"] = False
        if resid_p <= _ALPHA and not white:
            summary["widened"] = True
            best = self._stepwise(y, exog, d, D, season, allow_const, self.max_p + 2, self.max_q + 2, best.spec)
            resid = _arma.innovations(best, y, exog)[best.spec.p :]
            n_arma = best.spec.p + best.spec.q + best.spec.Q
            resid_p = ljung_box_pvalue(resid, lb_lags, dof=n_arma)
        summary["residual_ljungbox_pvalue"] = resid_p
        summary["residual_check_passed"] = bool(resid_p > _ALPHA)
        self._record(best)

    def _record(self, best: ArmaFit) -> None:
        """Keep ``best`` as the fitted model and record its orders, criterion and coefficients."""
        summary = self.summary_
        self.fit_ = best
        spec = best.spec
        summary.update(
            model="arima",
            p=spec.p, q=spec.q, Q=spec.Q, constant=spec.constant,
            order=[spec.p, spec.d, spec.q],
            seasonal_order=[0, spec.D, spec.Q, spec.season],
            criterion_value=self._trace[_key(spec)],
            criterion_values={_label(k): v for k, v in sorted(self._trace.items(), key=lambda kv: kv[1])[:25]},
            models_fitted=self._n_fitted,
            sigma2=best.sigma2,
            coefficients={
                "ar": best.ar.tolist(), "ma": best.ma.tolist(), "sma": best.sma.tolist(),
                "mean_of_differenced": best.mu, "fourier": best.beta.tolist(),
            },
        )

    def _end(self) -> pd.Timestamp:
        """The end of the history: the step after its last point."""
        return self.series_.start + self.series_.step * len(self.series_.values)

    def _orders_fresh(self, warm: dict[str, Any]) -> bool:
        """Whether the warm start's orders were searched less than ``keep_orders_for`` before the end."""
        return estimated_within(warm.get("searched_through"), self._end(), self.keep_orders_for)

    def _keep_orders(self, y: np.ndarray, warm: dict[str, Any], D: int, season: int,
                     fourier_periods: list[int]) -> bool:
        """Fit the warm start's orders as they are (coefficients only) and keep them when they
        fit, converge and pass the residual check they passed when searched; False: search."""
        summary = self.summary_
        d = warm["d"]
        allow_const = d + D <= 1
        # the search's white-noise shortcut sums over every point; a searched model over the
        # residuals after its widest search's max p: the same conditioning, the same fit
        white = warm["white"] and not D
        self._condition = 0 if white else max(self.max_p + 2, warm["p"])
        self._trace, self._fits, self._n_fitted = {}, {}, 0
        self.terms_ = [(p, k) for p, k in warm["fourier"] if p in fourier_periods]
        exog = self._exog(0, len(y))
        spec = ArmaSpec(0, 0, d, D, 0, season, allow_const) if white else ArmaSpec(
            warm["p"], warm["q"], d, D, warm["Q"] if D else 0, season, warm["constant"] and allow_const)
        fit = self._evaluate(spec, y, exog)
        if fit is None or not fit.converged or not math.isfinite(self._trace[_key(spec)]):
            return False
        resid = _arma.innovations(fit, y, exog)[spec.p :]
        lb_lags = int(min(max(10, 2 * (season or 0)), max(len(resid) // 5, 1)))
        resid_p = ljung_box_pvalue(resid, lb_lags, dof=spec.p + spec.q + spec.Q)
        if resid_p <= _ALPHA and warm["residual_check_passed"]:
            return False
        summary["d"] = d
        # the tests that chose them were the search's: carried from its record
        for key in ("adf_pvalues", "kpss_pvalues", "adf_pvalue", "kpss_pvalue", "ljungbox_pvalue", "white_noise",
                    "search", "residual_ljungbox_pvalue_first", "widened"):
            summary[key] = self.orders.get(key)
        summary["orders_searched_through"] = warm["searched_through"]
        summary["orders_kept"] = True
        summary["fourier"] = [{"period": p, "terms": k} for p, k in self.terms_]
        summary["residual_ljungbox_pvalue"] = resid_p
        summary["residual_check_passed"] = bool(resid_p > _ALPHA)
        self._record(fit)
        return True

    def _choose_d(self, x: np.ndarray) -> tuple[int, list[float], list[float]]:
        adf_p, kpss_p = [], []
        d = 0
        while True:
            a, k = adf_pvalue(x), kpss_pvalue(x)
            adf_p.append(a)
            kpss_p.append(k)
            # ADF decides; at d = 0 a KPSS rejection overrules an ADF rejection (the second
            # opinion), after one difference KPSS over-rejects near-unit MA roots and is only recorded.
            stationary = a < _ALPHA and (k > _ALPHA or d > 0)
            if stationary or d >= self.max_d or len(x) < 24:
                return d, adf_p, kpss_p
            x = np.diff(x)
            d += 1

    def _choose_fourier(self, y: np.ndarray, proxy: ArmaSpec, periods: list[int]) -> list[tuple[int, int]]:
        terms: list[tuple[int, int]] = []
        for period in periods:
            best_k, best_ic = 0, self._ic_with_terms(y, proxy, terms + [(period, 0)])
            for k in range(1, _max_terms(period) + 1):
                ic = self._ic_with_terms(y, proxy, terms + [(period, k)])
                if ic < best_ic:
                    best_k, best_ic = k, ic
                elif k >= best_k + 2:  # two terms without gain: the criterion has turned
                    break
            terms.append((period, best_k))
        return [(p, k) for p, k in terms if k > 0]

    def _ic_with_terms(self, y: np.ndarray, spec: ArmaSpec, terms: list[tuple[int, int]]) -> float:
        exog = fourier_terms(np.arange(len(y)), terms)
        try:
            fit = _arma.fit_css(spec, y, exog if exog.shape[1] else None, maxiter=self.maxiter,
                                condition=self._condition)
        except (ValueError, FloatingPointError, np.linalg.LinAlgError):
            return math.inf
        self._n_fitted += 1
        return fit.ic(self.criterion, exog.shape[1])

    def _evaluate(self, spec: ArmaSpec, y: np.ndarray, exog: np.ndarray | None) -> ArmaFit | None:
        key = _key(spec)
        if key in self._fits:
            return self._fits[key]
        try:
            fit = _arma.fit_css(spec, y, exog, maxiter=self.maxiter, condition=self._condition)
        except (ValueError, FloatingPointError, np.linalg.LinAlgError):
            self._trace[key] = math.inf
            return None
        self._n_fitted += 1
        n_exog = 0 if exog is None else exog.shape[1]
        self._trace[key] = fit.ic(self.criterion, n_exog) if fit.converged else math.inf
        self._fits[key] = fit
        return fit

    def _stepwise(self, y, exog, d, D, season, allow_const, max_p, max_q, start: ArmaSpec | None) -> ArmaFit:
        q_seas = [1, 0] if D else [0]
        defaults = [ArmaSpec(p, q, d, D, q_seas[0], season, allow_const)
                    for p, q in ((2, 2), (0, 0), (1, 0), (0, 1)) if p <= max_p and q <= max_q]
        best: ArmaFit | None = None
        # A warm start (last run's orders, or the first search's best when widening) is tried
        # alone first; the default starting set is the fallback when it cannot be fitted.
        for candidates in ([start] if start is not None else [], defaults):
            for spec in candidates:
                fit = self._evaluate(spec, y, exog)
                if fit is not None and math.isfinite(self._trace[_key(spec)]) and (
                    best is None or self._trace[_key(spec)] < self._trace[_key(best.spec)]
                ):
                    best = fit
            if best is not None:
                break
        if best is None:
            tried = [k for k in self._trace if k in self._fits]
            if tried:
                raise ValueError(f"the optimiser did not converge on any of {len(tried)} candidate models")
            raise ValueError("no candidate model could be fitted")
        max_p, max_q = max(max_p, best.spec.p), max(max_q, best.spec.q)
        improved = True
        while improved:
            improved = False
            s = best.spec
            neighbours = []
            for dp, dq in ((1, 0), (-1, 0), (0, 1), (0, -1), (1, 1), (-1, -1), (1, -1), (-1, 1)):
                p, q = s.p + dp, s.q + dq
                if 0 <= p <= max_p and 0 <= q <= max_q:
                    neighbours.append(ArmaSpec(p, q, d, D, s.Q, season, s.constant))
            if allow_const:
                neighbours.append(ArmaSpec(s.p, s.q, d, D, s.Q, season, not s.constant))
            if len(q_seas) > 1:
                neighbours.append(ArmaSpec(s.p, s.q, d, D, 1 - s.Q, season, s.constant))
            for spec in neighbours:
                if _key(spec) in self._trace:
                    continue
                fit = self._evaluate(spec, y, exog)
                if fit is not None and self._trace[_key(spec)] < self._trace[_key(best.spec)]:
                    best, improved = fit, True
                    break
        if not math.isfinite(self._trace[_key(best.spec)]):
            raise ValueError("no candidate model converged")
        return best

    # ------------------------------------------------------------------ helpers

    def _exog(self, first: int, length: int) -> np.ndarray | None:
        terms = getattr(self, "terms_", [])
        if not terms:
            return None
        return fourier_terms(np.arange(first, first + length), terms)

    def _degenerate_reason(self, values: np.ndarray, series: RegularSeries, primary: int | None) -> str | None:
        n = len(values)
        if np.all(values == 0):
            return "all zeros"
        if np.ptp(values) == 0:
            return "constant series"
        if series.missing_fraction > _MAX_MISSING:
            return f"gaps: {series.n_missing} of {n} points missing"
        if n < _MIN_OBS:
            return f"short series: {n} points"
        if primary is not None and n < 2 * primary:
            return f"short series: {n} points, fewer than two periods of {primary}"
        return None

    def _use_fallback(self, reason: str, primary: int | None) -> "ArimaForecaster":
        values = self.series_.values
        s = self.series_.to_series()
        if primary and len(values) >= primary and np.ptp(values) > 0:
            model = SeasonalNaiveForecaster(primary, self.level, self.lower_bound, self.upper_bound)
        else:
            model = MeanForecaster(None, self.level, self.lower_bound, self.upper_bound)
        model.fit(s)
        self.fallback_ = model
        self.fit_ = None
        self.summary_.update(model=model.name, fallback=reason, d=None, p=None, q=None, fourier=[])
        self.summary_["fallback_model"] = model.summary_
        self.summary_ = jsonable(self.summary_)
        return self

    def _check_fitted(self) -> None:
        if not hasattr(self, "series_"):
            raise RuntimeError("ArimaForecaster is not fitted")


def estimated_within(stamp: Any, end: pd.Timestamp, span: pd.Timedelta | None) -> bool:
    """Whether an estimate made on the history up to ``stamp`` is less than ``span`` before ``end``
    (False without a span or a stamp, or when the stamp cannot be read against ``end``)."""
    if span is None or not stamp:
        return False
    try:
        age = end - pd.Timestamp(stamp)
    except (TypeError, ValueError):  # unreadable, or one of them tz-aware and the other not
        return False
    return pd.Timedelta(0) <= age < span


def jsonable(value: Any) -> Any:
    """A copy of ``value`` that ``json.dumps`` accepts strictly: numpy scalars become Python
    numbers, non-finite floats become None, tuples become lists."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [jsonable(v) for v in value]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    return value


def _ols_residual(y: np.ndarray, x: np.ndarray) -> np.ndarray:
    design = np.hstack([np.ones((len(y), 1)), x]) if x.shape[1] else np.ones((len(y), 1))
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    return y - design @ coef


def _key(spec: ArmaSpec) -> tuple:
    return (spec.p, spec.q, spec.Q, spec.constant)


def _label(key: tuple) -> str:
    p, q, Q, const = key
    return f"p={p},q={q},Q={Q}{',const' if const else ''}"


def _warm_orders(orders: dict[str, Any] | None) -> dict[str, Any] | None:
    """Normalise last run's summary (or a hand-written dict) into the warm-start fields."""
    if not orders or orders.get("p") is None:
        return None
    fourier = orders.get("fourier") or []
    pairs = [(int(f["period"]), int(f["terms"])) if isinstance(f, dict) else (int(f[0]), int(f[1])) for f in fourier]
    return {
        "p": int(orders.get("p", 0)),
        "q": int(orders.get("q", 0)),
        "d": int(orders.get("d", 0)),
        "D": int(orders.get("D", 0)),
        "Q": int(orders.get("Q", 0)),
        "constant": bool(orders.get("constant", True)),
        "fourier": pairs,
        # when and how the orders were searched (absent from a hand-written warm start)
        "searched_through": orders.get("orders_searched_through"),
        "white": bool(orders.get("white_noise")) and str(orders.get("search", "")).startswith("white noise"),
        "residual_check_passed": bool(orders.get("residual_check_passed", True)),
    }
