"""Reading one time series from a CSV, as the `detect` and `forecast` CLIs take it."""

from __future__ import annotations

import contextlib
import errno
import io
import math
import os
import re
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Iterator

import numpy as np
import pandas as pd

from gpupool import inputfiles
from gpupool.errors import UserError, one_line


class SeriesInputError(UserError, ValueError):
    """An input file that does not hold a usable time series."""


#: largest magnitude a value may have: beyond it the detectors' and the forecaster's sums of
#: squares overflow double precision; GPU counts, shares and byte counters stay far below it
MAX_ABS_VALUE = 1e100

#: what ``duplicates=`` may say about a timestamp that repeats an earlier one
DUPLICATE_POLICIES = ("refuse", "first", "last", "mean")

#: a date written day or month first with the year last (``05.01.2026``, ``5/1/26 10:00``): the
#: only form whose reading depends on a convention the file does not state
_DAY_MONTH_YEAR = re.compile(r"^\s*(\d{1,2})([./-])(\d{1,2})\2(\d{4}|\d{2})(?!\d)(.*)$", re.DOTALL)


def read_series_csv(
    path: str | Path,
    time_col: str | None = None,
    value_col: str | None = None,
    dayfirst: bool | None = None,
    duplicates: str = "refuse",
) -> pd.Series:
    """Read a CSV into a float Series indexed by timestamp, in file order.

    By default the time column is the first column that parses as datetimes and the
    value column the first numeric column after it; other columns are ignored.
    Unparseable values become NaN (a gap), never zero. Row order is kept as in the file.
    Timestamps with different UTC offsets in one column are converted to UTC (naive ones are
    then read as UTC too).

    Dates written with the year last (``05.01.2026``, ``05/01/2026``) are read day-first when
    ``dayfirst`` is True, month-first when it is False; when None, the one reading under which
    every such date parses, and refused when both do and give different dates (the file does
    not say which convention it follows). ``duplicates`` says what a timestamp that repeats an
    earlier one gets: ``refuse`` (default: which value is the genuine one cannot be known),
    ``first`` or ``last`` (that row's value, the others dropped) or ``mean`` (of the rows'
    values); the kept row stands where the timestamp first appears.

    Refused with :class:`SeriesInputError` naming the file and the line (line 1 is the header):
    what :func:`gpupool.inputfiles.read_text` refuses (not a regular file, more than
    :data:`~gpupool.inputfiles.MAX_SERIES_BYTES` bytes, not UTF-8 text), a timestamp that does
    not parse (or is empty), an ambiguous date, a repeated timestamp under ``refuse``, and a
    value that is infinite or beyond ±:data:`MAX_ABS_VALUE`.
    """
    path = Path(path)
    if duplicates not in DUPLICATE_POLICIES:
        raise SeriesInputError(f"--duplicates {duplicates!r}: expected one of {', '.join(DUPLICATE_POLICIES)}")
    text = inputfiles.read_text(path, "CSV", inputfiles.MAX_SERIES_BYTES, SeriesInputError, decompress=True)
    try:
        raw = pd.read_csv(io.StringIO(text))
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise SeriesInputError(f"{path}: cannot read CSV ({one_line(str(exc), 200)})") from None
    del text  # the frame holds what it needs: the file's text need not stay in memory beside it
    if raw.empty:
        raise SeriesInputError(f"{path}: no rows")
    cols = list(raw.columns)
    if time_col is None:
        for col in cols:
            order = [dayfirst] if dayfirst is not None else [False, True]
            if any(_parse_times(raw[col], dayfirst=first) is not None for first in order):
                time_col = col
                break
        if time_col is None:
            raise SeriesInputError(f"{path}: no column parses as datetimes; pass --time-col")
    elif time_col not in cols:
        raise SeriesInputError(f"{path}: time column {time_col!r} not in {cols}")
    times = _read_times(path, time_col, raw[time_col], dayfirst)
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
    values = pd.to_numeric(raw[value_col], errors="coerce").astype("float64").to_numpy()
    index = pd.DatetimeIndex(times, name="timestamp")
    _check_values(path, value_col, values)
    if duplicates == "refuse":
        _check_unique(path, time_col, index)
        return pd.Series(values, index=index, name=value_col)
    series = pd.Series(values, index=index, name=value_col)
    if duplicates == "mean":
        return series.groupby(level=0, sort=False).mean()
    first = series[~index.duplicated(keep="first")]
    if duplicates == "first":
        return first
    last = series[~index.duplicated(keep="last")]
    return pd.Series(last.reindex(first.index).to_numpy(), index=first.index, name=value_col)


