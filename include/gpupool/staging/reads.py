"""Every read of staging that a stage, the pool page or the report makes.

This module knows the tables and no stage: it returns frames, series and plain values, and
decides nothing. It holds the one definition of a platform's hourly GPU demand
(:func:`hourly_demand`) that forecasting, planning, the pool page and the report all use.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pandas as pd
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from gpupool.canonical import DEMAND_METRICS, demand_of_steps, hourly_levels
from gpupool.staging.schema import (
    allocation_plan,
    clean_sample,
    extract_part,
    extract_run,
    forecast,
    forecast_run,
    handover,
    inventory_node,
    sample,
    part_sample,
)


def _utc_column(frame: pd.DataFrame, *cols: str) -> pd.DataFrame:
    for col in cols:
        if col in frame:
            frame[col] = pd.to_datetime(frame[col], utc=True)
    return frame


# --- samples and demand ------------------------------------------------------------------


def read_samples(engine: Engine, start: datetime, end: datetime, platform: str | None = None, **match: str) -> pd.DataFrame:
    """Rows of `sample` in [start, end), optionally for one platform / series fields."""
    q = sa.select(sample).where(sample.c.ts >= start, sample.c.ts < end)
    if platform:
        q = q.where(sample.c.platform == platform)
    for k, v in match.items():
        q = q.where(sample.c[k] == v)
    with engine.connect() as conn:
        frame = pd.read_sql(q, conn)
    if len(frame):
        frame["ts"] = pd.to_datetime(frame["ts"], utc=True)
    return frame


def platform_series(engine: Engine, start: datetime, end: datetime, platform: str | None = None) -> pd.DataFrame:
    """The platform totals (`entity_kind = platform`) of `sample` in [start, end):
    columns platform, metric, ts (UTC), value."""
    q = sa.select(sample.c.platform, sample.c.metric, sample.c.ts, sample.c.value).where(
        sample.c.entity_kind == "platform", sample.c.ts >= start, sample.c.ts < end
    )
    if platform:
        q = q.where(sample.c.platform == platform)
    with engine.connect() as conn:
        frame = pd.read_sql(q, conn)
    return _utc_column(frame, "ts")


def hourly_demand(engine: Engine, platform: str, start: datetime, end: datetime) -> tuple[pd.Series, dict]:
    """THE hourly GPU demand of a platform in [start, end): allocated + pending, each point
    cleaned where cleaning ran, else raw; an instant counts only where every demand metric the
    platform reports has a value; the hourly mean of those instants. Returns the series
    (hourly, UTC, NaN for an hour without data), how many clean and raw points fed it and the
    spread of demand inside an hour over the last day (:func:`gpupool.canonical.demand_of_steps`)."""
    return demand_from_points(*_demand_points(engine, platform, start, end))


def demand_levels(engine: Engine, platform: str, start: datetime, end: datetime) -> pd.Series:
    """The platform's demand as it stood at the end of each hour in [start, end), from the same
    points as :func:`hourly_demand` (:func:`gpupool.canonical.hourly_levels`): indexed by the
    hour's end, the mean of its last ``LEVEL_WINDOW`` of steps."""
    wide, _ = _demand_wide(*_demand_points(engine, platform, start, end))
    return hourly_levels(wide)


def _demand_points(engine: Engine, platform: str, start: datetime, end: datetime) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The platform's demand points (metric, ts, value) in [start, end): cleaned ones and raw ones."""
    q = sa.select(clean_sample.c.metric, clean_sample.c.ts, clean_sample.c.clean_value).where(
        clean_sample.c.platform == platform,
        clean_sample.c.entity_kind == "platform",
        clean_sample.c.metric.in_(DEMAND_METRICS),
        clean_sample.c.ts >= start,
        clean_sample.c.ts < end,
    )
    with engine.connect() as conn:
        clean = pd.read_sql(q, conn).rename(columns={"clean_value": "value"})
    raw = platform_series(engine, start, end, platform)
    raw = raw[raw["metric"].isin(DEMAND_METRICS)][["metric", "ts", "value"]]
    return clean, raw


