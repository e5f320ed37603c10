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
  ``disable-log-reason`` and ``enable`` actions before it), ``os-hypervisors`` (list, detail) and
  ``servers`` (one per running GPU job; ``all_tenants``/``host`` filters; ``os-migrateLive``).
  Disabling ``nova-compute`` of a host cordons the node: its instances run on and end, or leave
  it by live migration while another enabled host has room.
* Gnocchi at ``/metric``: one ``nova_compute`` resource per compute node (``host_name``
  attribute, as Ceilometer files compute nodes) with the metrics ``gpu.util`` (percent),
  ``gpu.allocated`` and ``gpu.capacity`` (GPUs), one ``generic`` resource for the cloud
  (``original_resource_id`` "cloud") with ``gpu.pending``; ``/v1/metric/{id}/measures``,
  ``/v1/resource/{type}[/{id}]``, ``/v1/search/resource/{type}`` and ``/v1/aggregates`` (resource
  type in the body, ``groupby`` an attribute of that type), held to a real Gnocchi 4.7 by
  ``tests/integration/test_gnocchi_source.py``.

Error bodies are each service's own: Keystone ``{"error": {...}}``, Placement ``{"errors": [...]}``,
Nova ``{"itemNotFound"|"badRequest"|...: {...}}``, Gnocchi ``{"code", "description", "title"}``.
"""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.responses import JSONResponse

from gpupool.emulator.openstack import gnocchi, keystone, nova, placement
from gpupool.emulator.openstack.common import (
    ROLE,
    FacadeContext,
    OsError,
    gnocchi_error,
    keystone_error,
    nova_error,
    placement_error,
)
from gpupool.emulator.state import SimState

__all__ = ["ROLE", "OsError", "make_app"]


def make_app(state: SimState, password: str = "gpupool-sim") -> Starlette:
    """The OpenStack app (Keystone, Placement, Nova, Gnocchi) over ``state``."""
    ctx = FacadeContext(state, password)

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

    routes = keystone.routes(ctx) + placement.routes(ctx) + nova.routes(ctx) + gnocchi.routes(ctx)
    return Starlette(routes=routes, exception_handlers={404: fallback, 405: not_allowed})
