"""Demand from a platform's own history: job logs and metric series on the simulator's grid.

A scenario's trace entry is a plain path (a Helios per-minute CSV, :mod:`gpupool.sim.traces`)
or a mapping naming its format (:class:`HistorySpec`):

``sacct``
    ``sacct --parsable2 --allocations --format=JobID,Submit,Start,End,State,AllocTRES,ReqTRES,Partition``:
    a job runs ``gres/gpu`` of its AllocTRES from Start to End and waits for ``gres/gpu`` of its
    ReqTRES from Submit to Start; times are local to ``timezone``.
``pods``
    a pod list ``name,creation_time,scheduled_time,deletion_time,num_gpu,gpu_milli`` (seconds
    from ``origin``, or ISO 8601): pending from creation to scheduling, running until deletion;
    a pod asking for one GPU with ``gpu_milli`` under 1000 holds that share of it.
``prometheus``
    ``query_range`` answers (files, or a live server) of an allocated and a pending query.
``csv``
    a time column and a value column as ``gpupool detect``/``forecast`` read them, with an
    optional pending column.

Every reader returns what :func:`gpupool.sim.traces.read_helios` does (``running, pending,
demand, total, util`` per step; ``total`` and ``util`` are 0: these formats carry neither), so
the rest of the simulator does not know where its demand came from. A job log defines demand at
every instant (zero between jobs), so the window is the scenario's ``start``/``end``; a step holds
the time-weighted mean of what ran and waited during it.
"""

from __future__ import annotations

import datetime as dt
import json
import zoneinfo
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, field_validator, model_validator

from gpupool.values import utc_field
from gpupool.sim.traces import TraceError, check_span, read_helios

#: the formats a trace mapping may name besides ``helios`` (the plain-path format)
HISTORY_FORMATS = ("sacct", "pods", "prometheus", "csv")

#: the keys each format takes beside ``format``
_KEYS = {
    "helios": {"path"},
    "sacct": {"path", "timezone", "partition"},
    "pods": {"path", "origin", "timezone"},
    "prometheus": {"allocated", "pending", "url", "allocated_query", "pending_query", "step"},
    "csv": {"path", "time_col", "value_col", "pending_col", "timezone", "duplicates"},
}

#: the columns a sacct file must carry (its header names them)
SACCT_COLUMNS = ("JobID", "Submit", "Start", "End", "State", "AllocTRES", "ReqTRES", "Partition")
#: the columns a pod list must carry
POD_COLUMNS = ("name", "creation_time", "scheduled_time", "deletion_time", "num_gpu", "gpu_milli")
#: the most GPUs one point of a Prometheus answer may count: far above any pool, and low enough
#: that the sums and forecasts made of such points stay finite
MAX_ANSWER_GPUS = 1e7
#: a Prometheus answer's point times, in seconds since the epoch: 1970-01-01 .. 2200-01-01
MAX_ANSWER_TIME_S = 7_258_118_400
#: what sacct writes for a time that has not happened (a pending job's Start, a running job's End)
_SACCT_UNKNOWN = {"", "unknown", "none"}


class HistoryError(TraceError):
    """A history file (or server) that cannot be read as demand; names the file and line."""


