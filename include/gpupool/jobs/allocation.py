"""The hourly plan-and-act, the job the pipeline and the CLI call: plan from staging, actuate a
stored plan, advance, list and roll back handovers. It reads staging and builds actuators; the
plan itself is :func:`gpupool.decisions.planner.plan` and the handovers
:mod:`gpupool.actuation.handover` (what ``gpupool`` prints of them: :mod:`gpupool.jobs.text`).

* :func:`plan_from_staging` — the pool inventory of the window's end, each platform's demand
  (the ARIMA forecast issued at the window's end for ``predictive``; the last hour's demand for
  ``reactive`` and ``static``), the policy from the configuration -> the planner's answer.
* :func:`actuate_plan` — opens one handover per move of a stored plan and advances every open
  handover; when the fast path does not run, the reclaim first
  (:func:`gpupool.jobs.reclaim.plan_reclaims`). A move is sent for real only when all of these
  say so: the call (``dry_run=False``), the configuration (``dry_run: false``), both platforms
  (``actuation: true``), and neither is an embedded ``simulator`` platform. Otherwise it is a
  dry-run handover: audited, never sent. Backfill runs never actuate: they record one
  ``action_audit`` row saying nothing was sent.
* :func:`list_handovers`, :func:`rollback_handover` — ``gpupool handovers`` and
  ``gpupool rollback ID``.

Embedded simulator platforms (config kind ``simulator``) are dry-run only: their world is
rebuilt from the configuration on every run, so an action on it would not survive to the next
run. :class:`~gpupool.sim.actuator.WorldActuator` acts on a World that a caller
holds (closed-loop studies, tests).
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta
from typing import Any, Mapping

import pandas as pd
from sqlalchemy.engine import Engine

from gpupool.values import utc
from gpupool.actuation import handover as ho
from gpupool.actuation.actuators.base import ActuationConfigError, Actuator, Command, with_pool_names
from gpupool.decisions.demand import DAILY_HISTORY_HOURS, SKILL_HOURS, SPREAD_HISTORY_HOURS, plan_demand
from gpupool.decisions.ownership import lent_and_borrowed
from gpupool.decisions.layouts import units_per_gpu
from gpupool.decisions.planner import GPU_UNIT, plan
from gpupool.decisions.policy import Policy
from gpupool.actuation.relayout import LayoutChangeFailed, apply_layout_changes
from gpupool.forecast.stage import FORECAST_LEVEL
from gpupool.jobs import reclaim
from gpupool.jobs.pool import pool_nodes  # noqa: F401 - re-exported: callers name it here
from gpupool.jobs.owners import homes_at, held_now, ownership_settings
from gpupool.staging import fastpath as fastpath_store
from gpupool.staging import handovers as handover_store
from gpupool.staging import reads


# ------------------------------------------------------------------------------------ policy


def policy_from_config(config, kind: str) -> Policy:
    """The planner's :class:`Policy` from ``platforms[]`` and ``limits`` of the configuration.

    ``limits`` is the policy's own :class:`~gpupool.config.PlanLimits` (``limits.allow_evict``
    included: the plan may choose a busy node exactly where actuation may evict it); the
    platforms give each one's bounds and priority.
    """
    return Policy(
        kind=kind,
        min_nodes={p.name: p.min_nodes for p in config.platforms},
        max_nodes={p.name: p.max_nodes for p in config.platforms if p.max_nodes is not None},
        priority={p.name: p.priority for p in config.platforms},
        ownership=ownership_settings(config),
        **config.limits.plan_limits(),
    )


# ------------------------------------------------------------------------------------ planning


def demand_units(config) -> dict[str, tuple[str, int]]:
    """Each platform's demand unit — its ``slice_profile`` (MIG slices), else whole GPUs — and how
    many of that unit one GPU of its staged demand is (``slice_demand``)."""
    return {p.name: (p.slice_profile or GPU_UNIT,
                     units_per_gpu(p.slice_profile) if p.slice_profile and p.slice_demand == "gpu_equivalent" else 1)
            for p in config.platforms}


def platform_demand(engine: Engine, window, platforms: list[str], policy: Policy,
                    units: Mapping[str, tuple[str, int]] | None = None) -> tuple[dict[str, dict], dict[str, str]]:
    """Demand per platform for the planner (``{mean, upper, unit, peak}`` per hour) and where it came from.

    ``units`` (:func:`demand_units`; default whole GPUs) is each platform's unit and the factor
    from staged demand to it. Sources stage GPUs allocated and pending; on a platform that asks for
    slices those count requests (a job per whole GPU; on MIG nodes Slurm's GRES, the device
    plugin's pods and DCGM's instances count slices), so by default one is one slice; with
    ``slice_demand: gpu_equivalent`` one is a GPU's worth of slices. The source string says which.

    Reads what :func:`~gpupool.decisions.demand.plan_demand` takes, from staging, and calls it:
    each platform's hourly demand before the window's end with the spread inside the hour and
    demand as it stands (:func:`~gpupool.staging.reads.hourly_demand`, the one source of both);
    for ``predictive`` also the forecast issued at the window's end, the one-hour-ahead
    forecasts issued before it and demand as it stood at each hour's start. ``gpupool simulate``
    calls the same function on the same stages' outputs.
    """
    end = utc(window.end)
    at = end.to_pydatetime()
    predictive = policy.kind == "predictive"
    hours = max(SKILL_HOURS, SPREAD_HISTORY_HOURS, DAILY_HISTORY_HOURS) if predictive else SPREAD_HISTORY_HOURS
    since = end - pd.Timedelta(hours=hours + 1)
    if predictive:
        fc = reads.read_forecasts(engine, at, platforms)
        fc_level = reads.forecast_levels(engine, at, platforms)
        issued = reads.forecasts_issued_between(engine, since.to_pydatetime(), at, step=1)
    demand: dict[str, dict] = {}
    source: dict[str, str] = {}
    for p in platforms:
        hourly, info = reads.hourly_demand(engine, p, since.to_pydatetime(), at)
        if predictive and (rows := fc[fc["platform"] == p].sort_values("step")).shape[0]:
            level = fc_level.get(p, FORECAST_LEVEL)
            levels = reads.demand_levels(engine, p, (end - pd.Timedelta(hours=DAILY_HISTORY_HOURS)).to_pydatetime(), at)
            choice = plan_demand(hourly, info, policy, end, forecast=rows, level=level,
                                 issued=_first_hour_forecasts(issued, p), levels=levels)
            source[p] = choice.why(end, level)
        else:
            choice = plan_demand(hourly, info, policy.model_copy(update={"kind": "reactive"}), end)
            source[p] = choice.why(end) + ("; no forecast issued at the window's end" if predictive else "")
        unit, k = (units or {}).get(p, (GPU_UNIT, 1))
        d = choice.demand.in_unit(unit, k)
        demand[p] = {"mean": list(d.mean), "upper": list(d.upper), "unit": d.unit, "peak": d.peak}
        if unit != GPU_UNIT:
            source[p] += (f"; in {unit} slices: each GPU of demand is {k} slices (a GPU's worth)" if k != 1
                          else f"; in {unit} slices: each GPU of demand is one request of a slice")
    return demand, source


def _first_hour_forecasts(issued: pd.DataFrame, platform: str) -> pd.Series:
    """One platform's one-hour-ahead demand forecasts, indexed by the hour they forecast (the
    newest issue where two forecast the same hour, as the what-if keeps them)."""
    mine = issued[(issued["platform"] == platform) & (issued["series"] == "demand")]
    mine = mine.sort_values("issued_at", kind="stable").drop_duplicates("ts", keep="last").sort_values("ts")
    return pd.Series(mine["yhat"].to_numpy(float), index=pd.DatetimeIndex(mine["ts"]))


def plan_from_staging(ctx, window, platforms: list[str], policy: str) -> dict[str, Any]:
    """Plan which platform holds each pool node from the window's end.

    Returns ``{"solver", "moves": [{node, from, to, gpus, expected_gain, mig_layout, reason}],
    "summary": {"platforms": {name: {...}}, ...}}`` — what ``gpupool.pipeline.plan`` stores.
    """
    at = utc(window.end)
    pol = policy_from_config(ctx.config, policy)
    # both paths share the move budget of any rolling hour: the plan gets what the fast path
    # (or an earlier plan) left of it, as in the what-if
    recent = [h for h in fastpath_store.handovers_opened_between(ctx.engine, (at - pd.Timedelta(hours=1)).to_pydatetime(),
                                                                  at.to_pydatetime())
              if (ctx.config.dry_run or not h["dry_run"]) and not h.get("outside_budget")]
    if recent:
        pol = pol.model_copy(update={"max_moves_per_decision": max(0, pol.max_moves_per_decision - len(recent))})
    nodes, excluded = pool_nodes(ctx.engine, at.to_pydatetime(), platforms, ctx.config)
    # who owns each node: recorded once in staging (config's owners, each platform's `owns` at
    # its first sight) so the plan's lend and borrow limits bind
    homes = homes_at(ctx, at.to_pydatetime(), held_now(ctx.config, nodes, excluded))
    if homes:
        nodes = [dataclasses.replace(n, home=homes.get(n.name)) for n in nodes]
    demand, source = platform_demand(ctx.engine, window, platforms, pol, demand_units(ctx.config))
    result = plan(nodes, demand, pol, at=at)
    moves = [{"node": m.node, "from": m.source, "to": m.target, "gpus": m.gpus,
              "expected_gain": m.expected_gain, "mig_layout": m.mig_layout, "reason": m.reason}
             for m in result.moves]
    per: dict[str, dict] = {}
    for p in platforms:
        mine = [n for n in nodes if n.owner == p]
        after = [name for name, tgt in result.targets.items() if tgt == p]
        per[p] = {
            "nodes": len(mine),
            "gpus": sum(n.gpus for n in mine),
            "busy_gpus": round(sum(n.busy_gpus for n in mine), 1),
            "nodes_after": len(after),
            "demand_mean": [round(v, 1) for v in demand[p]["mean"]],
            "demand_upper": [round(v, 1) for v in demand[p]["upper"]],
            "demand_peak_week": None if demand[p].get("peak") is None else round(demand[p]["peak"], 1),
            "demand_from": source[p],
            "demand_unit": demand[p]["unit"],
            "expected_unmet_before": round(result.expected_unmet_before.get(p, 0.0), 2),
            "expected_unmet_after": round(result.expected_unmet_after.get(p, 0.0), 2),
        }
    if homes:  # what each owns, lends and borrows now (absent where nobody owns anything)
        lent, borrowed = lent_and_borrowed((n.home, n.owner) for n in nodes)
        for p in platforms:
            per[p].update(owned=sum(1 for n in nodes if n.home == p), lent=lent.get(p, 0), borrowed=borrowed.get(p, 0))
    summary = {
        "platforms": per,
        "status": result.status,
        "objective_before": result.objective_before,
        "objective_after": result.objective_after,
        "layout_changes": [{"node": c.node, "platform": c.platform, "from": c.from_layout, "to": c.to_layout,
                            "expected_gain": c.expected_gain, "reason": c.reason} for c in result.layout_changes],
        "reasons": list(result.reasons),
        "excluded": excluded,
        "horizon_hours": pol.plan_horizon_hours,
    }
    return {"solver": result.solver, "moves": moves, "summary": summary}


# ------------------------------------------------------------------------------------ actuators


def _named(config, actuators: Mapping[str, Actuator]) -> dict[str, Actuator]:
    """The actuators, taking pool node ids (see :func:`~gpupool.actuation.actuators.base.with_pool_names`)."""
    return with_pool_names(config, actuators)


# ------------------------------------------------------------------------------------ actuation


def _live_platforms(config) -> set[str]:
    return {p.name for p in config.platforms if p.actuation and p.kind != "simulator"}


def actuate_plan(ctx, plan_id: int, dry_run: bool = True, backfill: bool = False,
                 actuators: Mapping[str, Actuator] | None = None, at: datetime | None = None,
                 allow_evict: bool = False, lookup=None, sources: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Open the handovers of plan ``plan_id`` and advance every open handover.

    ``at`` (default: the plan's decision time) is the logical time of this run. A plan older
    than ``limits.max_actuation_age_hours`` at ``at`` opens nothing (its inventory is stale);
    open handovers are still advanced. Moves whose node already has a handover are skipped and
    reported. The plan's in-place MIG re-layouts (``summary.layout_changes``) are applied before the
    handovers advance (:mod:`gpupool.actuation.relayout`; audited, dry run alike). Returns
    ``{"plan_id", "live", "opened": [...], "skipped": [...], "layouts": {...}, "advance": {...}}``.

    Raises :class:`~gpupool.actuation.handover.HandoverFailed` after everything was processed
    when a handover failed or timed out (its node's hold lifted or the node sent back where
    gpupool could), so the Airflow task fails and alerts; :class:`~gpupool.actuation.relayout.LayoutChangeFailed`
    likewise when a re-layout failed (its node back in service), and (live) :class:`~gpupool.actuation.handover.ReclaimLate`
    when a reclaim this run is responsible for is past its deadline, and ``ReclaimBlocked`` when
    a disruption budget blocks one whose deadline falls before the next plan (within the hour;
    listed under ``reclaim.blocked`` either way). ``lookup`` is Airflow's
    connection lookup (inside a task); ``sources`` the pressure sources of the reclaim (default:
    built from the configuration).
    """
    engine = ctx.engine
    row = reads.plan_by_id(engine, plan_id)
    if row is None:
        raise ho.HandoverError(f"no allocation plan #{plan_id}")
    decided = utc(row.decided_at).to_pydatetime()
    at = decided if at is None else utc(at).to_pydatetime()
    if backfill:
        ho.send_audited(engine, None, None, Command(
            "gpupool", "*", "backfill_skip", {"plan_id": plan_id, "moves": len(row.moves or []),
                                               "note": "backfill runs never actuate; nothing was sent"}), dry_run=True)
        return {"plan_id": plan_id, "live": False, "backfill": True, "opened": [], "skipped": [],
                "note": "backfill run: nothing sent, nothing opened"}
    live_ok = (not dry_run) and (not ctx.config.dry_run)
    live_platforms = _live_platforms(ctx.config)
    actuators = _actuators_for(ctx, at, live_ok, actuators, lookup)
    lim = ctx.config.limits
    timeout = timedelta(hours=lim.max_actuation_age_hours) if lim.max_actuation_age_hours > 0 else ho.DEFAULT_TIMEOUT
    opened, skipped = [], []
    stale = lim.max_actuation_age_hours > 0 and at - decided > timedelta(hours=lim.max_actuation_age_hours)
    with handover_store.moves_lock(engine):  # the fast path may have spent budget since the plan
        # reclaim first (when the fast path does not run it): the plan's moves then find those
        # nodes held by open handovers, and the budget what the reclaims left of it
        reclaims = reclaim.plan_reclaims(
            ctx, at, timeout=timeout, actuators=actuators, lookup=lookup, sources=sources,
            live=lambda m: (live_ok and m.source in live_platforms and m.target in live_platforms
                            and m.source in actuators and m.target in actuators))
        budget = _budget_left(ctx, at)
        done_nodes = handover_store.nodes_of_plan(engine, plan_id)
        for m in row.moves or []:
            node, src, dst = m["node"], m["from"], m["to"]
            if stale:
                skipped.append({"node": node, "why": f"plan decided {decided.isoformat()} is older than "
                                                     f"{lim.max_actuation_age_hours} h at {at.isoformat()}"})
                continue
            if node in done_nodes:
                skipped.append({"node": node, "why": "this plan already opened a handover for it"})
                continue
            if budget <= 0:
                skipped.append({"node": node, "why": f"move budget spent: {lim.max_moves_per_decision} handovers "
                                                     "opened in the last hour, both paths"})
                continue
            live = (live_ok and src in live_platforms and dst in live_platforms
                    and src in actuators and dst in actuators)
            try:
                hid = ho.open_handover(engine, node, src, dst, at, plan_id=plan_id, reason=m.get("reason"),
                                       dry_run=not live, timeout=timeout, gpus=m.get("gpus"))
            except ho.HandoverConflict as exc:
                skipped.append({"node": node, "why": str(exc)})
                continue
            budget -= 1
            opened.append({"id": hid, "node": node, "from": src, "to": dst, "dry_run": not live})
    layouts = _layout_step(ctx, row, decided, actuators, live_platforms if live_ok else set(),
                           f"plan decided {decided.isoformat()} is older than {lim.max_actuation_age_hours} h "
                           f"at {at.isoformat()}" if stale else None)
    advance = ho.advance_all(engine, actuators, at, dry_run=not live_ok, allow_evict=allow_evict,
                             reclaim_minutes=reclaim.promised_minutes(ctx.config))
    out = {"plan_id": plan_id, "live": live_ok, "opened": opened, "skipped": skipped, "layouts": layouts,
           "advance": advance}
    errors: list[Exception] = []
    if advance["failed"]:
        errors.append(ho.HandoverFailed(advance))
    if layouts["failed"]:
        errors.append(LayoutChangeFailed(layouts["failed"]))
    if reclaims is not None:
        out["reclaim"] = reclaims
        late = reclaim.late_reclaims(ctx, at, reclaims["waits"]) if "note" not in reclaims else []
        if late:
            out["reclaim"]["late"] = late
            if live_ok:
                errors.append(ho.ReclaimLate(late))
        if "note" not in reclaims:  # the plan ran the reclaim: a blocking budget said as the fast path says it
            from gpupool.jobs.pressure import PLAN_EVERY

            blocked = reclaim.blocked_reclaims(ctx, at, reclaims.pop("blocked", ()))
            due = reclaim.blocked_due(blocked, at, PLAN_EVERY) if blocked else []
            if blocked:
                out["reclaim"]["blocked"] = blocked
            if due and live_ok:
                errors.append(ho.ReclaimBlocked(due))
    if errors:  # the first fails the task; the others are said with it
        for other in errors[1:]:
            errors[0].add_note(f"{type(other).__name__}: {other}")
        raise errors[0]
    return out


