"""A staging database that accepts and never answers, or one that is gone, is one clear error
naming where staging was configured (never the URL), within the configured timeouts."""

from __future__ import annotations

import socket
import threading
import time

import pytest
import sqlalchemy as sa

from gpupool.staging import db

PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


@pytest.fixture
def silent_server():
    """A TCP server that accepts connections and never sends a byte."""
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            held.append(conn)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield srv.getsockname()[1]
    stop.set()
    t.join(2)
    for c in held:
        c.close()
    srv.close()


def test_a_database_that_never_answers_times_out_as_staging_unavailable(silent_server, monkeypatch):
    url = f"postgresql+psycopg://secretuser:s3cretpw@127.0.0.1:{silent_server}/stagingdb"
    monkeypatch.setenv("GPUPOOL_STAGING_URL", url)
    monkeypatch.setenv(db.CONNECT_TIMEOUT_ENV, "1")
    engine = db.make_engine()
    t0 = time.monotonic()
    with pytest.raises(db.StagingUnavailable) as err:
        db.require_migrated(engine)
    assert time.monotonic() - t0 < 8
    msg = str(err.value)
    assert "GPUPOOL_STAGING_URL" in msg and "no answer within 1 s" in msg
    for part in ("secretuser", "s3cretpw", "127.0.0.1", str(silent_server), "stagingdb"):
        assert part not in msg


def test_the_cli_says_one_line_and_exits_2_on_a_silent_database(silent_server, monkeypatch, capsys):
    from gpupool.cli import main

    monkeypatch.setenv("AIRFLOW_CONN_GPUPOOL_STAGING", f"postgres://u:pw9secret@127.0.0.1:{silent_server}/x")
    monkeypatch.delenv("GPUPOOL_STAGING_URL", raising=False)
    monkeypatch.setenv(db.CONNECT_TIMEOUT_ENV, "1")
    for argv in (["summary", "--start", "2026-11-01T00:00Z", "--end", "2026-11-01T01:00Z"], ["handovers"]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "connection gpupool_staging" in err and "unreachable" in err, err
        assert str(silent_server) not in err and "pw9secret" not in err


def test_a_refused_connection_names_no_part_of_the_url():
    engine = db.make_engine("postgresql+psycopg://nobody:hunter2@127.0.0.1:1/none")
    with pytest.raises(db.StagingUnavailable, match="connection refused") as err:
        db.upgrade(engine)
    assert "hunter2" not in str(err.value) and "nobody" not in str(err.value) and ":1" not in str(err.value)


def test_a_statement_longer_than_the_statement_timeout_is_cancelled(monkeypatch):
    monkeypatch.setenv(db.STATEMENT_TIMEOUT_ENV, "1")
    engine = db.make_engine(PG_URL)
    with pytest.raises(db.StagingUnavailable, match=f"within 1 s .*{db.STATEMENT_TIMEOUT_ENV}"):
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT pg_sleep(5)"))
    with engine.connect() as conn:  # the engine is still usable afterwards
        assert conn.execute(sa.text("SHOW statement_timeout")).scalar() == "1s"
    engine.dispose()


def test_default_timeouts_and_bad_values(monkeypatch):
    monkeypatch.delenv(db.CONNECT_TIMEOUT_ENV, raising=False)
    monkeypatch.delenv(db.STATEMENT_TIMEOUT_ENV, raising=False)
    assert db.timeouts() == (10, 300)
    engine = db.make_engine(PG_URL)
    with engine.connect() as conn:
        assert conn.execute(sa.text("SHOW statement_timeout")).scalar() == "5min"
    engine.dispose()
    monkeypatch.setenv(db.CONNECT_TIMEOUT_ENV, "soon")
    with pytest.raises(db.StagingError, match=f"{db.CONNECT_TIMEOUT_ENV} must be a whole number"):
        db.make_engine(PG_URL)
