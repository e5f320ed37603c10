"""Keystone v3 at ``/identity/v3``: password authentication, tokens, and the service catalog."""

from __future__ import annotations

import json
import secrets
from datetime import datetime, timedelta, timezone

from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gpupool.emulator.openstack.common import DOMAIN, PROJECTS, ROLES, USERS, FacadeContext, keystone_error
from gpupool.emulator.state import stable_uuid


def routes(ctx: FacadeContext) -> list[Route]:
    """The service's routes over ``ctx``'s state."""
    tokens, password, base = ctx.tokens, ctx.password, ctx.base

    def catalog(root: str) -> list[dict]:
        entries = []
        for typ, name, path in (("identity", "keystone", "/identity"), ("placement", "placement", "/placement"),
                                ("compute", "nova", "/compute/v2.1"), ("metric", "gnocchi", "/metric")):
            sid = stable_uuid("service", typ).replace("-", "")
            entries.append({"id": sid, "type": typ, "name": name, "endpoints": [
                {"id": stable_uuid("endpoint", typ, iface).replace("-", ""), "interface": iface,
                 "region_id": "RegionOne", "region": "RegionOne", "url": root + path}
                for iface in ("public", "internal", "admin")]})
        return entries

    def identity_version(root: str) -> dict:
        return {"id": "v3.14", "status": "stable", "updated": "2020-04-07T00:00:00Z",
                "links": [{"rel": "self", "href": f"{root}/identity/v3/"}],
                "media-types": [{"base": "application/json", "type": "application/vnd.openstack.identity-v3+json"}]}

    async def identity_root(request):
        return JSONResponse({"versions": {"values": [identity_version(base(request))]}}, status_code=300)

    async def identity_v3(request):
        return JSONResponse({"version": identity_version(base(request))})

    def token_body(tok: dict, root: str, with_catalog: bool = True) -> dict:
        body = {
            "methods": ["password"], "user": {"domain": DOMAIN, "id": USERS[tok["user"]], "name": tok["user"],
                                              "password_expires_at": None},
            "audit_ids": [tok["audit"]], "expires_at": tok["expires"], "issued_at": tok["issued"],
        }
        if tok["project"]:
            body.update(project={"domain": DOMAIN, "id": PROJECTS[tok["project"]], "name": tok["project"]},
                        is_domain=False, roles=ROLES)
            if with_catalog:
                body["catalog"] = catalog(root)
        return {"token": body}

    async def issue_token(request):
        try:
            body = json.loads(await request.body())
            auth = body["auth"]
            identity = auth["identity"]
            methods = identity["methods"]
        except (ValueError, KeyError, TypeError):
            return keystone_error(400, "Invalid input for field 'identity': 'identity' is a required property")
        if not isinstance(methods, list) or "password" not in methods:
            return keystone_error(401, "The request you have made requires authentication.")
        try:
            user = identity["password"]["user"]
            name, secret = user.get("name") or "", user["password"]
            if user.get("id") and not name:
                name = next((n for n, i in USERS.items() if i == user["id"]), "")
        except (KeyError, TypeError, AttributeError):
            return keystone_error(400, "Invalid input for field 'identity/password/user': 'password' is a required "
                                       "property")
        if name not in USERS or secret != password:
            return keystone_error(401, "The request you have made requires authentication.")
        project = None
        scope = auth.get("scope")
        if isinstance(scope, dict) and "project" in scope:
            p = scope["project"] or {}
            pname = p.get("name") or next((n for n, i in PROJECTS.items() if i == p.get("id")), None)
            if pname not in PROJECTS:
                return keystone_error(401, "The request you have made requires authentication.")
            project = pname
        elif name in PROJECTS:
            project = name
        now = datetime.now(timezone.utc)
        tok = {"user": name, "project": project, "issued": now.strftime("%Y-%m-%dT%H:%M:%S.000000Z"),
               "expires": (now + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S.000000Z"),
               "audit": secrets.token_urlsafe(16)[:22]}
        token_id = "gAAAAA" + secrets.token_urlsafe(140)
        tokens[token_id] = tok
        return JSONResponse(token_body(tok, base(request)), status_code=201, headers={"X-Subject-Token": token_id})

    async def validate_token(request):
        if request.headers.get("x-auth-token") not in tokens:
            return keystone_error(401, "The request you have made requires authentication.")
        subject = request.headers.get("x-subject-token")
        if subject not in tokens:
            return keystone_error(404, f"Could not find token: {subject}.")
        if request.method == "HEAD":
            return Response(status_code=200, headers={"X-Subject-Token": subject})
        return JSONResponse(token_body(tokens[subject], base(request)), headers={"X-Subject-Token": subject})

    return [
        Route("/identity", identity_root, methods=["GET"]),
        Route("/identity/", identity_root, methods=["GET"]),
        Route("/identity/v3", identity_v3, methods=["GET"]),
        Route("/identity/v3/", identity_v3, methods=["GET"]),
        Route("/identity/v3/auth/tokens", issue_token, methods=["POST"]),
        Route("/identity/v3/auth/tokens", validate_token, methods=["GET", "HEAD"]),
    ]