def _budget_left(ctx, at: datetime) -> int:
    """What is left of the rolling hour's move budget at ``at``: the limit,
    less every handover opened in the hour before (either path, this plan's own included) but
    the reclaims that went outside the budget (they take no slot)."""
    since = at - timedelta(hours=1)
    spent = [h for h in fastpath_store.handovers_opened_between(ctx.engine, since, at)
             if h["created_at"] > since and (ctx.config.dry_run or not h["dry_run"]) and not h.get("outside_budget")]
    return ctx.config.limits.max_moves_per_decision - len(spent)


def _layout_step(ctx, row, decided: datetime, actuators: Mapping[str, Actuator], live: set[str],
                 stale_why: str | None) -> dict[str, list]:
    """The plan's in-place MIG re-layouts (:mod:`gpupool.actuation.relayout`), with what the
    inventory the plan was made from says of each node's MIG."""
    changes = list(((row.summary or {}).get("layout_changes")) or [])
    if not changes:
        return {"applied": [], "skipped": [], "failed": []}
    platforms = sorted({c["platform"] for c in changes})
    nodes, _ = pool_nodes(ctx.engine, decided, platforms, ctx.config)
    return apply_layout_changes(ctx.engine, changes, actuators, live, {n.name: n.mig_capable for n in nodes}, stale_why)


