"""The GPU pool at a glance: what the Airflow "GPU pool" page and its JSON API show.

Everything is read back from staging around one instant — by default the newest forecast's
issue time, so a simulated or backfilled history is shown as it was, not relative to the
wall clock.
"""

from __future__ import annotations

import html
import math
from datetime import datetime
from typing import Any

import pandas as pd
from sqlalchemy.engine import Engine

from gpupool import energy
from gpupool.canonical import DEMAND_METRICS
from gpupool.decisions.ownership import lent_and_borrowed
from gpupool.errors import UserError
from gpupool.values import utc
from gpupool.staging import ownership_reads
from gpupool.staging import power as power_store
from gpupool.staging import reads

OPEN_STATES = ("planned", "releasing", "released", "attaching")


class NoDataError(LookupError):
    """Staging holds nothing to show yet."""


class InstantError(UserError, ValueError):
    """An instant whose window the page cannot show (it leaves the range staging's reads hold)."""


#: the instants the page shows: the whole years inside pandas' nanosecond timestamps, which bound
#: every frame the reads build
EARLIEST, LATEST = utc("1678-01-01"), utc("2262-01-01")


def latest_instant(engine: Engine) -> datetime:
    """The newest forecast issue time, else the newest sample; NoDataError if staging is empty."""
    at = reads.newest_instant(engine)
    if at is None:
        raise NoDataError("staging holds no samples yet: run the gpupool_pipeline DAG first")
    return utc(at).to_pydatetime()


def pool_state(engine: Engine, at: datetime | None = None, hours: int = 24, config=None) -> dict[str, Any]:
    """Per platform: GPUs owned, demand over the last `hours` and its forecast band over the
    next, the points the detect stage cleaned (telemetry faults) or flagged and kept (real bursts), open handovers, and the last plan with its reasons.
    ``power`` lists the nodes that were not on at ``at`` (parking, parked, waking), each platform's
    ``power`` counts them. ``owners`` lists each owned pool node with who holds it
    (:func:`node_owners`; ``config``: platforms.yaml, for ``pool.nodes[].owner`` and the platforms'
    names of a node), each platform's ``ownership`` counts what it owns, lends and borrows (absent
    where no node has an owner). An `at` whose window leaves the instants the reads hold is an InstantError."""
    at = utc(at if at is not None else latest_instant(engine))
    if not EARLIEST + pd.Timedelta(hours=hours) <= at <= LATEST:
        raise InstantError(f"{at.isoformat()}: the page shows instants whose last {hours} h lie within "
                           f"{EARLIEST:%Y-%m-%d} .. {LATEST:%Y-%m-%d}")
    since = at - pd.Timedelta(hours=hours)
    platforms = reads.sampled_platforms(engine, since.to_pydatetime(), at.to_pydatetime())
    plan_row = reads.latest_plan(engine, at.to_pydatetime())
    handovers = reads.handovers_in(engine, OPEN_STATES)
    state = {p: _platform_state(engine, p, at, since) for p in platforms}
    power = power_nodes(engine, at.to_pydatetime())
    for p, st in state.items():
        st["power"] = {s: sum(n["platform"] == p and n["state"] == s for n in power) for s in energy.STATES[1:]}
    owned = node_owners(engine, at.to_pydatetime(), [*platforms, *(p.name for p in getattr(config, "platforms", []))],
                        config)
    if owned:
        lent, borrowed = lent_and_borrowed((n["owner"], n["holder"]) for n in owned)
        for p, st in state.items():
            st["ownership"] = {"owned": sum(n["owner"] == p for n in owned), "lent": lent.get(p, 0),
                               "borrowed": borrowed.get(p, 0),
                               "borrowed_nodes": [(n["node"], n["owner"]) for n in owned
                                                  if n["holder"] == p and n["owner"] != p]}
    plan = None
    if plan_row is not None:
        plan = {
            "id": plan_row.id,
            "decided_at": utc(plan_row.decided_at).isoformat(),
            "policy": plan_row.policy,
            "solver": plan_row.solver,
            "dry_run": bool(plan_row.dry_run),
            "moves": plan_row.moves,
            "platforms": (plan_row.summary or {}).get("platforms", {}),
        }
    for h in handovers:
        for k in ("created_at", "updated_at", "deadline"):
            if h.get(k) is not None:
                h[k] = utc(h[k]).isoformat()
    return {"at": at.isoformat(), "hours": hours, "platforms": state, "handovers": handovers, "plan": plan,
            "power": power, "owners": owned}


