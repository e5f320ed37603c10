"""Reading demand traces in the Helios per-minute format.

A Helios cluster trace (one file per virtual cluster) has one row a minute with, among
others, the columns ``time, running_gpu_num, pending_gpu_num, total_gpu_num`` and
``gpu_utilization``. A platform's demand is ``running + pending``; several files assigned
to one platform are summed, and rows finer than the simulation step are averaged into it.
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from gpupool import inputfiles
from gpupool.errors import UserError

#: columns every Helios trace file must carry
HELIOS_REQUIRED = ("time", "running_gpu_num", "pending_gpu_num", "total_gpu_num")

#: the most simulation steps a world may hold: five years of five-minute steps. Every node keeps
#: its owner per step, so a longer span (a mistyped year in a three-line trace) only exhausts memory
MAX_WORLD_STEPS = 5 * 366 * 24 * 12

#: the most GPUs one count of a trace or history file may name (a cluster's, a job's, a pod's, one
#: sample of a series): more than any cluster holds, and few enough that a log's jobs summed in
#: thousandths of a GPU stay exact in 64-bit integers and a world's nodes fit in memory
MAX_GPU_COUNT = 1_000_000

#: the instants a trace or history file may name, from EARLIEST_TIME up to (not including)
#: LATEST_TIME: the simulator counts time in nanoseconds from 1970, a count that ends in 2262
EARLIEST_TIME = pd.Timestamp("1970-01-01T00:00:00Z")
LATEST_TIME = pd.Timestamp("2200-01-01T00:00:00Z")

#: columns of the frame :func:`read_helios` returns
TRACE_COLUMNS = ("running", "pending", "demand", "total", "util")


class TraceError(UserError, ValueError):
    """A trace file that cannot be used as demand."""


def read_helios(paths: str | Path | Iterable[str | Path], step: str | pd.Timedelta = "5min") -> pd.DataFrame:
    """Read one or more Helios trace files into one demand frame on a regular step grid.

    Parameters
    ----------
    paths:
        One path or several; several files are summed (one platform made of several clusters).
    step:
        The simulation step; rows finer than it are averaged into it (bins are left-closed,
        labelled by their start).

    Returns
    -------
    DataFrame indexed by a tz-aware UTC ``DatetimeIndex`` named ``ts`` with float columns
    ``running``, ``pending``, ``demand`` (= running + pending), ``total`` (GPUs the traced
    cluster had) and ``util`` (mean GPU utilisation of the running GPUs, 0..1).

    Raises
    ------
    TraceError
        Naming the file on a missing column, an unreadable file, no rows, or files that do
        not cover the same time range; naming the file, line and column on an infinite value,
        a negative GPU count or one beyond :data:`MAX_GPU_COUNT`, or a time outside
        :data:`EARLIEST_TIME` .. :data:`LATEST_TIME`.
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    paths = [Path(p) for p in paths]
    if not paths:
        raise TraceError("no trace files given")
    step = pd.Timedelta(step)
    if step <= pd.Timedelta(0):
        raise TraceError(f"step must be positive, got {step}")
    frames = [_read_one(p, step) for p in paths]
    index = frames[0].index
    for path, frame in zip(paths[1:], frames[1:]):
        if not frame.index.equals(index):
            raise TraceError(
                f"{path}: covers {frame.index[0]}..{frame.index[-1]} ({len(frame)} steps), but "
                f"{paths[0]} covers {index[0]}..{index[-1]} ({len(index)} steps); traces of one "
                "scenario must cover the same range"
            )
    running = sum(f["running"] for f in frames)
    pending = sum(f["pending"] for f in frames)
    total = sum(f["total"] for f in frames)
    busy_util = sum(f["util"] * f["running"] for f in frames)
    with np.errstate(invalid="ignore", divide="ignore"):
        util = np.where(running > 0, busy_util / running.where(running > 0, 1.0), 0.0)
    out = pd.DataFrame(
        {
            "running": running,
            "pending": pending,
            "demand": running + pending,
            "total": total,
            "util": np.clip(util, 0.0, 1.0),
        },
        index=index,
    )
    return out


