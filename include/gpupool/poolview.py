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
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from gpupool.canonical import DEMAND_METRICS
from gpupool.staging.schema import allocation_plan, clean_sample, forecast, handover, inventory_node, sample

OPEN_STATES = ("planned", "releasing", "released", "attaching")


class NoDataError(LookupError):
    """Staging holds nothing to show yet."""


def latest_instant(engine: Engine) -> datetime:
    """The newest forecast issue time, else the newest sample; NoDataError if staging is empty."""
    with engine.connect() as conn:
        at = conn.execute(sa.select(sa.func.max(forecast.c.issued_at))).scalar()
        if at is None:
            at = conn.execute(sa.select(sa.func.max(sample.c.ts))).scalar()
    if at is None:
        raise NoDataError("staging holds no samples yet: run the gpupool_pipeline DAG first")
    return _utc(at).to_pydatetime()


def pool_state(engine: Engine, at: datetime | None = None, hours: int = 24) -> dict[str, Any]:
    """Per platform: GPUs owned, demand over the last `hours` and its forecast band over the
    next, anomalies found and cleaned, open handovers, and the last plan with its reasons."""
    at = _utc(at if at is not None else latest_instant(engine))
    since = at - pd.Timedelta(hours=hours)
    with engine.connect() as conn:
        platforms = sorted(
            r[0] for r in conn.execute(sa.select(sample.c.platform).distinct().where(sample.c.ts >= since, sample.c.ts < at))
        )
        plan_row = conn.execute(
            sa.select(allocation_plan).where(allocation_plan.c.decided_at <= at).order_by(allocation_plan.c.decided_at.desc(), allocation_plan.c.id.desc()).limit(1)
        ).first()
        handovers = [
            dict(r._mapping)
            for r in conn.execute(sa.select(handover).where(handover.c.state.in_(OPEN_STATES)).order_by(handover.c.id))
        ]
        state: dict[str, Any] = {}
        for p in platforms:
            state[p] = _platform_state(conn, p, at, since, hours)
    plan = None
    if plan_row is not None:
        plan = {
            "id": plan_row.id,
            "decided_at": _utc(plan_row.decided_at).isoformat(),
            "policy": plan_row.policy,
            "solver": plan_row.solver,
            "dry_run": bool(plan_row.dry_run),
            "moves": plan_row.moves,
            "platforms": (plan_row.summary or {}).get("platforms", {}),
        }
    for h in handovers:
        for k in ("created_at", "updated_at", "deadline"):
            if h.get(k) is not None:
                h[k] = _utc(h[k]).isoformat()
    return {"at": at.isoformat(), "hours": hours, "platforms": state, "handovers": handovers, "plan": plan}


def _platform_state(conn: sa.Connection, platform: str, at: pd.Timestamp, since: pd.Timestamp, hours: int) -> dict:
    snap = conn.execute(
        sa.select(sa.func.max(inventory_node.c.snapshot_at)).where(inventory_node.c.platform == platform, inventory_node.c.snapshot_at <= at)
    ).scalar()
    nodes = gpus = 0
    if snap is not None:
        row = conn.execute(
            sa.select(sa.func.count(), sa.func.sum(inventory_node.c.gpus)).where(
                inventory_node.c.platform == platform, inventory_node.c.snapshot_at == snap
            )
        ).first()
        nodes, gpus = int(row[0]), int(row[1] or 0)
    raw = pd.read_sql(
        sa.select(sample.c.metric, sample.c.ts, sample.c.value).where(
            sample.c.platform == platform, sample.c.entity_kind == "platform", sample.c.ts >= since, sample.c.ts < at
        ),
        conn,
    )
    demand = _hourly_demand(raw)
    capacity = _hourly(raw[raw["metric"] == "gpu_capacity"])
    cl = pd.read_sql(
        sa.select(clean_sample.c.metric, clean_sample.c.ts, clean_sample.c.value, clean_sample.c.expected, clean_sample.c.is_anomaly, clean_sample.c.detector).where(
            clean_sample.c.platform == platform, clean_sample.c.ts >= since, clean_sample.c.ts < at, clean_sample.c.is_anomaly.is_(True)
        ),
        conn,
    )
    issued = conn.execute(
        sa.select(sa.func.max(forecast.c.issued_at)).where(forecast.c.platform == platform, forecast.c.issued_at <= at)
    ).scalar()
    band = []
    if issued is not None:
        for r in conn.execute(
            sa.select(forecast).where(forecast.c.platform == platform, forecast.c.issued_at == issued, forecast.c.series == "demand").order_by(forecast.c.step)
        ):
            band.append({"ts": _utc(r.ts).isoformat(), "yhat": r.yhat, "lower": r.yhat_lower, "upper": r.yhat_upper})
    anomalies = [
        {"ts": _utc(r.ts).isoformat(), "metric": r.metric, "value": _num(r.value), "cleaned_to": _num(r.expected), "detector": r.detector}
        for r in cl.sort_values("ts").itertuples()
    ]
    return {
        "nodes": nodes,
        "gpus": gpus,
        "demand": [{"ts": t.isoformat(), "value": _num(v)} for t, v in demand.items()],
        "capacity": [{"ts": t.isoformat(), "value": _num(v)} for t, v in capacity.items()],
        "forecast_issued_at": _utc(issued).isoformat() if issued is not None else None,
        "forecast": band,
        "anomalies": anomalies,
    }


