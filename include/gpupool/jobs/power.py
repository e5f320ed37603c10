"""The power step: production parks idle nodes and wakes parked ones by the rule the what-if runs.

One step at ``at`` (the fast path's tick runs it before its decision; the hourly plan's
actuation runs it when the fast path does not run):

1. the parks and wakes in flight are carried forward (:func:`gpupool.actuation.power.machine.advance_all`)
   and, once an hour, parked nodes their platform woke by itself recorded (``observe``);
2. the rule's inputs are read from staging, as the what-if builds them from its world
   (:mod:`gpupool.sim.power`): each pool node of a platform that parks (``power:`` and
   ``actuation: true``) with its power state, whether it has work (the reading of this step:
   a node its platform reports open and idle has none), since when it is idle (the fast path's
   recorded readings and the inventory snapshots), when it was last woken or moved, and whether
   a handover holds it; each platform's pressure from its readings staged one a tick over the
   last day (:func:`gpupool.decisions.parking.pressure_from_readings`, the what-if's too), the
   latest plan's upper bound and demand a day ago;
3. :func:`gpupool.decisions.parking.decide_parking` decides, with ``parking:`` of the
   configuration (:class:`~gpupool.decisions.parking.ParkingSettings`, the what-if's defaults);
4. the wakes go out first (a wake is faster than a move), then the parks, each through the
   power machine under the node's lock (``by`` the fast path or the plan). A dry run sends
   nothing: the machine records what it would have done. A backfill reads and sends nothing.

A fresh install parks nothing: without a platform with ``power:`` the step does nothing at all.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Mapping

from gpupool.actuation.power import machine as pm
from gpupool.decisions.cadence import FASTPATH_EVERY
from gpupool.decisions.parking import (
    ON, PowerNode, daily_window, decide_parking, kept_readings, plan_upper, pressure_from_readings)
from gpupool.jobs.pressure import FASTPATH_SEEN_WITHIN, PLAN_EVERY, fastpath_running, power_states  # noqa: F401 - shared reads
from gpupool.values import utc_datetime



def power_platforms(config) -> list[str]:
    """The platforms whose nodes the power step parks and wakes: ``power:`` and ``actuation: true``."""
    return [p.name for p in config.platforms if p.power is not None and p.actuation and p.kind != "simulator"]


def _build(ctx, names: list[str], live_ok: bool, lookup) -> tuple[dict, dict[str, str]]:
    """The live power actuators of ``names``, and why for those that could not be built (their
    parks and wakes are dry runs this step)."""
    built, why = {}, {}
    if not live_ok:
        return built, why
    for name in names:
        try:
            built.update(ctx.build_power_actuators([name], dry_run=False, lookup=lookup))
        except Exception as exc:  # a missing BMC connection: this platform's actions stay dry, said so
            why[name] = f"power actuator not built: {exc}"
    return built, why


def _readings(engine, names: list[str], at: datetime, tick: timedelta) -> dict[str, list[tuple[datetime, float]]]:
    """Each platform's staged demand readings over the last day and a tick, one per tick (the
    newest in each tick-wide slot back from ``at``), oldest first."""
    from gpupool.staging import fastpath as store

    minutes = tick / timedelta(minutes=1)
    span = tick * kept_readings(minutes)
    out = {}
    for p in names:
        slots: dict[int, tuple[datetime, float]] = {}
        for t, v in store.readings_between(engine, p, at - span - timedelta(days=1), at):
            slots[int((at - t) / tick)] = (t, v)  # later readings of a slot replace earlier ones
        out[p] = [slots[k] for k in sorted(slots, reverse=True)]
    return out


def _idle_since(engine, names: list[str], at: datetime, window: timedelta, pressures) -> dict[str, datetime]:
    """When each node last had work, as far as the recorded readings in ``window`` before ``at``
    say: after its last reading with work (or not open), else its first idle one. A node seen
    in no reading is missing (not known to be idle: it does not park)."""
    from gpupool.staging import fastpath as store
    from gpupool.staging import reads

    seen: list[tuple[datetime, str, bool]] = []
    for t, p, pr in store.pressures_seen(engine, at - window, at):
        if p in names:
            idle = set(pr.get("idle_nodes") or ())
            seen += [(t, n, n in idle) for n in (pr.get("node_gpus") or {})]
    inv = reads.inventory_between(engine, at - window, at, names)
    for r in inv.itertuples():
        busy = 0.0 if r.busy_gpus is None or r.busy_gpus != r.busy_gpus else float(r.busy_gpus)
        seen.append((r.snapshot_at.to_pydatetime(), str(r.node), bool(r.schedulable) and busy <= 0))
    for p, pr in (pressures or {}).items():
        if p in names:
            idle = set(pr.idle_nodes)
            seen += [(at, n, n in idle) for n in pr.node_gpus]
    first_idle: dict[str, datetime] = {}
    last_busy: dict[str, datetime] = {}
    for t, n, idle in sorted(seen):
        if idle:
            first_idle.setdefault(n, t)
        else:
            last_busy[n] = t
            first_idle.pop(n, None)
    return {n: max(t, last_busy.get(n, t)) for n, t in first_idle.items()}


def power_step(ctx, at: datetime, *, dry_run: bool = True, backfill: bool = False,
               actuators: Mapping[str, Any] | None = None, pressures: Mapping[str, Any] | None = None,
               tick: timedelta = FASTPATH_EVERY, by: str = "fastpath", lookup=None) -> dict[str, Any]:
    """Park and wake at ``at`` (module docstring). ``pressures``: this step's readings, node names
    as pool ids (the fast path's tick passes its own; otherwise they are read and staged here);
    ``tick``: the cadence the step runs at. Returns ``{at, by, platforms, live, need, wakes,
    parks, refused, advance, observed, unread}`` (``backfill``/``note`` when it did nothing).
    The caller raises :class:`~gpupool.actuation.power.machine.PowerFailed` on ``advance.failed``."""
    at = utc_datetime(at)
    config, engine = ctx.config, ctx.engine
    names = power_platforms(config)
    out: dict[str, Any] = {"at": at.isoformat(), "by": by, "platforms": names, "live": False, "need": {},
                           "wakes": [], "parks": [], "refused": [], "advance": None, "observed": [], "unread": {}}
    if not names:
        out["note"] = "no platform has power: and actuation: true; nothing parks or wakes"
        return out
    if backfill:
        out.update(backfill=True, note="backfill run: the power step never parks or wakes; nothing read, nothing sent")
        return out
    live_ok = (not dry_run) and (not config.dry_run)
    out["live"] = live_ok
    unbuilt: dict[str, str] = {}
    if actuators is None:
        actuators, unbuilt = _build(ctx, names, live_ok, lookup)
    actuators = {p: a for p, a in actuators.items() if p in names} if live_ok else {}
    if actuators and (tick >= PLAN_EVERY or at.minute * 60 + at.second < tick.total_seconds()):
        # a parked node its platform woke by itself (a Slurm job sent to it): observed once an
        # hour, as asking each parked node's platform (a BMC each) every tick costs more than
        # the rule loses by counting such a node parked a little longer
        out["observed"] = pm.observe(engine, actuators, at)
    out["advance"] = pm.advance_all(engine, actuators, at, dry_run=not live_ok)
    if pressures is None:
        pressures = _read_and_stage(ctx, at, names, lookup, out)
    settings = config.parking_settings()
    minutes = tick / timedelta(minutes=1)
    nodes = _nodes(ctx, at, names, pressures, settings, tick)
    decision = decide_parking(nodes, _pressures(ctx, at, names, settings, tick), settings, at,
                              wake_minutes=settings.wake_minutes, tick_minutes=minutes,
                              min_nodes={p.name: p.min_nodes for p in config.platforms})
    out["need"] = dict(decision.need)
    timeouts = {p.name: timedelta(minutes=p.power.timeout_minutes) for p in config.platforms if p.power is not None}
    owner = {n.name: n.platform for n in nodes}
    # a dry run leaves the node as it was, so the next step decides the same: what it would do is
    # recorded once an hour per node, not at every tick
    from gpupool.staging import power as store

    recorded = store.dry_recorded_since(engine, at - PLAN_EVERY, at) if len(actuators) < len(names) else set()
    for kind, chosen in (("wake", decision.wakes), ("park", decision.parks)):  # wakes first: faster than a move
        for node in chosen:
            platform = owner[node]
            act = actuators.get(platform)
            if act is None and (node, ON if kind == "wake" else "parked") in recorded:
                out[kind + "s"].append({"node": node, "platform": platform, "action": f"would {kind}",
                                        "dry_run": True, "state": "unchanged",
                                        "reason": "dry run: recorded within the hour already"})
                continue
            reason = (f"{by}: {platform} needs {decision.need.get(platform, 0)} powered node(s) "
                      f"({'short of them' if kind == 'wake' else 'idle beyond the warm buffer'})")
            timeout = timeouts.get(platform, pm.DEFAULT_TIMEOUT)
            try:
                if kind == "wake":
                    done = pm.wake(engine, node, act, at, dry_run=act is None, by=by, reason=reason, timeout=timeout)
                else:
                    done = pm.park(engine, node, platform, act, at, dry_run=act is None, by=by, reason=reason,
                                   timeout=timeout)
            except pm.PowerError as exc:  # another writer holds it, or a handover: the next step decides again
                out["refused"].append({"node": node, "platform": platform, "action": kind, "why": str(exc)})
                continue
            if platform in unbuilt:
                done["note"] = unbuilt[platform]
            out[kind + "s"].append({**done, "reason": reason})
    return out


def _read_and_stage(ctx, at: datetime, names: list[str], lookup, out: dict) -> dict[str, Any]:
    """This step's readings of ``names`` (node names as pool ids), staged as the fast path stages
    its own (the rule reads them back with the readings before)."""
    from gpupool.decisions.fastpath import READING_METRICS
    from gpupool.jobs.pressure import _pool_ids, read_pressures
    from gpupool.staging import fastpath as store

    read, unread, _ = read_pressures(ctx, at, lookup=lookup, only=names)
    out["unread"] = {p: why for p, why in unread.items() if p in names}
    mine = {}
    for p, pr in read.items():
        if p in names:
            store.record_pressure(ctx.engine, p, at, {m: getattr(pr, f) for f, m in READING_METRICS.items()})
            mine[p] = _pool_ids(ctx.config, pr)
    return mine


def _nodes(ctx, at: datetime, names: list[str], pressures: Mapping[str, Any], settings, tick: timedelta) -> list[PowerNode]:
    """The pool nodes of ``names`` as the rule sees them (module docstring)."""
    from gpupool.jobs.pool import pool_nodes
    from gpupool.staging import power as store

    engine = ctx.engine
    records, _ = pool_nodes(engine, at, ctx.platforms(), ctx.config)
    states = {r["node"]: r for r in store.power_rows(engine)}
    # a wake older than the cool-down and a tick is as good as none to the rule
    woken = {n: utc_datetime(t) for n, t in store.woken_since(
        engine, at - timedelta(minutes=settings.cooldown_minutes) - tick, at).items()}
    window = timedelta(minutes=settings.idle_minutes) + 2 * tick
    idle_since = _idle_since(engine, names, at, window, pressures)
    gpus = {n: g for pr in pressures.values() for n, g in pr.node_gpus.items()}
    idle_now = {p: set(pr.idle_nodes) for p, pr in pressures.items()}
    out, seen = [], set()
    for r in records:
        row = states.get(r.name)
        platform = row["platform"] if row is not None and row["state"] != ON else r.owner
        if platform not in names:
            continue
        seen.add(r.name)
        reading = pressures.get(platform)
        busy = r.busy_gpus
        if reading is not None and r.name in reading.node_gpus:  # the reading of this step says
            busy = 0.0 if r.name in idle_now[platform] else float(r.gpus)
        moved = None if r.last_moved_at is None else utc_datetime(r.last_moved_at)
        changed = max((t for t in (moved, woken.get(r.name)) if t is not None), default=None)
        state = row["state"] if row is not None else ON
        # a node powered down is planned as fixed (in_handover) but is in no handover: one never opens on it
        out.append(PowerNode(r.name, platform, int(r.gpus), float(busy) if state == ON else 0.0, state,
                             bool(r.in_handover) and state == ON, idle_since.get(r.name, at), changed))
    for platform in names:  # listed by this step's reading, not yet by an inventory (no hourly run yet)
        reading = pressures.get(platform)
        if reading is None:
            continue
        idle = set(reading.idle_nodes)
        for name, g in sorted(reading.node_gpus.items()):
            if name in seen or name in states:
                continue
            seen.add(name)
            out.append(PowerNode(name, platform, int(g), 0.0 if name in idle else float(g), ON, False,
                                 idle_since.get(name, at), woken.get(name)))
    listed: dict[str, int] | None = None  # GPUs by node from the latest inventories, read once if needed
    for name, row in sorted(states.items()):  # powered down: held by gpupool, so out of the plan's pool
        if name in seen or row["state"] == ON or row["platform"] not in names:
            continue
        if not gpus.get(name) and listed is None:
            listed = _inventory_gpus(engine, at, names)
        out.append(PowerNode(name, row["platform"], int(gpus.get(name) or (listed or {}).get(name, 0)),
                             0.0, row["state"], False, None, woken.get(name)))
    return out


def _inventory_gpus(engine, at: datetime, names: list[str]) -> dict[str, int]:
    """Each node's GPUs from its platform's latest inventory (a node not listed is absent)."""
    from gpupool.staging import reads

    inv = reads.read_inventory(engine, at, names)
    return {str(r.node): int(r.gpus) for r in inv.itertuples()}


def _pressures(ctx, at: datetime, names: list[str], settings, tick: timedelta) -> dict[str, Any]:
    """Each platform's pressure from its staged readings, built as the what-if builds it; a
    platform not read at ``at`` takes no part."""
    from gpupool.staging import fastpath as store
    from gpupool.staging import reads

    minutes = tick / timedelta(minutes=1)
    plan = reads.latest_plan(ctx.engine, at)
    out = {}
    for p, readings in _readings(ctx.engine, names, at, tick).items():
        if not readings or readings[-1][0] != at:
            continue
        upper = None
        if plan is not None:
            m = plan._mapping if hasattr(plan, "_mapping") else plan
            bounds = (((m["summary"] or {}).get("platforms") or {}).get(p) or {}).get("demand_upper") or []
            upper = plan_upper([float(b) for b in bounds if b is not None], utc_datetime(m["decided_at"]), at,
                               settings.wake_minutes)
        then = [v for _, v in store.readings_between(ctx.engine, p, *daily_window(at, settings.wake_minutes, minutes))]
        out[p] = pressure_from_readings([v for _, v in readings], settings, wake_minutes=settings.wake_minutes,
                                        tick_minutes=minutes, forecast_upper=upper, daily=max(then) if then else None)
    return out


def plan_power_step(ctx, at: datetime, *, dry_run: bool = True, backfill: bool = False, lookup=None,
                    actuators: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The power step of the hourly plan's actuation: run at the plan's cadence when the fast path
    does not run (:func:`fastpath_running`); otherwise the fast path's ticks run it, and this says so."""
    at = utc_datetime(at)
    if not power_platforms(ctx.config):
        return power_step(ctx, at, backfill=backfill)
    if not backfill and fastpath_running(ctx.engine, at):
        return {"at": at.isoformat(), "by": "plan", "note": "the fast path runs the power step (it ticked within "
                f"{FASTPATH_SEEN_WITHIN}); the plan leaves parking to it", "wakes": [], "parks": [], "refused": []}
    return power_step(ctx, at, dry_run=dry_run, backfill=backfill, tick=PLAN_EVERY, by="plan", lookup=lookup,
                      actuators=actuators)


# ------------------------------------------------------------------------------------ the operator


def power_status(engine) -> list[dict[str, Any]]:
    """Every node gpupool parked or woke: its power state, since when, the platform it wakes on,
    the transition in flight (``pending``: where it goes and by when) and the last error."""
    from gpupool.staging import power as store

    out = []
    for r in store.power_rows(engine):
        pending = None
        if r["state"] in pm.MOVING_STATES:
            to = pm.PARKED if r["state"] == pm.PARKING else ON
            pending = {"to": to, "deadline": None if r["deadline"] is None else utc_datetime(r["deadline"]).isoformat()}
            if r.get("wake_deadline") is not None:
                pending["then_wake_by"] = utc_datetime(r["wake_deadline"]).isoformat()
        out.append({"node": r["node"], "platform": r["platform"], "state": r["state"],
                    "since": utc_datetime(r["since"]).isoformat(), "pending": pending, "error": r["error"]})
    return out


def operator_power(ctx, action: str, node: str, at: datetime, *, dry_run: bool = True, reason: str | None = None,
                   lookup=None) -> dict[str, Any]:
    """``gpupool power park|wake NODE``: one park or wake by the operator, through the power
    machine (audited; a dry run, the default, sends nothing and records what it would send).
    A node of a platform without ``power:`` is refused, as is a node the pool does not know."""
    from gpupool.staging import power as store

    at = utc_datetime(at)
    config, engine = ctx.config, ctx.engine
    row = store.get_power(engine, node)
    if row is not None and row["state"] != ON:
        platform = row["platform"]
    else:
        from gpupool.jobs.pool import pool_nodes

        records, excluded = pool_nodes(engine, at, ctx.platforms(), config)
        owner = {r.name: r.owner for r in records}
        if node not in owner:
            why = next((e["why"] for e in excluded if e["node"] == node), "not in the latest inventory of any platform")
            raise pm.PowerError(f"node {node!r} is not a pool node gpupool may {action}: {why}")
        platform = owner[node]
    pcfg = config.platform(platform)
    if pcfg.power is None:
        raise pm.PowerError(f"node {node!r} is on platform {platform!r}, which has no power: section; gpupool "
                            "never parks or wakes its nodes")
    live = (not dry_run) and (not config.dry_run) and pcfg.actuation
    actuator = ctx.build_power_actuators([platform], dry_run=False, lookup=lookup).get(platform) if live else None
    timeout = timedelta(minutes=pcfg.power.timeout_minutes)
    why = reason or f"operator: gpupool power {action}"
    if action == "park":
        return pm.park(engine, node, platform, actuator, at, dry_run=actuator is None, by="operator", reason=why,
                       timeout=timeout)
    return pm.wake(engine, node, actuator, at, dry_run=actuator is None, by="operator", reason=why, timeout=timeout)
