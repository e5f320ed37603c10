"""The forecast stage's model of one platform's demand, called by the forecast task and by the what-if.

``gpupool.pipeline.forecast_demand`` (the DAG task) and ``gpupool.sim.study`` (``gpupool simulate``)
both forecast through :func:`demand_forecast` on :data:`FORECAST_HISTORY` of hourly demand,
warm-started by :func:`warm_start` from the previous run's summary.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import pandas as pd

from gpupool.config import FORECAST_LEVEL  # noqa: F401 - the stage's interval level, defined in config
from gpupool.forecast.select import AutoForecaster

FORECAST_HISTORY = timedelta(days=28)
@dataclass(frozen=True)
class ForecastTuning:
    """The forecast stage's constants chosen on benchmarks, one object: the forecast task and the
    what-if forecast with its defaults, and ``bench/simulate.py --baseline`` passes other values
    in (:func:`gpupool.sim.study.simulate`'s ``forecast_tuning``)."""

    #: the forecast stage searches ARIMA orders (and estimates the Holt-Winters candidate's
    #: smoothing parameters) at most this often: a warm start whose orders were searched within it
    #: keeps them and only re-estimates their coefficients (the search runs again when they no
    #: longer fit or pass their residual check); see `AutoForecaster`'s ``keep_orders_for``.
    #: None: every run searches and estimates everything, as before.
    order_search_every: timedelta | None = timedelta(days=1)


def demand_forecast(history: pd.Series, horizon: int, level: float = FORECAST_LEVEL, warm: dict | None = None,
                    tuning: ForecastTuning = ForecastTuning()) -> tuple[pd.DataFrame, dict]:
    """The forecast stage's model on one platform's hourly demand: ``(frame, summary)``.

    ``frame`` has ``ts, yhat, yhat_lower, yhat_upper`` for the next ``horizon`` hours; ``summary``
    is the fitted model's (orders, fallback, ...), the next run's warm start. ``warm``: the
    summary of a forecast issued within the last day (see :func:`warm_start`); when its ARIMA
    orders were searched less than ``tuning.order_search_every`` (:class:`ForecastTuning`) before
    the history's end they are kept and only their coefficients re-estimated (and the Holt-Winters
    candidate's smoothing parameters kept), so the order search runs about once a day.
    Pure: the pipeline stores both; ``gpupool simulate`` keeps the summary for its next hour.
    """
    # demand includes pending work, so it is bounded below by zero but not above by the
    # platform's capacity: the interval is clipped at zero only. The model is chosen by
    # validation inside the history (forecast.select).
    model = AutoForecaster(horizon=horizon, level=level, lower_bound=0.0, upper_bound=None, orders=warm,
                           keep_orders_for=tuning.order_search_every)
    model.fit(history)
    return model.predict(horizon), dict(model.summary_)


def warm_start(summary: dict | None) -> dict | None:
    """A stored forecast summary as a warm start: none from a fallback (it is no order to start from)."""
    if not isinstance(summary, dict) or summary.get("fallback"):
        return None
    return summary


def one_hour_ahead(history: pd.Series, hours: pd.DatetimeIndex, horizon: int, level: float = FORECAST_LEVEL) -> pd.DataFrame:
    """What the forecast stage would have forecast one hour ahead at each of ``hours``: for each
    hour ``h``, :func:`demand_forecast` on the :data:`FORECAST_HISTORY` of ``history`` (hourly
    demand) before ``h``, warm-started from the hour before's model as the hourly runs are.

    Returns ``ts, yhat, yhat_lower, yhat_upper`` (``ts`` = ``h``, the hour forecast); an hour
    with no history before it is left out.
    """
    rows, summary = [], None
    for h in pd.DatetimeIndex(hours):
        past = history[(history.index < h) & (history.index >= h - FORECAST_HISTORY)]
        if past.notna().sum() == 0:
            continue
        fc, summary = demand_forecast(past, horizon, level, warm_start(summary))
        first = fc.iloc[0]
        rows.append({"ts": h, "yhat": float(first["yhat"]), "yhat_lower": float(first["yhat_lower"]),
                     "yhat_upper": float(first["yhat_upper"])})
    return pd.DataFrame(rows, columns=["ts", "yhat", "yhat_lower", "yhat_upper"])