def _read_one(path: Path, step: pd.Timedelta) -> pd.DataFrame:
    text = inputfiles.read_text(path, "trace", inputfiles.MAX_TRACE_BYTES, TraceError, decompress=True)
    try:
        raw = pd.read_csv(io.StringIO(text))
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise TraceError(f"{path}: cannot read trace ({' '.join(str(exc).split())[:200]})") from None
    missing = [c for c in HELIOS_REQUIRED if c not in raw.columns]
    if missing:
        raise TraceError(f"{path}: not a Helios trace, missing columns {missing}")
    if raw.empty:
        raise TraceError(f"{path}: no rows")
    ts = pd.to_datetime(raw["time"], errors="coerce", utc=True)
    if ts.isna().any():
        bad = raw.loc[ts.isna(), "time"].iloc[0]
        raise TraceError(f"{path}: column 'time' has {int(ts.isna().sum())} unparseable values, first {bad!r}")
    outside = ((ts < EARLIEST_TIME) | (ts >= LATEST_TIME)).to_numpy()
    if outside.any():
        i = int(np.flatnonzero(outside)[0])
        raise TraceError(f"{path}: line {i + 2}, column 'time': {ts.iloc[i].isoformat()} is outside the times a trace "
                         f"may name ({EARLIEST_TIME:%Y-%m-%d} .. {LATEST_TIME:%Y-%m-%d})")
    cols = {}
    for name, col in (("running", "running_gpu_num"), ("pending", "pending_gpu_num"), ("total", "total_gpu_num")):
        values = pd.to_numeric(raw[col], errors="coerce")
        if values.isna().all():
            raise TraceError(f"{path}: column {col!r} has no numeric values")
        cols[name] = _checked(path, col, values.to_numpy(dtype="float64"), counts=True)
    if "gpu_utilization" in raw.columns:
        util = pd.to_numeric(raw["gpu_utilization"], errors="coerce").to_numpy(dtype="float64")
        cols["util"] = _checked(path, "gpu_utilization", util, counts=False)
    else:
        cols["util"] = np.full(len(raw), np.nan)
    check_span(ts.min(), ts.max() + step, step, str(path))
    frame = pd.DataFrame(cols, index=pd.DatetimeIndex(ts, name="ts")).sort_index()
    binned = frame.resample(step, label="left", closed="left").mean()
    # A step with no row at all (a gap in the trace) carries the previous step's state: the
    # cluster did not vanish, its exporter was silent.
    binned[["running", "pending", "total"]] = binned[["running", "pending", "total"]].ffill().bfill()
    binned["util"] = binned["util"].ffill().fillna(0.0)
    binned.index = binned.index.astype("datetime64[us, UTC]")
    binned.index.name = "ts"
    return binned


def check_span(start: pd.Timestamp, end: pd.Timestamp, step: pd.Timedelta, what: str) -> None:
    """Refuse (TraceError, one line naming the span and step) a span of more than
    :data:`MAX_WORLD_STEPS` steps; ``what`` names the trace file or the scenario window."""
    steps = (pd.Timestamp(end) - pd.Timestamp(start)) // pd.Timedelta(step)
    if steps > MAX_WORLD_STEPS:
        raise TraceError(
            f"{what}: spans {start} .. {end} ({pd.Timestamp(end) - pd.Timestamp(start)}), {steps:,} steps of {step}; "
            f"a world holds at most {MAX_WORLD_STEPS:,}: shorten the span or lengthen the step"
        )


def _checked(path: Path, col: str, values: np.ndarray, counts: bool) -> np.ndarray:
    """``values`` unchanged, or a TraceError naming the file line (the header is line 1) of the
    first infinite value or, for a GPU count, the first negative one or one beyond
    :data:`MAX_GPU_COUNT`. Blank values stay gaps."""
    with np.errstate(invalid="ignore"):
        bad = np.isinf(values) | (((values < 0) | (values > MAX_GPU_COUNT)) if counts else False)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        what = ("is not finite" if np.isinf(values[i]) else "is a negative GPU count" if values[i] < 0
                else f"is beyond {MAX_GPU_COUNT:,} GPUs (MAX_GPU_COUNT)")
        raise TraceError(f"{path}: line {i + 2}, column {col!r}: value {float(values[i])!r} {what}")
    return values