def _demand_wide(clean: pd.DataFrame, raw: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    """One column per demand metric, one row per instant: clean points win over raw ones."""
    # convert even when empty: an object-typed ts column would break the pivot's resample
    clean = clean.assign(ts=pd.to_datetime(clean["ts"], utc=True)).dropna(subset=["value"])
    raw = raw.assign(ts=pd.to_datetime(raw["ts"], utc=True))
    both = pd.concat([clean.assign(src=0), raw.assign(src=1)], ignore_index=True)
    both = both.sort_values("src", kind="stable").drop_duplicates(["metric", "ts"], keep="first")
    info = {"clean_points": int((both["src"] == 0).sum()), "raw_points": int((both["src"] == 1).sum())}
    if both.empty:
        return pd.DataFrame(), info
    return both.pivot(index="ts", columns="metric", values="value").sort_index(), info


def demand_from_points(clean: pd.DataFrame, raw: pd.DataFrame) -> tuple[pd.Series, dict]:
    """:func:`hourly_demand` from the points read (metric, ts, value): clean ones win over raw."""
    wide, info = _demand_wide(clean, raw)
    if wide.empty:
        return pd.Series(dtype="float64"), {**info, "within_hour_sd": 0.0}
    hourly, spread = demand_of_steps(wide)
    return hourly, {**info, **spread}


def hourly_metric(engine: Engine, platform: str, metric: str, start: datetime, end: datetime) -> pd.Series:
    """The hourly mean of one raw platform metric (e.g. gpu_capacity) in [start, end)."""
    raw = platform_series(engine, start, end, platform)
    raw = raw[raw["metric"] == metric]
    if raw.empty:
        return pd.Series(dtype="float64")
    return raw.set_index("ts")["value"].sort_index().resample("1h").mean()


def sampled_platforms(engine: Engine, start: datetime, end: datetime) -> list[str]:
    with engine.connect() as conn:
        rows = conn.execute(sa.select(sample.c.platform).distinct().where(sample.c.ts >= start, sample.c.ts < end))
        return sorted(r[0] for r in rows)


def anomalies(engine: Engine, start: datetime, end: datetime, platform: str | None = None) -> pd.DataFrame:
    """Points flagged anomalous in [start, end): platform, metric, ts, value, expected, detector."""
    c = clean_sample.c
    q = sa.select(c.platform, c.metric, c.ts, c.value, c.expected, c.detector).where(
        c.is_anomaly.is_(True), c.ts >= start, c.ts < end
    )
    if platform:
        q = q.where(c.platform == platform)
    with engine.connect() as conn:
        return _utc_column(pd.read_sql(q, conn), "ts")


def cleaning_decisions(engine: Engine, start: datetime, end: datetime, platform: str | None = None,
                       metrics: tuple[str, ...] = DEMAND_METRICS) -> pd.DataFrame:
    """The detect stage's stored decisions on the points it flagged or replaced in [start, end):
    platform, metric, ts, value (as reported), clean_value, is_anomaly, cleaned, detector, and
    ``decision``: ``cleaned`` (the value was replaced as a telemetry fault) or ``kept`` (an alarm
    whose value was kept as real demand), with ``fault``: ``spike`` (reported above the value it
    was cleaned to), ``drop`` (below it) or empty for a kept point."""
    c = clean_sample.c
    q = sa.select(c.platform, c.metric, c.ts, c.value, c.clean_value, c.is_anomaly, c.cleaned, c.detector).where(
        sa.or_(c.is_anomaly.is_(True), c.cleaned.is_(True)), c.ts >= start, c.ts < end, c.metric.in_(metrics)
    )
    if platform:
        q = q.where(c.platform == platform)
    with engine.connect() as conn:
        out = _utc_column(pd.read_sql(q, conn), "ts").sort_values(["platform", "ts", "metric"], ignore_index=True)
    cleaned = out["cleaned"].astype(bool)
    out["decision"] = cleaned.map({True: "cleaned", False: "kept"})
    value, clean_value = out["value"].astype(float), out["clean_value"].astype(float)
    out["fault"] = ""
    out.loc[cleaned & (value > clean_value), "fault"] = "spike"
    out.loc[cleaned & (value < clean_value), "fault"] = "drop"
    return out


# --- inventory ---------------------------------------------------------------------------


def latest_snapshot(platform: str, at: datetime):
    """The platform's newest inventory snapshot time at or before `at` (a scalar subquery)."""
    return (
        sa.select(sa.func.max(inventory_node.c.snapshot_at))
        .where(inventory_node.c.platform == platform, inventory_node.c.snapshot_at <= at)
        .scalar_subquery()
    )


def read_inventory(engine: Engine, at: datetime, platforms: list[str]) -> pd.DataFrame:
    """Each platform's latest inventory snapshot at or before `at`."""
    frames = []
    with engine.connect() as conn:
        for p in platforms:
            q = sa.select(inventory_node).where(
                inventory_node.c.platform == p, inventory_node.c.snapshot_at == latest_snapshot(p, at)
            )
            frames.append(pd.read_sql(q, conn))
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=[c.name for c in inventory_node.columns])


