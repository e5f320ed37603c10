"""OpenStack APIs over the simulated OpenStack platform, on one server under path prefixes.

* Keystone v3 at ``/identity/v3``: password authentication (users ``admin`` and ``gpupool``,
  projects ``admin``/``gpupool``, domain ``Default``), tokens in ``X-Subject-Token``, and a
  catalog whose placement, compute and metric endpoints point back at this server.
* Placement at ``/placement`` (microversions 1.0-1.39 via ``OpenStack-API-Version``): one root
  resource provider per compute node with ``VCPU``, ``MEMORY_MB`` and ``PGPU`` inventories
  (GPU passthrough), usages, traits (``COMPUTE_STATUS_DISABLED`` while Nova disables the host,
  ``CUSTOM_GPU_MODEL_*``), aggregates, and inventory updates guarded by the provider generation
  (409 ``placement.concurrent_update``). Reserving all ``PGPU`` takes the node out of service.
* Nova at ``/compute/v2.1`` (microversions up to 2.95): ``os-services`` (list, ``PUT
  /os-services/{id}`` with ``status``/``disabled_reason`` from 2.53, the older ``disable``,
  ``disable-log-reason`` and ``enable`` actions before it) and ``os-hypervisors`` (list, detail).
  Disabling ``nova-compute`` of a host cordons the node: its instances run on and end.
* Gnocchi at ``/metric``: one ``generic`` resource per compute node (``host`` attribute) with the
  metrics ``gpu.util`` (percent), ``gpu.allocated`` and ``gpu.capacity`` (GPUs), one for the cloud
  with ``gpu.pending``; ``/v1/metric/{id}/measures``, ``/v1/resource/generic[/{id}]``,
  ``/v1/search/resource/generic`` and ``/v1/aggregates`` (with ``groupby``).

Error bodies are each service's own: Keystone ``{"error": {...}}``, Placement ``{"errors": [...]}``,
Nova ``{"itemNotFound"|"badRequest"|...: {...}}``, Gnocchi ``{"code", "description", "title"}``.
"""

from __future__ import annotations

import json
import re
import secrets
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

import numpy as np
import pandas as pd
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gpupool.sim.facades.state import SimConflict, SimInvalid, SimNotFound, SimState, stable_uuid

ROLE = "openstack"
PLACEMENT_MAX = (1, 39)
NOVA_MAX = (2, 95)
DISABLED_TRAIT = "COMPUTE_STATUS_DISABLED"
DOMAIN = {"id": "default", "name": "Default"}
PROJECTS = {"admin": stable_uuid("project", "admin").replace("-", ""),
            "gpupool": stable_uuid("project", "gpupool").replace("-", "")}
USERS = {"admin": stable_uuid("user", "admin").replace("-", ""),
         "gpupool": stable_uuid("user", "gpupool").replace("-", "")}
ROLES = [{"id": stable_uuid("role", r).replace("-", ""), "name": r} for r in ("admin", "member", "reader")]
CONTROLLER = "controller-0"
GNOCCHI_NODE_METRICS = {"gpu.util": "%", "gpu.allocated": "GPU", "gpu.capacity": "GPU"}
GNOCCHI_CLOUD_METRICS = {"gpu.pending": "GPU"}
AGGREGATE_METHODS = ("mean", "max", "min", "sum", "last", "count")


def _iso(ts: pd.Timestamp | datetime) -> str:
    return pd.Timestamp(ts).strftime("%Y-%m-%dT%H:%M:%S.%f")


class OsError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


_TITLES = {400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed",
           406: "Not Acceptable", 409: "Conflict", 415: "Unsupported Media Type", 422: "Unprocessable Entity"}
_NOVA_KEYS = {400: "badRequest", 401: "unauthorized", 403: "forbidden", 404: "itemNotFound", 409: "conflictingRequest"}


def keystone_error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": status, "message": message, "title": _TITLES.get(status, "Error")}},
                        status_code=status)


_EXPLANATIONS = {
    400: "The server could not comply with the request since it is either malformed or otherwise incorrect.",
    401: "This server could not verify that you are authorized to access the document you requested.",
    404: "The resource could not be found.",
    406: "The resource could not be found.",
    409: "There was a conflict when trying to complete your request.",
}


