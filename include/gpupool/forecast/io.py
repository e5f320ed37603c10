"""File and frame entry points of the forecaster: the ``gpupool forecast`` CSV contract and the
long-frame form for many series at once."""

from __future__ import annotations

import json
import numbers
from pathlib import Path
from typing import Any

import pandas as pd

from gpupool.errors import UsageError
from gpupool.forecast.arima import jsonable
from gpupool.forecast._series import infer_step
from gpupool.forecast.select import AutoForecaster
from gpupool.tsio import SeriesInputError, atomic_output, check_output, iso_timestamps, read_series_csv

OUTPUT_COLUMNS = ["step", "timestamp", "yhat", "yhat_lower", "yhat_upper"]
#: the most points the input's regular grid (its span over its most common step) may hold: a
#: year of one-minute samples; beyond it the grid alone outgrows memory and the fit takes hours
MAX_GRID_POINTS = 525_600
#: the longest horizon a forecast may ask for, in steps: a year of hours (24 x 366)
MAX_HORIZON = 24 * 366
#: the prediction-interval levels a forecast may ask for, in percent: below 1 % the interval's
#: normal quantile is so near zero that the interval scale divides by it (1e-300 % divided by
#: zero); above 99.9 % the quantile grows without bound and the interval says nothing
MIN_LEVEL, MAX_LEVEL = 1.0, 99.9


def check_horizon_level(horizon: Any, level: Any) -> None:
    """Refuse a horizon outside 1..MAX_HORIZON steps or a level outside MIN_LEVEL..MAX_LEVEL percent."""
    if isinstance(horizon, bool) or not isinstance(horizon, numbers.Integral) or not 1 <= horizon <= MAX_HORIZON:
        raise UsageError(f"--horizon {horizon}: give a whole number of steps from 1 to {MAX_HORIZON}")
    if isinstance(level, bool) or not (isinstance(level, numbers.Real) and MIN_LEVEL <= float(level) <= MAX_LEVEL):
        raise UsageError(f"--level {level}: give a prediction-interval level in percent, "
                         f"from {MIN_LEVEL:g} to {MAX_LEVEL:g}")


def forecast_csv(
    input: str | Path,
    horizon: int,
    out: str | Path,
    level: float = 90,
    season: int | None = None,
    summary_json: str | Path | None = None,
    time_col: str | None = None,
    value_col: str | None = None,
    dayfirst: bool | None = None,
    duplicates: str = "refuse",
) -> dict[str, Any]:
    """Forecast the series in ``input`` and write ``out``; the CLI's ``gpupool forecast``.

    ``input`` has a time column and a value column (``time_col``/``value_col``, else found as
    :func:`gpupool.tsio.read_series_csv` finds them). ``out`` gets the columns ``step,timestamp,yhat,yhat_lower,yhat_upper`` with
    ``step`` = 1..horizon and ``timestamp`` carrying the input's UTC offset (``+00:00`` where the
    input's offsets were mixed and read as UTC; none for naive input). ``season`` is a period
    hint in steps; without it the period is detected.
    The model is chosen per series by validation inside the history (:class:`AutoForecaster`).
    Returns the summary (the choice, every candidate's validation error and the reason under
    ``selection``; the ARIMA procedure's orders, Fourier terms, criterion values, ADF/KPSS/Ljung-Box
    p-values and fallback reason; clipping), also written to ``summary_json`` when given.
    Refuses (:class:`gpupool.errors.UsageError`) a horizon outside 1..:data:`MAX_HORIZON`, a
    level outside :data:`MIN_LEVEL`..:data:`MAX_LEVEL` percent, and an output that is the input
    or that :func:`gpupool.tsio.check_output` refuses (both before the input is read); :class:`gpupool.tsio.SeriesInputError` an input whose grid
    would exceed :data:`MAX_GRID_POINTS` (``dayfirst`` and ``duplicates`` are
    :func:`gpupool.tsio.read_series_csv`'s). ``missing_filled`` counts the grid points
    interpolated over the whole history;
    outputs are replaced in one step, never left half-written, or written through when they
    are special files (:func:`gpupool.tsio.atomic_output`).
    """
    check_horizon_level(horizon, level)
    out = check_output(out, {"input": input})
    if summary_json is not None:
        summary_json = check_output(summary_json, {"input": input, "--out file": out}, option="--summary-json")
    series = read_series_csv(input, time_col=time_col, value_col=value_col, dayfirst=dayfirst, duplicates=duplicates)
    check_grid(input, series.index)
    model = AutoForecaster(horizon=int(horizon), level=level, season=season).fit(series)
    frame = model.predict(int(horizon))
    table = pd.DataFrame(
        {
            "step": range(1, len(frame) + 1),
            "timestamp": iso_timestamps(frame["ts"]),  # the input's UTC offset kept, as detect keeps it
            "yhat": frame["yhat"].to_numpy(),
            "yhat_lower": frame["yhat_lower"].to_numpy(),
            "yhat_upper": frame["yhat_upper"].to_numpy(),
        },
        columns=OUTPUT_COLUMNS,
    )
    with atomic_output(out) as tmp:
        table.to_csv(tmp, index=False)
    # the chosen candidate's own count covers only the window it was fitted on
    summary = jsonable({**model.summary_, "missing_filled": int(model.series_.n_missing),
                        "input": str(input), "horizon": int(horizon)})
    if summary_json is not None:
        with atomic_output(summary_json) as tmp:
            tmp.write_text(json.dumps(summary, indent=2, sort_keys=True, allow_nan=False) + "\n")
    return summary