def inventory_between(engine: Engine, start: datetime, end: datetime, platforms: list[str]) -> pd.DataFrame:
    """Every inventory snapshot row of ``platforms`` taken in ``(start, end]``: node, platform,
    snapshot_at, schedulable, busy_gpus (what says when a node last ran work)."""
    c = inventory_node.c
    q = sa.select(c.platform, c.node, c.snapshot_at, c.schedulable, c.busy_gpus).where(
        c.platform.in_(list(platforms)), c.snapshot_at > start, c.snapshot_at <= end)
    with engine.connect() as conn:
        frame = pd.read_sql(q, conn)
    return _utc_column(frame, "snapshot_at")


def inventory_totals(engine: Engine, platform: str, at: datetime) -> tuple[int, int]:
    """(nodes, GPUs) of the platform's latest snapshot at or before `at`; (0, 0) if none."""
    with engine.connect() as conn:
        row = conn.execute(
            sa.select(sa.func.count(), sa.func.sum(inventory_node.c.gpus)).where(
                inventory_node.c.platform == platform, inventory_node.c.snapshot_at == latest_snapshot(platform, at)
            )
        ).first()
    return int(row[0]), int(row[1] or 0)


# --- forecasts ---------------------------------------------------------------------------


def read_forecasts(engine: Engine, issued_at: datetime, platforms: list[str]) -> pd.DataFrame:
    q = sa.select(forecast).where(forecast.c.issued_at == issued_at, forecast.c.platform.in_(platforms), forecast.c.series == "demand")
    with engine.connect() as conn:
        return pd.read_sql(q.order_by(forecast.c.platform, forecast.c.step), conn)


def forecast_levels(engine: Engine, issued_at: datetime, platforms: list[str]) -> dict[str, float]:
    """The prediction-interval level of each platform's demand forecast issued at `issued_at`."""
    with engine.connect() as conn:
        rows = conn.execute(sa.select(forecast_run.c.platform, forecast_run.c.level).where(
            forecast_run.c.issued_at == issued_at, forecast_run.c.series == "demand",
            forecast_run.c.platform.in_(platforms)))
        return {r.platform: float(r.level) for r in rows}


def forecast_runs(engine: Engine, issued_at: datetime, platforms: list[str]) -> dict[str, tuple[float, dict]]:
    """Per platform, the level and model summary of its demand forecast issued at `issued_at`."""
    with engine.connect() as conn:
        rows = conn.execute(sa.select(forecast_run.c.platform, forecast_run.c.level, forecast_run.c.summary).where(
            forecast_run.c.issued_at == issued_at, forecast_run.c.series == "demand",
            forecast_run.c.platform.in_(platforms)))
        return {r.platform: (float(r.level), r.summary if isinstance(r.summary, dict) else {}) for r in rows}


def recent_forecast_summary(engine: Engine, platform: str, at: datetime, within: timedelta = timedelta(days=1)) -> Any:
    """The model summary of the platform's last demand forecast issued in [at - within, at), or None."""
    with engine.connect() as conn:
        row = conn.execute(
            sa.select(forecast_run.c.summary)
            .where(forecast_run.c.platform == platform, forecast_run.c.series == "demand",
                   forecast_run.c.issued_at < at, forecast_run.c.issued_at >= at - within)
            .order_by(forecast_run.c.issued_at.desc())
            .limit(1)
        ).first()
    return None if row is None else row.summary