def placement_error(status: int, detail: str, code: str | None = None, ver: tuple[int, int] = (1, 0)) -> JSONResponse:
    """Placement's error body (webob's explanation, then the detail; ``code`` from microversion 1.23)."""
    error = {"status": status, "title": _TITLES.get(status, "Error"),
             "detail": f"{_EXPLANATIONS.get(status, '')}\n\n {detail}  ", "request_id": f"req-{uuid.uuid4()}"}
    if ver >= (1, 23):
        error["code"] = code or "placement.undefined_code"
    return JSONResponse({"errors": [error]}, status_code=status)


def nova_error(status: int, message: str) -> JSONResponse:
    return JSONResponse({_NOVA_KEYS.get(status, "computeFault"): {"code": status, "message": message}},
                        status_code=status)


def gnocchi_error(status: int, description: Any) -> JSONResponse:
    return JSONResponse({"code": status, "description": description, "title": _TITLES.get(status, "Error")},
                        status_code=status)


def _microversion(request: Request, service: str, maximum: tuple[int, int], default: tuple[int, int]):
    """The requested microversion of ``service`` (``latest`` = maximum); raises OsError 400/406."""
    raw = None
    for header in ("openstack-api-version", "x-openstack-nova-api-version"):
        value = request.headers.get(header)
        if value is None:
            continue
        if header == "openstack-api-version":
            parts = value.strip().split()
            if len(parts) == 2 and parts[0].lower() == service:
                raw = parts[1]
            elif len(parts) == 1:
                raw = parts[0]
        elif service == "compute":
            raw = value.strip()
        if raw is not None:
            break
    if raw is None:
        return default
    if raw == "latest":
        return maximum
    m = re.fullmatch(r"(\d+)\.(\d+)", raw)
    if not m:
        raise OsError(400, f"invalid version string: {raw}", "placement.invalid_version")
    ver = (int(m.group(1)), int(m.group(2)))
    if ver > maximum or ver < (maximum[0], 0 if service == "placement" else 1):
        raise OsError(406, f"Unacceptable version header: {raw}", "placement.unacceptable_version")
    return ver


