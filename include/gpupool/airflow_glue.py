"""What the DAG tasks call: turn an Airflow task context into `gpupool.pipeline` calls.

Only plain values cross this boundary (XCom carries the window and counts, never data);
Airflow objects are read duck-typed, so this module imports nothing from Airflow.
"""

from __future__ import annotations

from typing import Any

from gpupool import pipeline
from gpupool.staging import db


def _params(context: Any) -> dict:
    return dict(context.get("params") or {})


def window_from_context(context: Any) -> dict:
    """Params first (UI trigger), then the data interval; fails loudly if neither."""
    window = pipeline.resolve_window(
        _params(context), context.get("data_interval_start"), context.get("data_interval_end")
    )
    ctx = pipeline.Context.load()
    db.upgrade(ctx.engine)
    return window.as_dict()


def platforms_from_context(context: Any) -> list[str]:
    ctx = pipeline.Context.load()
    return ctx.platforms(_params(context).get("platforms") or None)


def extract_parts(window: dict, platforms: list[str], lookup=None) -> list[dict]:
    """The extraction parts of the window (one per platform unless a platform is sharded):
    platform, part number and count only; each part's node range is in staging's plan."""
    ctx = pipeline.Context.load()
    return pipeline.plan_extract(ctx, pipeline.Window.from_dict(window), platforms, lookup=lookup)


def extract_one_part(window: dict, part: dict, lookup=None) -> dict:
    """Extract one planned part: a whole platform, or one range of a sharded one."""
    ctx = pipeline.Context.load()
    return pipeline.extract_part(ctx, part, pipeline.Window.from_dict(window), lookup=lookup)


def finish_extract(window: dict, platform: str, parts: list[dict], lookup=None) -> dict:
    """Replace a sharded platform's window from its parts (nothing to do for a whole one)."""
    ctx = pipeline.Context.load()
    return pipeline.finish_extract(ctx, platform, pipeline.Window.from_dict(window), parts, lookup=lookup)


def run_stage(stage: str, window: dict, platform: str, lookup=None) -> dict:
    """One stage for one platform; `lookup` is Airflow's connection lookup (extract only)."""
    ctx = pipeline.Context.load()
    w = pipeline.Window.from_dict(window)
    if stage == "extract":
        return pipeline.extract(ctx, platform, w, lookup=lookup)
    if stage == "detect":
        return pipeline.detect(ctx, platform, w)
    if stage == "forecast":
        return pipeline.forecast_demand(ctx, platform, w)
    raise ValueError(f"unknown stage {stage!r}")


def is_backfill(context: Any) -> bool:
    run = context.get("dag_run")
    run_type = str(getattr(run, "run_type", "") or "")
    return run_type.lower().endswith("backfill_job") or "backfill" in run_type.lower()


def plan_from_context(context: Any, window: dict, platforms: list[str]) -> dict:
    params = _params(context)
    ctx = pipeline.Context.load()
    dry_run = bool(params.get("dry_run", True)) or ctx.config.dry_run or is_backfill(context)
    result = pipeline.plan(
        ctx, pipeline.Window.from_dict(window), policy=params.get("policy", "predictive"), dry_run=dry_run, platforms=platforms
    )
    return {"plan_id": result["plan_id"], "moves": len(result["moves"]), "dry_run": dry_run}


def actuate_from_context(context: Any, window: dict, plan_result: dict, lookup=None) -> dict:
    """Turn the plan into handovers. Backfills and stale windows never actuate. ``lookup`` is
    Airflow's connection lookup (the same the extract uses). Raises when a handover failed."""
    from gpupool.jobs.allocation import actuate_plan
    from gpupool.jobs.power import plan_power_step

    ctx = pipeline.Context.load()
    w = pipeline.Window.from_dict(window)
    # how stale the window is when the run was created (run_after is set by Airflow when the
    # run is made: a UI trigger of an old window is as stale as a late scheduled run)
    ref = getattr(context.get("dag_run"), "run_after", None) or context.get("data_interval_end") or w.end
    age_h = (pipeline.parse_time(ref) - w.end).total_seconds() / 3600
    backfill = is_backfill(context)
    too_old = age_h > ctx.config.limits.max_actuation_age_hours
    dry_run = bool(plan_result.get("dry_run", True)) or backfill or too_old
    try:
        out = actuate_plan(ctx, plan_result["plan_id"], dry_run=dry_run, backfill=backfill,
                           allow_evict=ctx.config.limits.allow_evict, lookup=lookup)
    finally:  # parks and wakes are the plan's too when the fast path does not run (a failed handover included)
        power = plan_power_step(ctx, w.end, dry_run=dry_run, backfill=backfill, lookup=lookup)
    out["power"] = power
    if ((power.get("advance") or {}).get("failed")):
        from gpupool.actuation.power.machine import PowerFailed

        raise PowerFailed(power["advance"])
    return out




def maintain_from_context(context: Any) -> dict:
    """Daily staging maintenance at the run's data interval end."""
    from gpupool.staging.maintenance import maintain

    params = _params(context)
    window = pipeline.resolve_window({}, context.get("data_interval_start"), context.get("data_interval_end"))
    ctx = pipeline.Context.load()
    db.upgrade(ctx.engine)
    return maintain(ctx.engine, window.end, int(params.get("retention_days", 90)), int(params.get("ahead_days", 3)))


def advance_from_context(context: Any, lookup=None) -> dict:
    """Advance every open handover as far as it safely goes now: each keeps stepping while its
    steps complete at once and stops at the first wait (``handover.advance_all``). Backfills
    only look, never act (but a handover past its deadline still gets gpupool's hold lifted).
    Raises when one failed."""
    from gpupool.jobs.allocation import advance_handovers

    window = pipeline.resolve_window({}, context.get("data_interval_start"), context.get("data_interval_end"))
    ctx = pipeline.Context.load()
    db.upgrade(ctx.engine)
    return advance_handovers(
        ctx, at=window.end, dry_run=ctx.config.dry_run or is_backfill(context), allow_evict=ctx.config.limits.allow_evict,
        lookup=lookup,
    )


def fastpath_from_context(context: Any, lookup=None) -> dict:
    """One fast-path tick at the run's data interval end: read each platform's pressure, decide,
    record, start moves. ``dry_run`` (Param, default on) or the configuration's keeps every
    handover a dry run; a backfill records why it did nothing. XCom gets counts only."""
    from gpupool.jobs.fastpath import run_fastpath

    window = pipeline.resolve_window({}, context.get("data_interval_start"), context.get("data_interval_end"))
    ctx = pipeline.Context.load()
    db.upgrade(ctx.engine)
    out = run_fastpath(ctx, window.end, dry_run=bool(_params(context).get("dry_run", True)) or ctx.config.dry_run,
                       backfill=is_backfill(context), allow_evict=ctx.config.limits.allow_evict, lookup=lookup)
    return {"at": out["at"], "decisions": len(out["decisions"]), "opened": len(out["opened"])}
