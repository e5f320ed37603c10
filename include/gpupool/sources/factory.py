"""Connections (Airflow's URI and JSON forms, Airflow's own lookup) and connection -> a source.

A platform's `conn_id` names an Airflow connection. Inside a DAG task the connection is
looked up by Airflow (the task passes its lookup in); outside Airflow it is read from
`AIRFLOW_CONN_<CONN_ID>` in the environment, as an Airflow URI or JSON. The one lookup is
`gpupool.platforms.platform_connection`: sources and actuators share it. No error here quotes
any part of a connection. Connection fields the sources read:

    slurm       host/port/schema = Prometheus URL; password = bearer token (login+password =
                basic auth); extra: slurm_conf, restd_url (http(s)://... or unix:/path/to.sock),
                restd_user, restd_token, cluster, verify,
                live_tolerance_minutes (how far from now node state may be read; null: no check)
    openstack   host/port/schema = Keystone auth URL; login/password; extra: project_name,
                user_domain_name, project_domain_name, region_name, interface, verify,
                gnocchi_meters {metric: {metric, aggregation, ...}}
    kubernetes  host/port = API server; password = bearer token; extra: kubeconfig, context,
                in_cluster, ca_cert, verify, prometheus_url, prometheus_token
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping
from urllib.parse import parse_qsl, unquote, urlsplit

from gpupool.errors import UserError
from gpupool.config import GpupoolConfig, PlatformConfig


class ConnectionError_(UserError, ValueError):
    """A connection that is missing or cannot be parsed (never shows its secrets)."""


@dataclass
class Conn:
    """The fields of an Airflow connection that the sources use."""

    conn_type: str = ""
    host: str = ""
    port: int | None = None
    login: str | None = None
    password: str | None = None
    schema: str = ""
    extra: dict = field(default_factory=dict)

    def url(self, default_scheme: str = "http") -> str:
        host = self.host or ""
        if "://" not in host:
            scheme = self.extra.get("scheme") or ("https" if self.conn_type in ("https",) else default_scheme)
            host = f"{scheme}://{host}"
        if self.port:
            host = f"{host}:{self.port}"
        if self.schema:
            host = f"{host}/{self.schema.lstrip('/')}"
        return host

    @classmethod
    def from_airflow(cls, c: Any) -> "Conn":
        """From an Airflow Connection object (read duck-typed)."""
        extra = getattr(c, "extra_dejson", None)
        if extra is None:
            raw = getattr(c, "extra", None) or "{}"
            extra = json.loads(raw) if isinstance(raw, str) else dict(raw)
        if not isinstance(extra, dict):
            raise ConnectionError_("extra must be a JSON object")
        return cls(getattr(c, "conn_type", "") or "", getattr(c, "host", "") or "", getattr(c, "port", None),
                   getattr(c, "login", None), getattr(c, "password", None), getattr(c, "schema", "") or "", dict(extra))


def parse_connection(conn_id: str, value: str) -> Conn:
    """An `AIRFLOW_CONN_*` value: Airflow's URI form or its JSON form.

    URIs follow Airflow's rules: login and password are percent-encoded (``%2F`` for ``/``,
    ``%23`` for ``#``, ``%3F`` for ``?``, ``%40`` for ``@``). An unencoded ``/``, ``#`` or ``?``
    inside them cuts the URI in the wrong place, so such a URI is refused. No error here quotes
    any part of the value: it may hold a secret.
    """
    value = value.strip()
    if value.startswith("{"):
        try:
            d = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ConnectionError_(f"connection {conn_id!r}: not valid JSON ({exc.msg} at {exc.pos})") from None
        if not isinstance(d, dict):
            raise ConnectionError_(f"connection {conn_id!r}: JSON form must be an object")
        extra = d.get("extra") or {}
        if isinstance(extra, str):
            extra = _extra_json(conn_id, extra)
        if not isinstance(extra, dict):
            raise ConnectionError_(f"connection {conn_id!r}: 'extra' must be a JSON object")
        port = d.get("port")
        if port not in (None, ""):
            try:
                port = int(port)
            except (TypeError, ValueError):
                raise ConnectionError_(f"connection {conn_id!r}: port is not a number") from None
        else:
            port = None
        return Conn(str(d.get("conn_type", "") or ""), str(d.get("host", "") or ""), port, d.get("login"),
                    d.get("password"), str(d.get("schema", "") or ""), dict(extra))
    return _parse_uri(conn_id, value)


def _extra_json(conn_id: str, raw: str) -> dict:
    if not raw.strip():
        return {}
    try:
        extra = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConnectionError_(f"connection {conn_id!r}: extra is not valid JSON ({exc.msg} at {exc.pos})") from None
    if not isinstance(extra, dict):
        raise ConnectionError_(f"connection {conn_id!r}: extra must be a JSON object")
    return extra


_MALFORMED = "malformed URI (encode special characters in the login and password as %XX)"


def _parse_uri(conn_id: str, value: str) -> Conn:
    """Airflow's URI form ``type://[login[:password]@]host[:port][/schema][?extra]``."""
    if "://" not in value:
        raise ConnectionError_(f"connection {conn_id!r}: expected a URI like type://login:password@host:port/schema")
    rest = value.split("://", 1)[1]
    if rest.count("://") == 1 and re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*", rest.split("://", 1)[0]):
        # Airflow's host-with-protocol form: type://protocol://[login:password@]host...
        inner = _parse_uri(conn_id, rest)
        inner.host = f"{rest.split('://', 1)[0]}://{inner.host}"
        inner.conn_type = value.split("://", 1)[0].replace("-", "_")
        return inner
    try:
        parts = urlsplit(value)
    except ValueError:  # e.g. an unbalanced '[' in the netloc
        raise ConnectionError_(f"connection {conn_id!r}: {_MALFORMED}") from None
    if not parts.scheme:
        raise ConnectionError_(f"connection {conn_id!r}: expected a URI like type://login:password@host:port/schema")
    # an '@' after the authority means the userinfo held an unencoded '/', '?' or '#': the split
    # above cut it there, and what it calls path, query or fragment holds the rest of a secret
    after_authority = value.split("://", 1)[1][len(parts.netloc):]
    if "@" in after_authority and "@" not in parts.netloc:
        raise ConnectionError_(f"connection {conn_id!r}: {_MALFORMED}")
    if value.count("://") > 1:
        raise ConnectionError_(f"connection {conn_id!r}: {_MALFORMED}")
    try:
        port = parts.port
    except ValueError:
        raise ConnectionError_(f"connection {conn_id!r}: port is not a number in 0-65535 ({_MALFORMED})") from None
    try:
        extra: dict = dict(parse_qsl(parts.query, keep_blank_values=True))
    except ValueError:
        raise ConnectionError_(f"connection {conn_id!r}: malformed query string") from None
    if "__extra__" in extra:
        extra = _extra_json(conn_id, extra.pop("__extra__"))
    host = unquote(parts.hostname or "")
    return Conn(parts.scheme.replace("-", "_"), host, port, unquote(parts.username) if parts.username else None,
                unquote(parts.password) if parts.password else None, unquote(parts.path.lstrip("/")), extra)