def node_owners(engine: Engine, at: datetime, platforms: list[str], config=None) -> list[dict[str, Any]]:
    """Each pool node with an owner, in node order: ``{node, owner, holder, moving}``. The owner
    is ``node_owner`` as staging records it, with the ``pool.nodes[].owner`` of ``config`` it does
    not hold yet (:func:`gpupool.staging.ownership_reads.node_owners`); the holder is the platform
    that holds it at ``at`` as the planner sees the pool (a node in a handover: its target,
    ``moving`` true), None where the planner leaves it out of the pool (drained by someone else,
    open on several platforms, or in no inventory of ``platforms``)."""
    from gpupool.jobs.pool import pool_nodes

    explicit = {n.node: n.owner for n in config.pool.nodes if n.owner} if config is not None else {}
    owners = ownership_reads.node_owners(engine, explicit)
    if not owners:
        return []
    names = list(dict.fromkeys([*platforms, *sorted(set(owners.values()))]))
    held = {n.name: n.owner for n in pool_nodes(engine, at, names, config)[0]}
    moving = {h["node"] for h in reads.handovers_in(engine, OPEN_STATES) if not h["dry_run"]}
    return [{"node": node, "owner": owner, "holder": held.get(node), "moving": node in moving and node in held}
            for node, owner in sorted(owners.items())]


def power_nodes(engine: Engine, at: datetime) -> list[dict[str, Any]]:
    """The nodes that were not on at ``at``, in node order: ``{node, platform, state, since,
    deadline, late, error}``. ``late``: parking or waking past its deadline; ``error``: the
    node's error as staging holds it where its state is still the one of ``at``."""
    states = energy.states_at(power_store.live_transitions(engine, at), at)
    current = {r["node"]: r for r in power_store.power_rows(engine, energy.STATES[1:])}
    out = []
    for node, st in sorted(states.items()):
        if st["state"] == energy.ON:
            continue
        row = current.get(node)
        error = row["error"] if row is not None and row["transition_id"] == st["transition_id"] else st["error"]
        out.append({"node": node, "platform": st["platform"], "state": st["state"], "since": st["since"].isoformat(),
                    "deadline": None if st["deadline"] is None else st["deadline"].isoformat(),
                    "late": st["state"] in (energy.PARKING, energy.WAKING) and st["deadline"] is not None
                    and utc(at) >= utc(st["deadline"]),
                    "error": error})
    return out


def _platform_state(engine: Engine, platform: str, at: pd.Timestamp, since: pd.Timestamp) -> dict:
    t0, t1 = since.to_pydatetime(), at.to_pydatetime()
    nodes, gpus = reads.inventory_totals(engine, platform, t1)
    demand, _ = reads.hourly_demand(engine, platform, t0, t1)  # the demand the forecast is fitted on
    capacity = reads.hourly_metric(engine, platform, "gpu_capacity", t0, t1)
    cl = reads.cleaning_decisions(engine, t0, t1, platform)
    raw_demand = _raw_demand(engine, platform, t0, t1) if len(cl) else pd.Series(dtype=float)
    issued, rows = reads.latest_forecast(engine, platform, t1)
    band = [{"ts": utc(r.ts).isoformat(), "yhat": r.yhat, "lower": r.yhat_lower, "upper": r.yhat_upper} for r in rows]
    # the detect stage's decisions: replaced as a telemetry fault, or flagged and kept as demand
    anomalies = [
        {"ts": utc(r.ts).isoformat(), "metric": r.metric, "value": _num(r.value),
         "cleaned_to": _num(r.clean_value) if r.cleaned else None, "detector": r.detector,
         "demand_at": _num(raw_demand.get(utc(r.ts))),
         "decision": r.decision, "fault": r.fault or None, "label": decision_label(r.decision, r.fault)}
        for r in cl.sort_values("ts").itertuples()
    ]
    return {
        "nodes": nodes,
        "gpus": gpus,
        "demand": [{"ts": t.isoformat(), "value": _num(v)} for t, v in demand.items()],
        "capacity": [{"ts": t.isoformat(), "value": _num(v)} for t, v in capacity.items()],
        "forecast_issued_at": utc(issued).isoformat() if issued is not None else None,
        "forecast": band,
        "anomalies": anomalies,
    }


