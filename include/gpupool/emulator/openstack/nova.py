"""Nova at ``/compute/v2.1``: ``os-services`` (disable/enable a compute host), ``os-hypervisors``, and the
servers (instances) the platform's GPU work runs as, with their ``os-migrateLive`` action.

Servers: one per running one-GPU job of the platform (:meth:`SimState.running`), owned by a tenant
of its own (``research``), listed with ``all_tenants`` and filtered by ``host`` as an admin lists
them; the body has the keys of the API reference's admin sample (``OS-EXT-SRV-ATTR:host``,
``OS-SRV-USG:launched_at`` = when the job began, ...). ``os-migrateLive`` is answered as Nova does
at the microversions before 2.34, where the scheduler's checks are synchronous (openstacksdk sends
2.30): 202 when another enabled host of the platform has a free GPU (the instance leaves its host
at once; the fluid world places the work wherever the platform has room, as a new instance, since
the emulator keeps no identity across hosts), 400 "No valid host was found." when none has.
"""

from __future__ import annotations

import json

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gpupool.emulator.openstack.common import (
    CONTROLLER,
    NOVA_MAX,
    ROLE,
    FacadeContext,
    OsError,
    PROJECTS,
    int_id,
    iso,
    microversion,
    nova_error,
)
from gpupool.emulator.openstack.placement import hold_if_fully_reserved
from gpupool.emulator.state import SimConflict, SimNotFound, stable_uuid

