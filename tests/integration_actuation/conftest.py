"""Fixtures of the actuation tests against real services.

Slurm and Keystone + Placement are started with the project's own scripts through the helper
classes of tests/integration/realservices.py (one instance per session, own directories and
free loopback ports); sushy-tools' Redfish BMC emulator likewise, one per test (it starts in
about a second, and each test then has its own systems' power states). Kubernetes has no API server that installs here: the official client
talks to `kmock`'s KubernetesEmulator (an in-memory API server over real HTTP), run on its own
event loop in a thread, with the Eviction subresource answered as the API server does:
PodDisruptionBudgets whose selector matches the pod decide, 429 when none may be disrupted.
A service that cannot start fails the tests that need it; nothing here skips.
"""

from __future__ import annotations

import asyncio
import re
import sys
import threading
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "integration"))
sys.path.insert(0, str(HERE.parent / "unit" / "actuation"))

from realservices import (  # noqa: E402
    OpenStackServices,
    RedfishEmulator,
    SlurmCluster,
    reset_slurm,
    start_openstack,
    start_redfish,
    start_slurm_cluster,
)


def pytest_collection_modifyitems(config, items):
    """Everything here needs a real service."""
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def slurm_rig() -> SlurmCluster:
    """A one-node Slurm cluster with 2 fake GPUs, for the actuator tests."""
    cluster = start_slurm_cluster(gpus=2)
    yield cluster
    cluster.stop()


@pytest.fixture
def slurm_idle(slurm_rig) -> SlurmCluster:
    """The rig with no jobs and its node resumed, before and after the test."""
    reset_slurm(slurm_rig, resume_unless_idle=True)
    yield slurm_rig
    reset_slurm(slurm_rig, resume_unless_idle=True)


#: the systems of the Redfish emulator: pool nodes with a BMC
REDFISH_SYSTEMS = ("gpu-r01", "gpu-r02", "gpu-k01")


@pytest.fixture
def redfish_bmc() -> RedfishEmulator:
    """A fresh Redfish BMC emulator whose systems (:data:`REDFISH_SYSTEMS`) are all powered on."""
    emu = start_redfish(REDFISH_SYSTEMS)
    yield emu
    emu.stop()


@pytest.fixture(scope="session")
def placement_rig() -> OpenStackServices:
    """Keystone + Placement on loopback (the project's scripts; password auth)."""
    services = start_openstack()
    yield services
    services.stop()


class KubeEmulator:
    """kmock's KubernetesEmulator on a background event loop; ``url`` for the official client."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.evictions: list[tuple[str, str, int]] = []
        self._thread = threading.Thread(target=self._run, name="kmock", daemon=True)
        self._thread.start()
        if not self._ready.wait(20) or self._error:
            raise RuntimeError(f"kmock did not start: {self._error}")

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._serve())
        except BaseException as exc:  # surfaced by __init__
            self._error = exc
            self._ready.set()

    async def _serve(self) -> None:
        import kmock

        self._stop = asyncio.Event()
        async with kmock.KubernetesEmulator() as k, kmock.Server(k) as srv:
            self.k = k
            self.url = str(srv.url).rstrip("/")
            k["post", re.compile(r"^/api/v1/namespaces/[^/]+/pods/[^/]+/eviction$")] << self._evict
            self._ready.set()
            await self._stop.wait()

    async def _evict(self, request):
        import kmock

        ns, name = request.namespace, request.name
        try:
            pod = self.k.objects["v1/pods", ns, name]
        except KeyError:
            pod = None
        if pod is None or pod.deleted:
            raise kmock.KubernetesError(status=404, reason="NotFound", message=f"pods {name!r} not found")
        labels = (pod.raw.get("metadata") or {}).get("labels") or {}
        for pkey, pdb in list(self.k.objects.items()):
            res, pns, _ = pkey
            if getattr(res, "plural", None) != "poddisruptionbudgets" or pns != ns or pdb.deleted:
                continue
            want = ((pdb.raw.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
            if all(labels.get(k2) == v for k2, v in want.items()):
                allowed = int((pdb.raw.get("status") or {}).get("disruptionsAllowed", 0))
                if allowed < 1:
                    self.evictions.append((ns, name, 429))
                    raise kmock.KubernetesError(status=429, reason="TooManyRequests",
                                                message="Cannot evict pod as it would violate the pod's disruption budget.")
                pdb.patch({"status": {"disruptionsAllowed": allowed - 1}})
        pod.delete()
        self.evictions.append((ns, name, 201))
        return {"apiVersion": "v1", "kind": "Status", "status": "Success", "code": 201}

    def put(self, plural: str, namespace: str | None, name: str, obj: dict) -> None:
        """Create or replace an object (run on the server's loop)."""
        res = {"nodes": "v1/nodes", "pods": "v1/pods", "poddisruptionbudgets": "policy/v1/poddisruptionbudgets"}[plural]

        def assign():
            self.k.objects[res, namespace, name] = obj

        self._call(assign)

    def get(self, plural: str, namespace: str | None, name: str) -> dict | None:
        """The stored object, or None when deleted."""
        res = {"nodes": "v1/nodes", "pods": "v1/pods", "poddisruptionbudgets": "policy/v1/poddisruptionbudgets"}[plural]

        def read():
            try:
                obj = self.k.objects[res, namespace, name]
            except KeyError:
                return None
            return None if obj.deleted else obj.raw

        return self._call(read)

    def patch(self, plural: str, namespace: str | None, name: str, changes: dict) -> None:
        """Patch a stored object, as a controller (the GPU operator, the kubelet) would."""
        res = {"nodes": "v1/nodes", "pods": "v1/pods"}[plural]
        self._call(lambda: self.k.objects[res, namespace, name].patch(changes))

    def _call(self, fn):
        async def run():
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(10)

    def api_client(self):
        """An official-client ApiClient pointed at the emulator."""
        from kubernetes import client

        cfg = client.Configuration()
        cfg.host = self.url
        return client.ApiClient(cfg)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


@pytest.fixture
def kube():
    """A fresh emulated Kubernetes API server."""
    emu = KubeEmulator()
    yield emu
    emu.close()
