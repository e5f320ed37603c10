"""Demand forecasting: the ARIMA procedure of the design and the baselines it is measured against.

``AutoForecaster`` (the model chosen per series by validation inside its history; what the CLI
and the pipeline run), ``ArimaForecaster`` (fit / predict / update, summary_), ``SeasonalNaiveForecaster``,
``MeanForecaster``, ``NaiveForecaster``; ``forecast_csv`` is the ``gpupool forecast`` CLI contract
and ``forecast_long`` forecasts a long ``(series_id, ts, y)`` frame.
"""

from gpupool.forecast.arima import ArimaForecaster
from gpupool.forecast.baselines import MeanForecaster, NaiveForecaster, SeasonalNaiveForecaster
from gpupool.forecast.io import forecast_csv, forecast_long
from gpupool.forecast.select import AutoForecaster

__all__ = [
    "ArimaForecaster",
    "AutoForecaster",
    "MeanForecaster",
    "NaiveForecaster",
    "SeasonalNaiveForecaster",
    "forecast_csv",
    "forecast_long",
]
