"""Serving a Prometheus registry at ``/metrics``: the one small HTTP server behind
``gpupool metrics serve`` and ``gpupool nvml serve``.

A leaf module (it imports nothing from gpupool), so the node agent need not load the stages.
"""

from __future__ import annotations

from typing import Any, Callable


def serve_registry(registry: Any, host: str, port: int, what: str,
                   ready: Callable[[str, int], None] | None = None) -> None:
    """Serve ``registry`` at ``/metrics`` on ``host:port`` until interrupted (other paths answer
    404 saying where ``what`` is served); ``ready(host, port)`` once the socket is bound (port 0:
    an ephemeral one). Requests are not logged."""
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    from prometheus_client import make_wsgi_app

    metrics_app = make_wsgi_app(registry)
    where = f"{what} are served at /metrics\n".encode()

    def app(environ, start_response):
        if environ.get("PATH_INFO") in ("/metrics", "/metrics/"):
            return metrics_app(environ, start_response)
        start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
        return [where]

    class Quiet(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
            pass

    with make_server(host, port, app, handler_class=Quiet) as server:
        if ready is not None:
            ready(server.server_address[0], server.server_address[1])
        server.serve_forever()