def _raw_demand(engine: Engine, platform: str, t0: datetime, t1: datetime) -> pd.Series:
    """The platform's demand (allocated + pending) as reported at each instant, before cleaning:
    where the page marks a point the detect stage decided on, as the report does."""
    raw = reads.platform_series(engine, t0, t1, platform)
    raw = raw[raw["metric"].isin(DEMAND_METRICS)]
    if raw.empty:
        return pd.Series(dtype=float)
    return raw.pivot_table(index="ts", columns="metric", values="value", aggfunc="mean").sum(axis=1, min_count=1)


#: how a marked point is labelled on the pool page and in the report
CLEANED_LABEL = "cleaned: telemetry fault"
KEPT_LABEL = "kept: real burst"


def decision_label(decision: str, fault: str | None = None) -> str:
    """``cleaned: telemetry fault (spike)`` or ``kept: real burst``: one stored decision in words."""
    if decision == "cleaned":
        return f"{CLEANED_LABEL} ({fault})" if fault else CLEANED_LABEL
    return KEPT_LABEL


def _num(v: Any) -> float | None:
    if v is None:
        return None
    v = float(v)
    return None if math.isnan(v) else round(v, 3)



# --- HTML --------------------------------------------------------------------------------

_STYLE = """
body{font-family:system-ui,sans-serif;margin:1.2rem;color:#1b1f24;background:#fff}
h1{font-size:1.4rem;margin:0 0 .3rem} h2{font-size:1.1rem;margin:1rem 0 .3rem}
.meta{color:#57606a;font-size:.9rem} .cards{display:flex;flex-wrap:wrap;gap:1rem}
.card{border:1px solid #d0d7de;border-radius:8px;padding:.8rem;flex:1 1 330px;min-width:0;max-width:100%;
box-sizing:border-box}
.card svg.chart{display:block;width:100%;height:auto;overflow:hidden}
.kpi{font-size:1.6rem;font-weight:600} table{border-collapse:collapse;font-size:.85rem;width:100%}
td,th{border-bottom:1px solid #eaeef2;padding:.25rem .4rem;text-align:left;overflow-wrap:break-word}
.card table{table-layout:fixed} .card td,.card th{overflow-wrap:anywhere}
.legend span{display:inline-block;margin-right:.8rem;font-size:.8rem}
.sw{display:inline-block;width:10px;height:10px;margin-right:3px;vertical-align:middle}
.pw{display:inline-block;padding:0 .4rem;border-radius:8px;font-size:.8rem;color:#fff}
.pw-parking{background:#bf8700} .pw-parked{background:#57606a} .pw-waking{background:#1a7f37}
.late{color:#cf222e;font-weight:600}
"""


