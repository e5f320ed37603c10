"""The reads of staging that the Prometheus metrics make (:mod:`gpupool.metrics`), beside
:mod:`gpupool.staging.reads`: counts and newest instants, grouped in SQL so that a scrape
reads a few rows, not a history. Like ``reads`` this module knows tables, not stages.
"""

from __future__ import annotations

from datetime import datetime

import pandas as pd
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from gpupool.staging.schema import clean_sample, handover, sample


def newest_sample_times(engine: Engine, at: datetime) -> dict[str, datetime]:
    """Per platform, the time of its newest staged sample at or before ``at``."""
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(sample.c.platform, sa.func.max(sample.c.ts)).where(sample.c.ts <= at).group_by(sample.c.platform)
        ).all()
    return {r[0]: r[1] for r in rows}


def point_counts(engine: Engine, start: datetime, end: datetime) -> dict[str, tuple[int, int]]:
    """Per platform, (alarms, cleaned points) among the detected points in [start, end):
    ``is_anomaly`` and ``cleaned`` are two decisions, so the two counts differ."""
    c = clean_sample.c
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(c.platform, sa.func.sum(sa.case((c.is_anomaly, 1), else_=0)),
                      sa.func.sum(sa.case((c.cleaned, 1), else_=0)))
            .where(c.ts >= start, c.ts < end).group_by(c.platform)
        ).all()
    return {r[0]: (int(r[1] or 0), int(r[2] or 0)) for r in rows}


def handover_counts(engine: Engine, at: datetime) -> list[tuple[str, str, str, bool, int]]:
    """(state, source, target, dry_run, count) of the handovers created at or before ``at``."""
    h = handover.c
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(h.state, h.from_platform, h.to_platform, h.dry_run, sa.func.count())
            .where(h.created_at <= at)
            .group_by(h.state, h.from_platform, h.to_platform, h.dry_run)
        ).all()
    return [(r[0], r[1], r[2], bool(r[3]), int(r[4])) for r in rows]


def handovers_past_deadline(engine: Engine, at: datetime, open_states: tuple[str, ...]) -> list[tuple[str, str, int]]:
    """(source, target, count) of the live handovers still in ``open_states`` whose deadline
    passed at or before ``at``."""
    h = handover.c
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(h.from_platform, h.to_platform, sa.func.count())
            .where(h.state.in_(open_states), h.dry_run.is_(False), h.deadline.is_not(None), h.deadline <= at,
                   h.created_at <= at)
            .group_by(h.from_platform, h.to_platform)
        ).all()
    return [(r[0], r[1], int(r[2])) for r in rows]


def finished_handovers(engine: Engine, at: datetime, state: str) -> pd.DataFrame:
    """The handovers that reached ``state`` at or before ``at``: source, target, dry_run,
    created_at, updated_at (UTC)."""
    h = handover.c
    q = sa.select(h.from_platform.label("source"), h.to_platform.label("target"), h.dry_run, h.created_at,
                  h.updated_at).where(h.state == state, h.updated_at <= at)
    with engine.connect() as conn:
        frame = pd.read_sql(q, conn)
    for col in ("created_at", "updated_at"):
        frame[col] = pd.to_datetime(frame[col], utc=True)
    return frame


def platform_totals_wide(engine: Engine, platform: str, start: datetime, end: datetime) -> pd.DataFrame:
    """The platform's raw totals in [start, end] as reported: one row per instant (UTC, sorted),
    one column per metric (NaN where the metric has no point at that instant)."""
    q = sa.select(sample.c.metric, sample.c.ts, sample.c.value).where(
        sample.c.platform == platform, sample.c.entity_kind == "platform", sample.c.ts >= start, sample.c.ts <= end)
    with engine.connect() as conn:
        raw = pd.read_sql(q, conn)
    if raw.empty:
        return pd.DataFrame()
    raw["ts"] = pd.to_datetime(raw["ts"], utc=True)
    # a platform reporting per cluster has one total per cluster: the platform's is their sum
    return raw.pivot_table(index="ts", columns="metric", values="value", aggfunc="sum").sort_index()
