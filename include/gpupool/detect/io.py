"""The `gpupool detect` CLI contract, as a function the CLI (and other tools) call.

    gpupool detect INPUT.csv --out OUT.csv [--time-col NAME] [--value-col NAME]
                   [--detector auto|sr|svr|prophet]

OUT has one row per input row, in input order, with the columns
`timestamp,value,expected,score,is_anomaly,detector,clean_value`. Judging a point uses only
the points before it; the first part of the series is history only (see
`detect_and_clean`), so its rows carry no expected value or score and are never flagged.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from gpupool.detect.clean import detect_and_clean
from gpupool.detect.router import RouterConfig
from gpupool.tsio import atomic_output, check_output, read_series_csv

CLI_COLUMNS = ["timestamp", "value", "expected", "score", "is_anomaly", "detector", "clean_value"]
DETECTOR_CHOICES = ("auto", "sr", "svr", "prophet")


def detect_csv(
    input: str | Path,
    out: str | Path,
    time_col: str | None = None,
    value_col: str | None = None,
    detector: str = "auto",
    config: RouterConfig | None = None,
) -> dict:
    """Read INPUT.csv, detect and clean its series, write OUT.csv; returns a summary dict.

    The summary holds input, out, rows, judged (rows with a score), anomalies, filled,
    detector, reason and value_col. Raises `gpupool.tsio.SeriesInputError` on unusable
    input, `gpupool.errors.UsageError` when OUT is INPUT (by any name) or its directory does
    not exist, and ValueError on an unknown detector. OUT is replaced in one step, never left
    half-written.
    """
    if detector not in DETECTOR_CHOICES:
        raise ValueError(f"unknown detector {detector!r}; expected one of {', '.join(DETECTOR_CHOICES)}")
    out = check_output(out, {"input": input})
    y = read_series_csv(input, time_col=time_col, value_col=value_col)
    cfg = config or RouterConfig()
    frame = detect_and_clean(y, detector=detector, config=cfg)
    table = pd.DataFrame(
        {
            "timestamp": pd.DatetimeIndex(y.index).strftime("%Y-%m-%dT%H:%M:%S%z").str.replace(
                r"(\d\d)(\d\d)$", r"\1:\2", regex=True
            ),
            "value": frame["value"].to_numpy(),
            "expected": frame["expected"].to_numpy(),
            "score": frame["score"].to_numpy(),
            "is_anomaly": frame["is_anomaly"].to_numpy(),
            "detector": frame["detector"].to_numpy(),
            "clean_value": frame["clean_value"].to_numpy(),
        }
    )
    with atomic_output(out) as tmp:
        table.to_csv(tmp, index=False, columns=CLI_COLUMNS)
    name = str(frame["detector"].iloc[0]) if len(frame) else detector
    return {
        "input": str(input),
        "out": str(out),
        "rows": int(len(frame)),
        "judged": int(frame["score"].notna().sum()),
        "anomalies": int(frame["is_anomaly"].sum()),
        "filled": int(frame["filled"].sum()),
        "detector": name,
        "reason": frame.attrs.get("reason", ""),
        "value_col": str(y.name),
    }