def advance_handovers(ctx, at: datetime, dry_run: bool = True, actuators: Mapping[str, Actuator] | None = None,
                      allow_evict: bool = False, lookup=None) -> dict[str, Any]:
    """Advance every open handover (the short-interval handover DAG's one task).

    In a dry run live handovers are not moved, but their deadlines are checked and gpupool's
    own holds lifted (see :mod:`gpupool.actuation.handover`). Raises
    :class:`~gpupool.actuation.handover.HandoverFailed` after processing all of them when one
    failed or timed out, so the task fails and Airflow alerts.
    """
    at = utc(at).to_pydatetime()
    live_ok = (not dry_run) and (not ctx.config.dry_run)
    actuators = _actuators_for(ctx, at, live_ok, actuators, lookup)
    report = ho.advance_all(ctx.engine, actuators, at, dry_run=not live_ok, allow_evict=allow_evict,
                            reclaim_minutes=reclaim.promised_minutes(ctx.config))
    if report["failed"]:
        raise ho.HandoverFailed(report)
    return report


def _actuators_for(ctx, at: datetime, live_ok: bool, actuators: Mapping[str, Actuator] | None,
                   lookup) -> dict[str, Actuator]:
    """The actuators this pass needs, taking pool node ids.

    A live pass builds every actuating platform's. A dry-run pass builds only those of platforms
    with a live handover that failed or passed its deadline: it may lift gpupool's hold there.
    """
    if actuators is None:
        if live_ok:
            actuators = ctx.build_actuators(lookup=lookup)
        else:
            need = sorted({p for h in ho.list_handovers(ctx.engine, ho.BLOCKING_STATES) if not h.dry_run
                           and (h.state == ho.FAILED or (h.deadline is not None and utc(at) >= utc(h.deadline)))
                           for p in (h.from_platform, h.to_platform)})
            actuators = ctx.build_actuators(need, lookup=lookup) if need else {}
    return _named(ctx.config, actuators)


