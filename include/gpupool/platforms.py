"""From a platform's configuration to the source object that extracts from it.

The real platforms are reached through their APIs (`gpupool.sources`). The embedded
default (`kind: simulator`) reads the virtual datacenter's world in process, so
`make demo` and the DAG tests run with no service at all.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from functools import lru_cache

import pandas as pd

from gpupool.config import GpupoolConfig, PlatformConfig

#: the embedded world is generated per calendar quarter (plus this much history before it),
#: so every window inside a quarter sees the same, reproducible world
_LEAD = timedelta(days=35)


class EmbeddedWorldSource:
    """A platform of the embedded virtual datacenter, read in process."""

    def __init__(self, platform: str, seed: int = 0):
        self.platform = platform
        self.seed = seed

    def _world(self, until: datetime):
        start, end = _quarter_span(pd.Timestamp(until) - pd.Timedelta(microseconds=1))
        return _embedded_world(start.isoformat(), end.isoformat(), self.seed)

    def usage(self, start: datetime, end: datetime, step: str = "5min") -> pd.DataFrame:
        """Canonical samples of [start, end) as the platform's metrics APIs would report them."""
        world = self._world(end)
        if pd.Timestamp(start) < world.start:
            raise ValueError(
                f"platform {self.platform}: the embedded world starts at {world.start.isoformat()}, "
                f"window starts {pd.Timestamp(start).isoformat()}"
            )
        return world.samples(self.platform, start, end)

    def inventory(self, at: datetime) -> list[dict]:
        world = self._world(at)
        return [
            {
                "node": n["name"],
                "gpus": n["gpus"],
                "gpu_model": n["gpu_model"],
                "mig_layout": {"config": n["mig_layout"]} if n.get("mig_layout") else None,
                "schedulable": n["schedulable"],
                "drain_reason": n["drain_reason"] or None,
                "busy_gpus": n["busy_gpus"],
            }
            for n in world.inventory(self.platform, at)
        ]


def _quarter_span(ts: pd.Timestamp) -> tuple[pd.Timestamp, pd.Timestamp]:
    q = ts.tz_convert("UTC").tz_localize(None).to_period("Q")
    start = q.start_time.tz_localize("UTC") - _LEAD
    end = (q + 1).start_time.tz_localize("UTC")
    return start, end


@lru_cache(maxsize=4)
def _embedded_world(start: str, end: str, seed: int):
    from gpupool.sim.world import default_world

    return default_world(start, end, seed=seed)


def build_source(pcfg: PlatformConfig, cfg: GpupoolConfig, lookup=None):
    """The source object for one configured platform; `lookup(conn_id)` is Airflow's
    connection lookup inside a task, else connections come from the environment."""
    if pcfg.kind == "simulator":
        return EmbeddedWorldSource(pcfg.name, seed=cfg.simulator.seed)
    from gpupool.sources.factory import source_for

    return source_for(pcfg, os.environ, lookup)