def render_html(state: dict[str, Any]) -> str:
    """A self-contained page (inline SVG, no scripts) of `pool_state`'s result."""
    e = html.escape
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>GPU pool — gpupool</title>",
        f"<style>{_STYLE}</style></head><body>",
        "<h1>GPU pool</h1>",
        f"<div class='meta'>as of {e(state['at'])} · last and next {state['hours']} h · "
        "<a href='api/pool'>JSON</a></div>",
        "<div class='cards'>",
    ]
    for name, p in state["platforms"].items():
        parts.append("<div class='card' data-platform='%s'>" % e(name))
        parts.append(f"<h2>{e(name)}</h2><div class='kpi'>{p['gpus']} GPUs</div>")
        n_clean = sum(a["decision"] == "cleaned" for a in p["anomalies"])
        parts.append(f"<div class='meta'>{p['nodes']} nodes · last {state['hours']} h: {n_clean} points cleaned as "
                     f"telemetry faults, {len(p['anomalies']) - n_clean} flagged and kept as real bursts</div>")
        own = p.get("ownership")
        if own:
            pairs = ", ".join(f"{n} from {o}" for n, o in own["borrowed_nodes"])
            borrowed = f" ({pairs})" if pairs else ""
            parts.append(f"<div class='meta' data-ownership>owns {own['owned']} · lent {own['lent']} · "
                         f"borrowed {own['borrowed']}{e(borrowed)}</div>")
        powered = [f"{n} {s}" for s, n in p.get("power", {}).items() if n]
        if powered:
            parts.append(f"<div class='meta' data-power-counts>power: {e(', '.join(powered))}</div>")
        parts.append(_svg_chart(p))
        parts.append(
            "<div class='legend'><span><i class='sw' style='background:#0969da'></i>demand</span>"
            "<span><i class='sw' style='background:#8c959f'></i>capacity</span>"
            "<span><i class='sw' style='background:#bf8700;opacity:.4'></i>forecast band</span>"
            f"<span><i class='sw' style='background:#cf222e'></i>{CLEANED_LABEL}</span>"
            f"<span><i class='sw' style='background:#8250df'></i>{KEPT_LABEL}</span></div>"
        )
        if p["anomalies"]:
            # fixed column widths: the table fits its card at any width, the decision gets the room
            parts.append("<table><colgroup><col style='width:13%'><col style='width:21%'><col style='width:14%'>"
                         "<col style='width:18%'><col style='width:34%'></colgroup>"
                         "<tr><th>at</th><th>metric</th><th>value</th><th>cleaned to</th><th>decision</th></tr>")
            for a in p["anomalies"][-5:]:
                parts.append(
                    f"<tr data-decision='{e(a['decision'])}'><td>{e(a['ts'][11:16])}</td><td>{e(a['metric'].removeprefix('gpu_'))}</td>"
                    f"<td>{_fmt(a['value'])}</td><td>{_fmt(a['cleaned_to'])}</td><td>{e(a['label'])}</td></tr>"
                )
            parts.append("</table>")
        parts.append("</div>")
    parts.append("</div>")
    parts.append("<h2>Open handovers</h2>")
    if state["handovers"]:
        parts.append("<table><tr><th>#</th><th>node</th><th>from</th><th>to</th><th>state</th><th>since</th><th>dry run</th></tr>")
        for h in state["handovers"]:
            parts.append(
                f"<tr><td>{h['id']}</td><td>{e(h['node'])}</td><td>{e(h['from_platform'])}</td><td>{e(h['to_platform'])}</td>"
                f"<td>{e(h['state'])}</td><td>{e(str(h['updated_at']))}</td><td>{'yes' if h['dry_run'] else 'no'}</td></tr>"
            )
        parts.append("</table>")
    else:
        parts.append("<p class='meta'>none</p>")
    parts.append(_power_table(state.get("power", [])))
    if state.get("owners"):
        parts.append(_owners_table(state["owners"]))
    plan = state["plan"]
    parts.append("<h2>Last plan</h2>")
    if plan:
        parts.append(
            f"<p class='meta'>#{plan['id']} decided {e(plan['decided_at'])} · policy {e(plan['policy'])} · "
            f"solver {e(plan['solver'])} · {'dry run' if plan['dry_run'] else 'live'}</p>"
        )
        if plan["moves"]:
            parts.append("<table><tr><th>node</th><th>from</th><th>to</th><th>expected gain</th><th>why</th></tr>")
            for m in plan["moves"]:
                parts.append(
                    f"<tr><td>{e(str(m.get('node')))}</td><td>{e(str(m.get('from')))}</td><td>{e(str(m.get('to')))}</td>"
                    f"<td>{_fmt(m.get('expected_gain'))}</td><td>{e(str(m.get('reason', '')))}</td></tr>"
                )
            parts.append("</table>")
        else:
            parts.append("<p>No moves: every platform's forecast fits what it holds.</p>")
    else:
        parts.append("<p class='meta'>no plan yet</p>")
    parts.append("</body></html>")
    return "".join(parts)


def _power_table(nodes: list[dict[str, Any]]) -> str:
    """The parked, parking and waking nodes, each state its own colour, a late one in red."""
    e = html.escape
    parts = ["<h2>Parked and waking nodes</h2>"]
    if not nodes:
        parts.append("<p class='meta'>none: every node is on</p>")
        return "".join(parts)
    parts.append("<table><tr><th>node</th><th>platform</th><th>power</th><th>since</th><th>deadline</th><th>note</th></tr>")
    for n in nodes:
        late = " <span class='late'>late</span>" if n["late"] else ""
        parts.append(
            f"<tr data-power='{e(n['state'])}'><td>{e(n['node'])}</td><td>{e(n['platform'])}</td>"
            f"<td><span class='pw pw-{e(n['state'])}'>{e(n['state'])}</span>{late}</td><td>{e(n['since'])}</td>"
            f"<td>{e(n['deadline'] or '–')}</td><td>{e(str(n['error'] or ''))}</td></tr>")
    parts.append("</table>")
    return "".join(parts)


def _owners_table(nodes: list[dict[str, Any]]) -> str:
    """Who owns each owned node and who holds it: a node held by another platform is lent to it."""
    e = html.escape
    parts = ["<h2>Owners</h2>", "<table><tr><th>node</th><th>owner</th><th>held by</th><th>note</th></tr>"]
    for n in nodes:
        holder = n["holder"]
        if holder is None:
            note = "out of the pool (drained by someone else, or in no inventory)"
        elif holder != n["owner"]:
            note = f"{'moving' if n['moving'] else 'lent'} to {holder}"
        else:
            note = "coming home" if n["moving"] else "at home"
        parts.append(f"<tr data-owner='{e(n['owner'])}'><td>{e(n['node'])}</td><td>{e(n['owner'])}</td>"
                     f"<td>{e(holder or '–')}</td><td>{e(note)}</td></tr>")
    parts.append("</table>")
    return "".join(parts)


