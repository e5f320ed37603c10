"""Connections: Airflow's URI rules, one clear line naming only the connection id for a bad one,
no part of a URI in any error, log or staging row, and one lookup for sources and actuators."""

from __future__ import annotations

import logging

import pytest
import sqlalchemy as sa

from gpupool.config import ConfigError, parse_config
from gpupool.platforms import build_actuator, build_source, platform_connection
from gpupool.sources.factory import ConnectionError_, parse_connection

#: passwords a platform engineer may well choose; the unencoded ones are malformed URIs
HOSTILE = ["Sup3r/S3cretFAKE", "Sup3r#S3cretFAKE", "Sup3r?S3cretFAKE", "Sup3r/S3c#ret?FAKE", "Sup3r:S3cret/FAKE"]
PIECES = ("Sup3r", "S3c", "FAKE", "admin", "127.0.0.1", "9504")


def _uri(password: str) -> str:
    return f"http://admin:{password}@127.0.0.1:9504/"


def _clean(text: str) -> bool:
    return not any(p in text for p in PIECES)


@pytest.mark.parametrize("password", HOSTILE)
def test_unencoded_special_characters_are_a_malformed_uri_that_is_never_echoed(password):
    with pytest.raises(ConnectionError_) as err:
        parse_connection("prom", _uri(password))
    msg = str(err.value)
    assert msg.startswith("connection 'prom': malformed URI") and "%XX" in msg
    assert _clean(msg) and "\n" not in msg


def test_percent_encoded_userinfo_is_decoded():
    c = parse_connection("prom", "http://ad%40min:Sup3r%2FS3c%23ret%3FFAKE%25@127.0.0.1:9504/api?verify=false")
    assert (c.login, c.password, c.host, c.port, c.schema) == ("ad@min", "Sup3r/S3c#ret?FAKE%", "127.0.0.1", 9504, "api")
    assert c.extra == {"verify": "false"}
    # an unencoded '@' in the password is still split at the last '@', as Airflow does
    assert parse_connection("prom", "http://admin:p@ss@host:1/").password == "p@ss"


def test_airflows_host_with_protocol_form():
    c = parse_connection("prom", "prometheus://https://admin:Sup3r%2FS3cretFAKE@prom.example:9443/api")
    assert (c.conn_type, c.host, c.port, c.password) == ("prometheus", "https://prom.example", 9443, "Sup3r/S3cretFAKE")
    assert c.url() == "https://prom.example:9443/api"
    for bad in ("prometheus://https://admin:Sup3r/S3cretFAKE@prom.example:9443/",
                "prometheus://admin:Sup3r@https://prom.example", "a://b://c://d"):
        with pytest.raises(ConnectionError_, match="malformed URI") as err:
            parse_connection("prom", bad)
        assert _clean(str(err.value))


@pytest.mark.parametrize("value, why", [
    ("http://admin:x@127.0.0.1:port9504/", "port is not a number"),
    ("http://127.0.0.1:99999/", "port is not a number"),
    ("127.0.0.1:9504", "expected a URI"),
    ('{"host": "127.0.0.1", "password": "Sup3r/S3cretFAKE", "port": "x9504"}', "port is not a number"),
    ('{"password": "Sup3r/S3cretFAKE", "extra": "{not json Sup3r"}', "extra is not valid JSON"),
    ('{"password": "Sup3r/S3cretFAKE" ', "not valid JSON"),
    ("http://admin:Sup3r@[127.0.0.1:9504/", "malformed URI"),
])
def test_other_bad_connections_name_only_the_id(value, why):
    with pytest.raises(ConnectionError_, match=why) as err:
        parse_connection("prom", value)
    assert _clean(str(err.value).replace("'prom'", ""))


def _slurm_config(tmp_path):
    return parse_config({"platforms": [{"name": "hpc", "kind": "slurm", "conn_id": "prom", "actuation": True}]})


