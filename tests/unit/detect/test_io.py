"""detect_csv: the `gpupool detect` contract other tools rely on."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from gpupool.detect.io import CLI_COLUMNS, detect_csv
from gpupool.tsio import SeriesInputError


@pytest.fixture
def csv_in(tmp_path, spiky):
    y, _ = spiky
    raw = pd.DataFrame(
        {
            "host": "node-1",
            "ts": y.index.strftime("%Y-%m-%d %H:%M:%S"),
            "gpu_util": y.to_numpy().round(4).astype(object),
            "other": 1.0,
        }
    )
    raw.loc[50, "gpu_util"] = "n/a"  # unparseable value: a gap, never zero
    path = tmp_path / "in.csv"
    raw.to_csv(path, index=False)
    return path, raw


def test_contract_columns_and_one_row_per_input_row(tmp_path, csv_in, spiky):
    path, raw = csv_in
    out = tmp_path / "out.csv"
    summary = detect_csv(path, out)
    table = pd.read_csv(out)
    assert list(table.columns) == CLI_COLUMNS
    assert len(table) == len(raw) == summary["rows"]
    assert summary["value_col"] == "gpu_util"
    # routing is re-decided at every refit; the summary names the newest model's detector
    assert table["detector"].dropna().iloc[-1] == summary["detector"]
    assert table["detector"].isna().sum() < 0.1 * len(table)  # only the first hours lack a model
    assert np.isnan(table["value"].iloc[50])
    _, where = spiky
    assert set(where) <= set(np.flatnonzero(table["is_anomaly"].to_numpy()))
    assert summary["anomalies"] == int(table["is_anomaly"].sum())
    assert pd.to_datetime(table["timestamp"]).equals(pd.to_datetime(raw["ts"]))


def test_named_columns_and_forced_detector(tmp_path, csv_in):
    path, raw = csv_in
    out = tmp_path / "out.csv"
    summary = detect_csv(path, out, time_col="ts", value_col="other", detector="sr")
    table = pd.read_csv(out)
    assert summary["detector"] == "sr" and (table["detector"].dropna() == "sr").all()
    assert (table["value"] == 1.0).all() and len(table) == len(raw)


def test_bad_input_and_bad_detector(tmp_path, csv_in):
    path, _ = csv_in
    with pytest.raises(ValueError):
        detect_csv(path, tmp_path / "o.csv", detector="lstm")
    with pytest.raises(SeriesInputError):
        detect_csv(path, tmp_path / "o.csv", value_col="missing")


# ---------------------------------------------------------------- the reader's refusals and options

from gpupool.detect.io import detect_csv as _detect  # noqa: E402
from gpupool.forecast.io import forecast_csv  # noqa: E402
from gpupool.tsio import read_series_csv  # noqa: E402


def _hourly_dayfirst(tmp_path, days=10, sep="."):
    times = pd.date_range("2026-01-01", periods=24 * days, freq="h")
    text = "ts,v\n" + "".join(f"{t:%d}{sep}{t:%m}{sep}{t:%Y %H:%M},{10 + (t.hour % 6)}\n" for t in times)
    path = tmp_path / "dayfirst.csv"
    path.write_text(text)
    return path, times


@pytest.mark.parametrize("sep", [".", "/"])
def test_ambiguous_day_first_dates_are_refused_naming_file_column_and_line(tmp_path, sep):
    path, _ = _hourly_dayfirst(tmp_path, sep=sep)
    with pytest.raises(SeriesInputError) as err:
        forecast_csv(path, 24, tmp_path / "o.csv")
    text = str(err.value)
    assert str(path) in text and "'ts'" in text and "line 2" in text and "--dayfirst" in text
    with pytest.raises(SeriesInputError, match="--dayfirst"):
        _detect(path, tmp_path / "d.csv")


def test_dayfirst_option_reads_day_first_and_counts_nothing_filled(tmp_path):
    path, times = _hourly_dayfirst(tmp_path)
    y = read_series_csv(path, dayfirst=True)
    assert y.index.equals(pd.DatetimeIndex(times, name="timestamp"))
    summary = forecast_csv(path, 24, tmp_path / "o.csv", dayfirst=True)
    assert summary["missing_filled"] == 0
    out = pd.read_csv(tmp_path / "o.csv")
    assert out["timestamp"].iloc[0].startswith("2026-01-11T00:00")
    month_first = read_series_csv(path, dayfirst=False)  # asked for: 05.01 is the 1st of May
    assert month_first.index[4 * 24] == pd.Timestamp("2026-05-01")


def test_year_last_dates_that_parse_only_day_first_are_read_day_first(tmp_path):
    path, times = _hourly_dayfirst(tmp_path, days=14)  # 13.01 and 14.01 have no month-first reading
    assert read_series_csv(path).index.equals(pd.DatetimeIndex(times, name="timestamp"))
    with pytest.raises(SeriesInputError, match=r"line 290, column 'ts': '13\.01\.2026 00:00' is not a timestamp read month-first"):
        read_series_csv(path, time_col="ts", dayfirst=False)


def test_missing_filled_counts_the_interpolated_points(tmp_path):
    times = pd.date_range("2026-01-01", periods=24 * 14, freq="h")
    values = 10 + (times.hour % 6)
    keep = np.ones(len(times), bool)
    keep[[30, 31, 32, 100, 200]] = False
    pd.DataFrame({"ts": times[keep].strftime("%Y-%m-%d %H:%M"), "v": values[keep]}).to_csv(tmp_path / "g.csv", index=False)
    summary = forecast_csv(tmp_path / "g.csv", 24, tmp_path / "o.csv")
    assert summary["missing_filled"] == 5


@pytest.mark.parametrize("bad,what", [("garbage", "'garbage' is not a timestamp"), ("", "the timestamp is empty")])
def test_an_unparseable_timestamp_is_refused_naming_file_and_line(tmp_path, bad, what):
    times = pd.date_range("2026-01-01", periods=48, freq="h").strftime("%Y-%m-%d %H:%M").tolist()
    times[20] = bad
    path = tmp_path / "bad.csv"
    pd.DataFrame({"ts": times, "v": 1.0}).to_csv(path, index=False)
    with pytest.raises(SeriesInputError) as err:
        read_series_csv(path)
    assert f"{path}: line 22, column 'ts': {what}" in str(err.value)
    with pytest.raises(SeriesInputError, match="line 22"):
        _detect(path, tmp_path / "o.csv")


def test_repeated_timestamps_refused_by_default_else_first_last_or_mean(tmp_path):
    times = pd.date_range("2026-03-29", periods=72, freq="h").strftime("%Y-%m-%d %H:%M").tolist()
    values = [float(i) for i in range(72)]
    times.insert(4, times[3])  # the hour a DST change repeats
    values.insert(4, 100.0)
    path = tmp_path / "dst.csv"
    pd.DataFrame({"ts": times, "v": values}).to_csv(path, index=False)
    with pytest.raises(SeriesInputError, match="line 6, .*repeats line 5.*--duplicates"):
        read_series_csv(path)
    at = pd.Timestamp(times[3])
    for policy, expected in (("first", 3.0), ("last", 100.0), ("mean", 51.5)):
        y = read_series_csv(path, duplicates=policy)
        assert y.index.is_unique and len(y) == 72 and y[at] == expected
        assert y.index.is_monotonic_increasing
    out = tmp_path / "o.csv"
    assert _detect(path, out, duplicates="mean")["rows"] == 72
    assert forecast_csv(path, 12, tmp_path / "f.csv", duplicates="last")["horizon"] == 12
    with pytest.raises(SeriesInputError, match="--duplicates"):
        read_series_csv(path, duplicates="median")