def _line(row: int) -> int:
    """The file line of a data row (the header is line 1)."""
    return int(row) + 2


def _check_values(path: Path, col: str, values: np.ndarray) -> None:
    with np.errstate(invalid="ignore"):
        bad = ~np.isnan(values) & ~(np.abs(values) <= MAX_ABS_VALUE)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        what = "is not finite" if not math.isfinite(values[i]) else f"is beyond ±{MAX_ABS_VALUE:g}"
        raise SeriesInputError(f"{path}: line {_line(i)}, column {col!r}: value {float(values[i])!r} {what}")


def _check_unique(path: Path, col: str, index: pd.DatetimeIndex) -> None:
    dup = index.duplicated(keep="first") & ~index.isna()
    if dup.any():
        i = int(np.flatnonzero(dup)[0])
        first = int(np.flatnonzero(index == index[i])[0])
        raise SeriesInputError(
            f"{path}: line {_line(i)}, column {col!r}: timestamp {index[i].isoformat()} repeats line {_line(first)}; "
            "give one value per timestamp, or pass --duplicates first|last|mean"
        )


def iso_timestamps(index: pd.DatetimeIndex) -> pd.Index:
    """``index`` as ISO 8601 text the way the CSV modes write it: with the input's UTC offset
    (``+01:00``; ``+00:00`` for times read as UTC) when it had one, none when it was naive."""
    text = pd.DatetimeIndex(index).strftime("%Y-%m-%dT%H:%M:%S%z")
    return text.str.replace(r"([+-]\d\d)(\d\d)$", r"\1:\2", regex=True)


def check_output(target: str | Path, inputs: dict[str, str | Path | None], option: str = "--out") -> Path:
    """Refuse an output path that is one of ``inputs`` (by any name: relative path, symlink,
    hard link), or that :func:`atomic_output` could not write or would replace something it does
    not own, before any work; returns it as a Path. ``inputs`` maps a label ("input",
    "--out file") to a path.

    Accepted: a new file in a writable directory, an existing writable regular file (replaced in
    one step), and a special file written through, never replaced: a character device
    (``/dev/null``, a terminal), a FIFO with a reader, and a path naming an open file
    descriptor (``/dev/stdout``, ``/dev/fd/N``; appended to). Refused, in one line naming the
    path: a missing or unwritable directory, a directory, a symbolic link to a regular file or
    to nothing (it would be replaced, not its target), a FIFO no process reads (the write would
    wait forever), a socket or block device, and a file this process may not write.
    A special file is opened here and held open until :func:`atomic_output` writes it, so a
    FIFO's reader does not see its end before the output comes."""
    from gpupool.errors import UsageError

    out = Path(target)
    for label, given in inputs.items():
        if given is None:
            continue
        src = Path(given)
        same = out.resolve() == src.resolve()
        if not same and out.exists() and src.exists():
            with contextlib.suppress(OSError):
                same = os.path.samefile(out, src)
        if same:
            raise UsageError(f"{option} {out} is the {label} {src}; refusing to overwrite it")
    _check_target(out, option)
    return out


#: a path naming an open file descriptor of this process: written through whatever it leads to
#: (a pipe, a terminal, the file a shell redirected to), as a shell's own redirect would
_DESCRIPTOR = re.compile(r"^/(?:dev/(?:stdout|stderr|fd/\d+)|proc/(?:self|\d+)/fd/\d+)$")

#: special files opened by :func:`check_output`, by absolute path, until :func:`atomic_output` writes them
_THROUGH: dict[str, int] = {}


