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
import io
import json
import math
import zoneinfo
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, field_validator, model_validator

from gpupool import inputfiles
from gpupool.values import utc_field
from gpupool.sim.histparse import (HistoryError, ascii_float, bounded, check_times, counts, in_span, instant_text,
                                   intervals, order, pod_times, refuse_repeats, sacct_times, settle_folds,
                                   shown, span_text, unused, whole_count)
from gpupool.sim.traces import MAX_GPU_COUNT, check_span, read_helios

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
#: columns that, where a log has them, tell apart records of the same JobID and Submit (several
#: clusters' sacct) or pods of the same name and creation time (several namespaces)
_SACCT_DISTINCT = ("Cluster",)
_POD_DISTINCT = ("namespace", "uid")


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
    missing column, a row with too few or too many fields, a time that does not parse or lies
    outside :func:`~gpupool.sim.histparse.span_text`'s span, a GPU count that is not ASCII
    digits or is beyond :data:`~gpupool.sim.traces.MAX_GPU_COUNT`, a job (JobID and Submit, and
    Cluster where given) listed twice, a job that ends before it started (or, never started,
    before it was submitted). A job that started before its Submit time (a requeued job's
    Submit is the requeue) did not wait. A wall time the clock shows twice (the hour it goes
    back) takes the reading that keeps Submit, Start and End in order, else the daylight-saving
    one. The frame's ``attrs["unused"]`` says why a log gave no job.
    """
    path = Path(path)
    lines = _text(path).splitlines()
    if not lines:
        raise HistoryError(f"{path}: empty file, expected a sacct --parsable2 header ({'|'.join(SACCT_COLUMNS)})")
    lines[0] = lines[0].removeprefix("\ufeff")  # a byte-order mark (some editors write one) is no part of the header
    header = lines[0].split("|")
    missing = [c for c in SACCT_COLUMNS if c not in header]
    if missing:
        raise HistoryError(f"{path}: line 1: not sacct --parsable2 output with columns {'|'.join(SACCT_COLUMNS)}; "
                           f"missing {', '.join(missing)}")
    col = {c: header.index(c) for c in SACCT_COLUMNS}
    distinct = [header.index(c) for c in _SACCT_DISTINCT if c in header]
    keep = set(partition) if partition else None
    rows: list[tuple[int, str, str, str, str, str]] = []
    keys: list[tuple] = []  # of every job's record, whichever partition: a repeat is a repeat
    key_lines: list[int] = []
    skipped = {"job steps": 0, "in other partitions": 0}
    for n, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        fields = line.split("|")
        if len(fields) != len(header):
            raise HistoryError(f"{path}: line {n}: {len(fields)} fields, the header names {len(header)}")
        if "." in fields[col["JobID"]]:
            skipped["job steps"] += 1
            continue
        keys.append((fields[col["JobID"]].strip(), fields[col["Submit"]].strip(), *(fields[k] for k in distinct)))
        key_lines.append(n)
        if keep is not None and not keep & set(fields[col["Partition"]].split(",")):
            skipped["in other partitions"] += 1
            continue
        # a pending job's Start is the scheduler's estimate, not a start
        begun = "" if fields[col["State"]].strip().upper() == "PENDING" else fields[col["Start"]]
        rows.append((n, fields[col["Submit"]], begun, fields[col["End"]],
                     fields[col["AllocTRES"]], fields[col["ReqTRES"]]))
    line_no = np.array([r[0] for r in rows], dtype=np.int64)
    refuse_repeats(path, key_lines, keys, lambda k: f"job {shown(k[0])} submitted {shown(k[1])}",
                   "a job counts once: remove the repeated record (or add the Cluster column for several clusters)")
    times = [sacct_times(path, line_no, [r[i] for r in rows], c, timezone, unknown_ok=i > 1)
             for i, c in ((1, "Submit"), (2, "Start"), (3, "End"))]
    # the hour a clock goes back: Start before End settles it, Submit first where it can
    submit, start, end = settle_folds([t[0] for t in times], [t[1] for t in times], required=[(1, 2)],
                                      preferred=[(0, 1), (0, 2)])
    alloc = np.array([_tres_gpus(path, r[0], "AllocTRES", r[4]) for r in rows], dtype=np.int64) * 1000
    req = np.array([_tres_gpus(path, r[0], "ReqTRES", r[5]) for r in rows], dtype=np.int64) * 1000
    started = ~start.isna()
    # a Start before Submit (a requeued job's Submit is its requeue) is no wait, not a bad row
    order(path, line_no, start, end, "Start", "End")
    order(path, line_no, submit, end.where(~started), "Submit", "End")
    # pending from Submit until it started, or (never started) until it ended or the window does
    wait_end = start.where(started, end)
    jobs = intervals(line_no, submit, wait_end, req, start, end, alloc, started)
    skipped["without GPUs"] = int(((alloc == 0) & (req == 0)).sum())
    jobs.attrs["unused"] = unused(len(keys) + skipped["job steps"], skipped, "jobs")
    return jobs


def read_pods(path: str | Path, origin: dt.datetime | pd.Timestamp | None = None, timezone: str = "UTC") -> pd.DataFrame:
    """A pod list's GPU pods as intervals (see :func:`jobs_demand`).

    Times are seconds after ``origin`` (the trace's own zero) or ISO 8601 (naive ones in
    ``timezone``); an empty ``scheduled_time`` is a pod that never ran (pending until deleted),
    an empty ``deletion_time`` one still there (until the window's end). A pod holds ``num_gpu``
    GPUs, or ``gpu_milli``/1000 of one where it asks for one GPU and ``gpu_milli`` is under 1000.
    Refused, naming the file and line: a missing column, a time that does not parse (or is in
    seconds without ``origin``) or lies outside :func:`~gpupool.sim.histparse.span_text`'s span,
    a negative or non-numeric GPU count or one beyond :data:`~gpupool.sim.traces.MAX_GPU_COUNT`,
    a pod (name and creation time, and namespace or uid where given) listed twice, a pod
    scheduled before it was created or deleted before it was scheduled. A naive time the clock
    shows twice takes the reading that keeps the pod's times in order, else the daylight-saving
    one. The frame's ``attrs["unused"]`` says why a list gave no pod.
    """
    path = Path(path)
    text = _text(path)  # not a regular file, too large, not UTF-8 text: one line, before pandas reads
    try:
        raw = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False, skip_blank_lines=False)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise HistoryError(f"{path}: cannot read pod list ({' '.join(str(exc).split())})") from None
    missing = [c for c in POD_COLUMNS if c not in raw.columns]
    if missing:
        raise HistoryError(f"{path}: line 1: not a pod list with columns {','.join(POD_COLUMNS)}; "
                           f"missing {', '.join(missing)}")
    line_no = np.arange(len(raw), dtype=np.int64) + 2
    blank = (raw[list(POD_COLUMNS)].apply(lambda c: c.str.strip()) == "").all(axis=1).to_numpy()
    raw, line_no = raw[~blank].reset_index(drop=True), line_no[~blank]
    distinct = [c for c in _POD_DISTINCT if c in raw.columns]
    keys = list(zip(*(raw[c].str.strip() for c in ("name", "creation_time", *distinct))))
    refuse_repeats(path, line_no, keys, lambda k: f"pod {shown(k[0])} created {shown(k[1])}",
                   "a pod counts once: remove the repeated row (or add a namespace column for several namespaces)")
    zero = None if origin is None else _utc(pd.Timestamp(origin), "UTC")
    times = [pod_times(path, line_no, raw[c], c, zero, timezone, empty_ok=c != "creation_time")
             for c in ("creation_time", "scheduled_time", "deletion_time")]
    created, scheduled, deleted = settle_folds([t[0] for t in times], [t[1] for t in times],
                                               required=[(0, 1), (1, 2), (0, 2)])
    num_gpu = counts(path, line_no, raw["num_gpu"], "num_gpu")
    milli = counts(path, line_no, raw["gpu_milli"], "gpu_milli", scale=1000, empty=np.nan)
    share = (num_gpu == 1) & (milli < 1000)
    gpus_milli = np.where(share, milli, num_gpu * 1000).astype(np.int64)
    ran = ~scheduled.isna()
    order(path, line_no, created, scheduled, "creation_time", "scheduled_time")
    order(path, line_no, scheduled, deleted, "scheduled_time", "deletion_time")
    order(path, line_no, created, deleted, "creation_time", "deletion_time")
    wait_end = scheduled.where(ran, deleted)
    pods = intervals(line_no, created, wait_end, gpus_milli, scheduled, deleted, gpus_milli, ran)
    pods.attrs["unused"] = unused(len(raw), {"without GPUs": int((gpus_milli == 0).sum())}, "pods")
    return pods


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
    text = _text(path).removeprefix("\ufeff")  # a byte-order mark is no part of the JSON
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
    input (:func:`gpupool.tsio.read_series_csv`), in UTC. Refused besides what that reader
    refuses: a column without a number, a negative GPU count or one beyond
    :data:`~gpupool.sim.traces.MAX_GPU_COUNT`, a time outside
    :func:`~gpupool.sim.histparse.span_text`'s span (naive times are checked as written)."""
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
        # a row's line is its place only where no repeated timestamp was merged away
        line_no = np.arange(len(values)) + 2 if duplicates == "refuse" else None
        if np.isnan(values).all():
            key = "value_col" if col == value_col else "pending_col"
            raise HistoryError(f"{path}: column {series.name!r}: no number in its {len(values)} rows (text or empty "
                               f"cells); name the column of GPU counts with {key}")
        with np.errstate(invalid="ignore"):
            bad = np.flatnonzero((values < 0) | (values > MAX_GPU_COUNT))
        if len(bad):
            i = bad[0]
            what = "a negative GPU count" if values[i] < 0 else f"beyond {MAX_GPU_COUNT:,} GPUs (MAX_GPU_COUNT)"
            line = f"line {line_no[i]}, " if line_no is not None else ""
            raise HistoryError(f"{path}: {line}column {series.name!r}: value {float(values[i])!r} is {what}")
        idx = series.index
        # naive times are checked as written, before their zone: a far year need not survive tz_localize
        check_times(str(path), line_no, idx if idx.tz is not None else idx.tz_localize("UTC"),
                    repr(time_col) if time_col else "of times")
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
    """The first and last instant a file entry names (None for a live Prometheus): what a what-if
    over "the whole log" covers. A file that names none is refused, saying why (a log of job
    steps only, of other partitions, of jobs without GPUs; an answer without samples)."""
    why = "no samples"
    if spec.format in ("sacct", "pods"):
        jobs = history_jobs(spec)
        times = pd.concat([jobs["begin"], jobs["end"]]).dropna()
        why = jobs.attrs.get("unused", why)
    elif spec.format == "prometheus" and spec.url is None:
        times = pd.Series(read_prometheus_answer(spec.allocated).index)
    elif spec.format == "csv":
        times = pd.Series(read_csv_columns(spec.path, spec.time_col, spec.value_col, None, spec.timezone,
                                           spec.duplicates)[0].index)
    else:
        return None
    if not len(times):
        raise HistoryError(f"{spec.label()}: {why}, so nothing to take the what-if's window from")
    return times.min(), times.max()


# ------------------------------------------------------------------------------ internals
def _text(path: Path) -> str:
    return inputfiles.read_text(path, "history file", inputfiles.MAX_TRACE_BYTES, HistoryError, decompress=True)


def _utc(ts: pd.Timestamp, timezone: str) -> pd.Timestamp:
    if ts.tzinfo is None:
        return ts.tz_localize(zoneinfo.ZoneInfo(timezone), ambiguous=True, nonexistent="shift_forward").tz_convert("UTC")
    return ts.tz_convert("UTC")


def _tres_gpus(path: Path, line: int, col: str, tres: str) -> int:
    """GPUs of a TRES string (``cpu=8,gres/gpu=2,gres/gpu:a100=2,...``): ``gres/gpu``, else the
    sum of its typed forms; 0 for none."""
    plain, typed = None, 0
    for item in filter(None, (t.strip() for t in tres.split(","))):
        key, _, value = item.partition("=")
        if key == "gres/gpu" or key.startswith("gres/gpu:"):
            count = whole_count(path, line, col, item, value)
            if key == "gres/gpu":
                plain = count
            else:
                typed += count
    return plain if plain is not None else bounded(path, line, col, tres, typed)


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
                t, v = ascii_float(pt[0]), ascii_float(pt[1])
            except (TypeError, ValueError, IndexError, KeyError, OverflowError):  # OverflowError: 10**400
                raise HistoryError(f"{at}: {shown(pt)} is not [time, \"value\"]") from None
            if not math.isfinite(t):
                raise HistoryError(f"{at}: time {shown(pt[0])} is not a time")
            if not in_span(np.array([t]))[0]:
                raise HistoryError(f"{at}: time {shown(pt[0])} is {instant_text(t)}, outside the times a history may "
                                   f"name ({span_text()})")
            if np.isinf(v) or v < 0 or v > MAX_GPU_COUNT:  # NaN (a sum over nothing, 0/0) is a gap
                beyond = f" (at most {MAX_GPU_COUNT:,}: MAX_GPU_COUNT)" if v > MAX_GPU_COUNT else ""
                raise HistoryError(f"{at}: {shown(pt[1])} is not a GPU count{beyond}")
            times.append(t)
            values.append(v)
    if values and np.isnan(values).all():
        raise HistoryError(f"{where}: every value is NaN: no GPU count to read")
    series = pd.Series(values, index=pd.to_datetime(np.asarray(times, float), unit="s", utc=True), dtype=float)
    return series.groupby(level=0).sum(min_count=1).sort_index()


def _frame(running: np.ndarray, pending: np.ndarray, index: pd.DatetimeIndex) -> pd.DataFrame:
    running, pending = np.asarray(running, float), np.asarray(pending, float)
    return pd.DataFrame({"running": running, "pending": pending, "demand": running + pending,
                         "total": 0.0, "util": 0.0}, index=index)
