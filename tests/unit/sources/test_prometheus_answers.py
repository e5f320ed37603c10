"""Hostile Prometheus answers, read by the Prometheus source (over HTTP, as a server sends them)
and by the what-if's ``prometheus:`` history: a time of 1e999 or 10**400, a point given as an
object, JSON nested deeper than the parser recurses, and values of 1e308 are one clear error,
never a traceback, a silently wrong time, or an overflow that reaches the forecast. A refused
connection says so; it is not "no answer within 30 s"."""

from __future__ import annotations

import socket
import threading
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpupool.cli import main
from gpupool.sources.base import RetryPolicy, SourceError
from gpupool.sources.prometheus import MetricQuery, PrometheusReader

T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)
QUERIES = {"gpu_allocated": MetricQuery("sum(x)", "platform", "")}


def _matrix(points: str) -> str:
    """A query_range answer of one series whose ``values`` is the JSON text ``points``."""
    return '{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},"values":' + points + "}]}}"


GOOD = ", ".join(f'[{T0.timestamp() + 300 * i:.0f}, "{i % 5}"]' for i in range(12))
#: (name, the answer's JSON text, what the source's error says, what the what-if's says)
HOSTILE = [
    ("time-1e999", _matrix('[[1e999, "1"], ' + GOOD + "]"), "1970..2200", "time inf is not"),
    ("time-10**400", _matrix("[[1" + "0" * 400 + ', "1"], ' + GOOD + "]"), "non-numeric timestamp", "is not [time"),
    ("point-object", _matrix('[{"t": 1793505600, "v": "1"}, ' + GOOD + "]"), "a point is not [ts, value]",
     "is not [time"),
    ("deep", '{"status":"success","data":{"resultType":"matrix","result":' + "[" * 100_000 + "]" * 100_000 + "}}",
     "nested too deeply", "nested too deeply"),
    ("value-1e308", _matrix("[" + GOOD.replace('"1"', '"1e308"') + "]"), "beyond", "'1e308' is not a GPU count"),
]
IDS = [h[0] for h in HOSTILE]


# --- the source, over HTTP -----------------------------------------------------------------------


class _Answer(BaseHTTPRequestHandler):
    body = b""

    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


@pytest.fixture
def answering():
    """A server answering every request with the body it is given: its URL."""
    servers = []

    def serve(body: str) -> str:
        handler = type("Answer", (_Answer,), {"body": body.encode()})
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield serve
    for server in servers:
        server.shutdown()
        server.server_close()


def _reader(url: str) -> PrometheusReader:
    return PrometheusReader(url, platform="hpc", retry=RetryPolicy(attempts=1), timeout=5)


@pytest.mark.parametrize("name, body, needle, _", HOSTILE, ids=IDS)
def test_the_source_refuses_a_hostile_range_answer(answering, name, body, needle, _):
    with pytest.raises(SourceError, match="malformed payload") as err:
        _reader(answering(body)).read(QUERIES, T0, T0 + timedelta(hours=1), step="5min")
    assert needle in str(err.value) and not err.value.retryable


def test_the_source_reads_the_good_answer(answering):
    frame = _reader(answering(_matrix("[" + GOOD + "]"))).read(QUERIES, T0, T0 + timedelta(hours=1), step="5min")
    assert list(frame["value"]) == [float(i % 5) for i in range(12)]
    assert frame["ts"].iloc[0] == T0


@pytest.mark.parametrize("value", ['"1e308"', "1" + "0" * 400])
def test_the_instant_read_refuses_a_value_beyond_range(answering, value):
    body = '{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1793505600,' + value + "]}]}}"
    with pytest.raises(SourceError, match="malformed payload"):
        _reader(answering(body)).instant_sum("sum(x)", T0, "gpu_pending")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_refused_connection_says_refused_not_no_answer():
    with pytest.raises(SourceError) as err:
        _reader(f"http://127.0.0.1:{_free_port()}").read(QUERIES, T0, T0 + timedelta(hours=1), step="5min")
    assert "connection refused or unreachable" in str(err.value) and "no answer" not in str(err.value)
    assert err.value.retryable


def test_a_refused_connection_names_the_connection_id_never_its_uri(tmp_path, monkeypatch, capsys):
    """Through the CLI: the platform's connection by its id; no host, port or password."""
    port = _free_port()
    cfg = tmp_path / "platforms.yaml"
    cfg.write_text("platforms:\n  - {name: hpc, kind: slurm, conn_id: hpc_prom}\n")
    monkeypatch.setenv("AIRFLOW_CONN_HPC_PROM", f"http://reader:Sup3rS3cretFAKE@127.0.0.1:{port}")
    monkeypatch.setenv("GPUPOOL_STAGING_URL", f"sqlite:///{tmp_path / 'staging.db'}")
    rc = main(["extract", "--config", str(cfg), "--platform", "hpc", "--start", "2026-11-01T00:00Z",
               "--end", "2026-11-01T01:00Z"])
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert rc == 2 and line.startswith("gpupool extract: error: hpc: connection 'hpc_prom'"), line
    assert "refused" in line and "no answer" not in line
    for secret in ("Sup3rS3cretFAKE", "reader", "127.0.0.1", str(port), "http"):
        assert secret not in line, secret


# --- the what-if's prometheus: history -----------------------------------------------------------


@pytest.mark.parametrize("name, body, _, needle", HOSTILE, ids=IDS)
def test_the_whatif_refuses_a_hostile_answer_file(tmp_path, capsys, name, body, _, needle):
    (tmp_path / "hostile.json").write_text(body)
    (tmp_path / "good.json").write_text(_matrix("[" + GOOD + "]"))
    rc = main(["whatif", "--slurm", f"prometheus:{tmp_path / 'hostile.json'}", "--slurm-nodes", "4",
               "--kubernetes", f"prometheus:{tmp_path / 'good.json'}", "--kubernetes-nodes", "4",
               "--policy", "static", "--no-progress"])
    out, err = capsys.readouterr()
    assert rc == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "hostile.json" in lines[0] and needle in lines[0], lines[0]
    assert len(lines[0]) < 400


def test_a_point_of_1e308_gpus_never_reaches_the_forecast(tmp_path, capsys):
    """Two series of 1e308 summed to inf, and the forecast failed on it with a traceback."""
    points = "[" + GOOD.replace('"1"', '"1e308"') + "]"
    two = ('{"status":"success","data":{"resultType":"matrix","result":[{"metric":{"a":"1"},"values":' + points
           + '},{"metric":{"a":"2"},"values":' + points + "}]}}")
    (tmp_path / "huge.json").write_text(two)
    rc = main(["whatif", "--slurm", f"prometheus:{tmp_path / 'huge.json'}", "--slurm-nodes", "4", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "is not a GPU count" in err and len(err.strip().splitlines()) == 1, err


def test_a_number_longer_than_python_reads(tmp_path):
    from gpupool.sim.history import HistoryError, read_prometheus_answer

    path = tmp_path / "long.json"
    path.write_text(_matrix("[[1" + "0" * 5000 + ', "1"]]'))
    with pytest.raises(HistoryError, match="too long"):
        read_prometheus_answer(path)

