"""Nova at ``/compute/v2.1``: ``os-services`` (disable/enable a compute host) and ``os-hypervisors``."""

from __future__ import annotations

import json

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from gpupool.emulator.openstack.common import (
    CONTROLLER,
    NOVA_MAX,
    ROLE,
    FacadeContext,
    OsError,
    int_id,
    iso,
    microversion,
    nova_error,
)
from gpupool.emulator.openstack.placement import hold_if_fully_reserved
from gpupool.emulator.state import SimConflict, SimNotFound, stable_uuid


def routes(ctx: FacadeContext) -> list[Route]:
    """The service's routes over ``ctx``'s state."""
    c = "/compute/v2.1"
    state, base, authorized = ctx.state, ctx.base, ctx.authorized

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
                ver = microversion(request, "compute", NOVA_MAX, (2, 1))
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
            "id": stable_uuid(binary, host) if ver >= (2, 53) else int_id(binary, host),
            "binary": binary, "host": host, "zone": "nova" if binary == "nova-compute" else "internal",
            "status": "disabled" if disabled else "enabled", "state": "up",
            "updated_at": iso(state.now), "disabled_reason": rec["drain_reason"] if disabled else None,
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
            # enabling the service does not undo a Placement reservation of all its GPUs
            if not hold_if_fully_reserved(state, rec):
                state.uncordon(ROLE, rec["name"])

    @nova
    async def update_service(request, ver):
        sid = request.path_params["sid"]
        if ver < (2, 53):
            return await legacy_action(request, ver, sid)
        match = [(rec, b) for rec, b in all_services(ver) if b["id"] == sid]
        if not match:
            raise OsError(404, f"Service {sid} could not be found.")
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
        body = {"id": stable_uuid("hypervisor", name) if ver >= (2, 53) else int_id("hv", name),
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
                # an object since 2.28, a JSON string before (Nova API reference, os-hypervisors)
                cpu_info = {"arch": "x86_64", "model": "Icelake-Server", "vendor": "Intel",
                            "features": ["avx512f", "pge", "clflush"],
                            "topology": {"cores": 16, "threads": 2, "sockets": 2}}
                body.update({"vcpus": 64, "memory_mb": 524288, "local_gb": 1800, "vcpus_used": busy * 8,
                             "memory_mb_used": busy * 65536, "local_gb_used": busy * 100, "running_vms": busy,
                             "current_workload": 0, "free_ram_mb": 524288 - busy * 65536,
                             "free_disk_gb": 1800 - busy * 100, "disk_available_least": 1700 - busy * 100,
                             "cpu_info": cpu_info if ver >= (2, 28) else json.dumps(cpu_info)})
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
        raise OsError(404, f"Hypervisor with ID '{hid}' could not be found.")

    return [
        Route("/compute", compute_root, methods=["GET"]),
        Route("/compute/", compute_root, methods=["GET"]),
        Route(c, compute_v21, methods=["GET"]),
        Route(c + "/", compute_v21, methods=["GET"]),
        Route(c + "/os-services", list_services, methods=["GET"]),
        Route(c + "/os-services/{sid}", update_service, methods=["PUT"]),
        Route(c + "/os-hypervisors", list_hypervisors, methods=["GET"]),
        Route(c + "/os-hypervisors/detail", list_hypervisors, methods=["GET"]),
        Route(c + "/os-hypervisors/{hid}", show_hypervisor, methods=["GET"]),
    ]
