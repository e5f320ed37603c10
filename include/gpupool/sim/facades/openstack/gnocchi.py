"""Gnocchi at ``/metric``: per-node and cloud GPU metrics, measures, resources, aggregates."""

from __future__ import annotations

import json
import re

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from gpupool.sim.facades.openstack.common import (
    AGGREGATE_METHODS,
    GNOCCHI_CLOUD_METRICS,
    GNOCCHI_NODE_METRICS,
    PROJECTS,
    ROLE,
    USERS,
    FacadeContext,
    OsError,
    gnocchi_error,
    iso,
    parse_ts,
)
from gpupool.sim.facades.state import stable_uuid


def routes(ctx: FacadeContext) -> list[Route]:
    """The service's routes over ``ctx``'s state."""
    state, base, authorized = ctx.state, ctx.base, ctx.authorized

    cloud_resource = stable_uuid("gnocchi", "cloud")

    def gnocchi_resources() -> list[dict]:
        out = []
        created = iso(state.world.start) + "+00:00"
        for rec in state.nodes(ROLE):
            rid = stable_uuid("gnocchi", rec["name"])
            out.append({"id": rid, "type": "generic", "original_resource_id": rec["name"], "host": rec["name"],
                        "project_id": PROJECTS["admin"], "user_id": USERS["admin"], "started_at": created,
                        "ended_at": None, "revision_start": created, "revision_end": None, "creator": USERS["admin"],
                        "created_by_user_id": USERS["admin"], "created_by_project_id": PROJECTS["admin"],
                        "metrics": {m: stable_uuid("metric", rec["name"], m) for m in GNOCCHI_NODE_METRICS}})
        out.append({"id": cloud_resource, "type": "generic", "original_resource_id": "cloud", "host": "cloud",
                    "project_id": PROJECTS["admin"], "user_id": USERS["admin"], "started_at": created,
                    "ended_at": None, "revision_start": created, "revision_end": None, "creator": USERS["admin"],
                    "created_by_user_id": USERS["admin"], "created_by_project_id": PROJECTS["admin"],
                    "metrics": {m: stable_uuid("metric", "cloud", m) for m in GNOCCHI_CLOUD_METRICS}})
        return out

    def metric_index() -> dict[str, tuple[str, str]]:
        """metric id -> (host or 'cloud', metric name)."""
        return {mid: (r["host"], m) for r in gnocchi_resources() for m, mid in r["metrics"].items()}

    def gnocchi(fn):
        async def handler(request: Request):
            if not authorized(request):
                return gnocchi_error(401, "The request you have made requires authentication.")
            try:
                with state.lock:
                    state.sync()
                    return await fn(request)
            except OsError as exc:
                return gnocchi_error(exc.status, exc.message)
        return handler

    def series(host: str, metric: str, start: str | None, stop: str | None, granularity: float | None,
               aggregation: str) -> list[list]:
        step_s = state.step.total_seconds()
        gran = float(granularity or step_s)
        if gran < step_s or abs(gran / step_s - round(gran / step_s)) > 1e-9:
            raise OsError(404, f"Aggregation method '{aggregation}' at granularity '{gran}' for metric "
                               f"{metric} does not exist")
        if aggregation not in AGGREGATE_METHODS:
            raise OsError(404, f"Aggregation method '{aggregation}' for metric {metric} does not exist")
        t0 = parse_ts(start) if start else state.world.start
        t1 = parse_ts(stop) if stop else state.now
        i0, i1 = max(0, state.step_of(t0)), min(state.clock_i, int(np.ceil((t1 - state.world.start) / state.step)))
        if i1 <= i0:
            return []
        e = state.exported(ROLE, i0, i1)
        if e["platform"] is None:
            return []
        if host == "cloud":
            values = e["pending"]
            present = e["reported"].copy()
        else:
            j = state.node_index(host)
            owned = e["owned"][j]
            gpus = state.world.nodes[j].gpus
            if metric == "gpu.util":
                values = e["util"][j, :gpus].mean(axis=0)
            elif metric == "gpu.allocated":
                values = e["occ"][j].sum(axis=0) * e["factor"]
            else:
                values = np.where(state.world.cordoned_[j, i0:i1], 0.0, float(gpus))
            present = owned & e["reported"]
        k = int(round(gran / step_s))
        out = []
        first = (i0 // k) * k
        for b in range(first, i1, k):
            lo, hi = max(b, i0) - i0, min(b + k, i1) - i0
            sel = values[lo:hi][present[lo:hi]]
            if not len(sel):
                continue
            agg = {"mean": np.mean, "max": np.max, "min": np.min, "sum": np.sum, "last": lambda a: a[-1],
                   "count": len}[aggregation](sel)
            out.append([state.ts(b).isoformat(), gran, round(float(agg), 6)])
        return out

    @gnocchi
    async def measures(request):
        mid = request.path_params["mid"]
        idx = metric_index()
        if mid not in idx:
            raise OsError(404, f"Metric {mid} does not exist")
        q = request.query_params
        host, metric = idx[mid]
        gran = float(q["granularity"]) if q.get("granularity") else None
        return JSONResponse(series(host, metric, q.get("start"), q.get("stop"), gran, q.get("aggregation", "mean")))

    @gnocchi
    async def list_resources(request):
        return JSONResponse(gnocchi_resources())

    @gnocchi
    async def show_resource(request):
        rid = request.path_params["rid"]
        for r in gnocchi_resources():
            if rid in (r["id"], r["original_resource_id"]):
                return JSONResponse(r)
        raise OsError(404, f"Resource {rid} does not exist")

    @gnocchi
    async def resource_metric_measures(request):
        rid, name = request.path_params["rid"], request.path_params["metric"]
        for r in gnocchi_resources():
            if rid in (r["id"], r["original_resource_id"]):
                if name not in r["metrics"]:
                    raise OsError(404, f"Metric {name} does not exist")
                q = request.query_params
                gran = float(q["granularity"]) if q.get("granularity") else None
                return JSONResponse(series(r["host"], name, q.get("start"), q.get("stop"), gran,
                                           q.get("aggregation", "mean")))
        raise OsError(404, f"Resource {rid} does not exist")

    @gnocchi
    async def aggregates(request):
        q = request.query_params
        try:
            body = json.loads(await request.body())
            ops = body["operations"]
        except (ValueError, KeyError, TypeError):
            raise OsError(400, {"cause": "Invalid input", "reason": "'operations' is a required property"}) from None
        text = ops if isinstance(ops, str) else ""
        m = (re.fullmatch(r"\s*\(\s*aggregate\s+(\w+)\s+\(\s*metric\s+([\w.]+)\s+(\w+)\s*\)\s*\)\s*", text)
             or re.fullmatch(r"\s*()\(\s*metric\s+([\w.]+)\s+(\w+)\s*\)\s*", text))
        if not m:
            raise OsError(400, {"cause": "Invalid operations", "reason": "only (metric NAME AGG) and (aggregate AGG "
                                                                        "(metric NAME AGG)) are served here",
                                "detail": ops})
        outer, metric, agg = m.groups()
        outer = outer or None
        gran = float(q["granularity"]) if q.get("granularity") else None
        groupby = q.getlist("groupby")
        resources = [r for r in gnocchi_resources() if metric in r["metrics"]]
        groups: dict[tuple, list[dict]] = {}
        for r in resources:
            groups.setdefault(tuple((g, r.get(g)) for g in groupby), []).append(r)

        def answer(members: list[dict]) -> dict:
            per = {r["id"]: series(r["host"], metric, q.get("start"), q.get("stop"), gran, agg) for r in members}
            if outer:
                merged: dict[str, list[float]] = {}
                for pts in per.values():
                    for ts, _g, v in pts:
                        merged.setdefault(ts, []).append(v)
                fn = {"mean": np.mean, "max": np.max, "min": np.min, "sum": np.sum}.get(outer, np.mean)
                agg_pts = [[ts, gran or state.step.total_seconds(), round(float(fn(v)), 6)]
                           for ts, v in sorted(merged.items())]
                return {"references": members, "measures": {"aggregated": agg_pts}}
            return {"references": members, "measures": {rid: {metric: {agg: pts}} for rid, pts in per.items()}}

        if not groupby:
            return JSONResponse(answer(resources))
        return JSONResponse([{"group": dict(k), "measures": answer(v)} for k, v in groups.items()])

    async def gnocchi_root(request):
        return JSONResponse({"versions": [{"id": "v1.0", "status": "CURRENT", "updated": "2015-03-19",
                                           "links": [{"rel": "self", "href": f"{base(request)}/metric/v1/"}]}]})

    return [
        Route("/metric", gnocchi_root, methods=["GET"]),
        Route("/metric/", gnocchi_root, methods=["GET"]),
        Route("/metric/v1/resource/generic", list_resources, methods=["GET"]),
        Route("/metric/v1/search/resource/generic", list_resources, methods=["POST"]),
        Route("/metric/v1/resource/generic/{rid}", show_resource, methods=["GET"]),
        Route("/metric/v1/resource/generic/{rid}/metric/{metric}/measures", resource_metric_measures,
              methods=["GET"]),
        Route("/metric/v1/metric/{mid}/measures", measures, methods=["GET"]),
        Route("/metric/v1/aggregates", aggregates, methods=["POST"]),
    ]