class HistorySpec(BaseModel):
    """One trace entry of a scenario that names its format."""

    model_config = ConfigDict(extra="forbid")

    format: Literal["helios", "sacct", "pods", "prometheus", "csv"]
    path: Path | None = None
    timezone: str = "UTC"
    partition: list[str] | None = None
    origin: dt.datetime | None = None
    time_col: str | None = None
    value_col: str | None = None
    pending_col: str | None = None
    allocated: Path | None = None
    pending: Path | None = None
    url: str | None = None
    allocated_query: str | None = None
    pending_query: str | None = None
    step: str = "1m"
    duplicates: Literal["refuse", "first", "last", "mean"] = "refuse"

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, value: Any) -> Any:
        if isinstance(value, dict) and value.get("format") in _KEYS:
            extra = sorted(set(value) - _KEYS[value["format"]] - {"format"})
            if extra:
                raise ValueError(f"{', '.join(map(str, extra))}: not a key of format {value['format']} "
                                 f"(it takes {', '.join(sorted(_KEYS[value['format']]))})")
        return value

    @field_validator("partition", mode="before")
    @classmethod
    def _partitions(cls, value: Any) -> Any:
        return [p.strip() for p in value.split(",") if p.strip()] if isinstance(value, str) else value

    @field_validator("timezone")
    @classmethod
    def _zone(cls, value: str) -> str:
        try:
            zoneinfo.ZoneInfo(value)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown time zone {value!r} (an IANA name such as 'Europe/Berlin')") from None
        return value

    @field_validator("origin", mode="before")
    @classmethod
    def _origin(cls, value: Any) -> Any:
        return utc_field(value)

    @model_validator(mode="after")
    def _keys_of_format(self) -> "HistorySpec":
        given = {k for k in self.model_fields_set if k != "format"}
        if self.format == "prometheus":
            files, live = self.allocated is not None, self.url is not None
            if files == live:
                raise ValueError("format prometheus: give 'allocated' (and 'pending') answer files, or 'url' with "
                                 "'allocated_query' (and 'pending_query')")
            if live and not self.allocated_query:
                raise ValueError("format prometheus: 'url' needs 'allocated_query'")
            if not live and (self.allocated_query or self.pending_query or "step" in given):
                raise ValueError("format prometheus: queries and step go with 'url', not with answer files")
        elif self.path is None:
            raise ValueError(f"format {self.format}: 'path' is required")
        return self

    def files(self) -> list[Path]:
        """The files this entry reads (none for a live Prometheus)."""
        return [p for p in (self.path, self.allocated, self.pending) if p is not None]

    def label(self) -> str:
        """The file (or server) named in messages."""
        return str(self.path or self.allocated or self.url)


# ---------------------------------------------------------------------------------- job logs
def read_sacct(path: str | Path, timezone: str = "UTC", partition: Iterable[str] | None = None) -> pd.DataFrame:
    """A sacct file's GPU jobs as intervals (see :func:`jobs_demand`).

    Job steps (a JobID with a dot: the file was written without ``--allocations``) are skipped,
    so a job is counted once; ``partition`` keeps jobs of those partitions only (a pending job
    submitted to several counts when one of them is kept). Refused, naming the file and line: a
    missing column, a row with too few or too many fields, a time that does not parse, a GPU
    count that is not a whole number, a job that ends before it started (or, never started,
    before it was submitted). A job that started before its Submit time (a requeued job's
    Submit is the requeue) did not wait.
    """
    path = Path(path)
    lines = _text(path).splitlines()
    if not lines:
        raise HistoryError(f"{path}: empty file, expected a sacct --parsable2 header ({'|'.join(SACCT_COLUMNS)})")
    header = lines[0].split("|")
    missing = [c for c in SACCT_COLUMNS if c not in header]
    if missing:
        raise HistoryError(f"{path}: line 1: not sacct --parsable2 output with columns {'|'.join(SACCT_COLUMNS)}; "
                           f"missing {', '.join(missing)}")
    col = {c: header.index(c) for c in SACCT_COLUMNS}
    keep = set(partition) if partition else None
    rows: list[tuple[int, str, str, str, str, str]] = []
    for n, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        fields = line.split("|")
        if len(fields) != len(header):
            raise HistoryError(f"{path}: line {n}: {len(fields)} fields, the header names {len(header)}")
        if "." in fields[col["JobID"]]:
            continue
        if keep is not None and not keep & set(fields[col["Partition"]].split(",")):
            continue
        # a pending job's Start is the scheduler's estimate, not a start
        begun = "" if fields[col["State"]].strip().upper() == "PENDING" else fields[col["Start"]]
        rows.append((n, fields[col["Submit"]], begun, fields[col["End"]],
                     fields[col["AllocTRES"]], fields[col["ReqTRES"]]))
    line_no = np.array([r[0] for r in rows], dtype=np.int64)
    submit = _sacct_times(path, line_no, [r[1] for r in rows], "Submit", timezone, unknown_ok=False)
    start = _sacct_times(path, line_no, [r[2] for r in rows], "Start", timezone, unknown_ok=True)
    end = _sacct_times(path, line_no, [r[3] for r in rows], "End", timezone, unknown_ok=True)
    alloc = np.array([_tres_gpus(path, r[0], "AllocTRES", r[4]) for r in rows], dtype=np.int64) * 1000
    req = np.array([_tres_gpus(path, r[0], "ReqTRES", r[5]) for r in rows], dtype=np.int64) * 1000
    started = ~start.isna()
    # a Start before Submit (a requeued job's Submit is its requeue) is no wait, not a bad row
    _order(path, line_no, start, end, "Start", "End")
    _order(path, line_no, submit, end.where(~started), "Submit", "End")
    # pending from Submit until it started, or (never started) until it ended or the window does
    wait_end = start.where(started, end)
    return _intervals(line_no, submit, wait_end, req, start, end, alloc, started)