def latest_forecast(engine: Engine, platform: str, at: datetime) -> tuple[datetime | None, list]:
    """The platform's newest demand forecast issued at or before `at`: (issue time, rows by step)."""
    with engine.connect() as conn:
        issued = conn.execute(
            sa.select(sa.func.max(forecast.c.issued_at)).where(forecast.c.platform == platform, forecast.c.issued_at <= at)
        ).scalar()
        if issued is None:
            return None, []
        rows = conn.execute(
            sa.select(forecast).where(forecast.c.platform == platform, forecast.c.issued_at == issued,
                                      forecast.c.series == "demand").order_by(forecast.c.step)
        ).all()
    return issued, rows


def forecasts_issued_between(engine: Engine, start: datetime, end: datetime, step: int = 1) -> pd.DataFrame:
    """Forecast rows of one step ahead issued in [start, end]."""
    q = sa.select(forecast).where(forecast.c.issued_at >= start, forecast.c.issued_at <= end, forecast.c.step == step)
    with engine.connect() as conn:
        return _utc_column(pd.read_sql(q, conn), "ts", "issued_at")


def newest_instant(engine: Engine) -> datetime | None:
    """The newest forecast issue time, else the newest sample time, else None."""
    with engine.connect() as conn:
        at = conn.execute(sa.select(sa.func.max(forecast.c.issued_at))).scalar()
        if at is None:
            at = conn.execute(sa.select(sa.func.max(sample.c.ts))).scalar()
    return at


# --- plans and handovers -----------------------------------------------------------------


def latest_plan(engine: Engine, at: datetime):
    """The newest allocation plan decided at or before `at`."""
    with engine.connect() as conn:
        return conn.execute(
            sa.select(allocation_plan).where(allocation_plan.c.decided_at <= at)
            .order_by(allocation_plan.c.decided_at.desc(), allocation_plan.c.id.desc()).limit(1)
        ).first()


def plans_between(engine: Engine, start: datetime, end: datetime) -> list:
    """(decided_at, moves, policy) of the plans decided in [start, end], oldest first."""
    with engine.connect() as conn:
        return conn.execute(
            sa.select(allocation_plan.c.decided_at, allocation_plan.c.moves, allocation_plan.c.policy).where(
                allocation_plan.c.decided_at >= start, allocation_plan.c.decided_at <= end
            ).order_by(allocation_plan.c.decided_at)
        ).all()


def handovers_in(engine: Engine, states: tuple[str, ...]) -> list[dict]:
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(
            sa.select(handover).where(handover.c.state.in_(states)).order_by(handover.c.id))]


def last_moves(engine: Engine, done_state: str) -> dict[str, pd.Timestamp]:
    """When each node last finished a live handover (state `done_state`)."""
    out: dict[str, pd.Timestamp] = {}
    with engine.connect() as conn:
        for node, ts in conn.execute(sa.select(handover.c.node, sa.func.max(handover.c.updated_at)).where(
                handover.c.state == done_state, handover.c.dry_run.is_(False)).group_by(handover.c.node)):
            t = pd.Timestamp(ts)
            out[node] = t.tz_localize("UTC") if t.tzinfo is None else t.tz_convert("UTC")
    return out


def last_targets(engine: Engine, done_state: str) -> dict[str, str]:
    """The platform each node's newest finished live handover (state ``done_state``) brought it to."""
    newest = (sa.select(sa.func.max(handover.c.id)).where(handover.c.state == done_state,
                                                         handover.c.dry_run.is_(False))
              .group_by(handover.c.node))
    with engine.connect() as conn:
        return {node: to for node, to in conn.execute(
            sa.select(handover.c.node, handover.c.to_platform).where(handover.c.id.in_(newest)))}


# --- a sharded extraction's parts ---------------------------------------------------------


def extract_plan(engine: Engine, platform: str, start: datetime, end: datetime) -> list[Any]:
    """The parts (part, position, parts, nodes) planned for the platform's window [start, end),
    in position order; empty when the platform is extracted whole."""
    with engine.connect() as conn:
        return conn.execute(
            sa.select(extract_part.c.part, extract_part.c.position, extract_part.c.parts, extract_part.c.nodes)
            .where(extract_part.c.platform == platform, extract_part.c.window_start == start,
                   extract_part.c.window_end == end)
            .order_by(extract_part.c.position)
        ).all()