#: the tenant the platform's instances belong to (not gpupool's: an admin lists them with all_tenants)
WORK_TENANT = stable_uuid("project", "research").replace("-", "")
_TRUE = ("", "1", "t", "true", "on", "y", "yes")
_BOOLEAN = (True, False, "True", "False", "true", "false", "1", "0", "t", "f", "on", "off", "y", "n", "yes", "no")


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

    # ---- servers
    def server_id(w) -> str:
        return stable_uuid("server", w.job_id)

    def server_body(request, w) -> dict:
        sid, root = server_id(w), base(request)
        node = w.node
        stamp = w.start.strftime("%Y-%m-%dT%H:%M:%SZ")
        return {
            "OS-DCF:diskConfig": "MANUAL", "OS-EXT-AZ:availability_zone": "nova",
            "OS-EXT-SRV-ATTR:host": node, "OS-EXT-SRV-ATTR:hostname": w.name,
            "OS-EXT-SRV-ATTR:hypervisor_hostname": node, "OS-EXT-SRV-ATTR:instance_name": f"instance-{w.job_id:08x}",
            "OS-EXT-SRV-ATTR:kernel_id": "", "OS-EXT-SRV-ATTR:launch_index": 0, "OS-EXT-SRV-ATTR:ramdisk_id": "",
            "OS-EXT-SRV-ATTR:reservation_id": f"r-{sid[:8]}", "OS-EXT-SRV-ATTR:root_device_name": "/dev/vda",
            "OS-EXT-SRV-ATTR:user_data": None, "OS-EXT-STS:power_state": 1, "OS-EXT-STS:task_state": None,
            "OS-EXT-STS:vm_state": "active", "OS-SRV-USG:launched_at": iso(w.start),
            "OS-SRV-USG:terminated_at": None, "accessIPv4": "", "accessIPv6": "",
            "addresses": {"research-net": [{"OS-EXT-IPS-MAC:mac_addr": f"fa:16:3e:{sid[0:2]}:{sid[2:4]}:{sid[4:6]}",
                                            "OS-EXT-IPS:type": "fixed", "addr": f"10.20.{w.job_id % 250}.{w.slot + 2}",
                                            "version": 4}]},
            "config_drive": "", "created": stamp, "description": None,
            "flavor": {"disk": 100, "ephemeral": 0, "extra_specs": {"pci_passthrough:alias": "gpu:1"},
                       "original_name": "g1.gpu", "ram": 65536, "swap": 0, "vcpus": 8},
            "hostId": stable_uuid("host", WORK_TENANT, node).replace("-", "")[:28] * 2,
            "host_status": "UP", "id": sid,
            "image": {"id": stable_uuid("image", "ubuntu-cuda"),
                      "links": [{"href": f"{root}/compute/images/{stable_uuid('image', 'ubuntu-cuda')}",
                                 "rel": "bookmark"}]},
            "key_name": None,
            "links": [{"href": f"{root}/compute/v2.1/servers/{sid}", "rel": "self"},
                      {"href": f"{root}/compute/servers/{sid}", "rel": "bookmark"}],
            "locked": False, "locked_reason": None, "metadata": {}, "name": w.name,
            "os-extended-volumes:volumes_attached": [], "progress": 0, "security_groups": [{"name": "default"}],
            "status": "ACTIVE", "tags": [], "tenant_id": WORK_TENANT, "trusted_image_certificates": None,
            "updated": stamp, "user_id": stable_uuid("user", "research").replace("-", ""),
        }

    def caller_project(request) -> str | None:
        tok = ctx.tokens.get(request.headers.get("x-auth-token", "")) or {}
        return PROJECTS.get(tok.get("project") or "")

    def visible(request) -> list:
        q = request.query_params
        every = "all_tenants" in q and q["all_tenants"].strip().lower() in _TRUE
        out = [w for w in state.running(ROLE) if every or caller_project(request) == WORK_TENANT]
        if q.get("host"):
            out = [w for w in out if w.node == q["host"]]
        if q.get("node"):
            out = [w for w in out if w.node == q["node"]]
        return out

    @nova
    async def list_servers(request, ver):
        items = [server_body(request, w) for w in visible(request)]
        if not request.url.path.endswith("/detail"):
            items = [{k: b[k] for k in ("id", "links", "name")} for b in items]
        return JSONResponse({"servers": items})

    def find_server(sid: str):
        for w in state.running(ROLE):
            if server_id(w) == sid:
                return w
        raise OsError(404, f"Instance {sid} could not be found.")

    @nova
    async def show_server(request, ver):
        return JSONResponse({"server": server_body(request, find_server(request.path_params["sid"]))})

    def migrate_live_args(body, ver) -> tuple[str | None, bool]:
        args = body.get("os-migrateLive")
        allowed = {"block_migration", "host"}
        required = {"block_migration", "host"}
        if ver < (2, 25):
            allowed, required = allowed | {"disk_over_commit"}, required | {"disk_over_commit"}
        elif (2, 30) <= ver < (2, 68):
            allowed = allowed | {"force"}
        where = "Invalid input for field/attribute os-migrateLive."
        if not isinstance(args, dict):
            raise OsError(400, f"{where} Value: {args}. {args!r} is not of type 'object'")
        if set(args) - allowed:
            raise OsError(400, f"{where} Value: {args}. Additional properties are not allowed "
                               f"({', '.join(repr(k) for k in sorted(set(args) - allowed))} was unexpected)")
        if required - set(args):
            raise OsError(400, f"{where} Value: {args}. {sorted(required - set(args))[0]!r} is a required property")
        block = args["block_migration"]
        if block not in _BOOLEAN and not (ver >= (2, 25) and block == "auto"):
            raise OsError(400, f"Invalid input for field/attribute block_migration. Value: {block}. "
                               f"{block!r} is not one of {list(_BOOLEAN) + (['auto'] if ver >= (2, 25) else [])}")
        host = args["host"]
        if host is not None and not isinstance(host, str):
            raise OsError(400, f"Invalid input for field/attribute host. Value: {host}. {host!r} is not of type "
                               "'string', 'null'")
        force = args.get("force") in (True, "True", "true", "1", "t", "on", "y", "yes")
        if force and not host:
            raise OsError(400, "Can't force to a non-provided destination")
        return host, force

    def room(rec: dict) -> bool:
        return not rec["cordoned"] and not rec["in_transit"] and rec["gpus"] - int(rec["busy_gpus"]) >= 1

    def migrate_live(w, host: str | None) -> None:
        if host is not None:
            try:
                dest = state.node(ROLE, host)
            except SimNotFound:
                raise OsError(400, f"Compute host {host} could not be found.") from None
            if host == w.node:
                raise OsError(400, f"Unable to migrate instance ({server_id(w)}) to current host ({host}).")
            if not room(dest):
                raise OsError(400, f"No valid host was found. Host {host} has no room for instance {server_id(w)}")
        elif not any(room(rec) for rec in state.nodes(ROLE) if rec["name"] != w.node):
            raise OsError(400, "No valid host was found. There are not enough hosts available.")
        state.evict(ROLE, w.job_id)

    @nova
    async def server_action(request, ver):
        try:
            body = json.loads(await request.body())
        except ValueError:
            raise OsError(400, "Malformed request body") from None
        if not isinstance(body, dict) or len(body) != 1:
            raise OsError(400, "Malformed request body")
        action = next(iter(body))
        w = find_server(request.path_params["sid"])
        if action != "os-migrateLive":
            raise OsError(404, f"There is no such action: {action}")
        host, _ = migrate_live_args(body, ver)
        migrate_live(w, host)
        return Response(status_code=202)

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
        Route(c + "/servers", list_servers, methods=["GET"]),
        Route(c + "/servers/detail", list_servers, methods=["GET"]),
        Route(c + "/servers/{sid}", show_server, methods=["GET"]),
        Route(c + "/servers/{sid}/action", server_action, methods=["POST"]),
    ]
