"""A staged pool with owners, lent and borrowed nodes and reclaims, for the ownership metrics and
the pool page's owners (issue 42). Owners are written as staging records them
(:func:`gpupool.staging.owners.record_owners`), handovers through the handover store's own opener.

``CONFIG`` (with :func:`config`): slurm ``reclaim_minutes`` 60, kubernetes ``reclaim_minutes`` 30,
openstack ``lend_limit`` 1; ``pool.nodes`` names o1's owner (openstack) and k2's (kubernetes, over
the openstack a first sight recorded). Owners: slurm s1..s4, kubernetes k1..k3, openstack o1, o2;
p1 is nobody's.

Held at ``AT`` (the inventory, then the open handovers):

* slurm: s1 (idle), s2 (busy), s3 (idle, moved home 20 minutes ago: in its cool-down), k2
  (kubernetes' node, borrowed), s4 (on its way back from kubernetes: an open reclaim, need since
  AT-10m, within slurm's 60 minutes);
* kubernetes: k1 (idle), o2 (openstack's, borrowed, busy), k3 (on its way back from openstack: an
  open reclaim, need since AT-40m, past kubernetes' 30 minutes);
* openstack: o1 (idle), p1 (nobody's, idle).

Reclaims done, for kubernetes: k2's (need AT-5h, done AT-4h15m: 45 minutes, late) and k1's (need
AT-3h, done AT-2h48m: 12 minutes). A dry-run reclaim and a plain move never count as reclaims.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import sqlalchemy as sa

from gpupool.actuation import handover as ho
from gpupool.config import parse_config
from gpupool.staging import owners
from gpupool.staging.schema import handover, inventory_node

AT = datetime(2026, 11, 1, 4, 20, tzinfo=timezone.utc)
M = timedelta(minutes=1)
PLATFORMS = ("slurm", "kubernetes", "openstack")

CONFIG = {
    "platforms": [
        {"name": "slurm", "kind": "simulator", "reclaim_minutes": 60},
        {"name": "kubernetes", "kind": "simulator", "reclaim_minutes": 30},
        {"name": "openstack", "kind": "simulator", "lend_limit": 1},
    ],
    "pool": {"nodes": [{"node": "o1", "gpus": 8, "owner": "openstack"}, {"node": "k2", "gpus": 8, "owner": "kubernetes"}]},
}

#: what the metrics must say at AT, per platform
OWNED = {"slurm": 4, "kubernetes": 3, "openstack": 2}
HELD = {"slurm": 5, "kubernetes": 3, "openstack": 2}
LENT = {"slurm": 0, "kubernetes": 1, "openstack": 1}
BORROWED = {"slurm": 1, "kubernetes": 1, "openstack": 0}
#: slurm: s1 (s2 busy, s3 cooling down, s4 moving); kubernetes: k1; openstack: o1, but its
#: lend_limit 1 is spent on o2
LENDABLE = {"slurm": 1, "kubernetes": 1, "openstack": 0}
#: the done reclaims' latencies, seconds (kubernetes)
RECLAIM_S = (45 * 60.0, 12 * 60.0)


def config():
    return parse_config(CONFIG)


def _reclaim(engine, node, source, target, need, opened, done=None, dry_run=False, kind=ho.RECLAIM, state=ho.PLANNED):
    hid = ho.open_handover(engine, node, source, target, opened, dry_run=dry_run, kind=kind, need_since=need,
                           state=state)
    if done is not None:
        with engine.begin() as conn:
            conn.execute(handover.update().where(handover.c.id == hid).values(state=ho.DONE, updated_at=done))
    return hid


def fill(engine, with_owners: bool = True, with_reclaims: bool = True) -> None:
    """The inventory above; with ``with_owners`` the recorded owners, with ``with_reclaims`` the
    handovers."""
    snap = AT - 60 * M
    rows = [("slurm", "s1", 0), ("slurm", "s2", 4), ("slurm", "s3", 0), ("slurm", "k2", 0),
            ("kubernetes", "k1", 0), ("kubernetes", "o2", 2), ("kubernetes", "s4", 0),
            ("openstack", "o1", 0), ("openstack", "p1", 0), ("openstack", "k3", 0)]
    with engine.begin() as conn:
        conn.execute(inventory_node.insert(), [
            dict(platform=p, node=n, snapshot_at=snap, gpus=8, gpu_model="A100", schedulable=True, drain_reason=None,
                 busy_gpus=float(busy)) for p, n, busy in rows])
    if with_owners:
        first = {n: ("slurm", owners.FIRST_SIGHT) for n in ("s1", "s2", "s3", "s4")}
        first.update({"k1": ("kubernetes", owners.FIRST_SIGHT), "k3": ("kubernetes", owners.FIRST_SIGHT),
                      "k2": ("openstack", owners.FIRST_SIGHT), "o2": ("openstack", owners.CONFIG)})
        owners.record_owners(engine, first, AT - 6 * 60 * M, {"slurm": 4, "kubernetes": 2})
    if with_reclaims:
        _reclaim(engine, "k2", "slurm", "kubernetes", AT - 300 * M, AT - 295 * M, done=AT - 255 * M)
        _reclaim(engine, "k1", "openstack", "kubernetes", AT - 180 * M, AT - 178 * M, done=AT - 168 * M)
        _reclaim(engine, "k3", "openstack", "kubernetes", AT - 40 * M, AT - 38 * M, state=ho.RELEASING)
        _reclaim(engine, "s4", "kubernetes", "slurm", AT - 10 * M, AT - 9 * M)
        # a dry run and a plain move: neither is a reclaim the metrics count
        _reclaim(engine, "o1", "kubernetes", "openstack", AT - 120 * M, AT - 119 * M, done=AT - 60 * M, dry_run=True)
        _reclaim(engine, "s3", "kubernetes", "slurm", None, AT - 30 * M, done=AT - 20 * M, kind=None)