def _hourly(frame: pd.DataFrame) -> pd.Series:
    if frame.empty:
        return pd.Series(dtype="float64")
    s = frame.assign(ts=pd.to_datetime(frame["ts"], utc=True)).set_index("ts")["value"].sort_index()
    return s.resample("1h").mean()


def _hourly_demand(raw: pd.DataFrame) -> pd.Series:
    parts = [_hourly(raw[raw["metric"] == m]) for m in DEMAND_METRICS]
    parts = [p for p in parts if len(p)]
    if not parts:
        return pd.Series(dtype="float64")
    return pd.concat(parts, axis=1).sum(axis=1, min_count=1)


def _num(v: Any) -> float | None:
    if v is None:
        return None
    v = float(v)
    return None if math.isnan(v) else round(v, 3)


def _utc(ts: Any) -> pd.Timestamp:
    t = pd.Timestamp(ts)
    return t.tz_localize("UTC") if t.tzinfo is None else t.tz_convert("UTC")


# --- HTML --------------------------------------------------------------------------------

_STYLE = """
body{font-family:system-ui,sans-serif;margin:1.2rem;color:#1b1f24;background:#fff}
h1{font-size:1.4rem;margin:0 0 .3rem} h2{font-size:1.1rem;margin:1rem 0 .3rem}
.meta{color:#57606a;font-size:.9rem} .cards{display:flex;flex-wrap:wrap;gap:1rem}
.card{border:1px solid #d0d7de;border-radius:8px;padding:.8rem;min-width:330px;flex:1}
.kpi{font-size:1.6rem;font-weight:600} table{border-collapse:collapse;font-size:.85rem;width:100%}
td,th{border-bottom:1px solid #eaeef2;padding:.25rem .4rem;text-align:left}
.legend span{display:inline-block;margin-right:.8rem;font-size:.8rem}
.sw{display:inline-block;width:10px;height:10px;margin-right:3px;vertical-align:middle}
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
        parts.append(f"<div class='meta'>{p['nodes']} nodes · {len(p['anomalies'])} anomalies cleaned in the last {state['hours']} h</div>")
        parts.append(_svg_chart(p))
        parts.append(
            "<div class='legend'><span><i class='sw' style='background:#0969da'></i>demand</span>"
            "<span><i class='sw' style='background:#8c959f'></i>capacity</span>"
            "<span><i class='sw' style='background:#bf8700;opacity:.4'></i>forecast band</span>"
            "<span><i class='sw' style='background:#cf222e'></i>anomaly</span></div>"
        )
        if p["anomalies"]:
            parts.append("<table><tr><th>anomaly at</th><th>metric</th><th>value</th><th>cleaned to</th><th>detector</th></tr>")
            for a in p["anomalies"][-5:]:
                parts.append(
                    f"<tr><td>{e(a['ts'][11:16])}</td><td>{e(a['metric'])}</td><td>{_fmt(a['value'])}</td>"
                    f"<td>{_fmt(a['cleaned_to'])}</td><td>{e(a['detector'])}</td></tr>"
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


def _fmt(v: Any) -> str:
    return "–" if v is None else f"{float(v):.1f}"


def _svg_chart(p: dict, width: int = 420, height: int = 150) -> str:
    """Demand and capacity over the past, the forecast band ahead, anomalies as red dots."""
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
        return (8 + (t - t0).total_seconds() / span * (width - 16), height - 14 - v / vmax * (height - 24))

    def path(series):
        return " ".join(f"{'M' if i == 0 else 'L'}{x:.1f},{y:.1f}" for i, (x, y) in enumerate(xy(t, v) for t, v in series))

    out = [f"<svg width='{width}' height='{height}' viewBox='0 0 {width} {height}' role='img'>"]
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
        if a["value"] is None:
            continue
        x, y = xy(pd.Timestamp(a["ts"]), min(a["value"], vmax))
        out.append(f"<circle cx='{x:.1f}' cy='{y:.1f}' r='3' fill='#cf222e'/>")
    out.append(f"<text x='8' y='{height - 2}' font-size='10' fill='#57606a'>{t0:%m-%d %H:%M}</text>")
    out.append(f"<text x='{width - 8}' y='{height - 2}' font-size='10' fill='#57606a' text-anchor='end'>{t1:%m-%d %H:%M}</text>")
    out.append(f"<text x='8' y='10' font-size='10' fill='#57606a'>{vmax / 1.1:.0f} GPUs</text>")
    out.append("</svg>")
    return "".join(out)


__all__ = ["pool_state", "render_html", "latest_instant", "NoDataError"]
