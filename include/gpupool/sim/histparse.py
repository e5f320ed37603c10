"""The fields of a platform's history, parsed and checked: times, GPU counts, repeated records.

:mod:`gpupool.sim.history` reads the files; this module turns their fields into instants and
counts and refuses what cannot be one. Every refusal is a :class:`HistoryError` of one line
naming the file, the line (the header is line 1) and the field, showing at most a short,
escaped piece of the bad value. The bounds are :data:`~gpupool.sim.traces.MAX_GPU_COUNT` for a
count and :data:`~gpupool.sim.traces.EARLIEST_TIME` .. :data:`~gpupool.sim.traces.LATEST_TIME`
for an instant, shared with the Helios reader.
"""

from __future__ import annotations

import datetime as dt
import itertools
import math
import re
import zoneinfo
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpupool.sim.traces import EARLIEST_TIME, LATEST_TIME, MAX_GPU_COUNT, TraceError

#: what sacct writes for a time that has not happened (a pending job's Start, a running job's End)
SACCT_UNKNOWN = {"", "unknown", "none"}
#: the only form of a whole number a count field may take: ASCII digits (Python's int() would
#: also take ``1_0`` and other scripts' digits)
_DIGITS = re.compile(r"[0-9]+")
_SACCT_TIME = "%Y-%m-%dT%H:%M:%S"
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


class HistoryError(TraceError):
    """A history file (or server) that cannot be read as demand; names the file and line."""


def shown(value: Any, limit: int = 40) -> str:
    """``value`` as a message shows it: ``repr`` (quoted, control characters escaped), cut to
    ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def span_text() -> str:
    """The instants a history may name, as messages say them."""
    return f"{EARLIEST_TIME:%Y-%m-%d} .. {LATEST_TIME:%Y-%m-%d}"


def instant_text(seconds: float) -> str:
    """An instant given in seconds from 1970 as ISO 8601, also where pandas cannot hold it."""
    try:
        return (_EPOCH + dt.timedelta(seconds=seconds)).isoformat()
    except OverflowError:
        return "after the year 9999" if seconds > 0 else "before the year 1"


def epoch_seconds(ts: pd.Timestamp | dt.datetime) -> float:
    """Seconds of ``ts`` (tz-aware) from 1970, without pandas' nanosecond range."""
    return (pd.Timestamp(ts).to_pydatetime() - _EPOCH).total_seconds()


def in_span(seconds: np.ndarray) -> np.ndarray:
    """Which of ``seconds`` (from 1970; NaN: none) lie in the span history times may have."""
    lo, hi = epoch_seconds(EARLIEST_TIME), epoch_seconds(LATEST_TIME)
    with np.errstate(invalid="ignore"):
        return np.isnan(seconds) | ((seconds >= lo) & (seconds < hi))


def check_times(where: str, line_no: np.ndarray | None, times: pd.Series | pd.Index, col: str) -> None:
    """Refuse the first of ``times`` (tz-aware; NaT allowed) outside :func:`span_text`'s span,
    naming its line (``line_no`` None: the file's lines cannot be told) and year."""
    values = pd.Series(pd.DatetimeIndex(times))
    bad = (values.notna() & ((values < EARLIEST_TIME) | (values >= LATEST_TIME))).to_numpy()
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        line = f"line {line_no[i]}, " if line_no is not None else ""
        raise HistoryError(f"{where}: {line}column {col}: {values.iloc[i].isoformat()} is outside the times a history "
                           f"may name ({span_text()})")


def whole_count(path: Path, line: int, col: str, item: str, value: str) -> int:
    """A GPU count written as ASCII digits, at most :data:`MAX_GPU_COUNT`."""
    value = value.strip()
    if not _DIGITS.fullmatch(value):
        raise HistoryError(f"{path}: line {line}, column {col}: {shown(item)} is not a whole GPU count")
    return bounded(path, line, col, item, int(value))