def read_pods(path: str | Path, origin: dt.datetime | pd.Timestamp | None = None, timezone: str = "UTC") -> pd.DataFrame:
    """A pod list's GPU pods as intervals (see :func:`jobs_demand`).

    Times are seconds after ``origin`` (the trace's own zero) or ISO 8601 (naive ones in
    ``timezone``); an empty ``scheduled_time`` is a pod that never ran (pending until deleted),
    an empty ``deletion_time`` one still there (until the window's end). A pod holds ``num_gpu``
    GPUs, or ``gpu_milli``/1000 of one where it asks for one GPU and ``gpu_milli`` is under 1000.
    Refused, naming the file and line: a missing column, a time that does not parse (or is in
    seconds without ``origin``), a negative or non-numeric GPU count, a pod scheduled before it
    was created or deleted before it was scheduled.
    """
    path = Path(path)
    _text(path)  # not UTF-8 text: one line, before pandas' own message
    try:
        raw = pd.read_csv(path, dtype=str, keep_default_na=False, skip_blank_lines=False)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise HistoryError(f"{path}: cannot read pod list ({' '.join(str(exc).split())})") from None
    missing = [c for c in POD_COLUMNS if c not in raw.columns]
    if missing:
        raise HistoryError(f"{path}: line 1: not a pod list with columns {','.join(POD_COLUMNS)}; "
                           f"missing {', '.join(missing)}")
    line_no = np.arange(len(raw), dtype=np.int64) + 2
    blank = (raw[list(POD_COLUMNS)].apply(lambda c: c.str.strip()) == "").all(axis=1).to_numpy()
    raw, line_no = raw[~blank].reset_index(drop=True), line_no[~blank]
    zero = None if origin is None else _utc(pd.Timestamp(origin), "UTC")
    created = _pod_times(path, line_no, raw["creation_time"], "creation_time", zero, timezone, empty_ok=False)
    scheduled = _pod_times(path, line_no, raw["scheduled_time"], "scheduled_time", zero, timezone, empty_ok=True)
    deleted = _pod_times(path, line_no, raw["deletion_time"], "deletion_time", zero, timezone, empty_ok=True)
    num_gpu = _counts(path, line_no, raw["num_gpu"], "num_gpu", whole=True)
    milli = _counts(path, line_no, raw["gpu_milli"], "gpu_milli", whole=True, empty=np.nan)
    share = (num_gpu == 1) & (milli < 1000)
    gpus_milli = np.where(share, milli, num_gpu * 1000).astype(np.int64)
    ran = ~scheduled.isna()
    _order(path, line_no, created, scheduled, "creation_time", "scheduled_time")
    _order(path, line_no, scheduled, deleted, "scheduled_time", "deletion_time")
    _order(path, line_no, created, deleted, "creation_time", "deletion_time")
    wait_end = scheduled.where(ran, deleted)
    return _intervals(line_no, created, wait_end, gpus_milli, scheduled, deleted, gpus_milli, ran)