def _check_target(out: Path, option: str) -> None:
    """Refuse (UsageError) an output :func:`atomic_output` could not write or must not replace;
    open a special file for writing and hold it in ``_THROUGH``."""
    from gpupool.errors import UsageError

    key = os.path.abspath(out)
    if key in _THROUGH:
        return
    try:
        st = os.stat(out)  # through links: what a write would reach
    except FileNotFoundError:
        if os.path.islink(out):
            raise UsageError(f"{option} {out} is a symbolic link to {os.readlink(out)}, which does not exist; "
                             "give the file itself") from None
        _check_directory(out, option)
        return
    except OSError as exc:
        if not out.parent.is_dir():
            _check_directory(out, option)
        raise UsageError(f"{option} {out}: {exc.strerror}") from None
    mode = st.st_mode
    if stat.S_ISDIR(mode):
        raise UsageError(f"{option} {out} is a directory")
    if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode) or (stat.S_ISREG(mode) and _DESCRIPTOR.match(key)):
        _THROUGH[key] = _open_through(out, mode, option)
        return
    if not stat.S_ISREG(mode):
        kind = "a socket" if stat.S_ISSOCK(mode) else "a block device" if stat.S_ISBLK(mode) else "no regular file"
        raise UsageError(f"{option} {out} is {kind}; give a file, a FIFO or a character device")
    if os.path.islink(out):
        raise UsageError(f"{option} {out} is a symbolic link to {os.readlink(out)}; refusing to replace the link: "
                         "give the file it points to, or a new name")
    _check_directory(out, option)
    if not os.access(out, os.W_OK):
        raise UsageError(f"{option} {out} is not writable")
    parent = os.stat(out.parent)
    me = os.geteuid()
    if parent.st_mode & stat.S_ISVTX and me not in (0, st.st_uid, parent.st_uid):
        raise UsageError(f"{option} {out} belongs to another user in a sticky directory ({out.parent}); "
                         "it cannot be replaced: give a new name")


def _check_directory(out: Path, option: str) -> None:
    """Refuse an output whose directory is missing or where this process may not create a file."""
    from gpupool.errors import UsageError

    parent = out.parent
    if not parent.is_dir():
        raise UsageError(f"{option} {out}: directory {parent} does not exist")
    why = unwritable(parent)
    if why:
        raise UsageError(f"{option} {out}: directory {parent} is not writable ({why})")


