"""A reverse proxy in front of a real service that misbehaves on request.

The real services answer correctly; the failures a source must survive (5xx, 401,
timeouts, garbage bodies, truncated JSON) are injected here, one per request from a
queue, while every other request reaches the real upstream unchanged.
"""

from __future__ import annotations

import http.server
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from dataclasses import dataclass


@dataclass
class Fault:
    """What the proxy does instead of (or before) forwarding one request.

    status: answer with this HTTP status and `body` instead of forwarding (0 = forward)
    delay:  seconds to sleep before answering
    body:   replaces the upstream's body when `status` is 0 and `replace_body` is set
    path:   applies only to a request whose path starts with this (others pass through)
    """

    status: int = 0
    body: bytes = b""
    delay: float = 0.0
    replace_body: bool = False
    path: str = ""


class FaultProxy:
    """Forward HTTP GET/POST to `upstream`, applying queued `Fault`s first-in first-out."""

    def __init__(self, upstream: str):
        self.upstream = upstream.rstrip("/")
        self.faults: deque[Fault] = deque()
        #: (method, path, headers with lower-case names) of every request received
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def _handle(self):
                length = int(self.headers.get("Content-Length") or 0)
                data = self.rfile.read(length) if length else None
                proxy.requests.append((self.command, self.path, {k.lower(): v for k, v in self.headers.items()}))
                fault = proxy.take_fault(self.path)
                if fault.delay:
                    time.sleep(fault.delay)
                if fault.status:
                    self._send(fault.status, fault.body, "application/json")
                    return
                req = urllib.request.Request(proxy.upstream + self.path, data=data, method=self.command)
                for k, v in self.headers.items():
                    if k.lower() not in ("host", "content-length", "connection", "accept-encoding"):
                        req.add_header(k, v)
                try:
                    with urllib.request.urlopen(req, timeout=30) as resp:
                        status, body, ctype = resp.status, resp.read(), resp.headers.get("Content-Type", "")
                except urllib.error.HTTPError as err:
                    status, body, ctype = err.code, err.read(), err.headers.get("Content-Type", "")
                if fault.replace_body:
                    body = fault.body
                try:
                    self._send(status, body, ctype)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (its timeout): that is the point of a delay fault

            def _send(self, status, body, ctype):
                self.send_response(status)
                self.send_header("Content-Type", ctype or "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _handle

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def take_fault(self, path: str) -> Fault:
        """Remove and return the first queued fault that applies to `path` (else: forward)."""
        for fault in list(self.faults):
            if path.startswith(fault.path):
                self.faults.remove(fault)
                return fault
        return Fault()

    @property
    def url(self) -> str:
        """Base URL clients use instead of the upstream's."""
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> "FaultProxy":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