def bounded(path: Path, line: int, col: str, item: str, count: int | float) -> int | float:
    """``count`` unchanged, or refused when beyond :data:`MAX_GPU_COUNT`."""
    if count > MAX_GPU_COUNT:
        raise HistoryError(f"{path}: line {line}, column {col}: {shown(item)} is beyond {MAX_GPU_COUNT:,} GPUs "
                           "(MAX_GPU_COUNT)")
    return count


def ascii_float(value: Any) -> float:
    """``float(value)`` for a JSON number or ASCII text; ValueError for anything else (Python's
    float() would take ``1_0`` and other scripts' digits, and True)."""
    if isinstance(value, bool) or (isinstance(value, str) and (not value.isascii() or "_" in value)):
        raise ValueError(value)
    return float(value)


# ---------------------------------------------------------------------------------- times
def sacct_times(path: Path, line_no: np.ndarray, values: list[str], col: str, timezone: str,
                unknown_ok: bool) -> tuple[pd.Series, pd.Series]:
    """sacct's local times (``2023-04-26T10:00:00``) in UTC, both readings (:func:`readings`);
    NaT for Unknown where allowed."""
    text = pd.Series(values, dtype=object).str.strip()
    unknown = text.str.lower().isin(SACCT_UNKNOWN)
    ascii_ = text.str.isascii()
    parsed = pd.to_datetime(text.where(~unknown & ascii_), format=_SACCT_TIME, errors="coerce")
    bad = (parsed.isna() & ~unknown) | (unknown & (not unknown_ok))
    if bad.any():
        i = int(np.flatnonzero(bad.to_numpy())[0])
        raise HistoryError(f"{path}: line {line_no[i]}, column {col}: {shown(values[i])} is not a time "
                           "(expected YYYY-MM-DDTHH:MM:SS" + (" or Unknown)" if unknown_ok else ")"))
    naive = pd.Series(parsed)
    check_times(str(path), line_no, naive.dt.tz_localize("UTC"), col)  # as written: a far year may defeat the zone
    return readings(naive, timezone)


def readings(naive: pd.Series, timezone: str) -> tuple[pd.Series, pd.Series]:
    """Local wall times in UTC, twice: the earlier and the later reading of each. They differ only
    in the hour a clock goes back, which happens twice (:func:`settle_folds` picks); a time the
    clock skipped reads as the instant the clock jumped to."""
    idx = pd.DatetimeIndex(naive)
    zone = zoneinfo.ZoneInfo(timezone)
    a = idx.tz_localize(zone, ambiguous=np.ones(len(idx), bool), nonexistent="shift_forward").tz_convert("UTC")
    b = idx.tz_localize(zone, ambiguous=np.zeros(len(idx), bool), nonexistent="shift_forward").tz_convert("UTC")
    early = pd.Series(a.where(a <= b, b) if len(idx) else a)
    late = pd.Series(b.where(a <= b, a) if len(idx) else b)
    return early, late


def settle_folds(early: list[pd.Series], late: list[pd.Series], required: list[tuple[int, int]],
                 preferred: list[tuple[int, int]] = ()) -> list[pd.Series]:
    """One reading of each time of a row (columns ``early[k]``/``late[k]``): where a time lies in
    the hour a clock goes back, the reading that keeps the row's times in order (``(a, b)`` in
    ``required``, then ``preferred``: column a not after column b); where the order leaves a choice,
    the earlier (daylight-saving) reading. A row no reading orders keeps the earlier readings, for
    the order check to refuse."""
    out = [e.copy() for e in early]
    if not len(out[0]):
        return out
    e = [_instants(s) for s in early]
    lt = [_instants(s) for s in late]
    folded = np.zeros(len(out[0]), bool)
    for a, b in zip(e, lt):
        folded |= a != b
    for i in np.flatnonzero(folded):
        cols = [k for k in range(len(e)) if e[k][i] != lt[k][i]]
        best, pick = None, None
        for choice in itertools.product((False, True), repeat=len(cols)):
            t = [e[k][i] for k in range(len(e))]
            for k, later in zip(cols, choice):
                if later:
                    t[k] = lt[k][i]
            score = (_disorder(t, required), _disorder(t, preferred), sum(choice))
            if best is None or score < best:
                best, pick = score, choice
        for k, later in zip(cols, pick):
            if later:
                out[k].iloc[i] = late[k].iloc[i]
    return out


