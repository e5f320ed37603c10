"""Serving a Prometheus registry at ``/metrics``: the one small HTTP server behind
``gpupool metrics serve`` and ``gpupool nvml serve``.

A leaf module (it imports nothing from gpupool), so the node agent need not load the stages.
Each connection is served on a thread of its own, so a client that connects and says nothing
(or reads slowly) holds up no scrape; such a connection is dropped after
:data:`CONNECTION_TIMEOUT_S` seconds of silence.
"""

from __future__ import annotations

from socketserver import ThreadingMixIn
from typing import Any, Callable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

#: seconds a connection may stay silent (sending its request, or reading the answer) before it
#: is dropped: a scrape sends its request at once, so only a stuck or hostile client waits this long
CONNECTION_TIMEOUT_S = 10.0
#: connections the kernel holds while they wait to be accepted (the socketserver default is 5:
#: a burst of scrapes beyond it was refused)
LISTEN_BACKLOG = 128


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    """wsgiref's server with a thread per connection (daemon threads: an interrupt ends them)."""

    daemon_threads = True
    request_queue_size = LISTEN_BACKLOG

    def handle_error(self, request: Any, client_address: Any) -> None:  # noqa: D102 - socketserver's hook
        pass  # a client that went away mid-answer is no news; the default prints a traceback


def _handler(timeout: float) -> type[WSGIRequestHandler]:
    class Handler(WSGIRequestHandler):
        """Requests are not logged; a silent or vanished client ends its connection quietly."""

        def handle(self) -> None:
            try:
                super().handle()
            except (TimeoutError, ConnectionError):
                self.close_connection = True

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
            pass

    Handler.timeout = timeout  # socketserver sets it on each connection
    return Handler


def make_registry_server(registry: Any, host: str, port: int, what: str,
                         connection_timeout: float = CONNECTION_TIMEOUT_S) -> WSGIServer:
    """A bound (not yet serving) server of ``registry`` at ``/metrics`` on ``host:port`` (port 0:
    an ephemeral one, see ``server_address``); other paths answer 404 saying where ``what`` is
    served. Call ``serve_forever()`` on it; ``shutdown()`` and ``server_close()`` end it."""
    from prometheus_client import make_wsgi_app

    metrics_app = make_wsgi_app(registry)
    where = f"{what} are served at /metrics\n".encode()

    def app(environ, start_response):
        if environ.get("PATH_INFO") in ("/metrics", "/metrics/"):
            return metrics_app(environ, start_response)
        start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
        return [where]

    server = _ThreadingServer((host, port), _handler(connection_timeout))
    server.set_app(app)
    return server


def serve_registry(registry: Any, host: str, port: int, what: str,
                   ready: Callable[[str, int], None] | None = None) -> None:
    """Serve ``registry`` at ``/metrics`` on ``host:port`` until interrupted (other paths answer
    404 saying where ``what`` is served); ``ready(host, port)`` once the socket is bound (port 0:
    an ephemeral one). Requests are not logged; connections are served side by side."""
    with make_registry_server(registry, host, port, what) as server:
        if ready is not None:
            ready(server.server_address[0], server.server_address[1])
        server.serve_forever()
