"""A staged history of parks and wakes, written through the power store's own compare-and-set
writer (:func:`gpupool.staging.power.transition`), for the metrics, pool page and report tests.

At ``AT`` (``T0`` = six hours before):

* slurm: n1 parked T0+5m..T0+2h, woken in 4 min (deadline 15 min); n2 parked T0+10m..T0+3h,
  woken in 20 min past its 10-minute deadline (late); n6 parked T0+1h, woken by Slurm itself at
  T0+4h (observed: on at once); s1, s2 never parked. All on now.
* kubernetes: n3 parked since T0+1h (a wake asked after AT does not count yet); n4 parked at
  T0, waking since AT-30m, its deadline (AT-15m) passed, refused (someone else's cordon); k1 on.
* openstack: n5 parking since AT-5m; n8 waking since AT-20m, its last command failed; o1 on.
* a dry run's transitions (n7) never count.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import sqlalchemy as sa

from gpupool.staging import power as store
from gpupool.staging.schema import inventory_node

AT = datetime(2026, 11, 1, 4, 20, tzinfo=timezone.utc)
T0 = AT - timedelta(hours=6)
M = timedelta(minutes=1)


def _path(engine, node, platform, steps):
    """``steps``: (from, to, at, by, deadline) in order, each a won compare-and-set."""
    for frm, to, at, by, deadline in steps:
        assert store.transition(engine, node, platform, frm, to, at, by=by, deadline=deadline) is not None, (node, to)


def _park(at, done, deadline=None):
    return [("on", "parking", at, "plan", deadline or at + 15 * M), ("parking", "parked", done, "platform", None)]


def fill(engine) -> None:
    """Write the history above, and the inventory the pool's on nodes come from."""
    _path(engine, "n1", "slurm", _park(T0, T0 + 5 * M) + [
        ("parked", "waking", T0 + 120 * M, "fastpath", T0 + 135 * M), ("waking", "on", T0 + 124 * M, "platform", None)])
    _path(engine, "n2", "slurm", _park(T0, T0 + 10 * M) + [
        ("parked", "waking", T0 + 180 * M, "plan", T0 + 190 * M), ("waking", "on", T0 + 200 * M, "platform", None)])
    _path(engine, "n6", "slurm", _park(T0 + 50 * M, T0 + 60 * M) + [("parked", "on", T0 + 240 * M, "observed", None)])
    _path(engine, "n3", "kubernetes", _park(T0 + 55 * M, T0 + 60 * M))
    _path(engine, "n4", "kubernetes", [("on", "parking", T0 - 5 * M, "plan", T0 + 10 * M),
                                       ("parking", "parked", T0, "platform", None),
                                       ("parked", "waking", AT - 30 * M, "fastpath", AT - 15 * M)])
    assert store.set_error(engine, "n4", "waking", "left alone: cordoned by someone else", AT - 29 * M)
    _path(engine, "n5", "openstack", [("on", "parking", AT - 5 * M, "plan", AT + 10 * M)])
    _path(engine, "n8", "openstack", [("on", "parking", T0, "plan", T0 + 15 * M), ("parking", "parked", T0 + 5 * M, "platform", None),
                                      ("parked", "waking", AT - 20 * M, "operator", AT + 40 * M)])
    assert store.set_error(engine, "n8", "waking", "will retry: BMC answered 503", AT - 19 * M)
    store.record_dry(engine, "n7", "slurm", "on", "parked", T0, by="plan")
    store.record_dry(engine, "n7", "slurm", "parked", "on", T0 + 60 * M, by="plan")
    # after AT: not there yet
    _path(engine, "n3", "kubernetes", [("parked", "waking", AT + 60 * M, "plan", AT + 75 * M)])
    snap = T0 - 60 * M
    rows = [("slurm", n, True, None) for n in ("n1", "n2", "n6", "s1", "s2")]
    rows += [("kubernetes", "n3", False, "gpupool: parked"), ("kubernetes", "n4", True, None),
             ("kubernetes", "k1", True, None), ("openstack", "n5", True, None),
             ("openstack", "n8", False, "gpupool: parked"), ("openstack", "o1", True, None)]
    with engine.begin() as conn:
        conn.execute(inventory_node.insert(), [
            dict(platform=p, node=n, snapshot_at=snap, gpus=8, gpu_model="A100", schedulable=ok, drain_reason=why,
                 busy_gpus=0.0) for p, n, ok, why in rows])
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(inventory_node)).scalar() == len(rows)


#: parked node-seconds up to AT, per platform
PARKED_S = {
    "slurm": (115 + 170 + 180) * 60.0,          # n1 5m..120m, n2 10m..180m, n6 60m..240m
    "kubernetes": (300 + 330) * 60.0,           # n3 60m..AT (360m), n4 0..AT-30m
    "openstack": 335 * 60.0,                    # n8 5m..AT-20m (340m)
}