def _fmt(v: Any) -> str:
    return "–" if v is None else f"{float(v):.1f}"


def _svg_chart(p: dict, width: int = 420, height: int = 150) -> str:
    """Demand and capacity over the past, the forecast band ahead, the detect stage's marked points
    (red: cleaned as a telemetry fault, purple: kept as a real burst), scaled to its card."""
    pts = [(pd.Timestamp(x["ts"]), x["value"]) for x in p["demand"] if x["value"] is not None]
    cap = [(pd.Timestamp(x["ts"]), x["value"]) for x in p["capacity"] if x["value"] is not None]
    band = [(pd.Timestamp(x["ts"]), x["lower"], x["yhat"], x["upper"]) for x in p["forecast"]]
    times = [t for t, _ in pts + cap] + [b[0] for b in band]
    values = [v for _, v in pts + cap] + [b[3] for b in band] + [0.0]
    if not times:
        return "<p class='meta'>no data in this window</p>"
    t0, t1 = min(times), max(times)
    span = max((t1 - t0).total_seconds(), 1.0)
    vmax = max(values) * 1.1 or 1.0

    def xy(t, v):
        # every point inside the plot area (a value off the scale is drawn at its edge)
        v = min(max(float(v), 0.0), vmax)
        frac = min(max((t - t0).total_seconds() / span, 0.0), 1.0)
        return (8 + frac * (width - 16), height - 14 - v / vmax * (height - 24))

    def path(series):
        return " ".join(f"{'M' if i == 0 else 'L'}{x:.1f},{y:.1f}" for i, (x, y) in enumerate(xy(t, v) for t, v in series))

    # the chart scales to its card (width 100 %, height from the viewBox's aspect): drawn at a
    # fixed pixel width it ran past a card narrower than that into the next one; overflow is
    # clipped to the viewBox, so nothing drawn outside it shows either
    out = [f"<svg class='chart' viewBox='0 0 {width} {height}' width='100%' preserveAspectRatio='xMidYMid meet' "
           "overflow='hidden' role='img'>"]
    if band:
        upper = [xy(b[0], b[3]) for b in band]
        lower = [xy(b[0], b[1]) for b in reversed(band)]
        poly = " ".join(f"{x:.1f},{y:.1f}" for x, y in upper + lower)
        out.append(f"<polygon points='{poly}' fill='#bf8700' fill-opacity='0.25'/>")
        out.append(f"<path d='{path([(b[0], b[2]) for b in band])}' stroke='#bf8700' fill='none' stroke-dasharray='4 3'/>")
    if cap:
        out.append(f"<path d='{path(cap)}' stroke='#8c959f' fill='none'/>")
    if pts:
        out.append(f"<path d='{path(pts)}' stroke='#0969da' stroke-width='2' fill='none'/>")
    for a in p["anomalies"]:
        # on the demand as reported at that instant (the flagged metric's own value where unknown)
        at_value = a.get("demand_at") if a.get("demand_at") is not None else a["value"]
        if at_value is None:
            continue
        x, y = xy(pd.Timestamp(a["ts"]), at_value)
        color = "#cf222e" if a["decision"] == "cleaned" else "#8250df"
        out.append(f"<circle cx='{x:.1f}' cy='{y:.1f}' r='3' fill='{color}' data-decision='{a['decision']}'>"
                   f"<title>{html.escape(a['ts'][11:16])} {html.escape(a['metric'])}: {html.escape(a['label'])}</title></circle>")
    out.append(f"<text x='8' y='{height - 2}' font-size='10' fill='#57606a'>{t0:%m-%d %H:%M}</text>")
    out.append(f"<text x='{width - 8}' y='{height - 2}' font-size='10' fill='#57606a' text-anchor='end'>{t1:%m-%d %H:%M}</text>")
    out.append(f"<text x='8' y='10' font-size='10' fill='#57606a'>{vmax / 1.1:.0f} GPUs</text>")
    out.append("</svg>")
    return "".join(out)


__all__ = ["pool_state", "power_nodes", "node_owners", "render_html", "latest_instant", "NoDataError"]
