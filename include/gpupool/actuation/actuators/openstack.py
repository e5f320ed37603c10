"""OpenStack: disable the node's nova-compute service and reserve its GPU inventory in Placement.

Release, in order:

1. ``disable_service``: the ``nova-compute`` service of the host is disabled with a
   ``gpupool:`` reason, so the scheduler's ComputeFilter stops placing instances there;
2. ``reserve_inventory``: every GPU inventory (``VGPU``, ``PGPU``, ``CUSTOM_*GPU*``) of the
   host's resource-provider tree gets ``reserved = total`` and the provider gets the trait
   ``CUSTOM_GPUPOOL_HELD`` — the marker that says gpupool, not an operator, reserved it.

The node is released when no consumer has an allocation left on the tree (all usages zero).
Attach reverses both, and only where gpupool's marks are found: a service disabled with
another reason, or an inventory reserved without the trait, is left alone.

Evict (a reclaim, or a move the policy lets end work): one live migration per instance on the
host (``os-migrateLive`` through openstacksdk, no target host: Nova's scheduler chooses, and the
disabled service keeps it from choosing this one). Nova refuses with 400 (no valid host) or 409 (an
instance not ACTIVE, locked); the refusal names the instance and Nova's reason, and the release
waits: an instance that cannot move is never deleted. ``work_started`` reads the instances'
``OS-SRV-USG:launched_at`` (``created`` before it is set).

Placement is spoken to with ``openstacksdk``'s placement proxy at an explicit microversion;
the compute part is optional (``manage_compute_service=False``) for clouds — or test rigs —
where Placement is used without nova. Note that a nova-compute that reports inventory itself
rewrites ``reserved`` on its next periodic update; the disabled service is what keeps the
scheduler away, the reservation is what keeps direct Placement consumers away meanwhile.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Mapping

from gpupool.actuation.actuators.base import (
    ActuationError,
    Actuator,
    Command,
    ForeignHoldError,
    OwnerState,
    is_gpupool_reason,
)
from gpupool.actuation.marks import HELD_TRAIT

PLACEMENT_MICROVERSION = "1.26"  # in_tree= (1.14) and reserved == total (1.26)
_GPU_CLASSES = ("VGPU", "PGPU")


def is_gpu_class(resource_class: str) -> bool:
    """Whether a Placement resource class counts GPUs."""
    return resource_class in _GPU_CLASSES or (resource_class.startswith("CUSTOM_") and "GPU" in resource_class)


class OpenStackActuator(Actuator):
    """Release and attach compute hosts of one OpenStack cloud.

    Parameters
    ----------
    conn:
        An ``openstack.connection.Connection`` (admin or service role: Placement's default
        policy lets only them write inventories).
    platform:
        The configured platform name.
    manage_compute_service:
        Disable / enable the host's ``nova-compute`` service (needs a compute endpoint).
    names:
        Pool node name -> hypervisor host / root resource provider name, where they differ.
    """

    def __init__(self, conn, platform: str = "openstack", manage_compute_service: bool = True,
                 names: Mapping[str, str] | None = None):
        self.conn = conn
        self.platform = platform
        self.manage_compute_service = manage_compute_service
        self.names = dict(names or {})

    # ---- Placement plumbing
    def _name(self, node: str) -> str:
        return self.names.get(node, node)

    def _placement(self, method: str, url: str, node: str, action: str, json_body: Any = None,
                   ok: tuple[int, ...] = (200,)) -> Any:
        try:
            resp = getattr(self.conn.placement, method)(
                url, json=json_body, microversion=PLACEMENT_MICROVERSION, raise_exc=False
            )
        except Exception as exc:  # connection refused, auth failure: the SDK's own exceptions
            raise ActuationError(self.platform, node, action, f"placement {method.upper()} {url}: {exc}") from exc
        if resp.status_code not in ok:
            raise ActuationError(
                self.platform, node, action,
                f"placement {method.upper()} {url}: HTTP {resp.status_code} {resp.text[:300]}",
            )
        return resp.json() if resp.content else None

    def _root(self, node: str, action: str) -> dict[str, Any] | None:
        rps = self._placement("get", f"/resource_providers?name={self._name(node)}", node, action)["resource_providers"]
        return rps[0] if rps else None

    def _tree(self, node: str, action: str) -> list[dict[str, Any]]:
        root = self._root(node, action)
        if root is None:
            return []
        return self._placement("get", f"/resource_providers?in_tree={root['uuid']}", node, action)["resource_providers"]

    def _gpu_inventories(self, node: str, action: str) -> list[tuple[dict, str, dict]]:
        """(provider, resource class, inventory) of every GPU inventory in the host's tree."""
        out = []
        for rp in self._tree(node, action):
            inv = self._placement("get", f"/resource_providers/{rp['uuid']}/inventories", node, action)
            for rc, rec in sorted(inv["inventories"].items()):
                if is_gpu_class(rc):
                    out.append((rp, rc, rec))
        return out

    def _traits(self, uuid: str, node: str, action: str) -> tuple[list[str], int]:
        body = self._placement("get", f"/resource_providers/{uuid}/traits", node, action)
        return list(body["traits"]), int(body["resource_provider_generation"])

    def _compute_service(self, node: str, action: str):
        try:
            found = list(self.conn.compute.services(host=self._name(node), binary="nova-compute"))
        except Exception as exc:
            raise ActuationError(self.platform, node, action, f"compute services: {exc}") from exc
        return found[0] if found else None

    # ---- reads
    def owner_state(self, node: str) -> OwnerState:
        """Service status (when managed), reserved GPU inventory, held trait and usages."""
        tree = self._tree(node, "read node")
        if not tree:
            return OwnerState(self.platform, node, present=False, schedulable=False)
        inventories = self._gpu_inventories(node, "read node")
        reserved_all = bool(inventories) and all(rec["reserved"] >= rec["total"] for _, _, rec in inventories)
        marked = all(HELD_TRAIT in self._traits(rp["uuid"], node, "read node")[0] for rp in {r["uuid"]: r for r, _, _ in inventories}.values())
        usage = 0
        usages: dict[str, int] = {}
        for rp in tree:
            u = self._placement("get", f"/resource_providers/{rp['uuid']}/usages", node, "read node")["usages"]
            for rc, v in u.items():
                usages[rc] = usages.get(rc, 0) + int(v)
                usage += int(v)
        detail: dict[str, Any] = {
            "gpu_inventory": {f"{rp['name']}/{rc}": {"total": rec["total"], "reserved": rec["reserved"]}
                              for rp, rc, rec in inventories},
            "usages": usages,
        }
        hold_reason = None
        held = False
        if self.manage_compute_service:
            svc = self._compute_service(node, "read node")
            if svc is not None and str(getattr(svc, "status", "enabled")) == "disabled":
                held = True
                hold_reason = getattr(svc, "disabled_reason", None) or "compute service disabled"
            detail["service"] = None if svc is None else {"status": getattr(svc, "status", None),
                                                          "disabled_reason": getattr(svc, "disabled_reason", None)}
        if reserved_all and not held:
            held = True
            hold_reason = f"{'gpupool:' if marked else 'operator:'} GPU inventory reserved"
        elif reserved_all and held and not marked and is_gpupool_reason(hold_reason):
            hold_reason = "GPU inventory reserved by someone else than gpupool"
        return OwnerState(self.platform, node, present=True, schedulable=not held, hold_reason=hold_reason,
                          busy=usage, detail=detail)

    def is_released(self, node: str) -> bool:
        """Held by gpupool and no allocation left on the host's provider tree."""
        st = self.owner_state(node)
        return st.held_by_gpupool and st.busy == 0

    @property
    def can_evict(self) -> bool:  # type: ignore[override]
        """Live migration needs the compute API: not on a Placement-only cloud."""
        return self.manage_compute_service

    def servers(self, node: str, action: str = "list servers") -> list[Any]:
        """The instances on the host, every project's (an admin's listing filtered by ``host``)."""
        try:
            found = list(self.conn.compute.servers(details=True, all_projects=True, compute_host=self._name(node)))
        except Exception as exc:
            raise ActuationError(self.platform, node, action, f"compute servers: {exc}") from exc
        # a Nova that ignores the filter (a non-admin caller) must not make another host's instances ours
        return [s for s in found if getattr(s, "compute_host", None) in (None, self._name(node))]

    def work_started(self, node: str) -> list[datetime] | None:
        """When each instance on the host was launched (``created`` until it is), UTC; None on a
        Placement-only cloud, which cannot list instances."""
        if not self.manage_compute_service:
            return None
        out = []
        for s in self.servers(node, "read work"):
            when = _utc(getattr(s, "launched_at", None)) or _utc(getattr(s, "created_at", None))
            if when is not None:
                out.append(when)
        return out

    # ---- writes
    def release_commands(self, node: str, reason: str) -> list[Command]:
        """Disable nova-compute (when managed), then reserve all GPU inventory and mark it."""
        cmds = []
        if self.manage_compute_service:
            cmds.append(Command(self.platform, node, "disable_service",
                                {"host": self._name(node), "binary": "nova-compute", "disabled_reason": reason}))
        cmds.append(Command(self.platform, node, "reserve_inventory",
                            {"resource_provider": self._name(node), "reserved": "total", "trait": HELD_TRAIT}))
        return cmds

    def evict_commands(self, node: str) -> list[Command]:
        """One live migration per instance on the host (the scheduler picks the destination)."""
        if not self.manage_compute_service:
            return []
        return [Command(self.platform, node, "live_migrate",
                        {"server": s.id, "name": getattr(s, "name", None), "host": None, "block_migration": "auto"})
                for s in self.servers(node)]

    def attach_commands(self, node: str) -> list[Command]:
        """Unreserve gpupool-marked inventory, then enable the service — gpupool's holds only."""
        st = self.owner_state(node)
        self.refuse_foreign(st, "attach")
        if st.schedulable:
            return []
        cmds = [Command(self.platform, node, "unreserve_inventory",
                        {"resource_provider": self._name(node), "reserved": 0, "trait": HELD_TRAIT})]
        if self.manage_compute_service:
            cmds.append(Command(self.platform, node, "enable_service", {"host": self._name(node), "binary": "nova-compute"}))
        return cmds

    def send(self, command: Command) -> dict[str, Any]:
        """Carry out one command through openstacksdk; idempotent."""
        node, action = command.node, command.action
        if action == "disable_service":
            svc = self._require_service(node, action)
            try:
                self.conn.compute.disable_service(svc, host=svc.host, binary=svc.binary,
                                                  disabled_reason=command.request["disabled_reason"])
            except Exception as exc:
                raise ActuationError(self.platform, node, action, str(exc)) from exc
            return {"service": getattr(svc, "id", None), "status": "disabled"}
        if action == "enable_service":
            svc = self._require_service(node, action)
            reason = getattr(svc, "disabled_reason", None)
            if str(getattr(svc, "status", "")) == "disabled" and not is_gpupool_reason(reason):
                raise ForeignHoldError(self.platform, node, action, f"service disabled by someone else ({reason})")
            try:
                self.conn.compute.enable_service(svc, host=svc.host, binary=svc.binary)
            except Exception as exc:
                raise ActuationError(self.platform, node, action, str(exc)) from exc
            return {"service": getattr(svc, "id", None), "status": "enabled"}
        if action == "live_migrate":
            return self._live_migrate(node, command.request)
        if action == "reserve_inventory":
            return self._set_reserved(node, action, hold=True)
        if action == "unreserve_inventory":
            return self._set_reserved(node, action, hold=False)
        raise ActuationError(self.platform, node, action, "unknown action")

    def _live_migrate(self, node: str, req: Mapping[str, Any]) -> dict[str, Any]:
        """Live-migrate one instance; one already gone from the host (moved by an earlier send,
        migrating now, deleted) answers ok, so sending twice is sending once."""
        from openstack import exceptions as os_exc

        server = req["server"]
        label = f"server {req.get('name') or server} ({server})" if req.get("name") else f"server {server}"
        try:
            cur = self.conn.compute.get_server(server)
        except os_exc.NotFoundException:
            return {"server": server, "migrated": False, "detail": "gone"}
        except Exception as exc:
            raise ActuationError(self.platform, node, "live_migrate", f"{label}: {exc}") from exc
        host = getattr(cur, "compute_host", None)
        if host not in (None, self._name(node)) or getattr(cur, "task_state", None) == "migrating":
            return {"server": server, "migrated": False, "detail": f"on {host} ({getattr(cur, 'task_state', None)})"}
        try:
            self.conn.compute.live_migrate_server(server, host=req.get("host"),
                                                  block_migration=req.get("block_migration", "auto"))
        except os_exc.NotFoundException:
            return {"server": server, "migrated": False, "detail": "gone"}
        except os_exc.HttpException as exc:
            raise ActuationError(self.platform, node, "live_migrate",
                                 f"{label} refused by nova (HTTP {exc.status_code}): {exc.details or exc}") from exc
        except Exception as exc:
            raise ActuationError(self.platform, node, "live_migrate", f"{label}: {exc}") from exc
        return {"server": server, "migrated": True}

    def _require_service(self, node: str, action: str):
        svc = self._compute_service(node, action)
        if svc is None:
            raise ActuationError(self.platform, node, action, f"no nova-compute service on host {self._name(node)!r}")
        return svc

    def _set_reserved(self, node: str, action: str, hold: bool) -> dict[str, Any]:
        inventories = self._gpu_inventories(node, action)
        if not inventories:
            raise ActuationError(self.platform, node, action, "no GPU inventory in the host's resource provider tree")
        if hold:
            self._placement("put", f"/traits/{HELD_TRAIT}", node, action, ok=(201, 204))
        changed = {}
        for rp, rc, rec in inventories:
            uuid = rp["uuid"]
            traits, gen = self._traits(uuid, node, action)
            if not hold and HELD_TRAIT not in traits:
                if rec["reserved"] >= rec["total"]:
                    raise ForeignHoldError(self.platform, node, action,
                                           f"{rp['name']}/{rc} reserved without gpupool's trait {HELD_TRAIT}")
                continue
            if hold and HELD_TRAIT not in traits:  # the mark goes on before the reservation
                self._placement("put", f"/resource_providers/{uuid}/traits", node, action,
                                {"resource_provider_generation": gen, "traits": sorted(traits + [HELD_TRAIT])})
            want = rec["total"] if hold else 0
            if rec["reserved"] != want:
                inv = self._placement("get", f"/resource_providers/{uuid}/inventories/{rc}", node, action)
                body = {k: inv[k] for k in ("total", "min_unit", "max_unit", "step_size", "allocation_ratio") if k in inv}
                body.update(reserved=want, resource_provider_generation=inv["resource_provider_generation"])
                self._placement("put", f"/resource_providers/{uuid}/inventories/{rc}", node, action, body)
            changed[f"{rp['name']}/{rc}"] = want
            if not hold:  # the mark comes off after the reservation
                traits, gen = self._traits(uuid, node, action)
                if HELD_TRAIT in traits:
                    self._placement("put", f"/resource_providers/{uuid}/traits", node, action,
                                    {"resource_provider_generation": gen,
                                     "traits": sorted(t for t in traits if t != HELD_TRAIT)})
        return {"reserved": changed}


def _utc(value: Any) -> datetime | None:
    """A Nova timestamp (``2024-01-02T10:00:00.000000``, ``2024-01-02T10:00:00Z``; naive = UTC) as UTC."""
    if not value:
        return None
    try:
        when = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None
    return when.replace(tzinfo=timezone.utc) if when.tzinfo is None else when.astimezone(timezone.utc)
