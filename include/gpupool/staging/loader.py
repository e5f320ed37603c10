"""Idempotent loading: one (source, window) slice replaced per transaction.

Delete the slice, then COPY (psycopg 3) on PostgreSQL or executemany on SQLite, in one
transaction: rerunning a window yields identical rows, and a failure midway rolls back
to the previous rows.
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass
from datetime import datetime

import numpy as np
import pandas as pd
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from gpupool.errors import UserError
from gpupool.staging import db
from gpupool.staging.schema import metadata


class LoadError(UserError, RuntimeError):
    """A slice that could not be loaded; the previous rows of the slice are intact."""


@dataclass(frozen=True)
class Slice:
    """What one load replaces: rows of `table` matching `match` with ts in [start, end), except
    those whose column starts with a prefix of `foreign` (another writer's rows: a platform's
    extract leaves the rows its nodes' agents staged, `canonical.COLLECTOR_CLUSTER_PREFIX`)."""

    table: str
    match: dict[str, str]
    start: datetime
    end: datetime
    ts_column: str = "ts"
    foreign: tuple[tuple[str, str], ...] = ()

    def describe(self) -> str:
        keys = ", ".join([f"{k}={v}" for k, v in self.match.items()] + [f"{k}!={v}*" for k, v in self.foreign])
        return f"{self.table}[{keys}] window [{self.start.isoformat()}, {self.end.isoformat()})"

    def where(self, table: sa.Table) -> list:
        """The slice's rows of ``table`` (the slice's own table, or part_sample for sample)."""
        cond = [table.c[k] == v for k, v in self.match.items()]
        cond += [sa.not_(table.c[k].startswith(v, autoescape=True)) for k, v in self.foreign]
        return cond + [table.c[self.ts_column] >= self.start, table.c[self.ts_column] < self.end]


def replace_slice(engine: Engine, sl: Slice, frame: pd.DataFrame) -> int:
    """Replace the slice's rows by `frame` in one transaction; returns rows written.

    Every row of `frame` must lie inside the slice (its match columns and its window):
    a row outside would survive the next rerun's delete and break idempotency.
    """
    return replace_slices(engine, [(sl, frame)])[0]


def replace_slices(engine: Engine, parts: list[tuple[Slice, pd.DataFrame]], then=None) -> list[int]:
    """Replace several slices in ONE transaction: all of them are written, or none is and
    every slice keeps its previous rows. `then(conn, rows)`, if given, runs last in the same
    transaction (e.g. to record the outcome). Returns the rows written per slice."""
    prepared = [(sl, _prepare(sl, frame)) for sl, frame in parts]
    current = None
    try:
        with engine.begin() as conn:
            for sl, frame in prepared:
                current = sl
                _write(conn, sl, frame)
            current = None
            if then is not None:
                then(conn, [len(frame) for _, frame in prepared])
    except Exception as exc:  # any failure rolls every slice back
        where = current.describe() if current is not None else "load"
        raise LoadError(f"{where}: load failed, previous rows kept ({_short(exc)})") from exc
    return [len(frame) for _, frame in prepared]


def promote_parts(engine: Engine, sl: Slice, parts: list[str], extra: pd.DataFrame | None = None,
                  also: list[tuple[Slice, pd.DataFrame]] = (), then=None, expect: int | None = None) -> int:
    """Replace the `sample` slice `sl` by what the parts named `parts` landed in `part_sample`
    for it (same match and window), plus the rows of `extra`, in ONE transaction; the slices
    of `also` are replaced in it too, and `then(conn, rows)` runs last. Every part's rows for
    the slice's window are then cleared from `part_sample` (those of other, stale part names
    too). On any failure nothing changes: `sample` keeps its previous rows and the parts keep
    theirs; `expect` (the rows the parts say they landed) found otherwise is such a failure.
    Returns the rows now in the slice."""
    if sl.table != "sample":
        raise LoadError(f"{sl.describe()}: parts are promoted into sample only")
    src = metadata.tables["part_sample"]
    dst = metadata.tables["sample"]
    extra = _prepare(sl, extra if extra is not None else pd.DataFrame(columns=[c.name for c in dst.columns]))
    prepared = [(s_, _prepare(s_, f)) for s_, f in also]
    cols = [c.name for c in dst.columns]
    in_window = sl.where(src)
    current = sl
    try:
        with engine.begin() as conn:
            _write(conn, sl, extra)  # delete the slice, write the extra rows
            chosen = [*in_window, src.c.part.in_(parts)]
            # counted, not taken from the INSERT: its rowcount is -1 through SQLAlchemy on psycopg
            moved = conn.execute(sa.select(sa.func.count()).select_from(src).where(*chosen)).scalar()
            if expect is not None and moved != expect:
                raise LoadError(f"the parts landed {expect} rows but {moved} are there: rerun the parts")
            conn.execute(dst.insert().from_select(cols, sa.select(*[src.c[c] for c in cols]).where(*chosen)))
            conn.execute(src.delete().where(*in_window))
            for s_, f in prepared:
                current = s_
                _write(conn, s_, f)
            current = None
            rows = len(extra) + int(moved or 0)
            if then is not None:
                then(conn, rows)
    except Exception as exc:  # everything rolls back: sample and the parts as they were
        where = current.describe() if current is not None else "promote"
        raise LoadError(f"{where}: promoting parts failed, previous rows kept ({_short(exc)})") from exc
    return rows


def _prepare(sl: Slice, frame: pd.DataFrame) -> pd.DataFrame:
    table = metadata.tables[sl.table]
    cols = [c.name for c in table.columns if not (c.primary_key and c.autoincrement is True and c.name == "id")]
    missing = [c for c in cols if c not in frame.columns and not table.c[c].nullable and table.c[c].server_default is None]
    if missing:
        raise LoadError(f"{sl.describe()}: frame lacks columns {missing}")
    frame = frame.reindex(columns=[c for c in cols if c in frame.columns])
    _check_inside(sl, frame)
    json_cols = [c for c in frame.columns if isinstance(table.c[c].type, sa.JSON)]
    if json_cols:  # plain Python values (no numpy scalars), the same for COPY and INSERT
        frame = frame.copy()
        for c in json_cols:
            frame[c] = [None if v is None else json.loads(json_text(v)) for v in frame[c].tolist()]
    return frame


def _write(conn: sa.Connection, sl: Slice, frame: pd.DataFrame) -> None:
    """Delete the slice and write `frame` on the caller's transaction."""
    table = metadata.tables[sl.table]
    if sl.table == "sample":
        db.ensure_partitions(conn, sl.start, sl.end)
    conn.execute(table.delete().where(*sl.where(table)))
    if len(frame):
        if conn.dialect.name == "postgresql":
            _copy(conn, table, frame)
        else:
            conn.execute(table.insert(), records(frame))


def _check_inside(sl: Slice, frame: pd.DataFrame) -> None:
    if frame.empty:
        return
    for key, value in sl.match.items():
        if key in frame.columns:
            bad = frame[key].astype(str) != str(value)
            if bad.any():
                raise LoadError(f"{sl.describe()}: {int(bad.sum())} rows have {key} != {value!r}")
    for key, prefix in sl.foreign:
        if key in frame.columns:
            bad = frame[key].astype(str).str.startswith(prefix)
            if bad.any():
                raise LoadError(f"{sl.describe()}: {int(bad.sum())} rows have a {key} starting {prefix!r}, "
                                "which another writer's rows have")
    ts = pd.to_datetime(frame[sl.ts_column], utc=True)
    start, end = pd.Timestamp(sl.start), pd.Timestamp(sl.end)
    outside = (ts < start) | (ts >= end)
    if outside.any():
        raise LoadError(
            f"{sl.describe()}: {int(outside.sum())} rows outside the window, first at {ts[outside].iloc[0]}"
        )


def _copy(conn: sa.Connection, table: sa.Table, frame: pd.DataFrame, chunk_rows: int = 50_000) -> None:
    """COPY the frame as CSV through psycopg 3 on the transaction's own connection.

    Rows are formatted in chunks and handed to COPY as they are ready: psycopg writes
    from a worker thread, so the server ingests one chunk while the next is formatted.
    """
    cols = list(frame.columns)
    not_null_text = [
        c for c in cols if isinstance(table.c[c].type, (sa.String, sa.Text)) and not table.c[c].nullable
    ]
    options = "FORMAT csv"
    if not_null_text:
        options += ", FORCE_NOT_NULL (" + ", ".join(f'"{c}"' for c in not_null_text) + ")"
    sql = f'COPY "{table.name}" (' + ", ".join(f'"{c}"' for c in cols) + f") FROM STDIN ({options})"
    raw = conn.connection.driver_connection
    with raw.cursor() as cur, cur.copy(sql) as copy:
        for i in range(0, len(frame), chunk_rows):
            copy.write(_csv_chunk(table, frame.iloc[i : i + chunk_rows]))


def _csv_chunk(table: sa.Table, part: pd.DataFrame) -> str:
    """Format rows as PostgreSQL CSV. Column by column rather than pandas' `to_csv`, which
    is three times slower on the long string columns of the canonical format."""
    columns = []
    for c in part.columns:
        columns.append(_csv_column(part[c], table.c[c].type))
    lines = "\n".join(map(",".join, zip(*columns)))
    return lines + "\n" if lines else ""


_NEEDS_QUOTES = re.compile(r'[,"\n\r]')


def _quote(text: str) -> str:
    return '"' + text.replace('"', '""') + '"' if _NEEDS_QUOTES.search(text) else text


def _csv_column(col: pd.Series, kind):
    n = len(col)
    if isinstance(kind, sa.DateTime):
        utc = pd.to_datetime(col, utc=True).dt.tz_localize(None).to_numpy()
        text = np.datetime_as_string(utc, unit="us").tolist()
        return ["" if t == "NaT" else t + "+00" for t in text]
    if isinstance(kind, sa.Boolean):
        return ["" if v is None or v != v else ("t" if v else "f") for v in col.tolist()]
    if isinstance(kind, sa.Float):
        # repr is the shortest text that round-trips: the database gets the exact value
        return ["" if v is None or v != v else repr(v) for v in col.astype("float64").tolist()]
    if isinstance(kind, sa.Integer):
        return ["" if v is None or v != v else str(int(v)) for v in col.tolist()]
    if isinstance(kind, sa.JSON):
        # serialized here, as SQLAlchemy's own JSON type does for an INSERT: COPY bypasses
        # the dialect's bind processors (psycopg's has none for JSON)
        return ["" if v is None else _quote(json_text(v)) for v in col.tolist()]
    values = col.tolist()
    if n and col.nunique(dropna=False) == 1 and values[0] is not None and values[0] == values[0]:
        return itertools.repeat(_quote(str(values[0])), n)
    return ["" if v is None or v != v else _quote(str(v)) for v in values]


def json_text(value) -> str:
    """The JSON text of a JSON column's value, numpy scalars and arrays included."""
    return json.dumps(value, default=_json_default)


def _json_default(obj):
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def records(frame: pd.DataFrame) -> list[dict]:
    """The rows of `frame` as dicts of plain Python values, as a driver binds them: datetimes
    as `datetime`, numpy scalars as Python ones, missing values (NaN, NaT) as None."""
    out = frame.copy(deep=False)
    for c in out.columns:
        if pd.api.types.is_datetime64_any_dtype(out[c]):
            out[c] = pd.Series(out[c].dt.to_pydatetime(), index=out.index, dtype=object)
    out = out.astype(object).where(out.notna(), None)
    recs = out.to_dict("records")
    for r in recs:
        for k, v in r.items():
            if isinstance(v, np.generic):
                r[k] = v.item()
    return recs


def _short(exc: Exception) -> str:
    text = str(getattr(exc, "orig", exc)).strip().splitlines()
    return text[0] if text else type(exc).__name__