def _instants(s: pd.Series) -> np.ndarray:
    """Integer instants of ``s`` (NaT: a sentinel never out of order)."""
    return pd.DatetimeIndex(s).as_unit("us").asi8.copy()


def _disorder(t: list[int], pairs) -> int:
    nat = np.iinfo(np.int64).min
    return sum(1 for a, b in pairs if t[a] != nat and t[b] != nat and t[b] < t[a])


def pod_times(path: Path, line_no: np.ndarray, col: pd.Series, name: str, origin: pd.Timestamp | None,
              timezone: str, empty_ok: bool) -> tuple[pd.Series, pd.Series]:
    """A pod list's time column in UTC, both readings (:func:`readings`; they differ only for a
    naive ISO time in the hour a clock goes back): seconds after ``origin``, or ISO 8601; NaT
    where empty."""
    text = col.astype(object).str.strip()
    seconds = pd.to_numeric(text, errors="coerce").to_numpy(float)
    zero = None if origin is None else epoch_seconds(origin)
    origin_ok = zero is not None and in_span(np.array([zero]))[0]
    if origin_ok and np.isfinite(seconds).all() and in_span(zero + seconds).all():
        at = pd.Series(origin + pd.to_timedelta(seconds, unit="s"))  # the usual list: all seconds, at once
        return at, at
    early, late = [], []
    for i, value in enumerate(text):
        where = f"{path}: line {line_no[i]}, column {name}"
        if not value:
            if not empty_ok:
                raise HistoryError(f"{where}: empty, a pod has a creation time")
            early.append(pd.NaT)
            late.append(pd.NaT)
            continue
        try:
            secs = ascii_float(value)
        except ValueError:
            secs = None
        if secs is not None:
            if zero is None:
                raise HistoryError(f"{where}: {shown(value)} is seconds from the trace's origin; give origin (the "
                                   "instant second 0 stands for)")
            if not math.isfinite(secs):
                raise HistoryError(f"{where}: {shown(value)} is not a time")
            if not in_span(np.array([zero + secs]))[0]:
                raise HistoryError(f"{where}: {shown(value)} seconds from origin is {instant_text(zero + secs)}, "
                                   f"outside the times a history may name ({span_text()})")
            early.append(origin + pd.Timedelta(seconds=secs) if origin_ok
                         else pd.Timestamp(zero + secs, unit="s", tz="UTC"))
            late.append(early[-1])
            continue
        try:
            ts = pd.Timestamp(value) if value.isascii() else None
        except (ValueError, TypeError, OverflowError):
            ts = None
        if ts is None or ts is pd.NaT:
            raise HistoryError(f"{where}: {shown(value)} is neither seconds nor an ISO 8601 time")
        if ts.tzinfo is not None:
            ts = ts.tz_convert("UTC")
            check_times(str(path), line_no[i:i + 1], pd.DatetimeIndex([ts]), name)
            early.append(ts)
            late.append(ts)
            continue
        check_times(str(path), line_no[i:i + 1], pd.DatetimeIndex([ts.tz_localize("UTC")]), name)
        a, b = readings(pd.Series([ts]), timezone)
        early.append(a.iloc[0])
        late.append(b.iloc[0])
    return _utc_series(early), _utc_series(late)


def _utc_series(values: list) -> pd.Series:
    return pd.Series(pd.DatetimeIndex(values, tz="UTC") if values else pd.DatetimeIndex([], tz="UTC"))