def make_app(state: SimState, password: str = "gpupool-sim") -> Starlette:
    """The OpenStack app (Keystone, Placement, Nova, Gnocchi) over ``state``."""
    tokens: dict[str, dict] = {}

    def base(request: Request) -> str:
        return f"{request.url.scheme}://{request.url.netloc}"

    # ------------------------------------------------------------------ keystone
    def catalog(root: str) -> list[dict]:
        entries = []
        for typ, name, path in (("identity", "keystone", "/identity"), ("placement", "placement", "/placement"),
                                ("compute", "nova", "/compute/v2.1"), ("metric", "gnocchi", "/metric")):
            sid = stable_uuid("service", typ).replace("-", "")
            entries.append({"id": sid, "type": typ, "name": name, "endpoints": [
                {"id": stable_uuid("endpoint", typ, iface).replace("-", ""), "interface": iface,
                 "region_id": "RegionOne", "region": "RegionOne", "url": root + path}
                for iface in ("public", "internal", "admin")]})
        return entries

    def identity_version(root: str) -> dict:
        return {"id": "v3.14", "status": "stable", "updated": "2020-04-07T00:00:00Z",
                "links": [{"rel": "self", "href": f"{root}/identity/v3/"}],
                "media-types": [{"base": "application/json", "type": "application/vnd.openstack.identity-v3+json"}]}

    async def identity_root(request):
        return JSONResponse({"versions": {"values": [identity_version(base(request))]}}, status_code=300)

    async def identity_v3(request):
        return JSONResponse({"version": identity_version(base(request))})

    def token_body(tok: dict, root: str, with_catalog: bool = True) -> dict:
        body = {
            "methods": ["password"], "user": {"domain": DOMAIN, "id": USERS[tok["user"]], "name": tok["user"],
                                              "password_expires_at": None},
            "audit_ids": [tok["audit"]], "expires_at": tok["expires"], "issued_at": tok["issued"],
        }
        if tok["project"]:
            body.update(project={"domain": DOMAIN, "id": PROJECTS[tok["project"]], "name": tok["project"]},
                        is_domain=False, roles=ROLES)
            if with_catalog:
                body["catalog"] = catalog(root)
        return {"token": body}

    async def issue_token(request):
        try:
            body = json.loads(await request.body())
            auth = body["auth"]
            identity = auth["identity"]
            methods = identity["methods"]
        except (ValueError, KeyError, TypeError):
            return keystone_error(400, "Invalid input for field 'identity': 'identity' is a required property")
        if not isinstance(methods, list) or "password" not in methods:
            return keystone_error(401, "The request you have made requires authentication.")
        try:
            user = identity["password"]["user"]
            name, secret = user.get("name") or "", user["password"]
            if user.get("id") and not name:
                name = next((n for n, i in USERS.items() if i == user["id"]), "")
        except (KeyError, TypeError, AttributeError):
            return keystone_error(400, "Invalid input for field 'identity/password/user': 'password' is a required "
                                       "property")
        if name not in USERS or secret != password:
            return keystone_error(401, "The request you have made requires authentication.")
        project = None
        scope = auth.get("scope")
        if isinstance(scope, dict) and "project" in scope:
            p = scope["project"] or {}
            pname = p.get("name") or next((n for n, i in PROJECTS.items() if i == p.get("id")), None)
            if pname not in PROJECTS:
                return keystone_error(401, "The request you have made requires authentication.")
            project = pname
        elif name in PROJECTS:
            project = name
        now = datetime.now(timezone.utc)
        tok = {"user": name, "project": project, "issued": now.strftime("%Y-%m-%dT%H:%M:%S.000000Z"),
               "expires": (now + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S.000000Z"),
               "audit": secrets.token_urlsafe(16)[:22]}
        token_id = "gAAAAA" + secrets.token_urlsafe(140)
        tokens[token_id] = tok
        return JSONResponse(token_body(tok, base(request)), status_code=201, headers={"X-Subject-Token": token_id})

    async def validate_token(request):
        if request.headers.get("x-auth-token") not in tokens:
            return keystone_error(401, "The request you have made requires authentication.")
        subject = request.headers.get("x-subject-token")
        if subject not in tokens:
            return keystone_error(404, f"Could not find token: {subject}.")
        if request.method == "HEAD":
            return Response(status_code=200, headers={"X-Subject-Token": subject})
        return JSONResponse(token_body(tokens[subject], base(request)), headers={"X-Subject-Token": subject})

    def authorized(request: Request) -> bool:
        tok = tokens.get(request.headers.get("x-auth-token", ""))
        if tok is None:
            return False
        return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000000Z") < tok["expires"]

    # ------------------------------------------------------------------ shared node views
    def rp_uuid(name: str) -> str:
        return stable_uuid("rp", name)

    def service_id(name: str) -> str:
        return stable_uuid("nova-compute", name)

    def nodes_by_rp() -> dict[str, dict]:
        return {rp_uuid(n["name"]): n for n in state.nodes(ROLE)}

    def inventories(rec: dict) -> dict[str, dict]:
        gpus = rec["gpus"]
        meta = rec["meta"]
        return {
            "VCPU": {"total": 64, "reserved": 0, "min_unit": 1, "max_unit": 2147483647, "step_size": 1,
                     "allocation_ratio": 1.0},
            "MEMORY_MB": {"total": 524288, "reserved": 4096, "min_unit": 1, "max_unit": 2147483647, "step_size": 1,
                          "allocation_ratio": 1.0},
            "PGPU": {"total": gpus, "reserved": meta.reserved, "min_unit": 1, "max_unit": gpus, "step_size": 1,
                     "allocation_ratio": 1.0},
        }

    def usages(rec: dict) -> dict[str, int]:
        busy = int(rec["busy_gpus"])
        return {"VCPU": busy * 8, "MEMORY_MB": busy * 65536, "PGPU": busy}

    def traits(rec: dict) -> list[str]:
        model = re.sub(r"[^A-Z0-9]+", "_", rec["gpu_model"].upper()).strip("_")
        out = ["COMPUTE_NODE", "HW_CPU_X86_AVX2", "COMPUTE_VOLUME_MULTI_ATTACH", f"CUSTOM_GPU_MODEL_{model}"]
        if rec["cordoned"] and rec["meta"].cordon_via == "nova":
            out.append(DISABLED_TRAIT)
        return sorted(out)

    # ------------------------------------------------------------------ placement
    def placement(fn):
        async def handler(request: Request):
            try:
                ver = _microversion(request, "placement", PLACEMENT_MAX, (1, 0))
            except OsError as exc:
                return placement_error(exc.status, exc.message, exc.code)
            headers = {"OpenStack-API-Version": f"placement {ver[0]}.{ver[1]}", "Vary": "openstack-api-version"}
            if not authorized(request):
                return placement_error(401, "The request you have made requires authentication.", ver=ver)
            try:
                with state.lock:
                    state.sync()
                    resp = await fn(request, ver)
            except OsError as exc:
                resp = placement_error(exc.status, exc.message, exc.code, ver)
            except SimConflict as exc:
                resp = placement_error(409, str(exc), ver=ver)
            except SimInvalid as exc:
                resp = placement_error(400, str(exc), ver=ver)
            resp.headers.update(headers)
            return resp
        return handler

    async def placement_root(request):
        return JSONResponse({"versions": [{
            "id": "v1.0", "max_version": f"{PLACEMENT_MAX[0]}.{PLACEMENT_MAX[1]}", "min_version": "1.0",
            "status": "CURRENT", "links": [{"rel": "self", "href": ""}]}]},
            headers={"OpenStack-API-Version": "placement 1.0", "Vary": "openstack-api-version"})

    def rp_body(uid: str, rec: dict, ver: tuple[int, int], root: str) -> dict:
        links = [{"rel": "self", "href": f"/resource_providers/{uid}"},
                 {"rel": "inventories", "href": f"/resource_providers/{uid}/inventories"},
                 {"rel": "usages", "href": f"/resource_providers/{uid}/usages"}]
        if ver >= (1, 1):
            links.append({"rel": "aggregates", "href": f"/resource_providers/{uid}/aggregates"})
        if ver >= (1, 6):
            links.append({"rel": "traits", "href": f"/resource_providers/{uid}/traits"})
        if ver >= (1, 11):
            links.append({"rel": "allocations", "href": f"/resource_providers/{uid}/allocations"})
        body = {"uuid": uid, "name": rec["name"], "generation": rec["meta"].placement_generation, "links": links}
        if ver >= (1, 14):
            body["parent_provider_uuid"] = None
            body["root_provider_uuid"] = uid
        return body

    def get_rp(uid: str) -> dict:
        rps = nodes_by_rp()
        if uid not in rps:
            raise OsError(404, f"No resource provider with uuid {uid} found", "placement.undefined_code")
        return rps[uid]

    @placement
    async def list_rps(request, ver):
        q = request.query_params
        rps = nodes_by_rp()
        out = []
        for uid, rec in sorted(rps.items(), key=lambda kv: kv[1]["name"]):
            if q.get("name") and rec["name"] != q["name"]:
                continue
            if q.get("uuid") and uid != q["uuid"]:
                continue
            if q.get("member_of"):
                wanted = set(q["member_of"].removeprefix("in:").split(","))
                if not wanted & set(rec["meta"].aggregates):
                    continue
            out.append(rp_body(uid, rec, ver, base(request)))
        return JSONResponse({"resource_providers": out})

    @placement
    async def show_rp(request, ver):
        uid = request.path_params["uuid"]
        return JSONResponse(rp_body(uid, get_rp(uid), ver, base(request)))

    @placement
    async def show_inventories(request, ver):
        rec = get_rp(request.path_params["uuid"])
        return JSONResponse({"resource_provider_generation": rec["meta"].placement_generation,
                             "inventories": inventories(rec)})

    @placement
    async def show_inventory(request, ver):
        rec = get_rp(request.path_params["uuid"])
        rc = request.path_params["rc"]
        inv = inventories(rec)
        if rc not in inv:
            raise OsError(404, f"No inventory of class {rc} for {request.path_params['uuid']}")
        return JSONResponse({"resource_provider_generation": rec["meta"].placement_generation, **inv[rc]})

    async def json_body(request: Request) -> Any:
        try:
            return json.loads(await request.body())
        except ValueError as exc:
            raise OsError(400, f"Malformed JSON: {exc}") from None

    def apply_inventory(rec: dict, rc: str, new: dict, current: dict) -> None:
        if not isinstance(new, dict) or "total" not in new:
            raise OsError(400, f"JSON does not validate: 'total' is a required property")
        for key, val in new.items():
            if key not in ("total", "reserved", "min_unit", "max_unit", "step_size", "allocation_ratio"):
                raise OsError(400, f"JSON does not validate: Additional properties are not allowed ('{key}' was "
                                   "unexpected)")
            if not isinstance(val, (int, float)) or isinstance(val, bool) or val < 0:
                raise OsError(400, f"JSON does not validate: {val!r} is not of type 'integer'")
        if rc not in current:
            raise OsError(400, f"Unknown resource class in inventory for resource provider: {rc}",
                          "placement.inventory.invalid")
        if int(new["total"]) != current[rc]["total"]:
            raise OsError(409, f"Inventory for '{rc}' on resource provider '{rp_uuid(rec['name'])}' is fixed by the "
                               "hardware of the node", "placement.inventory.inuse")
        if rc == "PGPU":
            reserved = int(new.get("reserved", 0))
            if reserved > int(new["total"]):
                raise OsError(400, "Unable to update inventory for resource provider: reserved must be less than or "
                                   "equal to total", "placement.inventory.invalid")
            rec["meta"].reserved = reserved
            if reserved >= rec["gpus"] and not rec["cordoned"]:
                state.cordon(ROLE, rec["name"], "placement: all PGPU inventory reserved", via="placement")
            elif reserved < rec["gpus"] and rec["cordoned"] and rec["meta"].cordon_via == "placement":
                state.uncordon(ROLE, rec["name"])

    def check_generation(rec: dict, body: Any) -> None:
        if not isinstance(body, dict) or "resource_provider_generation" not in body:
            raise OsError(400, "JSON does not validate: 'resource_provider_generation' is a required property")
        if body["resource_provider_generation"] != rec["meta"].placement_generation:
            raise OsError(409, f"resource provider generation conflict", "placement.concurrent_update")

    @placement
    async def put_inventories(request, ver):
        uid = request.path_params["uuid"]
        rec = get_rp(uid)
        body = await json_body(request)
        check_generation(rec, body)
        invs = body.get("inventories")
        if not isinstance(invs, dict):
            raise OsError(400, "JSON does not validate: 'inventories' is a required property")
        current = inventories(rec)
        missing = set(current) - set(invs)
        if missing:
            raise OsError(409, f"Inventory for '{', '.join(sorted(missing))}' on resource provider '{uid}' in use.",
                          "placement.inventory.inuse")
        for rc, inv in invs.items():
            apply_inventory(rec, rc, inv, current)
        rec["meta"].placement_generation += 1
        state._bump(rec["name"])  # noqa: SLF001
        rec = get_rp(uid)
        return JSONResponse({"resource_provider_generation": rec["meta"].placement_generation,
                             "inventories": inventories(rec)})

    @placement
    async def put_inventory(request, ver):
        uid, rc = request.path_params["uuid"], request.path_params["rc"]
        rec = get_rp(uid)
        body = await json_body(request)
        check_generation(rec, body)
        inv = {k: v for k, v in body.items() if k != "resource_provider_generation"}
        apply_inventory(rec, rc, inv, inventories(rec))
        rec["meta"].placement_generation += 1
        state._bump(rec["name"])  # noqa: SLF001
        rec = get_rp(uid)
        return JSONResponse({"resource_provider_generation": rec["meta"].placement_generation,
                             **inventories(rec)[rc]})

    @placement
    async def show_usages(request, ver):
        rec = get_rp(request.path_params["uuid"])
        return JSONResponse({"resource_provider_generation": rec["meta"].placement_generation,
                             "usages": usages(rec)})

    @placement
    async def total_usages(request, ver):
        if ver < (1, 9):
            raise OsError(404, "The resource could not be found.")
        if not request.query_params.get("project_id"):
            raise OsError(400, "Invalid query string parameters: 'project_id' is a required property")
        total: dict[str, int] = {}
        if request.query_params["project_id"] == PROJECTS["admin"]:
            for rec in state.nodes(ROLE):
                for rc, v in usages(rec).items():
                    total[rc] = total.get(rc, 0) + v
        return JSONResponse({"usages": total})

    @placement
    async def show_traits(request, ver):
        if ver < (1, 6):
            raise OsError(404, "The resource could not be found.")
        rec = get_rp(request.path_params["uuid"])
        return JSONResponse({"resource_provider_generation": rec["meta"].placement_generation,
                             "traits": traits(rec)})

    @placement
    async def show_aggregates(request, ver):
        if ver < (1, 1):
            raise OsError(404, "The resource could not be found.")
        rec = get_rp(request.path_params["uuid"])
        body = {"aggregates": list(rec["meta"].aggregates)}
        if ver >= (1, 19):
            body["resource_provider_generation"] = rec["meta"].placement_generation
        return JSONResponse(body)

    @placement
    async def put_aggregates(request, ver):
        if ver < (1, 1):
            raise OsError(404, "The resource could not be found.")
        rec = get_rp(request.path_params["uuid"])
        body = await json_body(request)
        if ver >= (1, 19):
            check_generation(rec, body)
            aggs = body.get("aggregates") if isinstance(body, dict) else None
        else:
            aggs = body
        if not isinstance(aggs, list) or not all(isinstance(a, str) and _is_uuid(a) for a in aggs):
            raise OsError(400, "JSON does not validate: aggregates must be a list of UUIDs")
        rec["meta"].aggregates = list(dict.fromkeys(aggs))
        rec["meta"].placement_generation += 1
        state._bump(rec["name"])  # noqa: SLF001
        rec = get_rp(request.path_params["uuid"])
        out = {"aggregates": list(rec["meta"].aggregates)}
        if ver >= (1, 19):
            out["resource_provider_generation"] = rec["meta"].placement_generation
        return JSONResponse(out)

    # ------------------------------------------------------------------ nova
    def compute_version(root: str) -> dict:
        return {"id": "v2.1", "status": "CURRENT", "version": f"{NOVA_MAX[0]}.{NOVA_MAX[1]}", "min_version": "2.1",
                "updated": "2013-07-23T11:33:21Z", "links": [{"rel": "self", "href": f"{root}/compute/v2.1/"}],
                "media-types": [{"base": "application/json",
                                 "type": "application/vnd.openstack.compute+json;version=2.1"}]}

    async def compute_root(request):
        return JSONResponse({"versions": [compute_version(base(request))]})

    async def compute_v21(request):
        return JSONResponse({"version": compute_version(base(request))})

    def nova(fn):
        async def handler(request: Request):
            try:
                ver = _microversion(request, "compute", NOVA_MAX, (2, 1))
            except OsError as exc:
                return nova_error(400 if exc.status == 400 else 406, exc.message)
            headers = {"OpenStack-API-Version": f"compute {ver[0]}.{ver[1]}",
                       "X-OpenStack-Nova-API-Version": f"{ver[0]}.{ver[1]}",
                       "Vary": "OpenStack-API-Version, X-OpenStack-Nova-API-Version"}
            if not authorized(request):
                return nova_error(401, "The request you have made requires authentication.")
            try:
                with state.lock:
                    state.sync()
                    resp = await fn(request, ver)
            except OsError as exc:
                resp = nova_error(exc.status, exc.message)
            except SimConflict as exc:
                resp = nova_error(409, str(exc))
            resp.headers.update(headers)
            return resp
        return handler

    def service_body(rec: dict | None, ver: tuple[int, int], binary: str = "nova-compute",
                     host: str | None = None) -> dict:
        host = rec["name"] if rec else host
        disabled = bool(rec and rec["cordoned"] and rec["meta"].cordon_via == "nova")
        body = {
            "id": stable_uuid(binary, host) if ver >= (2, 53) else _int_id(binary, host),
            "binary": binary, "host": host, "zone": "nova" if binary == "nova-compute" else "internal",
            "status": "disabled" if disabled else "enabled", "state": "up",
            "updated_at": _iso(state.now), "disabled_reason": rec["drain_reason"] if disabled else None,
        }
        if ver >= (2, 11):
            body["forced_down"] = False
        return body

    def all_services(ver) -> list[tuple[dict | None, dict]]:
        out = [(None, service_body(None, ver, b, CONTROLLER)) for b in ("nova-scheduler", "nova-conductor")]
        out += [(rec, service_body(rec, ver)) for rec in state.nodes(ROLE)]
        return out

    @nova
    async def list_services(request, ver):
        q = request.query_params
        items = [b for _, b in all_services(ver)
                 if (not q.get("binary") or b["binary"] == q["binary"]) and (not q.get("host") or b["host"] == q["host"])]
        return JSONResponse({"services": items})

    def set_service(rec: dict, status: str | None, reason: str | None) -> None:
        if status == "disabled":
            state.cordon(ROLE, rec["name"], reason or "nova: compute service disabled", via="nova")
        elif status == "enabled" and rec["cordoned"]:
            if rec["meta"].cordon_via not in ("nova", ""):
                raise OsError(409, f"Compute host {rec['name']} is out of service for another reason: "
                                   f"{rec['drain_reason']}")
            state.uncordon(ROLE, rec["name"])

    @nova
    async def update_service(request, ver):
        sid = request.path_params["sid"]
        if ver < (2, 53):
            return await legacy_action(request, ver, sid)
        match = [(rec, b) for rec, b in all_services(ver) if b["id"] == sid]
        if not match:
            raise OsError(404, f"Service {sid} not found.")
        rec, _ = match[0]
        try:
            body = json.loads(await request.body())
        except ValueError:
            raise OsError(400, "Malformed request body") from None
        if not isinstance(body, dict) or not body:
            raise OsError(400, "Invalid input for field/attribute body. Value: {}. {} does not have enough properties")
        extra = set(body) - {"status", "disabled_reason", "forced_down"}
        if extra:
            raise OsError(400, f"Invalid input for field/attribute service. Value: {body}. Additional properties are "
                               f"not allowed ({', '.join(repr(e) for e in sorted(extra))} was unexpected)")
        status = body.get("status")
        if status not in (None, "enabled", "disabled"):
            raise OsError(400, f"Invalid input for field/attribute status. Value: {status}. '{status}' is not one of "
                               "['enabled', 'disabled']")
        reason = body.get("disabled_reason")
        if reason is not None and status != "disabled":
            raise OsError(400, "Specifying 'disabled_reason' with status 'enabled' is invalid.")
        if reason is not None and (not isinstance(reason, str) or len(reason) > 255):
            raise OsError(400, "Invalid input for field/attribute disabled_reason.")
        if rec is None:
            raise OsError(400, "Updating a nova-compute service is supported; this service is not one.")
        set_service(rec, status, reason)
        rec = state.node(ROLE, rec["name"])
        return JSONResponse({"service": service_body(rec, ver)})

    async def legacy_action(request, ver, action):
        if action not in ("disable", "disable-log-reason", "enable", "force-down"):
            raise OsError(404, f"Unknown action")
        try:
            body = json.loads(await request.body())
            host, binary = body["host"], body["binary"]
        except (ValueError, KeyError, TypeError):
            raise OsError(400, "Invalid input: host and binary are required") from None
        try:
            rec = state.node(ROLE, host)
        except SimNotFound:
            raise OsError(404, f"Host '{host}' is not mapped to any cell") from None
        if binary != "nova-compute":
            raise OsError(404, f"Service {binary} on host {host} not found.")
        if action == "disable-log-reason" and not body.get("disabled_reason"):
            raise OsError(400, "Missing disabled reason field")
        if action.startswith("disable"):
            set_service(rec, "disabled", body.get("disabled_reason"))
        elif action == "enable":
            set_service(rec, "enabled", None)
        rec = state.node(ROLE, host)
        out = {"host": host, "binary": binary, "status": service_body(rec, ver)["status"]}
        if action == "disable-log-reason":
            out["disabled_reason"] = body["disabled_reason"]
        return JSONResponse({"service": out})

    def hypervisor_body(rec: dict, ver: tuple[int, int], detail: bool) -> dict:
        name = rec["name"]
        svc = service_body(rec, ver)
        body = {"id": stable_uuid("hypervisor", name) if ver >= (2, 53) else _int_id("hv", name),
                "hypervisor_hostname": name, "state": "up", "status": svc["status"]}
        if detail:
            body.update({
                "hypervisor_type": "QEMU", "hypervisor_version": 8002002,
                "host_ip": f"10.1.0.{state.node_index(name) % 250 + 1}",
                "service": {"host": name, "id": svc["id"], "disabled_reason": svc["disabled_reason"]},
            })
            if ver >= (2, 88):
                body["uptime"] = " 10:00:00 up 42 days,  1:02,  0 users,  load average: 0.5, 0.5, 0.5"
            else:
                busy = int(rec["busy_gpus"])
                body.update({"vcpus": 64, "memory_mb": 524288, "local_gb": 1800, "vcpus_used": busy * 8,
                             "memory_mb_used": busy * 65536, "local_gb_used": busy * 100, "running_vms": busy,
                             "current_workload": 0, "free_ram_mb": 524288 - busy * 65536,
                             "free_disk_gb": 1800 - busy * 100, "disk_available_least": 1700 - busy * 100,
                             "cpu_info": json.dumps({"arch": "x86_64", "model": "Icelake-Server", "vendor": "Intel",
                                                     "topology": {"cells": 2, "sockets": 1, "cores": 16,
                                                                  "threads": 2}})})
        return body

    @nova
    async def list_hypervisors(request, ver):
        detail = request.url.path.endswith("/detail")
        items = [hypervisor_body(rec, ver, detail) for rec in state.nodes(ROLE)]
        pattern = request.query_params.get("hypervisor_hostname_pattern")
        if pattern:
            items = [h for h in items if pattern in h["hypervisor_hostname"]]
        return JSONResponse({"hypervisors": items})

    @nova
    async def show_hypervisor(request, ver):
        hid = request.path_params["hid"]
        for rec in state.nodes(ROLE):
            h = hypervisor_body(rec, ver, True)
            if str(h["id"]) == hid:
                return JSONResponse({"hypervisor": h})
        raise OsError(404, f"Hypervisor with ID {hid} could not be found.")

    # ------------------------------------------------------------------ gnocchi
    cloud_resource = stable_uuid("gnocchi", "cloud")

    def gnocchi_resources() -> list[dict]:
        out = []
        created = _iso(state.world.start) + "+00:00"
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
        t0 = _parse_ts(start) if start else state.world.start
        t1 = _parse_ts(stop) if stop else state.now
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

    async def fallback(request, exc):
        path = request.url.path
        if path.startswith("/placement"):
            return placement_error(404, "The resource could not be found.")
        if path.startswith("/compute"):
            return nova_error(404, "The resource could not be found.")
        if path.startswith("/metric"):
            return gnocchi_error(404, "The resource could not be found.")
        return keystone_error(404, "The resource could not be found.")

    async def not_allowed(request, exc):
        return JSONResponse({"error": {"code": 405, "message": "The method is not allowed for the requested URL.",
                                       "title": "Method Not Allowed"}}, status_code=405)

    p, c = "/placement", "/compute/v2.1"
    routes = [
        Route("/identity", identity_root, methods=["GET"]),
        Route("/identity/", identity_root, methods=["GET"]),
        Route("/identity/v3", identity_v3, methods=["GET"]),
        Route("/identity/v3/", identity_v3, methods=["GET"]),
        Route("/identity/v3/auth/tokens", issue_token, methods=["POST"]),
        Route("/identity/v3/auth/tokens", validate_token, methods=["GET", "HEAD"]),
        Route(p, placement_root, methods=["GET"]),
        Route(p + "/", placement_root, methods=["GET"]),
        Route(p + "/resource_providers", list_rps, methods=["GET"]),
        Route(p + "/resource_providers/{uuid}", show_rp, methods=["GET"]),
        Route(p + "/resource_providers/{uuid}/inventories", show_inventories, methods=["GET"]),
        Route(p + "/resource_providers/{uuid}/inventories", put_inventories, methods=["PUT"]),
        Route(p + "/resource_providers/{uuid}/inventories/{rc}", show_inventory, methods=["GET"]),
        Route(p + "/resource_providers/{uuid}/inventories/{rc}", put_inventory, methods=["PUT"]),
        Route(p + "/resource_providers/{uuid}/usages", show_usages, methods=["GET"]),
        Route(p + "/resource_providers/{uuid}/traits", show_traits, methods=["GET"]),
        Route(p + "/resource_providers/{uuid}/aggregates", show_aggregates, methods=["GET"]),
        Route(p + "/resource_providers/{uuid}/aggregates", put_aggregates, methods=["PUT"]),
        Route(p + "/usages", total_usages, methods=["GET"]),
        Route("/compute", compute_root, methods=["GET"]),
        Route("/compute/", compute_root, methods=["GET"]),
        Route(c, compute_v21, methods=["GET"]),
        Route(c + "/", compute_v21, methods=["GET"]),
        Route(c + "/os-services", list_services, methods=["GET"]),
        Route(c + "/os-services/{sid}", update_service, methods=["PUT"]),
        Route(c + "/os-hypervisors", list_hypervisors, methods=["GET"]),
        Route(c + "/os-hypervisors/detail", list_hypervisors, methods=["GET"]),
        Route(c + "/os-hypervisors/{hid}", show_hypervisor, methods=["GET"]),
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
    return Starlette(routes=routes, exception_handlers={404: fallback, 405: not_allowed})


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
        return True
    except ValueError:
        return False


def _int_id(*parts: str) -> int:
    return int(uuid.UUID(stable_uuid(*parts)).int % 100000)


def _parse_ts(text: str) -> pd.Timestamp:
    try:
        ts = pd.Timestamp(float(text), unit="s", tz="UTC")
    except ValueError:
        try:
            ts = pd.Timestamp(text)
        except ValueError:
            raise OsError(400, f"Timestamp must be ISO 8601 or unix seconds: {text}") from None
    return ts.tz_localize("UTC") if ts.tzinfo is None else ts.tz_convert("UTC")
