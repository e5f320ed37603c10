"""The slurmrestd client over a unix socket: statuses classified, hostlists expanded."""

from __future__ import annotations

import http.server
import json
import socketserver
import threading

import pytest

from gpupool.sources.base import PermanentError, TransientError
from gpupool.sources.slurmrestd import SlurmRestd, expand_hostlist

#: path -> (status, body text) the fake server answers
ANSWERS = {
    "/slurm/v0.0.38/nodes": (200, json.dumps({"errors": [], "nodes": [{"name": "n1"}]})),
    "/slurm/v0.0.38/node/gone": (500, json.dumps({"errors": [{"error": "Invalid node name specified", "errno": 2018}],
                                                  "nodes": []})),
    "/slurm/v0.0.38/job/abc": (400, json.dumps({"errors": [{"description": "Unable to find JobId=abc"}]})),
    "/slurm/v0.0.38/jobs": (401, "Authentication failure"),
    "/slurm/v0.0.38/ping": (200, "not json"),
}


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        # Recorded before answering: the client may return (and the test read `seen`) as soon
        # as the body is written.
        self.server.seen.append(dict(self.headers))
        status, text = ANSWERS.get(self.path, (404, "Unable find requested URL."))
        body = text.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def address_string(self):
        return "unix"

    def log_message(self, *args):
        pass


class _UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


@pytest.fixture
def restd_socket(tmp_path):
    path = tmp_path / "restd.sock"
    server = _UnixHTTPServer(str(path), _Handler)
    server.seen = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield path, server
    server.shutdown()
    server.server_close()


def test_reads_json_over_the_socket_without_a_token(restd_socket):
    path, server = restd_socket
    client = SlurmRestd(f"unix:{path}")
    assert client.get("nodes")["nodes"] == [{"name": "n1"}]
    assert "X-SLURM-USER-TOKEN" not in server.seen[-1]
    assert client.endpoint("nodes") == f"unix:{path}/slurm/v0.0.38/nodes"


def test_statuses_are_classified(restd_socket):
    path, _ = restd_socket
    client = SlurmRestd(f"unix:{path}", timeout=5)
    with pytest.raises(TransientError, match="HTTP 500: Invalid node name specified"):
        client.get("node/gone")
    with pytest.raises(PermanentError, match="HTTP 400: Unable to find JobId=abc"):
        client.get("job/abc")
    with pytest.raises(PermanentError, match="authentication refused"):
        client.get("jobs")
    with pytest.raises(PermanentError, match="not JSON"):
        client.get("ping")
    assert client.get("no-such-path", missing_ok=True) is None


def test_headers_carry_user_and_token_only_when_given(restd_socket):
    path, server = restd_socket
    SlurmRestd(f"unix:{path}", user="alice", token="secret-jwt").get("nodes")
    assert server.seen[-1]["X-SLURM-USER-NAME"] == "alice" and server.seen[-1]["X-SLURM-USER-TOKEN"] == "secret-jwt"
    assert "secret-jwt" not in SlurmRestd("https://u:pw@restd:6820", token="secret-jwt").endpoint("nodes")


def test_missing_socket_is_transient_and_relative_paths_are_refused(tmp_path):
    with pytest.raises(TransientError, match="no slurmrestd listening"):
        SlurmRestd(f"unix:{tmp_path}/none.sock").get("nodes")
    with pytest.raises(ValueError, match="absolute path"):
        SlurmRestd("unix:relative.sock")


@pytest.mark.parametrize("text, names", [
    ("vm", ["vm"]),
    ("", []),
    ("gpu-n[001-003,007],login1", ["gpu-n001", "gpu-n002", "gpu-n003", "gpu-n007", "login1"]),
    ("a[1-2]b,c[09-10]", ["a1b", "a2b", "c09", "c10"]),
])
def test_hostlists(text, names):
    assert expand_hostlist(text) == names
