"""Each platform's pressure read now, through its own source: what the fast path's tick and the
power step read (GPUs allocated, pending and open, idle whole nodes)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Mapping

from gpupool.sources.base import Pressure, SourceError


def _pool_ids(config, p: Pressure) -> Pressure:
    """``p`` with its node names as pool node ids (``pool.nodes[].names``)."""
    from dataclasses import replace

    ids = {n: config.pool.node_id(p.platform, n) for n in p.node_gpus}
    return replace(p, idle_nodes=tuple(ids[n] for n in p.idle_nodes),
                   node_gpus={ids[n]: g for n, g in p.node_gpus.items()})


def read_pressures(ctx, at: datetime, sources: Mapping[str, Any] | None = None,
                   lookup=None) -> tuple[dict[str, Pressure], dict[str, str], dict[str, str]]:
    """Each configured platform's pressure at ``at`` through its source (built from the
    configuration unless ``sources`` gives it); why for the platforms that failed to be read;
    and the platforms whose source has no instant read (they take no part, and that is no error)."""
    read, unread, without = {}, {}, {}
    for name in ctx.platforms():
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
