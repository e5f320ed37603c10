"""The fast path's tick: read each platform's pressure, stage and judge it, decide, record, open.

What the ``gpupool_fastpath`` DAG (and ``gpupool fastpath``) runs every
:data:`~gpupool.decisions.cadence.FASTPATH_EVERY`: each platform's pressure is read through its
own source (``Source.pressure``), staged (``fastpath_pressure``) and judged with the detect
stage's streaming rules before it is trusted (:func:`judge`), the pure
:func:`gpupool.decisions.fastpath.decide` decides on it, every decision is recorded
(``fastpath_decision``) and the moves' handovers are opened and advanced through the same
audited handover as the plan's (:mod:`gpupool.actuation.handover`). The rules the decision
keeps are :mod:`gpupool.decisions.fastpath`'s.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, Mapping

import pandas as pd

from gpupool.decisions.cadence import FASTPATH_EVERY  # the cadence, defined once (the DAG reads it too)
from gpupool.decisions.fastpath import (JUDGED, READING_METRICS, FastMove, Judged, PlanBounds, Skip, decide,
                                        decide_inputs, recent_since, settings_from_config, with_power)
from gpupool.errors import UserError
from gpupool.jobs import reclaim
from gpupool.jobs.power import power_states, power_step
from gpupool.jobs.pressure import _pool_ids, read_pressures  # noqa: F401  (the tick's reads, shared with the power step)
from gpupool.sources.base import Pressure
from gpupool.values import utc, utc_datetime


# ------------------------------------------------------------------------------ the judge


def reading_key(platform: str, metric: str) -> tuple:
    """The series key (:data:`gpupool.canonical.SERIES_KEY`) of a platform's fast-path readings of
    ``metric`` (a :data:`READING_METRICS` value): its judge's models are stored under it in the
    detect stage's model store, beside the hourly series' (whose metrics differ)."""
    return (platform, "", "platform", "", metric)


def judge_reading(history: pd.Series, value: float, at: datetime, router, metric: str,
                  step: timedelta = FASTPATH_EVERY, model_for=None) -> bool:
    """Whether the detect stage's streaming rules flag ``value`` read at ``at`` as anomalous,
    judged on ``history`` (the staged readings before ``at``) as the detect task judges a point:
    :func:`gpupool.detect.stage.judge_series` of the newest point alone (with the alarm
    look-back before it) by the model of its refit anchor.

    ``model_for(anchor, history)`` gives that model (the tick's: staging's model store, so an
    anchor is fitted once); without it the model is fitted here. Too short a history is not
    judged (False), as the detect stage leaves such points alone.
    """
    from gpupool.detect.stage import fit_detector, judge_series

    at = utc(at)
    step = pd.Timedelta(step)
    hist = history[history.index < at].astype("float64")
    series = pd.concat([hist, pd.Series([float(value)], index=pd.DatetimeIndex([at]))])
    series = series[~series.index.duplicated(keep="last")].sort_index()
    grid = pd.date_range(series.index.min().floor(step), at, freq=step)
    series = series.reindex(series.index.union(grid))
    fit = model_for or (lambda anchor, h: fit_detector(h, router, metric))
    scored = judge_series(series, router, metric, at, at + step, fit)
    return bool(len(scored) and scored["is_anomaly"].iloc[-1])


def judge(engine, pressure: Pressure, router, step: timedelta = FASTPATH_EVERY) -> Judged:
    """``pressure`` with the judged metrics the detect rules flag, on the platform's staged readings.

    Each judged metric's newest reading is judged alone, by the model of its refit anchor from
    the detect stage's model store (:func:`gpupool.detect.stage.model_for` under
    :func:`reading_key`): the first tick after an anchor fits and stores it, every later tick
    until the next anchor rebuilds it from its stored parameters.
    """
    return _judge_counted(engine, pressure, router, step)[0]


def _judge_counted(engine, pressure: Pressure, router, step: timedelta = FASTPATH_EVERY) -> tuple[Judged, int]:
    """:func:`judge` and how many detector models it fitted (0 on every tick but an anchor's first)."""
    from gpupool.detect.stage import detect_lookback, fit_detector, model_for
    from gpupool.staging import fastpath as store

    at = utc_datetime(pressure.at)
    history = store.pressure_histories(engine, pressure.platform, list(JUDGED), at - detect_lookback(router), at)
    flagged, fitted = [], []
    for metric, canonical in JUDGED.items():
        field_ = next(f for f, m in READING_METRICS.items() if m == metric)
        key = reading_key(pressure.platform, metric)

        def stored(anchor, h, key=key, canonical=canonical):
            model, new = model_for(engine, key, anchor, h, lambda hh: fit_detector(hh, router, canonical))
            fitted.append(new)
            return model

        value = float(getattr(pressure, field_))
        if judge_reading(history[metric], value, at, router, canonical, step, model_for=stored):
            flagged.append(f"{field_} {value:g}")
    return Judged(pressure, tuple(flagged)), sum(fitted)


# ------------------------------------------------------------------------------ one tick


class FastPathReadError(UserError, RuntimeError):
    """Some platforms' pressure could not be read this tick (the others were decided on); raised
    after the tick was recorded and its moves started, so the task fails and Airflow alerts."""


def run_fastpath(ctx, at: datetime, dry_run: bool = True, backfill: bool = False,
                 actuators: Mapping[str, Any] | None = None, sources: Mapping[str, Any] | None = None,
                 lookup=None, allow_evict: bool = False,
                 power_actuators: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One fast-path tick at ``at``: read, stage and judge each platform's pressure, decide,
    record every decision in ``fastpath_decision``, open the moves' handovers and advance all.

    A move is sent for real only when the call (``dry_run=False``), the configuration
    (``dry_run: false``) and both platforms (``actuation: true``, not ``simulator``) say so;
    otherwise its handover is a dry run: audited, never sent. A backfill records why it did
    nothing. A tick is decided once: a re-run at the same ``at`` returns what was recorded.
    Before deciding, the tick runs the power step (:func:`gpupool.jobs.power.power_step`: parks
    and wakes, wakes first, ``power_actuators`` or the configuration's), and decides on what it
    leaves: a parked, parking or waking node is never lent, a parked one is its platform's
    capacity and a waking one capacity on its way (:func:`gpupool.decisions.fastpath.with_power`).
    After the power step and before the decision the reclaim runs (:mod:`gpupool.jobs.reclaim`):
    an owner short of GPUs with a node of its own lent out gets it back first, through a handover
    of kind ``reclaim`` the decision then sees as open.
    Raises :class:`~gpupool.actuation.handover.HandoverFailed` when a handover failed,
    :class:`FastPathReadError` when a platform could not be read,
    :class:`~gpupool.actuation.power.machine.PowerFailed` when a park or wake failed and (a live
    tick) :class:`~gpupool.actuation.handover.ReclaimLate` when a reclaim is past its owner's
    ``reclaim_minutes`` and :class:`~gpupool.actuation.handover.ReclaimBlocked` when a disruption
    budget still blocks one whose deadline falls before the next tick, after the rest was done
    (the first of them, the others in its notes). Blocked reclaims are listed under ``blocked``
    from the first tick that sees them (:func:`gpupool.jobs.reclaim.blocked_reclaims`).
    """
    from gpupool.jobs import allocation
    from gpupool.staging import handovers as handover_store

    at = utc_datetime(at)
    # read, decide and open under the pool's move-budget lock: a CLI tick beside the DAG's, or
    # a plan's actuation beside either, waits, so no two spend the same rolling-hour budget
    with handover_store.moves_lock(ctx.engine):
        out = _decide_and_open(ctx, at, dry_run, backfill, actuators, sources, lookup, power_actuators)
    if out.get("repeat") or out.get("backfill"):
        return out
    from gpupool.actuation.handover import HandoverFailed, ReclaimBlocked, ReclaimLate
    from gpupool.jobs.reclaim import blocked_due, blocked_reclaims, late_reclaims

    errors: list[Exception] = []
    try:
        out["advance"] = allocation.advance_handovers(ctx, at, dry_run=dry_run, actuators=actuators,
                                                      allow_evict=allow_evict, lookup=lookup)
    except HandoverFailed as exc:
        out["advance"] = exc.report
        errors.append(exc)
    if out["unread"]:
        errors.append(FastPathReadError("; ".join(f"{p}: {why}" for p, why in sorted(out["unread"].items()))))
    if ((out.get("power") or {}).get("advance") or {}).get("failed"):
        from gpupool.actuation.power.machine import PowerFailed

        errors.append(PowerFailed(out["power"]["advance"]))
    late = late_reclaims(ctx, at, (out.get("reclaim") or {}).get("waits") or ())
    if late:  # a dry run reports them; a live tick fails so Airflow alerts
        out["late"] = late
        if out.get("live"):
            errors.append(ReclaimLate(late))
    blocked = blocked_reclaims(ctx, at, (out.get("reclaim") or {}).pop("blocked", ()))
    if blocked:  # said at once; the run fails only at the last tick before the deadline
        out["blocked"] = blocked
        due = blocked_due(blocked, at, FASTPATH_EVERY)
        if due and out.get("live"):
            errors.append(ReclaimBlocked(due))
    if errors:  # the first fails the task; the others are said with it
        for other in errors[1:]:
            errors[0].add_note(f"{type(other).__name__}: {other}")
        raise errors[0]
    return out


def _decide_and_open(ctx, at: datetime, dry_run: bool, backfill: bool, actuators, sources, lookup,
                     power_actuators=None) -> dict[str, Any]:
    """The part of a tick that spends the move budget: read, judge, decide, record, open."""
    from gpupool.actuation import handover as ho
    from gpupool.staging import fastpath as store
    from gpupool.staging import reads

    engine, config = ctx.engine, ctx.config
    done = store.decisions_at(engine, at)
    if done:
        return {"at": at.isoformat(), "repeat": True, "decisions": done, "opened": []}
    settings = settings_from_config(config, backfill=backfill)
    if backfill:
        decisions = decide({}, PlanBounds(None, None), [], [], at, settings)
        store.record_decisions(engine, at, [_row(d, None, True) for d in decisions])
        return {"at": at.isoformat(), "backfill": True, "decisions": store.decisions_at(engine, at), "opened": [],
                "power": power_step(ctx, at, backfill=True)}
    read, unread, without = read_pressures(ctx, at, sources, lookup)
    router = config.detect.router_config()
    judged, refits = {}, 0
    for name, p in read.items():
        store.record_pressure(engine, name, at, {m: getattr(p, f) for f, m in READING_METRICS.items()})
        judged[name], fitted = _judge_counted(engine, _pool_ids(config, p), router, pd.Timedelta(config.step))
        refits += fitted
    live_ok = (not dry_run) and (not config.dry_run)
    since = recent_since(at, settings)
    recent = [h for h in store.handovers_opened_between(engine, since, at) if not (live_ok and h["dry_run"])]
    open_h = [h.as_dict() for h in ho.list_handovers(engine, ho.BLOCKING_STATES)]
    if open_h:  # the GPUs each node in transit brings, from the last inventory that listed it
        inv = reads.read_inventory(engine, at, ctx.platforms())
        known = {config.pool.node_id(r.platform, r.node): int(r.gpus) for r in inv.itertuples()}
        for h in open_h:
            if h.get("gpus") is None:  # opened without its GPUs (by the plan, or before they were kept)
                h["gpus"] = known.get(h["node"])
    # the power step first (a wake is faster than a move); the decision takes what it leaves
    power = power_step(ctx, at, dry_run=dry_run, actuators=power_actuators, by="fastpath", lookup=lookup,
                       pressures={name: j.pressure for name, j in judged.items()})
    states = power_states(engine)
    for n in (power.get("advance") or {}).get("nodes") or ():  # woken during this step: the reading,
        if n.get("before") == "waking" and n.get("state") == "on":  # taken before it, saw them held
            states.setdefault(n["node"], ("waking", n["platform"]))
    if states:
        gpus = {n: g for j in judged.values() for n, g in j.pressure.node_gpus.items()}
        gpus.update({h["node"]: h["gpus"] for h in open_h if h.get("gpus") is not None})
        judged, waking = with_power(judged, states, gpus)
        open_h += [w for w in waking if w["node"] not in {h["node"] for h in open_h}]
    # the owners (pool.nodes[].owner and owns at first sight, recorded): the reclaim's and the limits'
    owned = reclaim.tick_homes(ctx, at, {p: j.pressure for p, j in judged.items()}, open_h, states)
    if owned[0]:
        settings = replace(settings, homes={**owned[0], **settings.homes})
    # reclaim first: an owner short of GPUs takes its lent node back before any move
    step = reclaim.decide_reclaims(ctx, at, judged, open_h, recent, tick=FASTPATH_EVERY, actuators=actuators,
                                   lookup=lookup, powered_down=states, owned=owned)
    if step is not None and step.moves:
        judged = reclaim.reading_without(judged, step.moves)
        open_h, recent = open_h + step.moving, recent + step.spent
    decisions = list(step.moves) if step is not None else []
    decisions += decide(**decide_inputs(judged, reads.latest_plan(engine, at), ctx.platforms(), recent, open_h,
                                        at, settings))
    decisions += step.skips() if step is not None else []
    decisions += [Skip(name, why) for name, why in sorted({**unread, **without}.items())]
    live_platforms = {p.name for p in config.platforms if p.actuation and p.kind != "simulator"}

    def live(d) -> bool:
        return (live_ok and d.source in live_platforms and d.target in live_platforms
                and (actuators is None or (d.source in actuators and d.target in actuators)))

    seen = {name: j.pressure.as_dict() | {"anomalous": list(j.anomalous)} for name, j in judged.items()}
    rows = [_row(d, seen, not (isinstance(d, FastMove) and live(d))) for d in decisions]
    ids = store.record_decisions(engine, at, rows)
    lim = config.limits
    timeout = timedelta(hours=lim.max_actuation_age_hours) if lim.max_actuation_age_hours > 0 else ho.DEFAULT_TIMEOUT
    opened = []
    for did, d in zip(ids, decisions):
        if not isinstance(d, FastMove):
            continue
        try:
            hid = ho.open_handover(engine, d.node, d.source, d.target, at, reason=d.reason, dry_run=not live(d), gpus=d.gpus,
                                   timeout=timeout, **reclaim.open_kwargs(d))
        except ho.HandoverConflict as exc:
            store.set_handover(engine, did, None, note=f"not opened: {exc}")
            continue
        store.set_handover(engine, did, hid)
        opened.append({"id": hid, "node": d.node, "from": d.source, "to": d.target, "dry_run": not live(d)})
    out = {"at": at.isoformat(), "live": live_ok, "decisions": store.decisions_at(engine, at), "opened": opened,
           "unread": unread, "refits": refits, "power": power}
    if step is not None:
        out["reclaim"] = {"waits": step.waits, "need": {p: t.isoformat() for p, t in step.need.items()},
                          "blocked": step.blocked}
    return out


def _row(d: FastMove | Skip, seen: Mapping[str, Any] | None, dry_run: bool) -> dict[str, Any]:
    """One ``fastpath_decision`` row: a move is recorded under its target platform."""
    if isinstance(d, FastMove):
        return {"platform": d.target, "pressure": {p: (seen or {}).get(p) for p in (d.source, d.target)},
                "node": d.node, "source": d.source, "target": d.target, "reason": d.reason, "dry_run": dry_run,
                "handover_id": None}
    pressure = None if seen is None or d.platform == "*" else (seen.get(d.platform))
    return {"platform": d.platform, "pressure": pressure, "node": None, "source": None, "target": None,
            "reason": d.reason, "dry_run": dry_run, "handover_id": None}