def jobs_demand(jobs: pd.DataFrame, index: pd.DatetimeIndex, step: pd.Timedelta) -> pd.DataFrame:
    """Running and pending GPUs per step of ``index`` from intervals (columns ``kind``:
    running/pending, ``begin``, ``end``: NaT = still open at the window's end, ``milli``:
    thousandths of a GPU): each step holds the time-weighted mean over ``[t, t + step)``."""
    out = {}
    for kind in ("running", "pending"):
        part = jobs[jobs["kind"] == kind]
        out[kind] = _integrate(part["begin"], part["end"], part["milli"].to_numpy(np.int64), index, step) / 1000.0
    return _frame(out["running"], out["pending"], index)


# ------------------------------------------------------------------------------ metric series
def read_prometheus_answer(path: str | Path) -> pd.Series:
    """A ``query_range`` answer file as one series: every result series summed per timestamp."""
    path = Path(path)
    text = _text(path)
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise HistoryError(f"{path}: line {exc.lineno}: not JSON ({exc.msg})") from None
    except RecursionError:
        raise HistoryError(f"{path}: not a query_range answer (JSON nested too deeply)") from None
    except ValueError:  # an integer of more digits than Python converts
        raise HistoryError(f"{path}: not a query_range answer (a number too long to read)") from None
    data = doc.get("data") if isinstance(doc, dict) and doc.get("status") == "success" else None
    matrix = isinstance(data, dict) and data.get("resultType") == "matrix"
    return _matrix_sum(data.get("result") if matrix else None, str(path))


def query_prometheus(url: str, query: str, start: pd.Timestamp, end: pd.Timestamp, step: str) -> pd.Series:
    """``query`` over ``[start, end)`` from a live Prometheus, its series summed per timestamp.

    Evaluated on the epoch grid of ``step`` (as the Prometheus source reads), in requests of at
    most :data:`~gpupool.sources.prometheus.DEFAULT_CHUNK_POINTS` points: a month at one minute
    is more than one query_range answer may hold."""
    from prometheus_api_client import PrometheusConnect
    from prometheus_api_client.exceptions import PrometheusApiClientException
    from requests import RequestException

    from gpupool.sources.base import aligned_points, chunk_range, redact_url, step_seconds
    from gpupool.sources.prometheus import DEFAULT_CHUNK_POINTS

    where = redact_url(url)
    try:
        step_s = step_seconds(step)
    except ValueError as exc:
        raise HistoryError(f"{where}: {exc}") from None
    grid = aligned_points(start.to_pydatetime(), end.to_pydatetime(), step_s)
    if grid is None:
        return pd.Series([], index=pd.DatetimeIndex([], tz="UTC"), dtype=float)
    client = PrometheusConnect(url=url, disable_ssl=False, timeout=60)
    result = []
    try:
        for lo, hi in chunk_range(grid[0], grid[1], step_s, DEFAULT_CHUNK_POINTS):
            result += client.custom_query_range(query=query, start_time=lo, end_time=hi, step=str(step_s))
    except (PrometheusApiClientException, RequestException, ValueError) as exc:
        raise HistoryError(f"{where}: query {query!r} failed ({' '.join(str(exc).split())[:300]})") from None
    finally:
        client.close()
    return _matrix_sum(result, f"{where} query {query!r}")