@pytest.mark.parametrize("password", HOSTILE)
def test_gpupool_extract_with_a_hostile_password_is_one_line_and_stores_no_secret(
        password, tmp_path, monkeypatch, capsys, caplog):
    from gpupool.cli import main
    from gpupool.staging.schema import extract_run

    caplog.set_level(logging.DEBUG)
    cfg = tmp_path / "platforms.yaml"
    cfg.write_text("platforms:\n  - {name: hpc, kind: slurm, conn_id: prom}\n")
    url = f"sqlite:///{tmp_path / 'staging.db'}"
    monkeypatch.setenv("AIRFLOW_CONN_PROM", _uri(password))
    assert main(["db", "upgrade", "--config", str(cfg), "--staging-url", url]) == 0
    capsys.readouterr()
    code = main(["extract", "--config", str(cfg), "--staging-url", url, "--platform", "hpc",
                 "--start", "2026-11-01T00:00Z", "--end", "2026-11-01T01:00Z"])
    out = capsys.readouterr()
    assert code == 2 and out.out == ""
    assert out.err.count("\n") == 1 and "connection 'prom': malformed URI" in out.err and "'hpc'" in out.err
    assert _clean(out.err) and _clean(caplog.text)
    with sa.create_engine(url).connect() as conn:
        errors = [r.error for r in conn.execute(sa.select(extract_run.c.error, extract_run.c.status))]
    assert errors and all(e and "malformed URI" in e and _clean(e) for e in errors)


class _AirflowConnection:
    """What Airflow's lookup hands back (read duck-typed)."""

    def __init__(self, **kw):
        self.conn_type, self.host, self.port = kw.get("conn_type", "http"), kw.get("host", ""), kw.get("port")
        self.login, self.password, self.schema = kw.get("login"), kw.get("password"), kw.get("schema", "")
        self.extra_dejson = kw.get("extra", {})


class AirflowNotFoundException(Exception):
    pass


def test_airflow_lookup_errors_never_quote_the_uri():
    pcfg = parse_config({"platforms": [{"name": "hpc", "kind": "slurm", "conn_id": "prom"}]}).platforms[0]

    def broken(conn_id):  # what Airflow's own URI parser says about the URI
        raise ValueError("Port could not be cast to integer value as 'Sup3r'")

    def missing(conn_id):
        raise AirflowNotFoundException(f"The conn_id `{conn_id}` isn't defined")

    with pytest.raises(ConnectionError_, match="platform 'hpc': connection 'prom': Airflow could not read it") as err:
        platform_connection(pcfg, broken)
    assert _clean(str(err.value))
    with pytest.raises(ConnectionError_, match="platform 'hpc': connection 'prom' not found in Airflow"):
        platform_connection(pcfg, missing)


def test_a_missing_conn_id_or_connection_names_platform_and_id():
    with pytest.raises(ConfigError, match=r"key 'platforms\[hpc\]': conn_id: a slurm platform needs one"):
        parse_config({"platforms": [{"name": "hpc", "kind": "slurm", "actuation": True}]})
    cfg = parse_config({"platforms": [{"name": "hpc", "kind": "slurm", "conn_id": "prom", "actuation": True},
                                      {"name": "ai", "kind": "kubernetes", "conn_id": "k8s_ai", "actuation": True}]})
    bare = cfg.platforms[0].model_copy(update={"conn_id": None})  # built without the config's checks
    with pytest.raises(ConnectionError_, match=r"platform 'hpc' \(slurm\) has no conn_id"):
        build_actuator(bare, cfg, env={})
    with pytest.raises(ConnectionError_, match=r"platform 'ai': connection 'k8s_ai' not found.*AIRFLOW_CONN_K8S_AI"):
        build_source(cfg.platforms[1], cfg, env={})


def test_source_and_actuator_share_one_lookup(tmp_path):
    """A connection made in the Airflow UI works for actuation as it does for extraction."""
    cfg = parse_config({"platforms": [{"name": "hpc", "kind": "slurm", "conn_id": "prom", "actuation": True}]})
    conn = _AirflowConnection(host="127.0.0.1", port=9504, login="admin", password="Sup3r/S3cretFAKE",
                              extra={"slurm_conf": "/etc/slurm/slurm.conf"})
    asked = []

    def lookup(conn_id):
        asked.append(conn_id)
        return conn

    source = build_source(cfg.platforms[0], cfg, lookup)
    act = build_actuator(cfg.platforms[0], cfg, lookup)
    assert asked == ["prom", "prom"]
    assert act.slurm_conf == "/etc/slurm/slurm.conf" and act.platform == "hpc"
    assert source.platform == "hpc"
    # and the URI form of AIRFLOW_CONN_* works for actuation too (it used to take JSON only)
    env = {"AIRFLOW_CONN_PROM": "http://admin:Sup3r%2FS3cretFAKE@127.0.0.1:9504/?slurm_conf=%2Fetc%2Fslurm%2Fslurm.conf"}
    assert build_actuator(cfg.platforms[0], cfg, env=env).slurm_conf == "/etc/slurm/slurm.conf"
