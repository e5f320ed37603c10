"""The /metrics server behind `gpupool metrics serve` and `gpupool nvml serve`: a client that
connects and says nothing holds up no scrape, a burst of concurrent scrapes is answered whole,
and a connection left idle is dropped without a word on stderr."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Gauge

from gpupool.staging import db

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def served(tmp_path):
    """`gpupool metrics serve` on an ephemeral port over a migrated SQLite staging: its /metrics URL."""
    url = f"sqlite:///{tmp_path / 'staging.db'}"
    db.upgrade(db.make_engine(url))
    proc = subprocess.Popen([sys.executable, "-m", "gpupool.cli", "metrics", "serve", "--port", "0", "--staging", url,
                             "--at", "2026-11-01T04:00:00Z"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT / "include")})
    try:
        line = proc.stdout.readline()
        assert line.startswith("gpupool metrics: serving http://127.0.0.1:"), line + proc.stderr.read()
        yield line.split()[-1]
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert "Traceback" not in err, err  # no scrape failed inside the server either


def _idle(endpoint: str) -> socket.socket:
    host, port = endpoint.split("//")[1].split("/")[0].split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def _scrape(endpoint: str, timeout: float = 10.0) -> int:
    with urllib.request.urlopen(endpoint, timeout=timeout) as r:
        r.read()
        return r.status


def test_an_idle_connection_holds_up_no_scrape(served):
    _scrape(served, timeout=60)  # the first scrape loads the stages' modules: not what is measured
    idle = _idle(served)  # connected, sends nothing: the single-threaded server waited on it
    try:
        t0 = time.monotonic()
        assert _scrape(served, timeout=5) == 200
        assert time.monotonic() - t0 < 2.0
    finally:
        idle.close()


def test_a_burst_of_concurrent_scrapes_is_answered_whole(served):
    _scrape(served, timeout=60)
    idles = [_idle(served) for _ in range(3)]  # and some clients that say nothing meanwhile
    try:
        with ThreadPoolExecutor(max_workers=25) as pool:
            statuses = list(pool.map(lambda _: _scrape(served, timeout=30), range(100)))
    finally:
        for s in idles:
            s.close()
    assert statuses == [200] * 100


def _in_thread(**kwargs):
    from gpupool.exposition import make_registry_server

    reg = CollectorRegistry(auto_describe=False)
    Gauge("probe_value", "a probe", registry=reg).set(7)
    server = make_registry_server(reg, "127.0.0.1", 0, "probe metrics", **kwargs)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/metrics"


def test_an_idle_connection_is_dropped_quietly(capfd):
    server, endpoint = _in_thread(connection_timeout=0.5)
    try:
        idle = _idle(endpoint)
        idle.settimeout(10)
        t0 = time.monotonic()
        assert idle.recv(1) == b""  # the server closed it
        assert time.monotonic() - t0 < 5
        idle.close()
        with urllib.request.urlopen(endpoint, timeout=5) as r:
            assert b"probe_value 7.0" in r.read()
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(endpoint.replace("/metrics", "/other"), timeout=5)
        assert err.value.code == 404 and b"probe metrics are served at /metrics" in err.value.read()
    finally:
        server.shutdown()
        server.server_close()
    out, err = capfd.readouterr()
    assert err == "" and out == ""


def test_the_listen_backlog_and_timeout_are_set():
    from gpupool.exposition import CONNECTION_TIMEOUT_S, LISTEN_BACKLOG

    server, _ = _in_thread()
    try:
        assert server.request_queue_size == LISTEN_BACKLOG >= 64
        assert server.RequestHandlerClass.timeout == CONNECTION_TIMEOUT_S
        assert server.daemon_threads
    finally:
        server.shutdown()
        server.server_close()