def check_grid(input: str | Path, index: pd.DatetimeIndex, limit: int = MAX_GRID_POINTS) -> None:
    """Refuse (SeriesInputError, one line naming the step and span) a series whose regular grid,
    its span over its most common step, would hold more than ``limit`` points."""
    step = infer_step(pd.DatetimeIndex(index))
    span = index.max() - index.min()
    points = int(span // step) + 1
    if points > limit:
        raise SeriesInputError(
            f"{input}: the series spans {span} at a most common step of {step}, a grid of {points:,} points; "
            f"at most {limit:,} are forecast: resample the input to a coarser step or cut its span"
        )


def forecast_long(
    frame: pd.DataFrame,
    horizon: int,
    level: float = 90,
    season: int | None = None,
    orders: dict[Any, dict[str, Any]] | None = None,
    **params: Any,
) -> tuple[pd.DataFrame, dict[Any, dict[str, Any]]]:
    """Forecast every series of a long frame ``(series_id, ts, y)``.

    ``orders`` maps a series id to last run's summary (warm start of the ARIMA candidate); other
    keyword arguments go to :class:`AutoForecaster`. Returns the long forecast frame
    ``(series_id, step, ts, yhat, yhat_lower, yhat_upper)`` and the summary of each series.
    The input frame is not modified.
    """
    missing = {"series_id", "ts", "y"} - set(frame.columns)
    if missing:
        raise ValueError(f"frame lacks columns {sorted(missing)}")
    parts, summaries = [], {}
    for sid, group in frame.groupby("series_id", sort=True):
        y = pd.Series(group["y"].to_numpy(dtype=float), index=pd.DatetimeIndex(group["ts"]))
        warm = (orders or {}).get(sid)
        model = AutoForecaster(horizon=int(horizon), level=level, season=season, orders=warm, **params).fit(y)
        fc = model.predict(int(horizon))
        fc.insert(0, "step", range(1, len(fc) + 1))
        fc.insert(0, "series_id", sid)
        parts.append(fc)
        summaries[sid] = jsonable(model.summary_)
    columns = ["series_id", "step", "ts", "yhat", "yhat_lower", "yhat_upper"]
    result = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=columns)
    return result[columns], summaries
