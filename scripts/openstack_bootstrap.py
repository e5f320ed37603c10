"""Point a Keystone copied from the template at its URL, register Placement, add users.

Run with the openstack virtualenv's Python once Keystone answers:

    python openstack_bootstrap.py KEYSTONE_URL PLACEMENT_URL CREDENTIALS_JSON

CREDENTIALS_JSON holds the passwords of `admin`, of the `placement` service user and of
the `gpupool` reader; the last two users are created here with them.
"""

import json
import sys

from keystoneauth1 import session
from keystoneauth1.identity import v3
from keystoneclient.v3 import client


def main(keystone_url: str, placement_url: str, creds_path: str) -> None:
    with open(creds_path) as f:
        creds = json.load(f)
    auth = v3.Password(
        auth_url=keystone_url, username="admin", password=creds["admin"], project_name="admin",
        user_domain_id="default", project_domain_id="default",
    )
    # The template's catalog names a placeholder URL; the client must not follow it.
    ks = client.Client(session=session.Session(auth=auth, timeout=30), endpoint_override=keystone_url)
    for ep in ks.endpoints.list():
        ks.endpoints.update(ep, url=keystone_url)
    admin_role = ks.roles.find(name="admin")
    service_role = ks.roles.find(name="service")
    service_project = ks.projects.create("service", domain="default")
    gpupool_project = ks.projects.create("gpupool", domain="default")
    placement_user = ks.users.create("placement", domain="default", password=creds["placement"])
    ks.roles.grant(admin_role, user=placement_user, project=service_project)
    ks.roles.grant(service_role, user=placement_user, project=service_project)
    # Placement's default policy lets only admin (or service) read resource providers.
    gpupool_user = ks.users.create("gpupool", domain="default", password=creds["gpupool"])
    ks.roles.grant(admin_role, user=gpupool_user, project=gpupool_project)
    svc = ks.services.create("placement", type="placement", description="Placement API")
    for iface in ("public", "internal", "admin"):
        ks.endpoints.create(svc, placement_url, interface=iface, region="RegionOne")


if __name__ == "__main__":
    main(*sys.argv[1:4])