def env_connection(conn_id: str, env: Mapping[str, str]) -> Conn:
    key = "AIRFLOW_CONN_" + conn_id.upper()
    if key not in env:
        raise ConnectionError_(f"connection {conn_id!r} not found: set Airflow connection {conn_id!r} or {key}")
    return parse_connection(conn_id, env[key])


def lookup_connection(conn_id: str, lookup: Callable[[str], Any] | None = None,
                      env: Mapping[str, str] | None = None) -> Conn:
    """The one connection lookup: Airflow's (``lookup``, inside a task) or ``AIRFLOW_CONN_<ID>``.

    Whatever the lookup raises is turned into a :class:`ConnectionError_` that names the
    connection id and the kind of failure only: Airflow's own messages may quote the URI.
    """
    if lookup is None:
        import os

        return env_connection(conn_id, os.environ if env is None else env)
    try:
        found = lookup(conn_id)
    except ConnectionError_:
        raise
    except Exception as exc:
        name = type(exc).__name__
        if "notfound" in name.lower():
            raise ConnectionError_(f"connection {conn_id!r} not found in Airflow") from None
        raise ConnectionError_(f"connection {conn_id!r}: Airflow could not read it ({name}); "
                               "check its URI (encode special characters in the password as %XX)") from None
    try:
        return Conn.from_airflow(found)
    except ConnectionError_:
        raise
    except Exception as exc:
        raise ConnectionError_(f"connection {conn_id!r}: could not be read ({type(exc).__name__})") from None