# ---------------------------------------------------------------------------------- counts
def counts(path: Path, line_no: np.ndarray, col: pd.Series, name: str, scale: int = 1,
           empty: float | None = None) -> np.ndarray:
    """A pod list's count column (a whole number, 0 or more, at most ``scale`` x
    :data:`MAX_GPU_COUNT`; ``empty`` for a blank cell where given)."""
    text = col.astype(object).str.strip()
    values = pd.to_numeric(text, errors="coerce").to_numpy(float)
    blank = (text == "").to_numpy()
    if empty is not None:
        values = np.where(blank, empty, values)
    with np.errstate(invalid="ignore"):
        bad = (np.isnan(values) & ~(blank & (empty is not None))) | (values < 0) | np.isinf(values)
        bad |= ~np.isnan(values) & (values != np.round(values))
        over = ~bad & (values > scale * MAX_GPU_COUNT)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise HistoryError(f"{path}: line {line_no[i]}, column {name}: {shown(col.iloc[i])} is not a GPU count "
                           "(a whole number, 0 or more)")
    if over.any():
        i = int(np.flatnonzero(over)[0])
        unit = "GPUs" if scale == 1 else "thousandths of a GPU"
        raise HistoryError(f"{path}: line {line_no[i]}, column {name}: {shown(col.iloc[i])} is beyond "
                           f"{scale * MAX_GPU_COUNT:,} {unit} (MAX_GPU_COUNT)")
    return values


# ----------------------------------------------------------------------------- records
def refuse_repeats(path: Path, line_no: np.ndarray, keys: list[tuple], what: Callable[[tuple], str],
                   hint: str) -> None:
    """Refuse a record whose key (``keys[i]``, of line ``line_no[i]``) repeats an earlier one's:
    a job counted twice would double its GPU-hours. ``what(key)`` names the record in the message."""
    seen: dict[tuple, int] = {}
    for n, key in zip(line_no, keys):
        first = seen.setdefault(key, int(n))
        if first != n:
            raise HistoryError(f"{path}: line {n}: {what(key)} repeats line {first}; {hint}")


def order(path: Path, line_no: np.ndarray, first: pd.Series, then: pd.Series, a: str, b: str) -> None:
    """Refuse the first row whose ``then`` precedes its ``first`` (both known)."""
    bad = (~first.isna() & ~then.isna() & (then < first)).to_numpy()
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise HistoryError(f"{path}: line {line_no[i]}: {b} {then.iloc[i]} is before {a} {first.iloc[i]}")


def intervals(line_no, wait_begin, wait_end, wait_milli, run_begin, run_end, run_milli, ran) -> pd.DataFrame:
    """The pending and running boxes of a log's rows (``kind, begin, end, milli, line``); a box of
    no GPUs is left out."""
    ran = np.asarray(ran, bool)
    # the times' own arrays: to_numpy() would make an object of every tz-aware instant
    pending = pd.DataFrame({"kind": "pending", "begin": wait_begin.array, "end": wait_end.array,
                            "milli": np.asarray(wait_milli, np.int64), "line": line_no})
    running = pd.DataFrame({"kind": "running", "begin": run_begin.array, "end": run_end.array,
                            "milli": np.asarray(run_milli, np.int64), "line": line_no})[ran]
    jobs = pd.concat([pending, running], ignore_index=True)
    jobs = jobs[jobs["milli"] > 0]
    for c in ("begin", "end"):
        jobs[c] = pd.to_datetime(jobs[c], utc=True)
    return jobs.reset_index(drop=True)


def unused(rows: int, skipped: dict[str, int], kind: str) -> str:
    """Why a log gave no usable ``kind`` (jobs, pods): its rows and what each skip took."""
    if not rows:
        return f"no {kind}: no rows below the header"
    parts = [f"{why}: {n}" for why, n in skipped.items() if n]
    return f"no usable {kind} in {rows} row{'s' if rows != 1 else ''}" + (f" ({', '.join(parts)})" if parts else "")
