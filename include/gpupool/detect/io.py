"""The `gpupool detect` CLI contract, as a function the CLI (and other tools) call.

    gpupool detect INPUT.csv --out OUT.csv [--time-col NAME] [--value-col NAME]
                   [--detector auto|sr|svr|prophet] [--refit-every 1d]

OUT has one row per input row, in input order, with the columns
`timestamp,value,expected,score,is_anomaly,cleaned,detector,clean_value`. The file is judged
as the pipeline judges a series hour by hour (`stream_detect`): every point on its past
only, by a model refitted every `--refit-every` (default: the pipeline's daily refit) on
the newest history, with routing re-decided at each refit, so `detector` can change along
the file. Rows before the first model (too little history) carry no expected value or
score and are never flagged. `is_anomaly` is an alarm (the point deviates beyond τ; one
per event, at its first point); `cleaned` says `clean_value` replaced the value.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from gpupool.detect.clean import stream_detect
from gpupool.detect.settings import RouterConfig
from gpupool.tsio import SeriesInputError, atomic_output, check_output, read_series_csv

CLI_COLUMNS = ["timestamp", "value", "expected", "score", "is_anomaly", "cleaned", "detector", "clean_value"]
DETECTOR_CHOICES = ("auto", "sr", "svr", "prophet", "zscore")


def detect_csv(
    input: str | Path,
    out: str | Path,
    time_col: str | None = None,
    value_col: str | None = None,
    detector: str = "auto",
    config: RouterConfig | None = None,
    refit_every: str | None = None,
    dayfirst: bool | None = None,
    duplicates: str = "refuse",
) -> dict:
    """Read INPUT.csv, detect and clean its series, write OUT.csv; returns a summary dict.

    The summary holds input, out, rows, judged (rows with a score), anomalies, filled,
    detector, reason and value_col. Raises `gpupool.tsio.SeriesInputError` on unusable
    input or an unreadable `refit_every` (a duration such as "1d", "6h" or "90min"),
    `gpupool.errors.UsageError` when OUT is INPUT (by any name) or an output
    :func:`gpupool.tsio.check_output` refuses (checked before the input is read), and
    ValueError on an unknown detector. ``dayfirst`` and ``duplicates`` are
    :func:`gpupool.tsio.read_series_csv`'s (a repeated timestamp collapsed by ``duplicates``
    gives one output row). OUT is replaced in one step, never left half-written, or written
    through when it is a special file (:func:`gpupool.tsio.atomic_output`).
    """
    if detector not in DETECTOR_CHOICES:
        raise ValueError(f"unknown detector {detector!r}; expected one of {', '.join(DETECTOR_CHOICES)}")
    out = check_output(out, {"input": input})
    y = read_series_csv(input, time_col=time_col, value_col=value_col, dayfirst=dayfirst, duplicates=duplicates)
    cfg = config or RouterConfig()
    if refit_every is not None:
        cfg = cfg.model_copy(update={"refit_every_hours": refit_hours(refit_every)})
    frame = stream_detect(y, cfg, detector=detector)
    table = pd.DataFrame(
        {
            "timestamp": pd.DatetimeIndex(y.index).strftime("%Y-%m-%dT%H:%M:%S%z").str.replace(
                r"(\d\d)(\d\d)$", r"\1:\2", regex=True
            ),
            "value": frame["value"].to_numpy(),
            "expected": frame["expected"].to_numpy(),
            "score": frame["score"].to_numpy(),
            "is_anomaly": frame["is_anomaly"].to_numpy(),
            "cleaned": frame["cleaned"].to_numpy(),
            "detector": frame["detector"].to_numpy(),
            "clean_value": frame["clean_value"].to_numpy(),
        }
    )
    with atomic_output(out) as tmp:
        table.to_csv(tmp, index=False, columns=CLI_COLUMNS)
    judged = frame["detector"][frame["detector"] != ""]
    name = str(judged.iloc[-1]) if len(judged) else detector
    return {
        "input": str(input),
        "out": str(out),
        "rows": int(len(frame)),
        "judged": int(frame["score"].notna().sum()),
        "anomalies": int(frame["is_anomaly"].sum()),
        "cleaned": int(frame["cleaned"].sum()),
        "refits": int(frame.attrs.get("refits", 0)),
        "filled": int(frame["filled"].sum()),
        "detector": name,
        "reason": frame.attrs.get("reason", ""),
        "value_col": str(y.name),
    }


def refit_hours(text: str) -> float:
    """A refit cadence such as "1d", "6h" or "90min" in hours; SeriesInputError (a user error) when unreadable."""
    try:
        td = pd.Timedelta(str(text).strip())
    except (ValueError, TypeError):
        raise SeriesInputError(f"--refit-every {text!r} is not a duration (e.g. 1d, 6h, 90min)") from None
    if pd.isna(td) or td <= pd.Timedelta(0):
        raise SeriesInputError(f"--refit-every {text!r} must be a positive duration (e.g. 1d, 6h, 90min)")
    return td.total_seconds() / 3600.0
