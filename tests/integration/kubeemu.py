"""kmock's Kubernetes emulator (an independent, in-memory API server) in a background thread.

The official client is synchronous; kmock is asyncio. The emulator runs its own event
loop in a thread and serves on a loopback port. kmock answers lists whole; real API
servers page them, so list calls here honour `limit`/`continue` the way the API server
documents it (opaque token, absent on the last page), over the emulator's stored objects.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import kmock


class KubeEmulator:
    """Start with `with KubeEmulator() as emu:`; `emu.url` is the API server URL."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.list_calls: list[dict[str, str]] = []
        self.extra: dict[str, Any] = {}
        self.url = ""
        self._error: BaseException | None = None

    def __enter__(self) -> "KubeEmulator":
        self._thread.start()
        if not self._ready.wait(15):
            raise RuntimeError("kmock emulator did not start within 15 s")
        if self._error:
            raise RuntimeError(f"kmock emulator failed: {self._error!r}")
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._main())
        except BaseException as exc:  # reported by __enter__
            self._error = exc
            self._ready.set()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        async with kmock.KubernetesEmulator() as emu, kmock.Server(emu) as server:
            self.emu = emu
            for path, payload in self.extra.items():  # before the list handler, which would answer them
                emu[f"get {path}"] << payload
            emu[kmock.action.LIST] << self._paginated
            self.url = str(server.url).rstrip("/")
            self._ready.set()
            await self._stop.wait()

    def _paginated(self, request: Any) -> dict[str, Any]:
        params = {k: v for k, v in request.params.items()}
        self.list_calls.append(params)
        items = sorted(
            (obj.raw for (res, ns, name), obj in self.emu.objects.items()
             if res == request.resource and not obj.deleted
             and (request.namespace is None or ns == request.namespace)),
            key=lambda o: (o["metadata"].get("namespace") or "", o["metadata"]["name"]),
        )
        start = int(params.get("continue") or 0)
        limit = int(params.get("limit") or 0) or len(items)
        page = items[start:start + limit]
        meta: dict[str, Any] = {"resourceVersion": "1"}
        if start + limit < len(items):
            meta["continue"] = str(start + limit)
        return {"kind": "List", "apiVersion": "v1", "metadata": meta, "items": page}