def source_for(pcfg: PlatformConfig, conn: Conn):
    """The configured platform's source from its resolved connection
    (see :func:`gpupool.platforms.platform_connection`)."""
    from gpupool.sources import source_class

    cls = source_class(pcfg.kind)
    x = conn.extra
    verify = str(x.get("verify", "true")).lower() not in ("false", "0", "no")
    # seconds per HTTP request (a large platform's Prometheus may need more than the default)
    timeout = {"timeout": _seconds(pcfg.name, x["timeout"])} if x.get("timeout") is not None else {}
    if pcfg.kind == "slurm":
        token = conn.password if not conn.login else None
        basic = (conn.login, conn.password) if conn.login and conn.password else None
        return cls(pcfg.name, prometheus_url=conn.url(), prometheus_token=token, prometheus_basic_auth=basic,
                   queries=queries_for(pcfg), cluster=pcfg.cluster or x.get("cluster", ""), slurm_conf=x.get("slurm_conf"),
                   restd_url=x.get("restd_url"), restd_user=x.get("restd_user"), restd_token=x.get("restd_token"),
                   verify=verify, **timeout,
                   live_tolerance=_minutes(x.get("live_tolerance_minutes", 60)))
    if pcfg.kind == "openstack":
        from gpupool.sources.openstack import GnocchiMeter

        meters = {m: GnocchiMeter(**spec) for m, spec in (x.get("gnocchi_meters") or {}).items()}
        for metric, spec in pcfg.metrics.items():
            meters[metric] = GnocchiMeter(metric=spec) if isinstance(spec, str) else GnocchiMeter(**spec)
        return cls(pcfg.name, auth_url=conn.url(), username=conn.login, password=conn.password,
                   project_name=x.get("project_name", "admin"), user_domain_name=x.get("user_domain_name", "Default"),
                   project_domain_name=x.get("project_domain_name", "Default"), region_name=x.get("region_name"),
                   interface=x.get("interface", "public"), cluster=pcfg.cluster, gnocchi_meters=meters or None, verify=verify)
    if pcfg.kind == "kubernetes":
        kwargs: dict[str, Any] = {"cluster": pcfg.cluster, "queries": queries_for(pcfg), **timeout}
        if x.get("in_cluster"):
            kwargs["in_cluster"] = True
        elif x.get("kubeconfig"):
            kwargs.update(kubeconfig=x["kubeconfig"], context=x.get("context"))
        else:
            kwargs.update(host=conn.url("https"), token=conn.password, ca_cert=x.get("ca_cert"), verify=verify)
        if x.get("prometheus_url"):
            kwargs.update(prometheus_url=x["prometheus_url"], prometheus_token=x.get("prometheus_token"))
        return cls(pcfg.name, **kwargs)
    raise ValueError(f"platform {pcfg.name!r}: no source for kind {pcfg.kind!r}")


def _seconds(platform: str, value) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        out = -1.0
    if not out > 0:
        raise ConnectionError_(f"platform {platform!r}: connection extra 'timeout' must be a number of seconds > 0, "
                               f"got {str(value)[:40]!r}")
    return out


def _minutes(value):
    """`null`/"none" turns the live-only check off (a simulated clock is not the wall clock)."""
    from datetime import timedelta

    if value is None or str(value).lower() in ("none", "null", "off"):
        return None
    return timedelta(minutes=float(value))


def queries_for(pcfg: PlatformConfig) -> dict | None:
    """The source's default PromQL per canonical metric, overlaid with the configured ones.

    A configured value is either a PromQL string (a platform-wide series) or a mapping with
    `expr`, `entity_kind`, `entity` (label template), `unit`; null drops the metric. Every
    selector of every query then gets the platform's `prometheus_match` matchers."""
    from dataclasses import replace

    from gpupool.sources.prometheus import MetricQuery, with_label_matcher

    if pcfg.kind == "slurm":
        from gpupool.sources.slurm import DEFAULT_SLURM_QUERIES as defaults
    elif pcfg.kind == "kubernetes":
        from gpupool.sources.kubernetes import DEFAULT_K8S_QUERIES as defaults
    else:
        return None
    out = dict(defaults)
    for metric, spec in pcfg.metrics.items():
        if spec is None or spec == "":  # this deployment has no such series: don't ask for it
            out.pop(metric, None)
        elif isinstance(spec, str):
            out[metric] = MetricQuery(spec, "platform", "")
        else:
            out[metric] = MetricQuery(**spec)
    if not pcfg.prometheus_match:
        return out

    def match(expr: str) -> str:
        for label, value in pcfg.prometheus_match.items():
            expr = with_label_matcher(expr, label, "=", value)
        return expr

    def matched(q: MetricQuery) -> MetricQuery:
        return replace(q, expr=match(q.expr), health=q.health.mapped(match) if q.health else None)

    return {m: tuple(matched(q) for q in spec) if isinstance(spec, tuple) else matched(spec) for m, spec in out.items()}
