"""Reading one time series from a CSV, as the `detect` and `forecast` CLIs take it."""

from __future__ import annotations

from pathlib import Path

import pandas as pd


class SeriesInputError(ValueError):
    """An input file that does not hold a usable time series."""


def read_series_csv(path: str | Path, time_col: str | None = None, value_col: str | None = None) -> pd.Series:
    """Read a CSV into a float Series indexed by timestamp, in file order.

    By default the time column is the first column that parses as datetimes and the
    value column the first numeric column after it; other columns are ignored.
    Unparseable values become NaN (a gap), never zero. Row order and duplicates are kept
    as in the file; the caller decides what to do with them.
    """
    path = Path(path)
    try:
        raw = pd.read_csv(path)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise SeriesInputError(f"{path}: cannot read CSV ({exc})") from exc
    if raw.empty:
        raise SeriesInputError(f"{path}: no rows")
    cols = list(raw.columns)
    if time_col is None:
        for col in cols:
            parsed = _parse_times(raw[col])
            if parsed is not None:
                time_col = col
                break
        if time_col is None:
            raise SeriesInputError(f"{path}: no column parses as datetimes; pass --time-col")
    elif time_col not in cols:
        raise SeriesInputError(f"{path}: time column {time_col!r} not in {cols}")
    times = _parse_times(raw[time_col])
    if times is None:
        raise SeriesInputError(f"{path}: column {time_col!r} does not parse as datetimes")
    if value_col is None:
        after = cols[cols.index(time_col) + 1 :]
        for col in after:
            if pd.to_numeric(raw[col], errors="coerce").notna().mean() > 0.5:
                value_col = col
                break
        if value_col is None:
            raise SeriesInputError(f"{path}: no numeric column after {time_col!r}; pass --value-col")
    elif value_col not in cols:
        raise SeriesInputError(f"{path}: value column {value_col!r} not in {cols}")
    values = pd.to_numeric(raw[value_col], errors="coerce").astype("float64")
    series = pd.Series(values.to_numpy(), index=pd.DatetimeIndex(times, name="timestamp"), name=value_col)
    return series


def _parse_times(col: pd.Series) -> pd.DatetimeIndex | None:
    if pd.api.types.is_numeric_dtype(col):
        return None
    try:
        parsed = pd.to_datetime(col, errors="coerce", format="mixed")
    except (ValueError, TypeError):
        return None
    if parsed.notna().mean() < 0.9:
        return None
    return pd.DatetimeIndex(parsed)
