"""Placement at ``/placement``: resource providers, inventories, usages, traits, aggregates.

Traits: a provider shows the traits nova-compute reports for the host (``COMPUTE_NODE``, the
CPU's, ``CUSTOM_GPU_MODEL_<MODEL>``, ``COMPUTE_STATUS_DISABLED`` while its service is disabled)
plus the traits a client set with ``PUT /resource_providers/{uuid}/traits``. nova-compute owns
its traits — on a real cloud it puts them back (or takes them off) on its next periodic update —
so a PUT stores only the others, and the nova-owned ones follow the host's state. Custom traits
must be created first (``PUT /traits/CUSTOM_...``), as in Placement.

A provider whose whole ``PGPU`` inventory is reserved is out of service in the world; when it
carries gpupool's hold trait at that moment the world records the hold as gpupool's (a drain
reason starting ``gpupool:``), otherwise as an operator's reservation.
"""

from __future__ import annotations

import json
import re
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gpupool.actuation.marks import HELD_TRAIT, REASON_PREFIX
from gpupool.emulator.openstack.common import (
    DISABLED_TRAIT,
    PLACEMENT_MAX,
    PROJECTS,
    ROLE,
    FacadeContext,
    OsError,
    is_uuid,
    microversion,
    placement_error,
)
from gpupool.emulator.state import SimConflict, SimInvalid, SimState, stable_uuid

#: standard (os-traits) traits the facade's hosts report; custom ones start ``CUSTOM_``
STANDARD_TRAITS = ("COMPUTE_NODE", "COMPUTE_VOLUME_MULTI_ATTACH", DISABLED_TRAIT, "HW_CPU_X86_AVX2")
_CUSTOM_TRAIT = re.compile(r"CUSTOM_[A-Z0-9_]+")
_ANY_TRAIT = re.compile(r"[A-Z0-9_]+")
_INVALID_TRAIT = ('The trait is invalid. A valid trait must be no longer than 255 characters, start with the '
                  'prefix "CUSTOM_" and use following characters: "A"-"Z", "0"-"9" and "_"')


def hold_if_fully_reserved(state: SimState, rec: dict) -> bool:
    """Keep ``rec`` out of service in the world while its whole ``PGPU`` inventory is reserved.

    The hold is gpupool's (a ``gpupool:`` drain reason) when the provider carries its trait.
    A node already out of service (its compute service disabled) becomes Placement's hold.
    Returns whether the node is held.
    """
    if rec["meta"].reserved <= 0 or rec["meta"].reserved < rec["gpus"]:
        return False
    who = REASON_PREFIX if HELD_TRAIT in rec["meta"].traits else "placement:"
    state.cordon(ROLE, rec["name"], f"{who} all PGPU inventory reserved", via="placement")
    rec["meta"].cordon_via = "placement"
    state._bump(rec["name"])  # noqa: SLF001
    return True


