"""What the four OpenStack services of the facade share: constants, error bodies, microversions,
and the context (simulator state, Keystone's tokens) every service's routes close over."""

from __future__ import annotations

import re
import uuid
from datetime import datetime, timezone
from typing import Any

import pandas as pd
from starlette.requests import Request
from starlette.responses import JSONResponse

from gpupool.emulator.state import SimState, stable_uuid

ROLE = "openstack"
PLACEMENT_MAX = (1, 39)
NOVA_MAX = (2, 95)
DISABLED_TRAIT = "COMPUTE_STATUS_DISABLED"
DOMAIN = {"id": "default", "name": "Default"}
PROJECTS = {"admin": stable_uuid("project", "admin").replace("-", ""),
            "gpupool": stable_uuid("project", "gpupool").replace("-", "")}
USERS = {"admin": stable_uuid("user", "admin").replace("-", ""),
         "gpupool": stable_uuid("user", "gpupool").replace("-", "")}
ROLES = [{"id": stable_uuid("role", r).replace("-", ""), "name": r} for r in ("admin", "member", "reader")]
CONTROLLER = "controller-0"
GNOCCHI_NODE_METRICS = {"gpu.util": "%", "gpu.allocated": "GPU", "gpu.capacity": "GPU"}
GNOCCHI_CLOUD_METRICS = {"gpu.pending": "GPU"}
AGGREGATE_METHODS = ("mean", "max", "min", "sum", "last", "count")


def iso(ts: pd.Timestamp | datetime) -> str:
    return pd.Timestamp(ts).strftime("%Y-%m-%dT%H:%M:%S.%f")


class OsError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


_TITLES = {400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed",
           406: "Not Acceptable", 409: "Conflict", 415: "Unsupported Media Type", 422: "Unprocessable Entity"}
_NOVA_KEYS = {400: "badRequest", 401: "unauthorized", 403: "forbidden", 404: "itemNotFound", 409: "conflictingRequest"}


def keystone_error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": status, "message": message, "title": _TITLES.get(status, "Error")}},
                        status_code=status)


_EXPLANATIONS = {
    400: "The server could not comply with the request since it is either malformed or otherwise incorrect.",
    401: "This server could not verify that you are authorized to access the document you requested.",
    404: "The resource could not be found.",
    406: "The resource could not be found.",
    409: "There was a conflict when trying to complete your request.",
}


def placement_error(status: int, detail: str, code: str | None = None, ver: tuple[int, int] = (1, 0)) -> JSONResponse:
    """Placement's error body (webob's explanation, then the detail; ``code`` from microversion 1.23)."""
    error = {"status": status, "title": _TITLES.get(status, "Error"),
             "detail": f"{_EXPLANATIONS.get(status, '')}\n\n {detail}  ", "request_id": f"req-{uuid.uuid4()}"}
    if ver >= (1, 23):
        error["code"] = code or "placement.undefined_code"
    return JSONResponse({"errors": [error]}, status_code=status)


def nova_error(status: int, message: str) -> JSONResponse:
    return JSONResponse({_NOVA_KEYS.get(status, "computeFault"): {"code": status, "message": message}},
                        status_code=status)


def gnocchi_error(status: int, description: Any) -> JSONResponse:
    return JSONResponse({"code": status, "description": description, "title": _TITLES.get(status, "Error")},
                        status_code=status)


def microversion(request: Request, service: str, maximum: tuple[int, int], default: tuple[int, int]):
    """The requested microversion of ``service`` (``latest`` = maximum); raises OsError 400/406."""
    raw = None
    for header in ("openstack-api-version", "x-openstack-nova-api-version"):
        value = request.headers.get(header)
        if value is None:
            continue
        if header == "openstack-api-version":
            parts = value.strip().split()
            if len(parts) == 2 and parts[0].lower() == service:
                raw = parts[1]
            elif len(parts) == 1:
                raw = parts[0]
        elif service == "compute":
            raw = value.strip()
        if raw is not None:
            break
    if raw is None:
        return default
    if raw == "latest":
        return maximum
    m = re.fullmatch(r"(\d+)\.(\d+)", raw)
    if not m:
        raise OsError(400, f"invalid version string: {raw}", "placement.invalid_version")
    ver = (int(m.group(1)), int(m.group(2)))
    if ver > maximum or ver < (maximum[0], 0 if service == "placement" else 1):
        raise OsError(406, f"Unacceptable version header: {raw}", "placement.unacceptable_version")
    return ver


class FacadeContext:
    """The state behind the services, Keystone's issued tokens and the password it accepts."""

    def __init__(self, state: SimState, password: str) -> None:
        self.state = state
        self.password = password
        self.tokens: dict[str, dict] = {}

    @staticmethod
    def base(request: Request) -> str:
        """Scheme and host the client reached this server at (catalog URLs point back at it)."""
        return f"{request.url.scheme}://{request.url.netloc}"

    def authorized(self, request: Request) -> bool:
        """Whether the request carries an unexpired token Keystone issued."""
        tok = self.tokens.get(request.headers.get("x-auth-token", ""))
        if tok is None:
            return False
        return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.000000Z") < tok["expires"]


def is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
        return True
    except ValueError:
        return False


def int_id(*parts: str) -> int:
    return int(uuid.UUID(stable_uuid(*parts)).int % 100000)


def parse_ts(text: str) -> pd.Timestamp:
    try:
        ts = pd.Timestamp(float(text), unit="s", tz="UTC")
    except ValueError:
        try:
            ts = pd.Timestamp(text)
        except ValueError:
            raise OsError(400, f"Timestamp must be ISO 8601 or unix seconds: {text}") from None
    return ts.tz_localize("UTC") if ts.tzinfo is None else ts.tz_convert("UTC")
