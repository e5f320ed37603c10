"""Kueue's ClusterQueue and ResourceFlavor (``kueue.x-k8s.io/v1beta1``, cluster-scoped) on the
virtual datacenter's Kubernetes API server: what gpupool's queue quota reads and replaces.

A plain object store, as the API server keeps custom resources: create (POST), get, list,
replace (PUT) and delete. A replace must carry the stored ``metadata.resourceVersion`` (absent:
422 Invalid, stale: 409 Conflict) and never changes ``status`` (a subresource); every write
moves the ``resourceVersion`` on. Kueue's controller is not emulated: the simulated world does
not admit through the queue, and ``status`` stays what a ClusterQueue reports with nothing
admitted.
"""

from __future__ import annotations

import copy
import itertools
import threading
import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from gpupool.emulator.kubernetes_objects import ApiError, not_found, status_body

GROUP, VERSION = "kueue.x-k8s.io", "v1beta1"
#: plural -> kind
KINDS = {"clusterqueues": "ClusterQueue", "resourceflavors": "ResourceFlavor"}


def _empty_status(obj: dict) -> dict:
    """What Kueue reports of a ClusterQueue with nothing admitted (its flavors' usage at 0)."""
    flavors = []
    for group in (obj.get("spec") or {}).get("resourceGroups") or []:
        for fl in group.get("flavors") or []:
            flavors.append({"name": fl.get("name"), "resources": [
                {"borrowed": "0", "name": r.get("name"), "total": "0"} for r in fl.get("resources") or []]})
    return {"admittedWorkloads": 0, "pendingWorkloads": 0, "reservingWorkloads": 0,
            "conditions": [{"lastTransitionTime": obj["metadata"]["creationTimestamp"], "message": "Can admit new workloads",
                            "observedGeneration": 1, "reason": "Ready", "status": "True", "type": "Active"}],
            "flavorsReservation": copy.deepcopy(flavors), "flavorsUsage": flavors}


class KueueStore:
    """The stored objects of one API server; ``now()`` gives creation timestamps."""

    def __init__(self, now):
        self.now = now
        self.objects: dict[tuple[str, str], dict] = {}
        self._rv = itertools.count(1)
        self.lock = threading.Lock()

    def _kind(self, plural: str) -> str:
        if plural not in KINDS:
            raise ApiError(404, "NotFound", "the server could not find the requested resource", {})
        return KINDS[plural]

    def get(self, plural: str, name: str) -> dict:
        self._kind(plural)
        obj = self.objects.get((plural, name))
        if obj is None:
            raise not_found(plural, name, GROUP)
        return copy.deepcopy(obj)

    def list(self, plural: str) -> dict:
        kind = self._kind(plural)
        items = [copy.deepcopy(o) for (p, _), o in sorted(self.objects.items()) if p == plural]
        return {"apiVersion": f"{GROUP}/{VERSION}", "kind": f"{kind}List",
                "metadata": {"resourceVersion": str(next(self._rv))}, "items": items}

    def create(self, plural: str, body: Any) -> dict:
        kind = self._kind(plural)
        name = ((body or {}).get("metadata") or {}).get("name") if isinstance(body, dict) else None
        if not name:
            raise ApiError(422, "Invalid", f"{kind}.{GROUP} is invalid: metadata.name: Required value: name is required",
                           {"kind": kind, "group": GROUP})
        if (plural, name) in self.objects:
            raise ApiError(409, "AlreadyExists", f'{plural}.{GROUP} "{name}" already exists',
                           {"name": name, "group": GROUP, "kind": plural})
        obj = copy.deepcopy(body)
        obj.update({"apiVersion": f"{GROUP}/{VERSION}", "kind": kind})
        meta = obj["metadata"]
        meta.pop("namespace", None)
        meta.update({"creationTimestamp": self.now(), "generation": 1, "resourceVersion": str(next(self._rv)),
                     "uid": str(uuid.uuid4()), "finalizers": [f"{GROUP}/resource-in-use"]})
        if plural == "clusterqueues":
            obj["status"] = _empty_status(obj)
        self.objects[(plural, name)] = obj
        return copy.deepcopy(obj)

    def replace(self, plural: str, name: str, body: Any) -> dict:
        kind = self._kind(plural)
        current = self.objects.get((plural, name))
        if current is None:
            raise not_found(plural, name, GROUP)
        md = (body.get("metadata") or {}) if isinstance(body, dict) else {}
        if md.get("name") != name:
            raise ApiError(400, "BadRequest", f"the name of the object ({md.get('name')}) does not match the name on "
                                              f"the URL ({name})")
        if not md.get("resourceVersion"):
            raise ApiError(422, "Invalid", f'{kind}.{GROUP} "{name}" is invalid: metadata.resourceVersion: Invalid '
                                           "value: 0x0: must be specified for an update", {"name": name, "kind": kind})
        if str(md["resourceVersion"]) != current["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {plural}.{GROUP} "{name}": the object '
                                            "has been modified; please apply your changes to the latest version and "
                                            "try again", {"name": name, "group": GROUP, "kind": plural})
        obj = copy.deepcopy(body)
        obj.update({"apiVersion": f"{GROUP}/{VERSION}", "kind": kind})
        for key in ("uid", "creationTimestamp", "finalizers"):
            obj["metadata"][key] = current["metadata"].get(key)
        generation = current["metadata"].get("generation", 1)
        if obj.get("spec") != current.get("spec"):
            generation += 1
        obj["metadata"].update({"generation": generation, "resourceVersion": str(next(self._rv))})
        if "status" in current:
            obj["status"] = copy.deepcopy(current["status"])
        else:
            obj.pop("status", None)
        self.objects[(plural, name)] = obj
        return copy.deepcopy(obj)

    def delete(self, plural: str, name: str) -> dict:
        self._kind(plural)
        if self.objects.pop((plural, name), None) is None:
            raise not_found(plural, name, GROUP)
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                "details": {"name": name, "group": GROUP, "kind": plural}}

    # ---- HTTP
    def routes(self, read_body) -> list[Route]:
        """The routes under ``/apis/kueue.x-k8s.io/v1beta1``; ``read_body`` parses a request's JSON."""

        def guarded(fn):
            async def handler(request: Request):
                try:
                    body = await read_body(request) if request.method in ("POST", "PUT") else None
                    with self.lock:
                        return JSONResponse(fn(request.path_params, body), status_code=201 if request.method == "POST" else 200)
                except ApiError as exc:
                    return JSONResponse(status_body(exc.code, exc.reason, exc.message, exc.details), status_code=exc.code)
            return handler

        base = f"/apis/{GROUP}/{VERSION}"
        return [
            Route(base + "/{plural}", guarded(lambda p, b: self.list(p["plural"])), methods=["GET"]),
            Route(base + "/{plural}", guarded(lambda p, b: self.create(p["plural"], b)), methods=["POST"]),
            Route(base + "/{plural}/{name}", guarded(lambda p, b: self.get(p["plural"], p["name"])), methods=["GET"]),
            Route(base + "/{plural}/{name}", guarded(lambda p, b: self.replace(p["plural"], p["name"], b)),
                  methods=["PUT"]),
            Route(base + "/{plural}/{name}", guarded(lambda p, b: self.delete(p["plural"], p["name"])),
                  methods=["DELETE"]),
        ]

    @staticmethod
    def discovery() -> dict:
        """The group-version's APIResourceList."""
        return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": f"{GROUP}/{VERSION}", "resources": [
            {"name": p, "singularName": k.lower(), "namespaced": False, "kind": k,
             "verbs": ["create", "delete", "get", "list", "update"]} for p, k in KINDS.items()]}