def routes(ctx: FacadeContext) -> list[Route]:
    """The service's routes over ``ctx``'s state."""
    p = "/placement"
    state, base, authorized = ctx.state, ctx.base, ctx.authorized

    def rp_uuid(name: str) -> str:
        return stable_uuid("rp", name)

    by_rp: dict[str, Any] = {}

    def nodes_by_rp() -> dict[str, dict]:
        # kept while the pool is (the state caches it per clock step and revision): a client
        # reading a thousand providers one by one must not rebuild the map for each of them
        key = (state.clock_i, state.revision)
        if by_rp.get("key") != key:
            by_rp.update(key=key, rps={rp_uuid(n["name"]): n for n in state.nodes(ROLE)})
        return by_rp["rps"]

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

    created_traits: set[str] = set()  # custom traits created with PUT /traits/{name}

    def model_trait(rec: dict) -> str:
        return "CUSTOM_GPU_MODEL_" + re.sub(r"[^A-Z0-9]+", "_", rec["gpu_model"].upper()).strip("_")

    def compute_traits(rec: dict) -> list[str]:
        """The traits nova-compute reports for the host now."""
        out = ["COMPUTE_NODE", "HW_CPU_X86_AVX2", "COMPUTE_VOLUME_MULTI_ATTACH", model_trait(rec)]
        if rec["cordoned"] and rec["meta"].cordon_via == "nova":
            out.append(DISABLED_TRAIT)
        return out

    def traits(rec: dict) -> list[str]:
        """The provider's traits: nova-compute's plus those a client set."""
        return sorted(set(compute_traits(rec)) | set(rec["meta"].traits))

    def known_traits() -> set[str]:
        """Every trait Placement knows: the standard ones, nova's model traits, the created ones."""
        out = set(STANDARD_TRAITS) | created_traits
        for rec in state.nodes(ROLE):
            out.add(model_trait(rec))
            out.update(rec["meta"].traits)
        return out

    # ------------------------------------------------------------------ placement
    def placement(fn):
        async def handler(request: Request):
            try:
                ver = microversion(request, "placement", PLACEMENT_MAX, (1, 0))
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
        if "in_tree" in q and ver < (1, 14):
            raise OsError(400, "Invalid query string parameters: Additional properties are not allowed "
                               "('in_tree' was unexpected)")
        rps = nodes_by_rp()
        out = []
        for uid, rec in sorted(rps.items(), key=lambda kv: kv[1]["name"]):
            if q.get("name") and rec["name"] != q["name"]:
                continue
            if q.get("uuid") and uid != q["uuid"]:
                continue
            if q.get("in_tree") and uid != q["in_tree"]:
                continue  # every provider here is the root of a one-provider tree
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
                hold_if_fully_reserved(state, rec)
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
        need_traits_api(ver)
        rec = get_rp(request.path_params["uuid"])
        return JSONResponse({"resource_provider_generation": rec["meta"].placement_generation,
                             "traits": traits(rec)})

    def need_traits_api(ver: tuple[int, int]) -> None:
        if ver < (1, 6):
            raise OsError(404, "The resource could not be found.")

    @placement
    async def list_traits(request, ver):
        need_traits_api(ver)
        q = request.query_params
        for key in q:
            if key not in ("name", "associated"):
                raise OsError(400, f"Invalid query string parameters: Additional properties are not allowed "
                                   f"('{key}' was unexpected)")
        names = known_traits()
        if "name" in q:
            op, sep, value = q["name"].partition(":")
            if not sep:
                raise OsError(400, "Badly formatted name parameter. Expected name query string parameter in form: "
                                   f'?name=[in|startswith]:[name1,name2|prefix]. Got: "{q["name"]}"')
            if op == "in":
                names &= set(value.split(","))
            elif op == "startswith":
                names = {n for n in names if n.startswith(value)}
        if "associated" in q:
            flag = q["associated"].lower()
            if flag not in ("true", "false"):
                raise OsError(400, 'The query parameter "associated" only accepts "true" or "false"')
            used = {t for rec in state.nodes(ROLE) for t in traits(rec)}
            names = names & used if flag == "true" else names - used
        return JSONResponse({"traits": sorted(names)})

    @placement
    async def show_trait(request, ver):
        need_traits_api(ver)
        name = request.path_params["name"]
        if name not in known_traits():
            raise OsError(404, f"No such trait(s): {name}.")
        return Response(status_code=204)

    @placement
    async def create_trait(request, ver):
        need_traits_api(ver)
        name = request.path_params["name"]
        if len(name) > 255 or not _CUSTOM_TRAIT.fullmatch(name):
            raise OsError(400, _INVALID_TRAIT)
        status = 204 if name in known_traits() else 201
        created_traits.add(name)
        return Response(status_code=status, headers={"Location": f"/traits/{name}"})

    @placement
    async def put_traits(request, ver):
        need_traits_api(ver)
        uid = request.path_params["uuid"]
        rec = get_rp(uid)
        body = await json_body(request)
        if not isinstance(body, dict) or "traits" not in body:
            raise OsError(400, "JSON does not validate: 'traits' is a required property")
        extra = sorted(set(body) - {"traits", "resource_provider_generation"})
        if extra:
            raise OsError(400, "JSON does not validate: Additional properties are not allowed "
                               f"({', '.join(repr(k) for k in extra)} {'was' if len(extra) == 1 else 'were'} "
                               "unexpected)")
        wanted = body["traits"]
        if not isinstance(wanted, list) or not all(isinstance(t, str) and _ANY_TRAIT.fullmatch(t) for t in wanted):
            raise OsError(400, f"JSON does not validate: {wanted!r} is not a list of trait names")
        gen = body.get("resource_provider_generation")
        if not isinstance(gen, int) or isinstance(gen, bool):
            raise OsError(400, "JSON does not validate: 'resource_provider_generation' is a required property")
        if gen != rec["meta"].placement_generation:
            raise OsError(409, "Resource provider's generation already changed. Please update the generation and "
                               "try again.", "placement.concurrent_update")
        unknown = sorted(set(wanted) - known_traits())
        if unknown:
            raise OsError(400, f"No such trait {', '.join(unknown)}")
        owned = set(compute_traits(rec)) | {DISABLED_TRAIT}
        rec["meta"].traits = sorted(set(wanted) - owned)
        rec["meta"].placement_generation += 1
        state._bump(rec["name"])  # noqa: SLF001
        rec = get_rp(uid)
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
        if not isinstance(aggs, list) or not all(isinstance(a, str) and is_uuid(a) for a in aggs):
            raise OsError(400, "JSON does not validate: aggregates must be a list of UUIDs")
        rec["meta"].aggregates = list(dict.fromkeys(aggs))
        rec["meta"].placement_generation += 1
        state._bump(rec["name"])  # noqa: SLF001
        rec = get_rp(request.path_params["uuid"])
        out = {"aggregates": list(rec["meta"].aggregates)}
        if ver >= (1, 19):
            out["resource_provider_generation"] = rec["meta"].placement_generation
        return JSONResponse(out)

    return [
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
        Route(p + "/resource_providers/{uuid}/traits", put_traits, methods=["PUT"]),
        Route(p + "/traits", list_traits, methods=["GET"]),
        Route(p + "/traits/{name}", show_trait, methods=["GET"]),
        Route(p + "/traits/{name}", create_trait, methods=["PUT"]),
        Route(p + "/resource_providers/{uuid}/aggregates", show_aggregates, methods=["GET"]),
        Route(p + "/resource_providers/{uuid}/aggregates", put_aggregates, methods=["PUT"]),
        Route(p + "/usages", total_usages, methods=["GET"]),
    ]
