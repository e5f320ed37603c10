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
