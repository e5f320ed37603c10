"""Demand forecasting: the ARIMA procedure of the design and the baselines it is measured against.

``ArimaForecaster`` (fit / predict / update, summary_), ``SeasonalNaiveForecaster``,
``MeanForecaster``, ``NaiveForecaster``; ``forecast_csv`` is the ``gpupool forecast`` CLI contract
and ``forecast_long`` forecasts a long ``(series_id, ts, y)`` frame.
"""

from gpupool.forecast.arima import ArimaForecaster
from gpupool.forecast.baselines import MeanForecaster, NaiveForecaster, SeasonalNaiveForecaster
from gpupool.forecast.io import forecast_csv, forecast_long

__all__ = [
    "ArimaForecaster",
    "MeanForecaster",
    "NaiveForecaster",
    "SeasonalNaiveForecaster",
    "forecast_csv",
    "forecast_long",
]
