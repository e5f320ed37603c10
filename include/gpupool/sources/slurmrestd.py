"""A small client of slurmrestd: GET/DELETE of its JSON documents over HTTP(S) or a unix socket.

``url`` is either ``http(s)://host:port`` (slurmrestd behind a TCP listener, usually with JWT:
``X-SLURM-USER-NAME`` / ``X-SLURM-USER-TOKEN``) or ``unix:/path/to/slurmrestd.sock`` (slurmrestd's
own ``unix:`` listen syntax; ``rest_auth/local`` identifies the client by the socket's peer
credentials, so no token is sent). Failures are classified for :func:`call_with_retry`: no answer,
408/429/5xx are transient; refused authentication, other 4xx and a body that is not JSON are
permanent. The token never appears in an error or an endpoint name.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
from typing import Any

import requests

from gpupool.sources.base import PermanentError, TransientError, redact_url, timed_out

UNIX_PREFIX = "unix:"


class _UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP/1.1 to a unix-domain socket (the Host header says ``localhost``)."""

    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


class SlurmRestd:
    """slurmrestd at ``url`` speaking OpenAPI plugin ``version`` (``v0.0.38`` is Slurm 22.05's)."""

    def __init__(self, url: str, *, user: str | None = None, token: str | None = None,
                 version: str = "v0.0.38", timeout: float = 30.0, verify: bool = True):
        url = url.rstrip("/")
        self.socket_path = url[len(UNIX_PREFIX):] if url.startswith(UNIX_PREFIX) else None
        if self.socket_path is not None and not self.socket_path.startswith("/"):
            raise ValueError("slurmrestd unix socket must be an absolute path (unix:/path/to.sock)")
        self.url = url
        self.user = user
        self._token = token
        self.version = version
        self.timeout = timeout
        self.verify = verify

    def path(self, rel: str) -> str:
        """URL path of ``rel`` under this plugin ("nodes" -> "/slurm/v0.0.38/nodes")."""
        return f"/slurm/{self.version}/{rel.lstrip('/')}"

    def endpoint(self, rel: str) -> str:
        """A printable name of the resource, without credentials."""
        if self.socket_path is not None:
            return f"{self.url}{self.path(rel)}"
        return redact_url(f"{self.url}{self.path(rel)}")

    def headers(self) -> dict[str, str]:
        out = {"Accept": "application/json"}
        if self.user:
            out["X-SLURM-USER-NAME"] = self.user
        if self._token:
            out["X-SLURM-USER-TOKEN"] = self._token
        return out

    def get(self, rel: str, *, missing_ok: bool = False) -> Any:
        """The JSON document at ``rel``; with ``missing_ok``, None for HTTP 404."""
        return self.request("GET", rel, missing_ok=missing_ok)

    def request(self, method: str, rel: str, *, missing_ok: bool = False) -> Any:
        status, text = self.send(method, self.path(rel))
        if missing_ok and status == 404:
            return None
        if status in (401, 403):
            raise PermanentError(f"authentication refused (HTTP {status})")
        if status in (408, 429) or status >= 500:
            raise TransientError(f"HTTP {status}{_first_error(text)}")
        if status >= 400:
            raise PermanentError(f"HTTP {status}{_first_error(text)}")
        try:
            return json.loads(text)
        except ValueError as exc:
            raise PermanentError("malformed payload: not JSON") from exc

    def send(self, method: str, path: str) -> tuple[int, str]:
        """(HTTP status, body text) of ``method path``; no answer at all is a TransientError."""
        if self.socket_path is None:
            try:
                resp = requests.request(method, self.url + path, headers=self.headers(), timeout=self.timeout,
                                        verify=self.verify)
            except requests.Timeout as exc:  # ConnectTimeout is a ConnectionError too: this first
                raise TransientError(f"{type(exc).__name__}: no answer within {self.timeout}s") from exc
            except requests.ConnectionError as exc:
                if timed_out(exc):  # a read that timed out inside the body comes wrapped as a ConnectionError
                    raise TransientError(f"ReadTimeout: no answer within {self.timeout}s") from exc
                raise TransientError(f"connection refused or unreachable ({type(exc).__name__})") from exc
            return resp.status_code, resp.text
        conn = _UnixHTTPConnection(self.socket_path, self.timeout)
        try:
            conn.request(method, path, headers=self.headers())
            resp = conn.getresponse()
            return resp.status, resp.read().decode("utf-8", "replace")
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            raise TransientError(f"no slurmrestd listening on the socket ({type(exc).__name__})") from exc
        except (OSError, http.client.HTTPException) as exc:
            raise TransientError(f"{type(exc).__name__}: no answer within {self.timeout}s") from exc
        finally:
            conn.close()


def _first_error(text: str) -> str:
    """": <description>" of the first entry of a slurmrestd ``errors`` list, if the body has one."""
    try:
        errors = json.loads(text).get("errors") or []
        first = errors[0]
        return f": {first.get('description') or first.get('error')}"[:200]
    except (ValueError, AttributeError, IndexError, TypeError):
        return ""


def expand_hostlist(text: str) -> list[str]:
    """Slurm's hostlist syntax to names: "gpu-n[001-003,007],login1" -> gpu-n001..gpu-n003, gpu-n007, login1.

    One bracket group per name (what slurmctld prints for ``nodes``); zero padding is kept.
    """
    out: list[str] = []
    for item in re.findall(r"[^,\[]+(?:\[[^\]]*\][^,\[]*)*", text):
        m = re.fullmatch(r"(?P<pre>[^\[]*)\[(?P<ranges>[^\]]*)\](?P<post>.*)", item)
        if not m:
            out.append(item)
            continue
        for part in m.group("ranges").split(","):
            lo, _, hi = part.partition("-")
            width = len(lo)
            for i in range(int(lo), int(hi or lo) + 1):
                out.append(f"{m.group('pre')}{i:0{width}d}{m.group('post')}")
    return [n for n in out if n]

