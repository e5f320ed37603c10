"""The NVML node agent: a GPU node of one of the platforms reads its own GPUs through NVML and
stages the readings (``gpupool nvml push``), or serves them to the platform's Prometheus
(``gpupool nvml serve``).

NVML is a collector, not a platform: a bare node has no scheduler to ask for work waiting or
to drain and attach through, so it cannot be lent or borrowed on its own; what NVML adds is
the node's own view of its GPUs (capacity, GPUs running a compute process, utilisation and
memory per GPU) where no DCGM exporter runs, and the health series that say how each read was
made. A pushed reading is one snapshot at one instant: NVML keeps no history, so the agent runs
every step (a systemd timer, cron) and each run stages the instant it was run for.

Rows are staged under the platform's name with ``cluster`` = ``collector_cluster(node)``: each
node's readings are series of their own beside the exporter series the platform's extract
stages for the same node (which that extract replaces without touching the agent's rows), and
its health series vouch for its readings only. They are node and GPU rows, never platform
totals: a platform's demand still comes from its scheduler.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

import pandas as pd
from sqlalchemy.engine import Engine

from gpupool.canonical import COLLECTOR_CLUSTER_PREFIX, collector_cluster
from gpupool.errors import UserError
from gpupool.sources.nvml import NvmlSource
from gpupool.staging import db, loader

#: a snapshot is stamped at one instant: the slice a push replaces is that instant
_INSTANT = timedelta(microseconds=1)
#: the longest node name whose cluster (prefix + name) fits staging's cluster column (128)
MAX_NODE_NAME = 128 - len(COLLECTOR_CLUSTER_PREFIX)


class CollectorError(UserError, ValueError):
    """A node agent asked for something it cannot do (an unknown platform, a bad node name)."""


def check_node(node: str) -> str:
    """The node's name as staged; a name that is empty, holds whitespace or a character that is
    not printable (a terminal escape would reach every listing that shows it) is refused."""
    if not node or not node.isprintable() or any(ch.isspace() for ch in node) or len(node) > MAX_NODE_NAME:
        raise CollectorError(f"--node {node[:60]!r}{'…' if len(node) > 60 else ''}: give the node's name as its "
                             f"platform knows it (printable, no spaces, at most {MAX_NODE_NAME} characters)")
    return node


def step_instant(at: datetime, step: str) -> datetime:
    """``at`` floored to the configured step, so each run's reading lands on the pipeline's grid."""
    return pd.Timestamp(at).floor(pd.Timedelta(step)).to_pydatetime()


def source_for(platform: str, node: str, nvml: Any = None, clock: Callable[[], float] = time.time) -> NvmlSource:
    """The NVML source of this host as the agent of ``node`` on ``platform`` reads it."""
    return NvmlSource(platform, node=check_node(node), cluster=collector_cluster(node), nvml=nvml, clock=clock)


def push(engine: Engine, platform: str, node: str, at: datetime, *, nvml: Any = None,
         clock: Callable[[], float] = time.time) -> dict[str, Any]:
    """Read this host's GPUs now and stage the snapshot stamped ``at`` under ``platform`` and
    ``node``, replacing what an earlier push for the same instant staged (a rerun is
    idempotent). ``nvml`` is the NVML binding (None: ``pynvml``). Raises SourceError when NVML
    cannot be read, nothing staged then; a GPU whose measuring call failed stages the
    readings that worked and ``health_up`` 0 for the metric that did not.
    """
    db.require_migrated(engine)
    source = source_for(platform, node, nvml, clock)
    frame = source.snapshot(at)
    sl = loader.Slice("sample", {"platform": platform, "cluster": source.cluster}, at, at + _INSTANT)
    rows = loader.replace_slice(engine, sl, frame)
    unhealthy = sorted(frame.loc[(frame["metric"] == "health_up") & (frame["value"] == 0), "entity_id"])
    return {"platform": platform, "node": node, "cluster": source.cluster, "at": pd.Timestamp(at).isoformat(),
            "rows": rows, "gpus": int(frame.loc[frame["metric"] == "gpu_capacity", "value"].sum()),
            "unhealthy": unhealthy}


def registry(platform: str, node: str, *, nvml: Any = None, clock: Callable[[], float] = time.time):
    """A prometheus_client registry whose collector reads NVML at each scrape and exposes the
    snapshot: ``gpupool_nvml_<metric>{platform, node, entity_kind, entity}`` per sample row,
    ``gpupool_nvml_health_up`` and ``gpupool_nvml_health_sample_age_seconds`` per metric
    (label ``target``), and ``gpupool_nvml_up`` 0 with no other sample when NVML cannot be read
    at all (the scrape still answers, so Prometheus' own ``up`` stays about the agent)."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import GaugeMetricFamily

    from gpupool.canonical import HEALTH_ENTITY_KIND
    from gpupool.sources.base import SourceError

    source = source_for(platform, node, nvml, clock)

    class NvmlCollector:
        def collect(self):
            up = GaugeMetricFamily("gpupool_nvml_up", "1: NVML answered this scrape's read", labels=["platform", "node"])
            try:
                frame = source.snapshot(datetime.fromtimestamp(clock(), tz=timezone.utc))
            except SourceError:
                up.add_metric([platform, node], 0.0)
                yield up
                return
            up.add_metric([platform, node], 1.0)
            yield up
            samples = frame[frame["entity_kind"] != HEALTH_ENTITY_KIND]
            for metric, rows in samples.groupby("metric", sort=True):
                fam = GaugeMetricFamily(f"gpupool_nvml_{metric}", f"{metric} ({rows['unit'].iloc[0]}) as NVML reads it",
                                        labels=["platform", "node", "entity_kind", "entity"])
                for r in rows.itertuples(index=False):
                    fam.add_metric([platform, node, r.entity_kind, r.entity_id], float(r.value))
                yield fam
            health = frame[frame["entity_kind"] == HEALTH_ENTITY_KIND]
            for metric, rows in health.groupby("metric", sort=True):
                fam = GaugeMetricFamily(f"gpupool_nvml_{metric}", f"{metric} of the read, per metric it vouches for",
                                        labels=["platform", "node", "target"])
                for r in rows.itertuples(index=False):
                    fam.add_metric([platform, node, r.entity_id], float(r.value))
                yield fam

    reg = CollectorRegistry()
    reg.register(NvmlCollector())
    return reg


def serve(platform: str, node: str, host: str = "127.0.0.1", port: int = 9810, *, nvml: Any = None,
          ready: Callable[[str, int], None] | None = None) -> None:
    """Serve ``/metrics`` (the :func:`registry`) on ``host:port`` until interrupted, reading NVML
    at each scrape; ``ready(host, port)`` once the socket is bound (port 0: an ephemeral one)."""
    from gpupool.exposition import serve_registry

    serve_registry(registry(platform, node, nvml=nvml), host, port, "gpupool nvml metrics", ready)