def read_csv_columns(path: Path, time_col: str | None, value_col: str | None, pending_col: str | None,
                     timezone: str = "UTC", duplicates: str = "refuse") -> tuple[pd.Series, pd.Series | None]:
    """The allocated (and pending) series of a plain CSV, read as ``gpupool detect`` reads its
    input (:func:`gpupool.tsio.read_series_csv`), in UTC; a negative GPU count names its line."""
    from gpupool.tsio import SeriesInputError, read_series_csv

    out = []
    for col in (value_col, pending_col) if pending_col else (value_col,):
        try:
            series = read_series_csv(path, time_col=time_col, value_col=col, duplicates=duplicates)
        except SeriesInputError as exc:  # the reader speaks of CLI options; a trace entry has keys
            text = str(exc)
            for option, key in (("--time-col", "time_col"), ("--value-col", "value_col"), ("--duplicates", "duplicates:")):
                text = text.replace(option, key)
            raise HistoryError(text) from None
        values = series.to_numpy()
        with np.errstate(invalid="ignore"):
            neg = np.flatnonzero(values < 0)
        if len(neg):
            raise HistoryError(f"{path}: line {neg[0] + 2}, column {series.name!r}: value {float(values[neg[0]])!r} is a "
                               "negative GPU count")
        idx = series.index
        idx = idx.tz_localize(zoneinfo.ZoneInfo(timezone), ambiguous=True, nonexistent="shift_forward") \
            if idx.tz is None else idx
        out.append(pd.Series(values, index=idx.tz_convert("UTC")))
    return out[0], (out[1] if len(out) > 1 else None)