def planned_part(engine: Engine, platform: str, start: datetime, end: datetime, position: int) -> Any:
    """One planned part (part, position, parts, nodes) of the platform's window, or None."""
    with engine.connect() as conn:
        return conn.execute(
            sa.select(extract_part.c.part, extract_part.c.position, extract_part.c.parts, extract_part.c.nodes)
            .where(extract_part.c.platform == platform, extract_part.c.window_start == start,
                   extract_part.c.window_end == end, extract_part.c.position == position)
        ).first()


def part_runs(engine: Engine, platform: str, start: datetime, end: datetime, parts: list[str]) -> dict[str, Any]:
    """The newest `extract_run` row (status, rows, error) of each named part of the
    platform's window [start, end); a part that never ran is absent."""
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(extract_run.c.part, extract_run.c.status, extract_run.c.rows, extract_run.c.error)
            .where(extract_run.c.platform == platform, extract_run.c.window_start == start,
                   extract_run.c.window_end == end, extract_run.c.part.in_(parts))
            .order_by(extract_run.c.id)
        ).all()
    return {r.part: r for r in rows}  # ordered by id: the newest run of a part wins


def platform_run(engine: Engine, platform: str, start: datetime, end: datetime) -> Any:
    """The newest `extract_run` row (status, rows, error) of the platform's own extraction of
    the window [start, end) (not one of its parts), or None."""
    with engine.connect() as conn:
        return conn.execute(
            sa.select(extract_run.c.status, extract_run.c.rows, extract_run.c.error)
            .where(extract_run.c.platform == platform, extract_run.c.window_start == start,
                   extract_run.c.window_end == end, extract_run.c.part.is_(None))
            .order_by(extract_run.c.id.desc()).limit(1)
        ).first()


def part_samples(engine: Engine, platform: str, start: datetime, end: datetime, parts: list[str],
                 metrics: tuple[str, ...]) -> pd.DataFrame:
    """The canonical rows of `metrics` the named parts landed for the platform's window."""
    cols = [part_sample.c[c] for c in ("platform", "cluster", "entity_kind", "entity_id", "metric", "ts", "value", "unit")]
    with engine.connect() as conn:
        frame = pd.read_sql(
            sa.select(*cols).where(part_sample.c.platform == platform, part_sample.c.part.in_(parts),
                                   part_sample.c.metric.in_(metrics), part_sample.c.ts >= start, part_sample.c.ts < end)
            .order_by(part_sample.c.metric, part_sample.c.entity_kind, part_sample.c.entity_id, part_sample.c.ts),
            conn,
        )
    return _utc_column(frame, "ts")


# --- one window, read back ---------------------------------------------------------------


def window_record(engine: Engine, start: datetime, end: datetime) -> dict[str, list]:
    """What each stage left for the window [start, end): extract runs (oldest first), clean
    points and anomalies per platform, forecast rows issued at `end`, the plan decided at `end`."""
    with engine.connect() as conn:
        runs = conn.execute(
            sa.select(extract_run.c.platform, extract_run.c.status, extract_run.c.rows)
            .where(extract_run.c.window_start == start, extract_run.c.window_end == end,
                   extract_run.c.part.is_(None))  # a sharded platform's own row, not its parts'
            .order_by(extract_run.c.id)
        ).all()
        clean = conn.execute(
            sa.select(clean_sample.c.platform, sa.func.count(), sa.func.sum(sa.case((clean_sample.c.is_anomaly, 1), else_=0)))
            .where(clean_sample.c.ts >= start, clean_sample.c.ts < end)
            .group_by(clean_sample.c.platform)
        ).all()
        fc = conn.execute(
            sa.select(forecast.c.platform, forecast.c.step, forecast.c.yhat, forecast.c.yhat_lower, forecast.c.yhat_upper)
            .where(forecast.c.issued_at == end)
            .order_by(forecast.c.platform, forecast.c.step)
        ).all()
        plan = conn.execute(
            sa.select(allocation_plan).where(allocation_plan.c.decided_at == end).order_by(allocation_plan.c.id.desc()).limit(1)
        ).first()
    return {"extract_runs": runs, "clean": clean, "forecast": fc, "plan": plan}


def plan_by_id(engine: Engine, plan_id: int):
    """The allocation plan row of ``plan_id`` (decided_at, moves, ...), or None."""
    with engine.connect() as conn:
        return conn.execute(sa.select(allocation_plan).where(allocation_plan.c.id == plan_id)).first()
