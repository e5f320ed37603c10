"""Each platform's pressure read now, through its own source: what the fast path's tick, the
power step and the reclaim read (GPUs allocated, pending and open, idle whole nodes); and the
staged state those three share (whether the fast path runs, which nodes are powered down)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Mapping

from gpupool.decisions.cadence import FASTPATH_EVERY
from gpupool.sources.base import Pressure, SourceError
from gpupool.values import utc_datetime

#: the plan's cadence: the rule's tick when the fast path does not run (the what-if's too)
PLAN_EVERY = timedelta(hours=1)
#: the fast path counts as running while it recorded a tick this recently (a tick or two may fail)
FASTPATH_SEEN_WITHIN = 3 * FASTPATH_EVERY


def fastpath_running(engine, at: datetime) -> bool:
    """Whether the fast path recorded a tick within :data:`FASTPATH_SEEN_WITHIN` before ``at``
    (it then runs the power step; otherwise the plan's actuation does)."""
    from gpupool.staging import fastpath as store

    last = store.recent_decisions(engine, limit=1, until=at)
    return bool(last) and utc_datetime(last[0]["decided_at"]) > utc_datetime(at) - FASTPATH_SEEN_WITHIN


def power_states(engine) -> dict[str, tuple[str, str]]:
    """node -> (power state, platform) of every node that is not on."""
    from gpupool.staging import power as store

    return {r["node"]: (r["state"], r["platform"]) for r in store.power_rows(engine) if r["state"] != store.ON}




def _pool_ids(config, p: Pressure) -> Pressure:
    """``p`` with its node names as pool node ids (``pool.nodes[].names``)."""
    from dataclasses import replace

    ids = {n: config.pool.node_id(p.platform, n) for n in p.node_gpus}
    return replace(p, idle_nodes=tuple(ids[n] for n in p.idle_nodes),
                   node_gpus={ids[n]: g for n, g in p.node_gpus.items()})


def read_pressures(ctx, at: datetime, sources: Mapping[str, Any] | None = None, lookup=None,
                   only: list[str] | None = None) -> tuple[dict[str, Pressure], dict[str, str], dict[str, str]]:
    """Each configured platform's pressure at ``at`` through its source (built from the
    configuration unless ``sources`` gives it); why for the platforms that failed to be read;
    and the platforms whose source has no instant read (they take no part, and that is no error).
    ``only``: those platforms alone."""
    read, unread, without = {}, {}, {}
    for name in ctx.platforms(only):
        pcfg = ctx.config.platform(name)
        try:
            source = (sources or {}).get(name) or ctx.build_source(name, lookup)
        except Exception as exc:  # a missing connection: this platform is out of the tick, and said so
            unread[name] = f"source not built: {exc}"
            continue
        if not hasattr(source, "pressure"):
            without[name] = f"a {pcfg.kind} source has no instant pressure read: this platform takes no part"
            continue
        try:
            read[name] = source.pressure(at)
        except (SourceError, ValueError) as exc:
            unread[name] = f"pressure not read: {exc}"
    return read, unread, without