def series_demand(series: pd.Series | None, index: pd.DatetimeIndex, step: pd.Timedelta, gaps: str) -> np.ndarray:
    """``series`` on ``index``: samples of a step averaged; a step without one is 0 (``gaps="zero"``:
    a Prometheus sum over no series) or carries the step before it (``gaps="carry"``: a CSV's
    silent exporter, as Helios traces are read)."""
    if series is None:
        return np.zeros(len(index))
    edges = index.append(pd.DatetimeIndex([index[-1] + step]).as_unit(index.unit))
    s = series[(series.index >= edges[0]) & (series.index < edges[-1])].dropna()
    bins = ((s.index - edges[0]) // step).to_numpy()
    sums = np.bincount(bins, weights=s.to_numpy(float), minlength=len(index))
    counts = np.bincount(bins, minlength=len(index))
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    if gaps == "zero":
        return np.nan_to_num(mean, nan=0.0)
    return pd.Series(mean).ffill().bfill().fillna(0.0).to_numpy()


# ------------------------------------------------------------------------------ one entry
def read_traces(entries: Iterable[Path | HistorySpec], step: pd.Timedelta, start: pd.Timestamp | None,
                end: pd.Timestamp | None) -> pd.DataFrame:
    """One platform's demand from its trace entries, summed: Helios paths as
    :func:`gpupool.sim.traces.read_helios` reads them, history entries on ``[start, end)``."""
    entries = list(entries)
    helios = [e for e in entries if not isinstance(e, HistorySpec)]
    frames = [read_helios(helios, step)] if helios else []
    history = [e for e in entries if isinstance(e, HistorySpec)]
    if history and (start is None or end is None):
        raise HistoryError(f"{history[0].label()}: a {history[0].format} trace needs the scenario's start and end")
    for spec in history:
        frame = read_history(spec, step, start, end)
        if frames:
            first = frames[0].loc[(frames[0].index >= start) & (frames[0].index < end)]
            if not first.index.equals(frame.index):
                raise HistoryError(f"{spec.label()}: the platform's Helios traces do not cover start..end "
                                   f"({start} .. {end}); set start/end inside them")
            frames[0] = first
        frames.append(frame)
    out = frames[0]
    for frame in frames[1:]:
        out = out.add(frame[list(out.columns)], fill_value=0.0)
    if len(frames) > 1:
        out["util"] = frames[0]["util"] if helios else 0.0
    return out


def read_history(spec: HistorySpec, step: pd.Timedelta, start: pd.Timestamp, end: pd.Timestamp) -> pd.DataFrame:
    """One trace entry as demand on the grid ``[start, end)`` of ``step``."""
    step = pd.Timedelta(step)
    check_span(start, end, step, spec.label())
    index = pd.date_range(start, end, freq=step, inclusive="left", name="ts").astype("datetime64[us, UTC]")
    if spec.format in ("sacct", "pods"):
        return jobs_demand(history_jobs(spec), index, step)
    if spec.format == "prometheus":
        if spec.url is not None:
            alloc = query_prometheus(spec.url, spec.allocated_query, start, end, spec.step)
            pend = (query_prometheus(spec.url, spec.pending_query, start, end, spec.step)
                    if spec.pending_query else None)
        else:
            alloc = read_prometheus_answer(spec.allocated)
            pend = read_prometheus_answer(spec.pending) if spec.pending is not None else None
        gaps = "zero"
    elif spec.format == "csv":
        alloc, pend = read_csv_columns(spec.path, spec.time_col, spec.value_col, spec.pending_col, spec.timezone,
                                       spec.duplicates)
        gaps = "carry"
    else:
        raise HistoryError(f"{spec.label()}: format {spec.format} is read by gpupool.sim.traces")
    return _frame(series_demand(alloc, index, step, gaps), series_demand(pend, index, step, gaps), index)


def history_jobs(spec: HistorySpec) -> pd.DataFrame:
    """The intervals of a job-log entry (sacct or pods)."""
    if spec.format == "sacct":
        return read_sacct(spec.path, spec.timezone, spec.partition)
    return read_pods(spec.path, spec.origin, spec.timezone)


def history_span(spec: HistorySpec) -> tuple[pd.Timestamp, pd.Timestamp] | None:
    """The first and last instant a file entry names (None for a live Prometheus or no rows):
    what a what-if over "the whole log" covers."""
    if spec.format in ("sacct", "pods"):
        jobs = history_jobs(spec)
        times = pd.concat([jobs["begin"], jobs["end"]]).dropna()
    elif spec.format == "prometheus" and spec.url is None:
        times = pd.Series(read_prometheus_answer(spec.allocated).index)
    elif spec.format == "csv":
        times = pd.Series(read_csv_columns(spec.path, spec.time_col, spec.value_col, None, spec.timezone,
                                           spec.duplicates)[0].index)
    else:
        return None
    return (times.min(), times.max()) if len(times) else None


# ------------------------------------------------------------------------------ internals
def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise HistoryError(f"{path}: not UTF-8 text (undecodable byte at offset {exc.start})") from None
    except OSError as exc:
        raise HistoryError(f"{path}: cannot read ({exc.strerror or exc})") from None


def _utc(ts: pd.Timestamp, timezone: str) -> pd.Timestamp:
    if ts.tzinfo is None:
        return ts.tz_localize(zoneinfo.ZoneInfo(timezone), ambiguous=True, nonexistent="shift_forward").tz_convert("UTC")
    return ts.tz_convert("UTC")


def _sacct_times(path: Path, line_no: np.ndarray, values: list[str], col: str, timezone: str,
                 unknown_ok: bool) -> pd.Series:
    """sacct's local times (``2023-04-26T10:00:00``) in UTC; NaT for Unknown where allowed. An
    ambiguous wall time (the hour a clock goes back) is read as the daylight-saving one."""
    text = pd.Series(values, dtype=object).str.strip()
    unknown = text.str.lower().isin(_SACCT_UNKNOWN)
    parsed = pd.to_datetime(text.where(~unknown), format="%Y-%m-%dT%H:%M:%S", errors="coerce")
    bad = (parsed.isna() & ~unknown) | (unknown & (not unknown_ok))
    if bad.any():
        i = int(np.flatnonzero(bad.to_numpy())[0])
        raise HistoryError(f"{path}: line {line_no[i]}, column {col}: {values[i]!r} is not a time "
                           "(expected YYYY-MM-DDTHH:MM:SS" + (" or Unknown)" if unknown_ok else ")"))
    zone = zoneinfo.ZoneInfo(timezone)
    return pd.Series(pd.DatetimeIndex(parsed).tz_localize(zone, ambiguous=np.ones(len(parsed), bool),
                                                          nonexistent="shift_forward").tz_convert("UTC"))


def _tres_gpus(path: Path, line: int, col: str, tres: str) -> int:
    """GPUs of a TRES string (``cpu=8,gres/gpu=2,gres/gpu:a100=2,...``): ``gres/gpu``, else the
    sum of its typed forms; 0 for none."""
    plain, typed = None, 0
    for item in filter(None, (t.strip() for t in tres.split(","))):
        key, _, value = item.partition("=")
        if key == "gres/gpu" or key.startswith("gres/gpu:"):
            try:
                count = int(value)
            except ValueError:
                count = -1
            if count < 0:
                raise HistoryError(f"{path}: line {line}, column {col}: {item!r} is not a whole GPU count")
            if key == "gres/gpu":
                plain = count
            else:
                typed += count
    return plain if plain is not None else typed


def _pod_times(path: Path, line_no: np.ndarray, col: pd.Series, name: str, origin: pd.Timestamp | None,
               timezone: str, empty_ok: bool) -> pd.Series:
    """A pod list's time column in UTC: seconds after ``origin``, or ISO 8601; NaT where empty."""
    text = col.str.strip()
    seconds = pd.to_numeric(text, errors="coerce").to_numpy(float)
    if origin is not None and np.isfinite(seconds).all() and (np.abs(seconds) <= 1e11).all():
        return pd.Series(origin + pd.to_timedelta(seconds, unit="s"))  # the usual list: all seconds, at once
    out = []
    for i, value in enumerate(text):
        if not value:
            if not empty_ok:
                raise HistoryError(f"{path}: line {line_no[i]}, column {name}: empty, a pod has a creation time")
            out.append(pd.NaT)
            continue
        try:
            seconds = float(value)
        except ValueError:
            seconds = None
        if seconds is not None:
            if origin is None:
                raise HistoryError(f"{path}: line {line_no[i]}, column {name}: {value!r} is seconds from the trace's "
                                   "origin; give origin (the instant second 0 stands for)")
            if not np.isfinite(seconds) or abs(seconds) > 1e11:
                raise HistoryError(f"{path}: line {line_no[i]}, column {name}: {value!r} is not a time")
            out.append(origin + pd.Timedelta(seconds=seconds))
            continue
        try:
            out.append(_utc(pd.Timestamp(value), timezone))
        except (ValueError, TypeError, OverflowError):
            raise HistoryError(f"{path}: line {line_no[i]}, column {name}: {value!r} is neither seconds nor an "
                               "ISO 8601 time") from None
    return pd.Series(pd.DatetimeIndex(out, tz="UTC") if out else pd.DatetimeIndex([], tz="UTC"))


def _counts(path: Path, line_no: np.ndarray, col: pd.Series, name: str, whole: bool,
            empty: float | None = None) -> np.ndarray:
    text = col.str.strip()
    values = pd.to_numeric(text, errors="coerce").to_numpy(float)
    blank = (text == "").to_numpy()
    if empty is not None:
        values = np.where(blank, empty, values)
    with np.errstate(invalid="ignore"):
        bad = (np.isnan(values) & ~(blank & (empty is not None))) | (values < 0) | np.isinf(values)
        if whole:
            bad |= ~np.isnan(values) & (values != np.round(values))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise HistoryError(f"{path}: line {line_no[i]}, column {name}: {col.iloc[i]!r} is not a GPU count "
                           "(a whole number, 0 or more)")
    return values


def _order(path: Path, line_no: np.ndarray, first: pd.Series, then: pd.Series, a: str, b: str) -> None:
    bad = (~first.isna() & ~then.isna() & (then < first)).to_numpy()
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise HistoryError(f"{path}: line {line_no[i]}: {b} {then.iloc[i]} is before {a} {first.iloc[i]}")


def _intervals(line_no, wait_begin, wait_end, wait_milli, run_begin, run_end, run_milli, ran) -> pd.DataFrame:
    ran = np.asarray(ran, bool)
    pending = pd.DataFrame({"kind": "pending", "begin": wait_begin.to_numpy(), "end": wait_end.to_numpy(),
                            "milli": np.asarray(wait_milli, np.int64), "line": line_no})
    running = pd.DataFrame({"kind": "running", "begin": run_begin.to_numpy(), "end": run_end.to_numpy(),
                            "milli": np.asarray(run_milli, np.int64), "line": line_no})[ran]
    jobs = pd.concat([pending, running], ignore_index=True)
    jobs = jobs[jobs["milli"] > 0]
    for c in ("begin", "end"):
        jobs[c] = pd.to_datetime(jobs[c], utc=True)
    return jobs.reset_index(drop=True)


def _integrate(begin: pd.Series, end: pd.Series, milli: np.ndarray, index: pd.DatetimeIndex,
               step: pd.Timedelta) -> np.ndarray:
    """Mean level per step of a sum of boxes ``milli`` over ``[begin, end)`` (end NaT: open)."""
    n = len(index)
    t0 = index[0].value
    width = pd.Timedelta(step).value
    t1 = t0 + n * width
    b = pd.DatetimeIndex(begin).as_unit("ns").asi8 if len(begin) else np.zeros(0, np.int64)
    e_idx = pd.DatetimeIndex(end).as_unit("ns") if len(end) else pd.DatetimeIndex([], tz="UTC")
    e = np.where(e_idx.isna(), t1, e_idx.asi8) if len(end) else np.zeros(0, np.int64)
    b, e = np.clip(b, t0, t1), np.clip(e, t0, t1)
    live = e > b
    b, e, m = b[live], e[live], milli[live]
    edges = t0 + width * np.arange(n + 1, dtype=np.int64)
    points = np.concatenate([edges, b, e])
    delta = np.concatenate([np.zeros(n + 1, np.int64), m, -m])
    order = np.argsort(points, kind="stable")
    points, level = points[order], np.cumsum(delta[order])
    dur = np.diff(points)
    bins = np.minimum((points[:-1] - t0) // width, n - 1)
    area = np.bincount(bins, weights=level[:-1].astype(float) * dur, minlength=n)
    return area / width


def _matrix_sum(result: Any, where: str) -> pd.Series:
    if not isinstance(result, list):
        raise HistoryError(f"{where}: not a query_range answer (expected status success, data.resultType matrix)")
    times, values = [], []
    for k, series in enumerate(result):
        pts = series.get("values") if isinstance(series, dict) else None
        if not isinstance(pts, list):
            raise HistoryError(f"{where}: data.result[{k}]: a series without 'values'")
        for j, pt in enumerate(pts):
            at = f"{where}: data.result[{k}].values[{j}]"
            try:
                if not isinstance(pt, (list, tuple)) or len(pt) != 2:
                    raise TypeError
                t, v = float(pt[0]), float(pt[1])
            except (TypeError, ValueError, OverflowError):
                raise HistoryError(f"{at}: {_short(pt)} is not [time, \"value\"]") from None
            if not 0 <= t <= MAX_ANSWER_TIME_S:  # also NaN and inf (JSON's 1e999)
                raise HistoryError(f"{at}: time {_short(pt[0])} is not an instant of 1970..2200 in seconds")
            if np.isinf(v) or v < 0 or v > MAX_ANSWER_GPUS:
                raise HistoryError(f"{at}: {_short(pt[1])} is not a GPU count (0 to {MAX_ANSWER_GPUS:g})")
            times.append(t)
            values.append(v)
    series = pd.Series(values, index=pd.to_datetime(np.asarray(times, float), unit="s", utc=True), dtype=float)
    return series.groupby(level=0).sum(min_count=1).sort_index()


def _short(value: Any) -> str:
    """A value of a file as a message shows it: its repr, cut to a short prefix."""
    text = repr(value)
    return text if len(text) <= 60 else text[:60] + "…"


def _frame(running: np.ndarray, pending: np.ndarray, index: pd.DatetimeIndex) -> pd.DataFrame:
    running, pending = np.asarray(running, float), np.asarray(pending, float)
    return pd.DataFrame({"running": running, "pending": pending, "demand": running + pending,
                         "total": 0.0, "util": 0.0}, index=index)