# ------------------------------------------------------------------------------------ CLI


def list_handovers(engine: Engine, at: datetime | None = None, open_only: bool = False,
                   limit: int | None = 100) -> list[dict[str, Any]]:
    """Handovers newest first, each with its age (from ``at``, default now) and audit counts."""
    hs = ho.list_handovers(engine, ho.BLOCKING_STATES if open_only else None, limit=limit)
    ref = utc(at) if at is not None else pd.Timestamp.now(tz="UTC")
    counts = handover_store.audit_counts(engine, [h.id for h in hs])
    out = []
    for h in hs:
        d = h.as_dict()
        d["age_minutes"] = round((ref - utc(h.created_at)).total_seconds() / 60.0, 1)
        d["actions"] = counts.get(h.id, {})
        out.append(d)
    return out


def rollback_handover(ctx, handover_id: int, actuators: Mapping[str, Actuator] | None = None,
                      at: datetime | None = None, dry_run: bool = False, lookup=None) -> dict[str, Any]:
    """``gpupool rollback ID``: undo a handover (see :func:`gpupool.actuation.handover.rollback`).

    ``dry_run: true`` in the configuration makes it a dry run too: what would be sent is
    returned and audited as ``dry_run``, nothing is sent. A dry run whose platforms' actuators
    cannot be built describes the commands instead of building them.
    """
    from gpupool.sources.factory import ConnectionError_

    dry_run = bool(dry_run) or ctx.config.dry_run
    h = ho.get_handover(ctx.engine, handover_id)
    if actuators is None:
        try:
            actuators = {} if h.dry_run else ctx.build_actuators([h.from_platform, h.to_platform], lookup=lookup)
        except (ActuationConfigError, ConnectionError_):
            if not dry_run:
                raise
            actuators = {}
    return ho.rollback(ctx.engine, handover_id, _named(ctx.config, actuators), at=at, dry_run=dry_run)


__all__ = [
    "plan_from_staging", "actuate_plan", "advance_handovers", "list_handovers", "rollback_handover",
    "policy_from_config", "pool_nodes", "platform_demand", "demand_units", "ActuationConfigError",
]
