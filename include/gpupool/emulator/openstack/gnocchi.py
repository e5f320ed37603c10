"""Gnocchi at ``/metric``: per-node and cloud GPU metrics, measures, resources, aggregates."""

from __future__ import annotations

import json
import re

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from gpupool.emulator.openstack.common import (
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
    keystone_error,
    parse_ts,
)
from gpupool.emulator.state import stable_uuid


#: resource types and the attributes each adds to the generic ones: compute nodes are filed as
#: Ceilometer files them (``nova_compute``, attribute ``host_name``), the cloud-wide series on a
#: plain ``generic`` resource
RESOURCE_TYPES = {"generic": (), "nova_compute": ("host_name",)}
#: the generic attributes Gnocchi can sort, and so group, resources by
GENERIC_SORT_KEYS = ("id", "type", "original_resource_id", "project_id", "user_id", "started_at", "ended_at",
                     "revision_start", "revision_end", "creator")


def routes(ctx: FacadeContext) -> list[Route]:
    """The service's routes over ``ctx``'s state."""
    state, base, authorized = ctx.state, ctx.base, ctx.authorized

    cloud_resource = stable_uuid("gnocchi", "cloud")

    def gnocchi_resources() -> list[dict]:
        """Every resource with all its attributes (``type`` says which it has)."""
        out = []
        created = iso(state.world.start) + "+00:00"

        def resource(rid: str, rtype: str, original: str, metrics: dict, **attrs) -> dict:
            return {"id": rid, "type": rtype, "original_resource_id": original, **attrs,
                    "project_id": PROJECTS["admin"], "user_id": USERS["admin"], "started_at": created,
                    "ended_at": None, "revision_start": created, "revision_end": None,
                    "creator": f"{USERS['admin']}:{PROJECTS['admin']}",
                    "created_by_user_id": USERS["admin"], "created_by_project_id": PROJECTS["admin"],
                    "metrics": metrics}

        for rec in state.nodes(ROLE):
            out.append(resource(stable_uuid("gnocchi", rec["name"]), "nova_compute", rec["name"],
                                {m: stable_uuid("metric", rec["name"], m) for m in GNOCCHI_NODE_METRICS},
                                host_name=rec["name"]))
        out.append(resource(cloud_resource, "generic", "cloud",
                            {m: stable_uuid("metric", "cloud", m) for m in GNOCCHI_CLOUD_METRICS}))
        return out

    def of_type(rtype: str) -> list[dict]:
        """The resources listed under ``rtype`` as Gnocchi shows them: every resource is a
        ``generic`` one, seen through ``generic`` without its own type's attributes."""
        if rtype not in RESOURCE_TYPES:
            raise OsError(404, f"Resource type {rtype} does not exist")
        own = set(RESOURCE_TYPES[rtype])
        extra = {a for attrs in RESOURCE_TYPES.values() for a in attrs} - own
        return [{k: v for k, v in r.items() if k not in extra} for r in gnocchi_resources()
                if rtype == "generic" or r["type"] == rtype]

    def host_of(r: dict) -> str:
        """The node a resource's series belong to ('cloud' for the cloud-wide one)."""
        return r.get("host_name") or r["original_resource_id"]

    def metric_index() -> dict[str, tuple[str, str]]:
        """metric id -> (host or 'cloud', metric name)."""
        return {mid: (host_of(r), m) for r in gnocchi_resources() for m, mid in r["metrics"].items()}

    def gnocchi(fn):
        async def handler(request: Request):
            if not authorized(request):
                # keystonemiddleware's refusal, in front of Gnocchi: its body, and where to get a token
                resp = keystone_error(401, "The request you have made requires authentication.")
                resp.headers["WWW-Authenticate"] = f'Keystone uri="{base(request)}/identity/v3"'
                return resp
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
        return JSONResponse(of_type(request.path_params["rtype"]))

    def find_resource(rtype: str, rid: str) -> dict:
        for r in of_type(rtype):
            if rid in (r["id"], r["original_resource_id"]):
                return r
        raise OsError(404, f"Resource {rid} does not exist")

    @gnocchi
    async def show_resource(request):
        return JSONResponse(find_resource(request.path_params["rtype"], request.path_params["rid"]))

    @gnocchi
    async def resource_metric_measures(request):
        r = find_resource(request.path_params["rtype"], request.path_params["rid"])
        name = request.path_params["metric"]
        if name not in r["metrics"]:
            raise OsError(404, f"Metric {name} does not exist")
        q = request.query_params
        gran = float(q["granularity"]) if q.get("granularity") else None
        return JSONResponse(series(host_of(r), name, q.get("start"), q.get("stop"), gran,
                                   q.get("aggregation", "mean")))

    @gnocchi
    async def aggregates(request):
        """``(metric NAME AGG)`` and ``(aggregate AGG (metric NAME AGG))`` over the resources of
        the body's ``resource_type``, optionally grouped by attributes, answered as Gnocchi 4.7 does."""
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
        rtype = body.get("resource_type")
        if rtype is None:
            # without a resource type Gnocchi reads the references as metric ids
            raise OsError(400, {"cause": "Invalid metric references", "reason": "badly formed hexadecimal UUID string",
                                "detail": [[metric, agg]]})
        if rtype not in RESOURCE_TYPES:
            raise OsError(400, {"cause": "Resource type does not exist", "detail": rtype})
        if body.get("search"):
            raise OsError(400, {"cause": "Invalid search", "reason": "only an empty search is served here",
                                "detail": body["search"]})
        gran = float(q["granularity"]) if q.get("granularity") else None
        step_s = state.step.total_seconds()
        if gran is not None and (gran < step_s or abs(gran / step_s - round(gran / step_s)) > 1e-9):
            raise OsError(400, {"cause": "Metrics cannot be aggregated", "reason": "Granularities are missing",
                                "detail": [[metric, agg, gran]]})
        groupby = sorted(set(g for v in q.getlist("groupby") for g in v.split(",") if g))
        for g in groupby:
            if g not in GENERIC_SORT_KEYS + RESOURCE_TYPES[rtype]:
                raise OsError(400, f"Invalid pagination: `Sort key supplied is invalid: {g}'")
        details = q.get("details", "false").lower() in ("true", "1", "yes", "on", "y")
        resources = of_type(rtype)

        def answer(members: list[dict]) -> dict | None:
            """One group's answer; None when no member has the metric (Gnocchi leaves it out)."""
            members = [r for r in members if metric in r["metrics"]]
            if not members:
                return None
            per = {r["id"]: series(host_of(r), metric, q.get("start"), q.get("stop"), gran, agg) for r in members}
            if outer:
                merged: dict[str, list[float]] = {}
                for pts in per.values():
                    for ts, _g, v in pts:
                        merged.setdefault(ts, []).append(v)
                fn = {"mean": np.mean, "max": np.max, "min": np.min, "sum": np.sum}.get(outer, np.mean)
                out = {"measures": {"aggregated": [[ts, gran or step_s, round(float(fn(v)), 6)]
                                                   for ts, v in sorted(merged.items())]}}
            else:
                out = {"measures": {rid: {metric: {agg: pts}} for rid, pts in per.items()}}
            if details:
                out["references"] = members
            return out

        not_found = OsError(404, f"Metric [{metric!r}] does not exist")
        if not groupby:
            whole = answer(resources)
            if whole is None:
                raise not_found
            return JSONResponse(whole)
        groups: dict[tuple, list[dict]] = {}
        for r in resources:
            groups.setdefault(tuple((g, r.get(g)) for g in groupby), []).append(r)
        results = []
        for key in sorted(groups, key=lambda k: tuple("" if v is None else str(v) for _, v in k)):
            got = answer(groups[key])
            if got is not None:
                results.append({"group": dict(key), "measures": got})
        if not results:
            raise not_found
        return JSONResponse(results)

    async def gnocchi_root(request):
        return JSONResponse({"versions": [{"id": "v1.0", "status": "CURRENT", "updated": "2015-03-19",
                                           "links": [{"rel": "self", "href": f"{base(request)}/metric/v1/"}]}]})

    return [
        Route("/metric", gnocchi_root, methods=["GET"]),
        Route("/metric/", gnocchi_root, methods=["GET"]),
        Route("/metric/v1/resource/{rtype}", list_resources, methods=["GET"]),
        Route("/metric/v1/search/resource/{rtype}", list_resources, methods=["POST"]),
        Route("/metric/v1/resource/{rtype}/{rid}", show_resource, methods=["GET"]),
        Route("/metric/v1/resource/{rtype}/{rid}/metric/{metric}/measures", resource_metric_measures,
              methods=["GET"]),
        Route("/metric/v1/metric/{mid}/measures", measures, methods=["GET"]),
        Route("/metric/v1/aggregates", aggregates, methods=["POST"]),
    ]