def unwritable(directory: str | Path) -> str | None:
    """Why no file can be made in ``directory`` (the error's text), or None where one can: found
    by making one and removing it, since permission bits alone do not say it (a superuser, a
    read-only mount, a filesystem such as /proc)."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".gpupool-probe.", dir=directory)
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(probe)
    return None


def _open_through(out: Path, mode: int, option: str) -> int:
    """``out`` (a special file, or a file descriptor's path) opened for appending. A FIFO is
    opened without blocking first: with no process reading it the open fails at once (ENXIO)
    instead of waiting for a reader that may never come."""
    from gpupool.errors import UsageError

    fifo = stat.S_ISFIFO(mode)
    flags = os.O_WRONLY | os.O_APPEND | os.O_NOCTTY | os.O_CLOEXEC | (os.O_NONBLOCK if fifo else 0)
    try:
        fd = os.open(out, flags)
    except OSError as exc:
        if fifo and exc.errno == errno.ENXIO:
            raise UsageError(f"{option} {out} is a FIFO no process reads; start its reader first") from None
        raise UsageError(f"{option} {out}: cannot open it for writing ({exc.strerror})") from None
    if fifo:
        os.set_blocking(fd, True)  # a reader that reads slowly is waited for, as a shell pipe waits
    return fd


@contextlib.contextmanager
def atomic_output(out: str | Path) -> Iterator[Path]:
    """Yield a temporary path to write the output to. On success a regular file replaces
    ``out`` in one step (a reader never sees a half-written file); a special file accepted by
    :func:`check_output` (a character device, a FIFO, a file descriptor's path) is written
    through, never replaced. On failure the temporary is removed and ``out`` left as it was; an
    OSError of the write (a full disk, a reader gone) is a one-line
    :class:`gpupool.errors.UsageError`. ``out`` is checked as :func:`check_output` checks it when
    that was not called first."""
    from gpupool.errors import UsageError

    out = Path(out)
    key = os.path.abspath(out)
    if key not in _THROUGH:
        _check_target(out, "output")
    fd = _THROUGH.pop(key, None)
    tmp: str | None = None
    try:
        # a special file's directory (/dev) is no place for a temporary: the system's is
        tmp_fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent if fd is None else None)
        os.close(tmp_fd)
        if fd is None:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)  # as a plain open() would have created it
        yield Path(tmp)
        if fd is None:
            os.replace(tmp, out)
            tmp = None
        else:
            with open(tmp, "rb") as src, os.fdopen(fd, "wb", closefd=False) as dst:  # O_APPEND: at its end
                shutil.copyfileobj(src, dst)
    except OSError as exc:
        raise UsageError(f"cannot write {out}: {exc.strerror or exc}") from None
    finally:
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def _parse_times(col: pd.Series, dayfirst: bool = False, min_share: float = 0.9) -> pd.DatetimeIndex | None:
    """``col`` as datetimes (year-last dates read as ``dayfirst`` says, strictly: a date that
    reads only the other way is NaT), or None where fewer than ``min_share`` of the values, or
    none at all, parse."""
    if pd.api.types.is_numeric_dtype(col):
        return None
    text = col.where(col.isna(), col.astype(str))
    parts = text.str.extract(_DAY_MONTH_YEAR) if text.notna().any() else pd.DataFrame()
    if len(parts.columns) and parts[0].notna().any():
        dmy = parts[0].notna()
        a, b = parts.loc[dmy, 0].astype(int), parts.loc[dmy, 2].astype(int)
        day, month = (a, b) if dayfirst else (b, a)
        year = parts.loc[dmy, 3].astype(int)
        year = year.where(parts.loc[dmy, 3].str.len() == 4, year + np.where(year < 69, 2000, 1900))
        iso = (year.map("{:04d}".format) + "-" + month.map("{:02d}".format) + "-" + day.map("{:02d}".format)
               + parts.loc[dmy, 4])
        text = text.copy()
        text[dmy] = iso.where(month <= 12, None)  # a month of 13 or more: that reading does not parse
    try:
        parsed = pd.to_datetime(text, errors="coerce", format="mixed")
    except ValueError:  # mixed UTC offsets (or aware and naive together): bring them to UTC
        try:
            parsed = pd.to_datetime(text, errors="coerce", format="mixed", utc=True)
        except (ValueError, TypeError):
            return None
    except TypeError:
        return None
    if parsed.notna().mean() < min_share or parsed.isna().all():
        return None
    return pd.DatetimeIndex(parsed)


def _read_times(path: Path, col: str, raw: pd.Series, dayfirst: bool | None) -> pd.DatetimeIndex:
    """The time column read as :func:`read_series_csv` says; a SeriesInputError naming the line
    of the first value that does not parse, or of a date the two conventions read differently."""
    if dayfirst is not None:
        times = _parse_times(raw, dayfirst=dayfirst, min_share=0.0)  # a line the order refuses is named below
    else:
        month_first, day_first = _parse_times(raw, dayfirst=False), _parse_times(raw, dayfirst=True)
        if month_first is not None and day_first is not None:
            full_m, full_d = month_first.notna().sum(), day_first.notna().sum()
            both = np.asarray(month_first.notna() & day_first.notna())
            differ = both & (month_first.to_numpy() != day_first.to_numpy())
            if full_m == full_d and differ.any():
                i = int(np.flatnonzero(differ)[0])
                raise SeriesInputError(
                    f"{path}: line {_line(i)}, column {col!r}: {raw.iloc[i]!r} reads as {month_first[i].date()} "
                    f"month-first and {day_first[i].date()} day-first, and every date of the column parses "
                    "either way; pass --dayfirst or --no-dayfirst"
                )
            times = day_first if full_d > full_m else month_first
        else:
            times = month_first if month_first is not None else day_first
    if times is None:
        raise SeriesInputError(f"{path}: column {col!r} does not parse as datetimes")
    if times.isna().any():
        i = int(np.flatnonzero(times.isna())[0])
        value = raw.iloc[i]
        what = "the timestamp is empty" if pd.isna(value) or not str(value).strip() else f"{value!r} is not a timestamp"
        order = "" if dayfirst is None else (" read day-first" if dayfirst else " read month-first")
        raise SeriesInputError(
            f"{path}: line {_line(i)}, column {col!r}: {what}{order} "
            f"({int(times.isna().sum())} such rows); fix or remove them"
        )
    return times
