"""Per-series model choice by validation inside the history.

A demand series is forecast by whichever of a few candidates forecast *its own* recent past best:

1. **Profile.** The series is classed ``regular``, ``step`` (mostly flat: most hours equal the
   hour before, demand moves in rare steps of whole nodes), ``intermittent`` (mostly zero) or
   ``constant``. Step-like and intermittent series are not over-modelled: the exponential
   smoothing candidate (whose trend would smooth a step into a slope) is not tried, candidates
   are not averaged, and a model other than the last value must beat the last value by
   ``step_margin`` on validation. A series with zero demand in at least ``sparse_share`` of its
   last four weeks is also *sparse* (a mostly idle tenant, often on/off with the time of day).
2. **Candidates.** The ARIMA procedure of the design (:class:`ArimaForecaster`, always tried and
   first on ties), seasonal naive, naive (last value), on regular series additive Holt-Winters
   with a damped trend (statsmodels ``ExponentialSmoothing``) and on sparse series seasonal TSB
   (:class:`~gpupool.forecast.baselines.TSBForecaster` on the daily period: per hour of the day,
   the smoothed chance of any demand times its smoothed size).
3. **Validation.** ``n_origins`` forecast origins ``stride`` hours apart (a sparse series: up to
   ``sparse_origins``, as its history allows, so that a daily on/off pattern is seen on enough
   days to tell seasonal naive from a level), the last one ``horizon``
   hours before the end of the history, each forecasting ``horizon`` hours inside the history.
   The models are estimated once, on the history before the first origin, and *filtered* (same
   coefficients, no re-estimation) to each later origin, so validation costs one estimation per
   candidate. Every candidate's validation MAE is recorded.
4. **Choice.** The candidate with the lowest validation MAE, or (regular series) the inverse-MAE
   weighted mean of the best ``combine`` candidates when that mean did better on the same
   origins. A sparse series falls back to the better of seasonal naive and naive unless another
   model (or the mean) validates ``step_margin`` better than it. A chosen ARIMA's coefficients
   are then re-estimated on the whole history with the validated orders (``refit``).
5. **Intervals.** The chosen model's own standard errors (ARIMA's from its MA(inf) weights, the
   baselines' from their in-sample errors, Holt-Winters' from its smoothing weights), rescaled
   so that on the validation origins they would have covered ``level`` percent of the errors
   (``calibrate="widen"``, the default, only widens; the scale is bounded by 3). A series whose
   validation errors were all zero keeps its model's own intervals.

Everything is recorded in ``summary_``: the profile, the origins, every candidate's validation
MAE, the choice and its reason, the interval scale; the ARIMA procedure's own record (orders,
tests, criterion values) stays at the top level so the pipeline can warm-start from it.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import numpy as np
import pandas as pd

from gpupool.forecast import _arma
from gpupool.forecast._series import candidate_periods, forecast_frame, regularize, z_value
from gpupool.forecast.arima import ArimaForecaster, estimated_within, jsonable
from gpupool.forecast.baselines import tsb_filter

CANDIDATES = ("arima", "seasonal_naive", "naive", "ets", "tsb")
#: the simple baselines a sparse series falls back to (see ``sparse_share``)
BASELINES = ("seasonal_naive", "naive")


def profile_series(values: np.ndarray, recent: int | None = None) -> dict[str, Any]:
    """Classify a series by how it moves: ``constant``, ``intermittent`` (at least half of the
    points zero), ``step`` (at least 80% of the hours equal the hour before) or ``regular``.
    ``recent`` restricts the profile to the last ``recent`` points."""
    v = np.asarray(values, dtype=float)
    if recent:
        v = v[-int(recent):]
    scale = max(float(np.max(np.abs(v))) if len(v) else 0.0, 1.0)
    diffs = np.abs(np.diff(v))
    flat_share = float(np.mean(diffs <= 1e-9 * scale)) if len(diffs) else 1.0
    zero_share = float(np.mean(v == 0)) if len(v) else 1.0
    moving = diffs[diffs > 1e-9 * scale]
    if len(v) == 0 or np.ptp(v) == 0:
        kind = "constant"
    elif zero_share >= 0.5:
        kind = "intermittent"
    elif flat_share >= 0.8:
        kind = "step"
    else:
        kind = "regular"
    return {
        "kind": kind,
        "flat_share": round(flat_share, 4),
        "zero_share": round(zero_share, 4),
        "steps": int(len(moving)),
        "median_step": float(np.median(moving)) if len(moving) else 0.0,
        "points": int(len(v)),
    }


class AutoForecaster:
    """Forecast one demand series with the candidate its own history validates best.

    Parameters
    ----------
    horizon:
        Steps each validation origin forecasts (the production horizon); :meth:`predict` may ask
        for any horizon.
    level, season, lower_bound, upper_bound, orders:
        As :class:`ArimaForecaster` (``orders`` warm-starts its order search).
    n_origins, stride:
        Validation origins and their spacing in steps.
    combine:
        Weighted mean of the best ``combine`` candidates when it validates better (1: never).
    step_margin:
        On step-like and intermittent series, a candidate replaces the last value only when its
        validation MAE is below ``(1 - step_margin)`` times the last value's.
    sparse_share, sparse_origins, tsb_alpha:
        A *sparse* series is one with zero demand in at least ``sparse_share`` of the points of
        its last four weeks (None: no series is). A sparse series is validated on up to
        ``sparse_origins`` origins (as many as its history allows, never fewer than
        ``n_origins``): one week of origins cannot tell an on/off daily pattern's seasonal naive
        from a level. It also gets the seasonal TSB candidate ("tsb", :class:`TSBForecaster` on
        the daily period, both smoothing weights ``tsb_alpha``), and any model other than the
        simple baselines (seasonal naive, naive) must validate ``step_margin`` better than the
        better of the two, else that baseline is chosen.
    refit:
        How a chosen ARIMA, estimated before the first origin, reaches the end of the history:
        ``"params"`` (default) re-estimates its coefficients with the validated orders, ``"search"``
        re-runs the whole procedure warm-started, ``"none"`` filters it (as the hourly update does).
    arima_window:
        Estimate the ARIMA candidate on at most this many points before the first origin (its
        order search costs grow with the history): ``"4w"`` (default) four weeks of steps, the
        history the pipeline reads; None: all of them.
    ets_init, ets_brute:
        statsmodels' ``initialization_method`` of the Holt-Winters candidate, and whether its fit
        starts from a brute-force grid of smoothing parameters (``use_brute``).
    keep_orders_for:
        Re-estimate at most this often: a warm start (``orders``) whose ARIMA orders were searched
        less than this before the end of the history keeps them (see :class:`ArimaForecaster`),
        and one whose Holt-Winters smoothing parameters were estimated less than this before
        keeps those (its initial states still come from the history at hand). ``None``
        (default): everything is re-estimated on every fit.
    calibrate:
        ``"widen"`` (default): widen the chosen model's intervals when they would have covered
        less than ``level`` on validation; ``"both"``: also narrow them; ``"off"``: keep them.
    arima_params:
        Further keyword arguments of :class:`ArimaForecaster`.
    """

    def __init__(
        self,
        horizon: int = 24,
        level: float = 90,
        season: int | None = None,
        lower_bound: float | None = 0.0,
        upper_bound: float | None = None,
        orders: dict[str, Any] | None = None,
        n_origins: int = 14,
        stride: int = 12,
        combine: int = 2,
        step_margin: float = 0.1,
        sparse_share: float | None = 0.25,
        sparse_origins: int = 28,
        tsb_alpha: float = 0.2,
        calibrate: str = "widen",
        refit: str = "params",
        ets_init: str = "heuristic",
        ets_brute: bool = False,
        arima_window: int | str | None = "4w",
        keep_orders_for: str | pd.Timedelta | None = None,
        **arima_params: Any,
    ):
        if int(horizon) < 1:
            raise ValueError("horizon must be at least 1")
        z_value(level)
        self.horizon = int(horizon)
        self.level = level
        self.season = season
        self.lower_bound = lower_bound
        self.upper_bound = upper_bound
        self.orders = orders
        self.n_origins = int(n_origins)
        self.stride = int(stride)
        self.combine = int(combine)
        self.step_margin = float(step_margin)
        if sparse_share is not None and not 0 < float(sparse_share) <= 1:
            raise ValueError(f"sparse_share must be in (0, 1] or None, got {sparse_share!r}")
        self.sparse_share = None if sparse_share is None else float(sparse_share)
        self.sparse_origins = int(sparse_origins)
        if not 0 < float(tsb_alpha) <= 1:
            raise ValueError(f"tsb_alpha must be in (0, 1], got {tsb_alpha!r}")
        self.tsb_alpha = float(tsb_alpha)
        if calibrate not in ("off", "widen", "both"):
            raise ValueError("calibrate must be 'off', 'widen' or 'both'")
        self.calibrate = calibrate
        if refit not in ("none", "params", "search"):
            raise ValueError("refit must be 'none', 'params' or 'search'")
        self.refit = refit
        self.ets_init = ets_init
        self.ets_brute = bool(ets_brute)
        if arima_window not in (None, "4w") and not (isinstance(arima_window, int) and arima_window > 0):
            raise ValueError("arima_window must be a positive number of points, '4w' or None")
        self.arima_window = arima_window
        self.keep_orders_for = None if keep_orders_for is None else pd.Timedelta(keep_orders_for)
        self.arima_params = arima_params

    # ------------------------------------------------------------------ public interface

    def fit(self, y: pd.Series) -> "AutoForecaster":
        """Profile, validate the candidates and keep the choice (``y`` is not modified)."""
        self.series_ = regularize(y)
        v = self.series_.values
        n = len(v)
        periods = candidate_periods(self.series_.step, self.season)
        self.m_ = periods[0] if periods else 1
        H = self.horizon
        profile = profile_series(v, recent=7 * max(self.m_, 24) if self.m_ > 1 else None)
        if profile["kind"] == "constant" and np.ptp(v) > 0:
            profile["kind"] = "step"  # flat for the last week, moved before: a step series at rest
        window = self._window_points()
        profile["history_zero_share"] = round(float(np.mean(v[-window:] == 0)) if window else float(np.mean(v == 0)), 4)
        sparse = self.sparse_share is not None and profile["history_zero_share"] >= self.sparse_share
        profile["sparse"] = bool(sparse)
        self.profile_ = profile
        # Too little history before the first origin to estimate anything: the ARIMA procedure
        # alone (it has its own fallbacks for short and degenerate series).
        min_first = max(2 * self.m_ + 8, 48) if self.m_ > 1 else 48
        n_origins = self.n_origins
        if sparse and self.sparse_origins > n_origins:  # as many as the history allows
            n_origins = max(n_origins, min(self.sparse_origins, (n - H - min_first) // self.stride + 1))
        first = n - H - (n_origins - 1) * self.stride
        if first < min_first or profile["kind"] == "constant":
            arima_full = self._arima(self.orders).fit(y)
            reason = ("constant series" if profile["kind"] == "constant"
                      else f"history of {n} points too short to validate {n_origins} origins of {H} steps")
            self._choose_single("arima", arima_full, reason, {})
            return self

        origins = [first + k * self.stride for k in range(n_origins)]
        truth = np.stack([v[o:o + H] for o in origins])
        names = ["arima", "seasonal_naive", "naive"]
        if profile["kind"] == "regular" and n >= 2 * self.m_ + 10:
            names.append("ets")
        if sparse and self.m_ > 1:
            names.append("tsb")
        fits: dict[str, Any] = {}
        val_mean: dict[str, np.ndarray] = {}
        val_se: dict[str, np.ndarray] = {}
        errors: dict[str, str] = {}
        for name in names:
            try:
                fit = self._fit_candidate(name, v, first)
                if name == "ets":  # one pass of the recursions for every origin
                    states = _hw_filter_states(fit, v[: origins[-1]], origins)[1]
                    means, ses = zip(*(_holt_winters_forecast(fit, None, H, state=st) for st in states))
                else:
                    means, ses = zip(*(self._candidate_forecast(name, fit, v[:o], o, H) for o in origins))
                mean, se = np.stack(means), np.stack(ses)
                if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(se))):
                    raise FloatingPointError("non-finite validation forecast")
            except Exception as exc:  # noqa: BLE001 - a candidate that fails is recorded and skipped
                errors[name] = f"{type(exc).__name__}: {exc}"
                continue
            fits[name] = fit
            val_mean[name], val_se[name] = mean, se
        mae = {k: float(np.mean(np.abs(val_mean[k] - truth))) for k in val_mean}
        self.validation_ = {"origins": origins, "truth": truth, "mean": val_mean, "se": val_se, "mae": mae}
        if not mae:
            arima_full = self._arima(self.orders).fit(y)
            self._choose_single("arima", arima_full, "every candidate failed on validation", errors)
            return self
        chosen, weights, reason = self._choose(mae, val_mean, truth, profile)
        self._finish(y, v, chosen, weights, fits, reason, errors)
        return self

    def predict(self, h: int | None = None, level: float | None = None) -> pd.DataFrame:
        """Forecast ``h`` steps (default: the validated horizon): ``ts, yhat, yhat_lower, yhat_upper``."""
        if not hasattr(self, "summary_"):
            raise RuntimeError("AutoForecaster is not fitted")
        h = self.horizon if h is None else int(h)
        if h < 1:
            raise ValueError("h must be at least 1")
        level = self.level if level is None else level
        if self.single_ is not None:
            frame = self.single_.predict(h, level)
            self.summary_["clipped"] = bool(frame.attrs.get("clipped", False))
            return frame
        v = self.series_.values
        n = len(v)
        mean, se = np.zeros(h), np.zeros(h)
        for name, w in self.weights_.items():
            mu, s = self._candidate_forecast(name, self.final_[name], v, n, h)
            mean += w * mu
            se += w * s
        se = se * self.scale_
        if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(se))):
            mean = v[n - self.m_ + np.arange(h) % self.m_] if n >= self.m_ else np.full(h, v[-1])
            se = np.zeros(h)
            self.summary_["fallback"] = "non-finite forecast: seasonal naive"
        frame, clipped = forecast_frame(self.series_.future_index(h), mean, se, level,
                                        self.lower_bound, self.upper_bound)
        self.summary_["clipped"] = clipped
        return frame

    def _choose(self, mae: dict[str, float], val_mean: dict[str, np.ndarray], truth: np.ndarray,
                profile: dict[str, Any]) -> tuple[list[str], dict[str, float], str]:
        """The models to forecast with, their weights and why, from the validation MAEs (``mae``
        gains the combination's when one was tried).

        Lowest validation MAE, ARIMA first on ties. A step-like or intermittent series keeps the
        last value, and a sparse one the better of seasonal naive and the last value, unless
        another model validates ``step_margin`` better than that baseline."""
        order = {k: i for i, k in enumerate(CANDIDATES)}
        ranked = sorted(mae, key=lambda k: (round(mae[k], 12), order[k]))
        best = ranked[0]
        reason = f"lowest validation MAE ({mae[best]:.4g})"
        ref = None
        if profile.get("sparse"):
            ref = min((k for k in BASELINES if k in mae), key=lambda k: (mae[k], order[k]), default=None)
            why = (f"sparse series (zero in {100 * profile['history_zero_share']:.0f}% of its recent points): "
                   f"{ref} is kept unless another model validates {100 * self.step_margin:.0f}% better")
        elif profile["kind"] in ("step", "intermittent") and "naive" in mae:
            ref = "naive"
            why = (f"{profile['kind']} series: the last value is kept unless another model validates "
                   f"{100 * self.step_margin:.0f}% better")
        exempt = (ref, *BASELINES) if profile.get("sparse") else (ref,)
        if ref is not None and best not in exempt and not mae[best] < (1 - self.step_margin) * mae[ref]:
            best, reason = ref, why
        chosen, weights = [best], {best: 1.0}
        # a weighted mean would smooth a step into a ramp: step-like series take one model
        if self.combine > 1 and best == ranked[0] and len(ranked) > 1 and profile["kind"] == "regular":
            top = ranked[: self.combine]
            inv = np.array([1.0 / max(mae[k], 1e-12) for k in top])
            w = inv / inv.sum()
            comb = sum(wi * val_mean[k] for wi, k in zip(w, top))
            comb_mae = float(np.mean(np.abs(comb - truth)))
            mae["combination"] = comb_mae
            if comb_mae < mae[best] and (ref is None or comb_mae < (1 - self.step_margin) * mae[ref]):
                chosen, weights = top, {k: float(wi) for k, wi in zip(top, w)}
                reason = f"weighted mean of {', '.join(top)} validated best ({comb_mae:.4g})"
        return chosen, weights, reason

    # ------------------------------------------------------------------ candidates

    def _window_points(self) -> int | None:
        """Four weeks of steps, when a day is a whole number of them (else None)."""
        per_day = pd.Timedelta("1D") / self.series_.step
        return int(round(28 * per_day)) if per_day >= 1 and float(per_day).is_integer() else None

    def _arima(self, orders: dict[str, Any] | None) -> ArimaForecaster:
        return ArimaForecaster(level=self.level, season=self.season, lower_bound=self.lower_bound,
                               upper_bound=self.upper_bound, orders=orders, keep_orders_for=self.keep_orders_for,
                               **self.arima_params)

    def _fit_candidate(self, name: str, v: np.ndarray, end: int) -> Any:
        """Estimate ``name`` on ``v[:end]``; what :meth:`_candidate_forecast` needs to filter on."""
        if name == "arima":
            # at most ``arima_window`` points: the search's cost grows with the history
            window = self.arima_window
            if window == "4w":  # four weeks of steps, the pipeline's history; all when not whole
                window = self._window_points()
            lo = max(0, end - window) if window else 0
            model = self._arima(self.orders).fit(pd.Series(v[lo:end], index=self.series_.index[lo:end]))
            model.offset_ = lo
            return model
        if name == "ets":
            through = self.series_.index[end] if end < len(v) else self.series_.future_index(1)[0]
            kept = self._fresh_ets(through)
            hw = _fit_holt_winters(v[:end], self.m_, self.ets_init, self.ets_brute,
                                   params=kept["params"] if kept else None)
            hw.estimated_through = kept["estimated_through"] if hw.kept else through.isoformat()
            return hw
        return None  # the baselines have nothing to estimate

    def _candidate_forecast(self, name: str, fit: Any, hist: np.ndarray, n: int, h: int) -> tuple[np.ndarray, np.ndarray]:
        """Mean and standard error of ``h`` steps after ``hist`` (``n`` points) under ``fit``."""
        if name == "arima":
            model: ArimaForecaster = fit
            if model.fallback_ is not None:
                # the procedure fell back to a baseline: score that baseline
                kind = model.summary_["model"]
                return _baseline(hist, h, self.m_ if kind == "seasonal_naive" else None, mean=kind == "mean")
            lo = getattr(model, "offset_", 0)
            return _arma.forecast(model.fit_, hist[lo:], model._exog(0, n - lo), model._exog(n - lo, h), h)
        if name == "seasonal_naive":
            return _baseline(hist, h, self.m_ if len(hist) > self.m_ else None)
        if name == "naive":
            return _baseline(hist, h, None)
        if name == "ets":
            return _holt_winters_forecast(fit, hist, h)
        if name == "tsb":
            prob, size, sigma = tsb_filter(hist, self.tsb_alpha, self.tsb_alpha, self.m_ if len(hist) >= 2 * self.m_ else 1)
            phase = np.arange(h) % len(prob)
            return prob[phase] * size[phase], sigma[phase]
        raise ValueError(f"unknown candidate {name}")

    def _fresh_ets(self, through: pd.Timestamp) -> dict | None:
        """The warm start's Holt-Winters record when its parameters were estimated less than
        ``keep_orders_for`` before ``through`` (the end of the points it is fitted on), else None."""
        warm = (self.orders or {}).get("ets") if isinstance(self.orders, dict) else None
        if not isinstance(warm, dict) or not estimated_within(warm.get("estimated_through"), through,
                                                               self.keep_orders_for):
            return None
        try:
            params = {k: float(warm[k]) for k in ("alpha", "beta", "gamma", "phi")}
        except (KeyError, TypeError, ValueError):  # a record without readable parameters
            return None
        return {"params": {**params, "seasonal": bool(warm.get("seasonal"))},
                "estimated_through": warm["estimated_through"]}

    # ------------------------------------------------------------------ choice and record

    def _finish(self, y, v, chosen, weights, fits, reason, errors) -> None:
        val = self.validation_
        final: dict[str, Any] = {}
        arima_summary: dict[str, Any] = {}
        for name in chosen:
            final[name] = fits.get(name)
            if name == "arima" and self.refit != "none":
                final[name] = self._refit_arima(fits["arima"], y, v)
        if "arima" in fits:
            src = final.get("arima", fits["arima"])
            arima_summary = dict(src.summary_)
        self.final_ = final
        self.weights_ = weights
        self.single_ = None
        # interval scale from validation: the level-quantile of |error| / se of the chosen forecast
        truth = val["truth"]
        mean = sum(w * val["mean"][k] for k, w in weights.items())
        se = sum(w * val["se"][k] for k, w in weights.items())
        err = np.abs(mean - truth)
        z = z_value(self.level)
        scale, how = 1.0, "model's own"
        usable = se > 1e-12
        if self.calibrate != "off" and np.any(err > 0) and usable.sum() >= 10:
            q = float(np.quantile(err[usable] / se[usable], self.level / 100.0))
            scale = float(np.clip(q / z, 1.0 if self.calibrate == "widen" else 1 / 3, 3.0))
            how = "model's own, rescaled to the validation coverage"
        self.scale_ = scale
        inside = float(np.mean(err <= z * se * scale + 1e-12))
        model_name = chosen[0] if len(chosen) == 1 else "combination"
        ets = fits.get("ets")
        ets_summary = {"ets": {"alpha": ets.alpha, "beta": ets.beta, "gamma": ets.gamma, "phi": ets.phi,
                               "seasonal": ets.m > 1, "estimated_through": ets.estimated_through,
                               "kept": ets.kept}} if ets is not None else {}
        self.summary_ = jsonable({
            **arima_summary,
            **ets_summary,
            "model": model_name,
            "selection": {
                "chosen": chosen,
                "weights": weights,
                "reason": reason,
                "profile": self.profile_,
                "horizon": self.horizon,
                "origins": [self.series_.index[o].isoformat() for o in val["origins"]],
                "validation_mae": val["mae"],
                "failed": errors,
                "interval": {"method": how, "scale": scale, "validation_coverage": inside},
            },
            "level": self.level,
            "clipped": False,
        })

    def _refit_arima(self, first: ArimaForecaster, y: pd.Series, v: np.ndarray) -> ArimaForecaster:
        """The validated ARIMA brought to the whole history: its coefficients re-estimated with the
        validated orders (``"params"``) or the whole procedure re-run warm-started (``"search"``).
        The validated fit, filtered to the end, is kept when re-estimation fails."""
        if first.fallback_ is not None:
            return first
        if self.refit == "search":
            model = self._arima(first.summary_).fit(y)
            return first if model.fallback_ is not None else model
        spec = first.fit_.spec
        try:
            lo = getattr(first, "offset_", 0)
            fit = _arma.fit_css(spec, v[lo:], first._exog(0, len(v) - lo), start=first.fit_.raw_params,
                                maxiter=first.maxiter, condition=max(spec.p, first._condition))
        except (ValueError, FloatingPointError, np.linalg.LinAlgError):
            return first
        if not fit.converged:
            return first
        model = copy.copy(first)
        model.fit_ = fit
        model.summary_ = {**first.summary_, "sigma2": fit.sigma2, "refit": "coefficients on the whole history",
                          "coefficients": {"ar": fit.ar.tolist(), "ma": fit.ma.tolist(), "sma": fit.sma.tolist(),
                                           "mean_of_differenced": fit.mu, "fourier": fit.beta.tolist()}}
        return model

    def _choose_single(self, name: str, model: ArimaForecaster, reason: str, errors: dict) -> None:
        self.single_ = model
        self.final_, self.weights_, self.scale_ = {name: model}, {name: 1.0}, 1.0
        self.summary_ = jsonable({
            **model.summary_,
            "selection": {"chosen": [name], "weights": {name: 1.0}, "reason": reason, "profile": self.profile_,
                          "horizon": self.horizon, "origins": [], "validation_mae": {}, "failed": errors,
                          "interval": {"method": "model's own", "scale": 1.0}},
        })


# ---------------------------------------------------------------------- the candidates' numerics


def _baseline(hist: np.ndarray, h: int, m: int | None, mean: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Seasonal naive (``m``), naive (``m`` None) or the mean, with their in-sample errors."""
    steps = np.arange(h)
    if mean:
        sd = float(np.std(hist, ddof=1)) if len(hist) > 1 else 0.0
        return np.full(h, float(np.mean(hist))), np.full(h, sd)
    m = m if m and len(hist) > m else 1
    diffs = hist[m:] - hist[:-m]
    sigma = float(np.sqrt(np.mean(diffs**2))) if len(diffs) else 0.0
    mu = hist[len(hist) - m + steps % m]
    return mu, sigma * np.sqrt(steps // m + 1)


class _HoltWinters:
    __slots__ = ("alpha", "beta", "gamma", "phi", "m", "l0", "b0", "s0", "sigma", "estimated_through", "kept")

    def __init__(self, alpha, beta, gamma, phi, m, l0, b0, s0, sigma):
        self.alpha, self.beta, self.gamma, self.phi = alpha, beta, gamma, phi
        self.m, self.l0, self.b0, self.s0, self.sigma = m, l0, b0, s0, sigma
        self.estimated_through, self.kept = None, False


def _fit_holt_winters(x: np.ndarray, m: int, init: str = "heuristic", brute: bool = False,
                      params: dict | None = None) -> _HoltWinters:
    """Additive Holt-Winters with a damped trend (seasonal when ``m > 1``), estimated by statsmodels.

    ``params`` (``alpha``, ``beta``, ``gamma``, ``phi``, ``seasonal``): smoothing parameters kept
    from an earlier estimate (only the initial states are computed); ignored when the model's
    seasonality is not the same as theirs."""
    from statsmodels.tsa.holtwinters import ExponentialSmoothing

    seasonal = "add" if m > 1 and len(x) >= 2 * m + 10 else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = ExponentialSmoothing(x, trend="add", damped_trend=True, seasonal=seasonal,
                                     seasonal_periods=m if seasonal else None, initialization_method=init)
        if params is not None and bool(params.get("seasonal")) == bool(seasonal):
            fixed = {"smoothing_level": params["alpha"], "smoothing_trend": params["beta"],
                     "damping_trend": params["phi"]}
            if seasonal:
                fixed["smoothing_seasonal"] = params["gamma"]
            res = model.fit(optimized=False, **fixed)
            kept = True
        else:
            res = model.fit(use_brute=brute)
            kept = False
    p = res.params
    s0 = np.asarray(p["initial_seasons"], float) if seasonal else np.zeros(0)
    hw = _HoltWinters(float(p["smoothing_level"]), float(p["smoothing_trend"]),
                      float(p["smoothing_seasonal"]) if seasonal else 0.0, float(p["damping_trend"]),
                      m if seasonal else 1, float(p["initial_level"]), float(p["initial_trend"]), s0, 0.0)
    _, _, _, resid = _hw_filter(hw, x)
    hw.sigma = float(np.sqrt(np.mean(resid**2))) if len(resid) else 0.0
    hw.kept = kept
    return hw


def _hw_filter(hw: _HoltWinters, x: np.ndarray) -> tuple[float, float, np.ndarray, np.ndarray]:
    """Run the smoothing recursions over ``x``: final level, trend, last season and one-step errors."""
    return _hw_filter_states(hw, x)[0]


def _hw_filter_states(hw: _HoltWinters, x: np.ndarray, stops: list[int] = ()) -> tuple[tuple, list[tuple]]:
    """:func:`_hw_filter` over ``x``, and the state ``(level, trend, season)`` after each of the
    first ``stops`` points (what ``_hw_filter(hw, x[:stop])`` ends in: one pass for every origin)."""
    a, b_, g, phi, m = hw.alpha, hw.beta, hw.gamma, hw.phi, hw.m
    level, trend = hw.l0, hw.b0
    seasonal = len(hw.s0) > 0
    season = list(hw.s0) if seasonal else [0.0]
    resid = np.empty(len(x))
    wanted = {int(k) for k in stops}
    states: dict[int, tuple] = {}

    def state():
        return level, trend, np.asarray(season[-m:] if seasonal else [])

    if 0 in wanted:
        states[0] = state()
    for t, value in enumerate(x.tolist()):
        s = season[-m] if seasonal else 0.0
        fitted = level + phi * trend + s
        resid[t] = value - fitted
        new_level = a * (value - s) + (1 - a) * (level + phi * trend)
        trend = b_ * (new_level - level) + (1 - b_) * phi * trend
        if seasonal:
            season.append(g * (value - fitted + s) + (1 - g) * s)
        level = new_level
        if t + 1 in wanted:
            states[t + 1] = state()
    return (*state(), resid), [states[int(o)] for o in stops]


def _holt_winters_forecast(hw: _HoltWinters, hist: np.ndarray | None, h: int,
                           state: tuple | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Mean and standard error of ``h`` steps after ``hist`` (or after the filtered ``state``)."""
    level, trend, season = state if state is not None else _hw_filter(hw, hist)[:3]
    k = np.arange(1, h + 1)
    phi = hw.phi
    damp = np.cumsum(phi ** k)  # phi + phi^2 + ... + phi^k
    mean = level + damp * trend
    if len(season):
        mean = mean + season[(k - 1) % hw.m]
    # ETS(A,Ad,A) variance: sigma^2 (1 + sum_{j<k} c_j^2), c_j = alpha (1 + beta (phi + .. + phi^j)) + gamma [j % m == 0]
    j = np.arange(1, h)
    c = hw.alpha * (1 + hw.beta * np.cumsum(phi ** j)) if h > 1 else np.zeros(0)
    if len(season) and h > 1:
        c = c + hw.gamma * (j % hw.m == 0)
    var = 1 + np.concatenate([[0.0], np.cumsum(c**2)])
    return mean, hw.sigma * np.sqrt(var)


__all__ = ["AutoForecaster", "profile_series", "CANDIDATES", "BASELINES"]
