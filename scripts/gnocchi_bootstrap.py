"""Register a Gnocchi in the tests' Keystone, or take it out again.

Run with the openstack virtualenv's Python once Keystone answers:

    python gnocchi_bootstrap.py register KEYSTONE_URL GNOCCHI_URL CREDENTIALS_JSON GNOCCHI_PASSWORD
    python gnocchi_bootstrap.py unregister KEYSTONE_URL CREDENTIALS_JSON

`register` creates the `gnocchi` service user (admin + service in project `service`, which
Gnocchi's keystonemiddleware authenticates as) and the `metric` service with its endpoints in
RegionOne; `unregister` deletes both. CREDENTIALS_JSON is openstack-services.sh's (admin's password).
"""

import json
import sys

from keystoneauth1 import session
from keystoneauth1.identity import v3
from keystoneclient.v3 import client


def admin_client(keystone_url: str, creds_path: str) -> client.Client:
    with open(creds_path) as f:
        creds = json.load(f)
    auth = v3.Password(
        auth_url=keystone_url, username="admin", password=creds["admin"], project_name="admin",
        user_domain_id="default", project_domain_id="default",
    )
    return client.Client(session=session.Session(auth=auth, timeout=30), endpoint_override=keystone_url)


def unregister(ks: client.Client) -> None:
    for svc in ks.services.list(type="metric"):
        ks.services.delete(svc)  # deletes its endpoints too
    for user in ks.users.list(name="gnocchi", domain="default"):
        ks.users.delete(user)


def register(keystone_url: str, gnocchi_url: str, creds_path: str, password: str) -> None:
    ks = admin_client(keystone_url, creds_path)
    unregister(ks)  # one Gnocchi per Keystone: a leftover registration is replaced
    service_project = ks.projects.find(name="service", domain_id="default")
    user = ks.users.create("gnocchi", domain="default", password=password)
    for role in ("admin", "service"):
        ks.roles.grant(ks.roles.find(name=role), user=user, project=service_project)
    svc = ks.services.create("gnocchi", type="metric", description="Gnocchi metric API")
    for iface in ("public", "internal", "admin"):
        ks.endpoints.create(svc, gnocchi_url, interface=iface, region="RegionOne")


if __name__ == "__main__":
    if sys.argv[1] == "register":
        register(*sys.argv[2:6])
    elif sys.argv[1] == "unregister":
        unregister(admin_client(*sys.argv[2:4]))
    else:
        sys.exit(f"usage: {sys.argv[0]} register|unregister ...")
