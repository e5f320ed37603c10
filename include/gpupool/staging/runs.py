"""The extraction bookkeeping: each run's `extract_run` row and each window's `extract_part` plan.

This module knows its two tables and no stage. A run's row is inserted `running` in a
transaction of its own, marked `success` in the transaction that lands its rows (the loader's
`then`), or `failed`/`unrecoverable` with the error in a transaction of its own; a plan
replaces the platform's earlier plan of the window in one transaction.
"""

from __future__ import annotations

from datetime import datetime, timezone

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from gpupool.staging.schema import extract_part, extract_run


def start_extract_run(engine: Engine, platform: str, source: str, start: datetime, end: datetime,
                      part: str | None = None) -> int:
    """Insert this run's `running` row and return its id; an earlier run of the same platform,
    source, window and part still `running` never finished (its worker died or was killed):
    mark it `interrupted`.

    Decided from the table alone, not from the clock: a run of a window supersedes any earlier
    unfinished run of that window (runs of one window are serialized by the DAG's
    `max_active_runs=1` and by the one CLI user), so no age threshold, and no wall-clock read
    decides anything; `started_at`/`finished_at` are audit only."""
    now = datetime.now(timezone.utc)  # audit only; never decides anything
    key = [extract_run.c.platform == platform, extract_run.c.source == source,
           extract_run.c.window_start == start, extract_run.c.window_end == end,
           extract_run.c.part.is_(None) if part is None else extract_run.c.part == part]
    with engine.begin() as conn:
        res = conn.execute(
            extract_run.insert().values(
                platform=platform, source=source, window_start=start, window_end=end,
                status="running", started_at=now, part=part,
            )
        )
        run_id = res.inserted_primary_key[0]
        conn.execute(
            extract_run.update()
            .where(*key, extract_run.c.status == "running", extract_run.c.id < run_id)
            .values(status="interrupted", finished_at=now,
                    error=f"interrupted: never finished; superseded by extract run #{run_id} of the same window")
        )
        return run_id


def finish_extract_run(conn: sa.Connection, run_id: int, status: str, rows: int | None, error: str | None) -> None:
    """Record the run's outcome on `conn`, inside the caller's transaction (the one that
    lands the run's rows, so the rows and the `success` commit together)."""
    conn.execute(
        extract_run.update()
        .where(extract_run.c.id == run_id)
        .values(status=status, rows=rows, error=error, finished_at=datetime.now(timezone.utc))
    )


def fail_extract_run(engine: Engine, run_id: int, exc: Exception) -> None:
    """Record why an extraction (a platform's, a part's or a finish) failed, in a transaction
    of its own: `unrecoverable` when the error says so, else `failed`."""
    status = "unrecoverable" if getattr(exc, "unrecoverable", False) else "failed"
    with engine.begin() as conn:
        finish_extract_run(conn, run_id, status, None, f"{type(exc).__name__}: {exc}")


def replace_extract_plan(engine: Engine, platform: str, start: datetime, end: datetime,
                         parts: list[tuple[str, list[str] | None]]) -> None:
    """Replace the platform's extraction plan of the window by `parts`, each `(name, nodes)`
    in plan order (`nodes` None for the platform-wide part), in one transaction; no parts
    (a platform extracted whole) leaves it with no plan."""
    rows = [{"platform": platform, "window_start": start, "window_end": end, "part": name,
             "position": i, "parts": len(parts), "nodes": None if nodes is None else list(nodes)}
            for i, (name, nodes) in enumerate(parts)]
    with engine.begin() as conn:
        conn.execute(extract_part.delete().where(
            extract_part.c.platform == platform, extract_part.c.window_start == start,
            extract_part.c.window_end == end))
        if rows:
            conn.execute(extract_part.insert(), rows)
