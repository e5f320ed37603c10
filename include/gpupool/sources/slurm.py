"""Slurm: usage history from Prometheus (Slurm + DCGM exporters), node state from Slurm.

History comes from `query_range` over the configured PromQL per canonical metric
(`DEFAULT_SLURM_QUERIES`). Node state comes from Slurm itself: `sinfo --json` (the
22.05+ data parser, the same node objects slurmrestd serves) run with an explicit
`SLURM_CONF`, or slurmrestd's `/slurm/<version>/nodes` when `restd_url` is given: an
`http(s)://` URL (with a JWT in `restd_token`) or `unix:/path/to/slurmrestd.sock` (local auth).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Mapping, Sequence

import pandas as pd

from gpupool.canonical import normalize_samples
from gpupool.sources.base import (
    NodeShard,
    PermanentError,
    Pressure,
    RetryPolicy,
    SourceError,
    TransientError,
    as_utc,
    call_with_retry,
    format_window,
    inventory_record,
    pressure_from_records,
)
from gpupool.sources.prometheus import (
    DEFAULT_CHUNK_POINTS,
    MetricQuery,
    PrometheusReader,
    TargetHealth,
    as_query_tuple,
)
from gpupool.sources.slurmrestd import SlurmRestd

#: the Prometheus scrape jobs of the Slurm exporter and of the exporter of pending GPUs, whose
#: `up`, `scrape_samples_scraped` and sample times say how the demand readings were made
SLURM_EXPORTER_JOB = "slurm-exporter"
PENDING_EXPORTER_JOB = "slurm-pending-exporter"

#: PromQL per canonical metric for the Slurm exporter's node-labelled `gpus` collector
#: (`slurm_gpus_total` / `slurm_gpus_alloc` with `node`, `model` labels) and the DCGM
#: exporter with Slurm job mapping (`Hostname`, `gpu`, `hpc_job` labels). Pending GPUs
#: are not exported by the common Slurm exporters: `slurm_partition_gpus_pending` is the
#: gauge the project's own exporter/simulator writes; point `gpu_pending` elsewhere if a
#: site exports it under another name. GPU series are aggregated over `hpc_job` because
#: the DCGM exporter starts a new series each time the job on a GPU changes.
DEFAULT_SLURM_QUERIES: dict[str, MetricQuery | tuple[MetricQuery, ...]] = {
    "gpu_capacity": MetricQuery("sum by (node) (slurm_gpus_total)", "node", "{node}", node_label="node"),
    "gpu_allocated": MetricQuery("sum by (node) (slurm_gpus_alloc)", "node", "{node}", node_label="node",
                                 health=TargetHealth(up=f'up{{job="{SLURM_EXPORTER_JOB}"}}',
                                                     stamp="min(timestamp(slurm_gpus_alloc))",
                                                     scraped=f'scrape_samples_scraped{{job="{SLURM_EXPORTER_JOB}"}}')),
    "gpu_pending": MetricQuery("sum by (partition) (slurm_partition_gpus_pending)", "partition", "{partition}",
                               health=TargetHealth(up=f'up{{job="{PENDING_EXPORTER_JOB}"}}',
                                                   stamp="min(timestamp(slurm_partition_gpus_pending))",
                                                   scraped=f'scrape_samples_scraped{{job="{PENDING_EXPORTER_JOB}"}}')),
    "gpu_util": (
        MetricQuery("max by (Hostname, gpu) (DCGM_FI_DEV_GPU_UTIL)", "gpu", "{Hostname}/{gpu}", node_label="Hostname"),
        # a job may span nodes of several shards: its average is read once, platform-wide
        MetricQuery('avg by (hpc_job) (DCGM_FI_DEV_GPU_UTIL{hpc_job!=""})', "job", "{hpc_job}"),
    ),
    # DCGM reports framebuffer in MiB; canonical unit is bytes.
    "gpu_mem_used": MetricQuery("max by (Hostname, gpu) (DCGM_FI_DEV_FB_USED) * 1048576", "gpu", "{Hostname}/{gpu}",
                                node_label="Hostname"),
}

_GRES_ITEM = re.compile(r"^(?P<name>[^:(,]+)(?::(?P<type>[^:(,]+))?(?::(?P<count>\d+))?(?P<rest>\(.*\))?$")


def parse_gres(text: str | None, name: str = "gpu") -> tuple[int, str | None]:
    """GPU count and type from a Slurm GRES string like "gpu:a100:4(S:0),shard:8".

    Returns (0, None) for "", "(null)" or a GRES list without `name`.
    """
    if not text or text in ("(null)", "N/A"):
        return 0, None
    count, model = 0, None
    # Split on commas outside parentheses ("gpu:a100:2(IDX:0,2)").
    for item in re.split(r",(?![^()]*\))", text):
        m = _GRES_ITEM.match(item.strip())
        if not m or m.group("name") != name:
            continue
        typ, cnt = m.group("type"), m.group("count")
        if cnt is None and typ is not None and typ.isdigit():
            typ, cnt = None, typ
        count += int(cnt) if cnt is not None else 1
        if typ and typ not in ("no_consume",):
            model = model or typ
    return count, model


def job_gpus(job: Mapping[str, Any], name: str = "gpu") -> int:
    """GPUs a job asks for, from squeue/slurmrestd job fields.

    tres_per_job ("gres:gpu:4") counts for the whole job; tres_per_node is multiplied by
    the node count and tres_per_task by the task count.
    """
    def count(field: str) -> int:
        text = job.get(field) or ""
        total = 0
        for item in str(text).split(","):
            item = item.strip()
            if item.startswith("gres:") or item.startswith("gres/"):
                item = item[5:]
            n, _ = parse_gres(item.replace("=", ":"), name)
            total += n
        return total

    per_job = count("tres_per_job")
    if per_job:
        return per_job
    per_node = count("tres_per_node")
    if per_node:
        return per_node * max(1, int(job.get("node_count") or 1))
    per_task = count("tres_per_task")
    if per_task:
        return per_task * max(1, int(job.get("tasks") or 1))
    return 0


class SlurmSource:
    """A Slurm cluster: `inventory(at)` from Slurm, `usage(start, end, step)` from Prometheus.

    Parameters
    ----------
    platform: configured platform instance name (first column of every sample)
    prometheus_url, prometheus_token, prometheus_basic_auth: where the exporters' history is
    queries: canonical metric -> MetricQuery (or a tuple of them); defaults to DEFAULT_SLURM_QUERIES
    cluster: value of the cluster column
    slurm_conf: path passed as SLURM_CONF to `sinfo` (None: Slurm's default)
    sinfo, squeue: the Slurm client executables
    restd_url, restd_user, restd_token, restd_version: read nodes and jobs from slurmrestd instead
        of sinfo/squeue; `restd_url` is `http(s)://host:port` or `unix:/path/to/slurmrestd.sock`
    gres_name: the GRES that counts as GPUs
    timeout: seconds per call; retry: RetryPolicy for every call
    live_tolerance: node state is live only; `inventory(at)` refuses an `at` further than
        this from `clock()` (None disables the check, e.g. for a simulated clock)
    """

    def __init__(
        self,
        platform: str,
        *,
        prometheus_url: str | None = None,
        prometheus_token: str | None = None,
        prometheus_basic_auth: tuple[str, str] | None = None,
        queries: Mapping[str, MetricQuery | Sequence[MetricQuery]] | None = None,
        cluster: str = "",
        slurm_conf: str | None = None,
        sinfo: str = "sinfo",
        squeue: str = "squeue",
        restd_url: str | None = None,
        restd_user: str | None = None,
        restd_token: str | None = None,
        restd_version: str = "v0.0.38",
        gres_name: str = "gpu",
        timeout: float = 30.0,
        retry: RetryPolicy = RetryPolicy(),
        live_tolerance: timedelta | None = timedelta(hours=1),
        clock: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
        chunk_points: int = DEFAULT_CHUNK_POINTS,
        verify: bool = True,
    ):
        self.platform = platform
        self.cluster = cluster
        self.queries = dict(DEFAULT_SLURM_QUERIES if queries is None else queries)
        unknown = [m for m, q in self.queries.items() if not as_query_tuple(q)]
        if unknown:
            raise ValueError(f"{platform}: empty query for {unknown}")
        self.slurm_conf = slurm_conf
        self.sinfo = sinfo
        self.squeue = squeue
        self.restd_url = restd_url.rstrip("/") if restd_url else None
        self.restd_user = restd_user
        self.restd_version = restd_version
        self._restd = (SlurmRestd(self.restd_url, user=restd_user, token=restd_token, version=restd_version,
                                  timeout=timeout, verify=verify) if self.restd_url else None)
        self.gres_name = gres_name
        self.timeout = timeout
        self.retry = retry
        self.live_tolerance = live_tolerance
        self.clock = clock
        self.verify = verify
        self._prom = (
            PrometheusReader(
                prometheus_url,
                platform=platform,
                bearer_token=prometheus_token,
                basic_auth=prometheus_basic_auth,
                timeout=timeout,
                retry=retry,
                verify=verify,
                chunk_points=chunk_points,
            )
            if prometheus_url
            else None
        )

    # ---------------------------------------------------------------- usage
    def usage(self, start: datetime, end: datetime, step: str = "5min", shard: NodeShard | None = None) -> pd.DataFrame:
        """Canonical samples for `[start, end)` from Prometheus, one query per configured metric
        (with `shard`: one part of them, see `PrometheusReader.read`)."""
        return self._require_prom(start, end).read(self.queries, start, end, step, cluster=self.cluster, shard=shard)

    def node_names(self, start: datetime, end: datetime, step: str = "5min") -> list[str]:
        """The nodes with series in `[start, end)` (what a sharded extraction divides)."""
        return self._require_prom(start, end).node_names(self.queries, start, end, step)

    def _require_prom(self, start: datetime, end: datetime) -> PrometheusReader:
        if self._prom is None:
            raise SourceError(
                self.platform, "prometheus", format_window(start, end),
                "no Prometheus configured: Slurm keeps no usage history of its own",
            )
        return self._prom

    # ------------------------------------------------------------ inventory
    def inventory(self, at: datetime) -> list[dict[str, Any]]:
        """GPU nodes as Slurm sees them now; `at` must be within `live_tolerance` of now."""
        at = as_utc(at, "at")
        window = format_window(at)
        endpoint = self._node_endpoint()
        if self.live_tolerance is not None:
            now = self.clock()
            if abs(now - at) > self.live_tolerance:
                raise SourceError(
                    self.platform, endpoint, window,
                    f"node state is live only and cannot be recovered for {window} "
                    f"(now {format_window(now)}, tolerance {self.live_tolerance})",
                    unrecoverable=True,
                )
        nodes = self._read_nodes(window)
        out = []
        for node in nodes:
            try:
                rec = self._node_record(node)
            except (KeyError, TypeError, ValueError) as exc:
                raise SourceError(self.platform, endpoint, window, f"malformed node object ({exc!r})") from exc
            if rec is not None:
                out.append(rec)
        return sorted(out, key=lambda r: r["node"])

    def snapshot(self, at: datetime) -> pd.DataFrame:
        """Live `gpu_capacity`/`gpu_allocated` per node and `gpu_pending` per partition, stamped `at`.

        Pending GPUs are summed over PENDING jobs of `squeue --json` (GPUs per job from
        tres_per_job, or tres_per_node x nodes, or tres_per_task x tasks); every partition
        of a GPU node gets a row, 0 when nothing waits, so "no demand" is never an absent row.
        """
        at = as_utc(at, "at")
        window = format_window(at)
        records = self.inventory(at)
        nodes = {r["node"]: r for r in records}
        partitions: dict[str, float] = {}
        for node in self._read_nodes(window):
            if node.get("name") in nodes:
                for part in node.get("partitions") or []:
                    partitions.setdefault(part, 0.0)
        for job in self._read_jobs(window):
            if job.get("job_state") != "PENDING":
                continue
            gpus = job_gpus(job, self.gres_name)
            if gpus:
                for part in str(job.get("partition", "")).split(","):
                    partitions[part] = partitions.get(part, 0.0) + gpus
        rows = []
        for r in records:
            rows.append((self.platform, self.cluster, "node", r["node"], "gpu_capacity", at, float(r["gpus"]), "gpus"))
            rows.append((self.platform, self.cluster, "node", r["node"], "gpu_allocated", at, float(r["busy_gpus"]),
                         "gpus"))
        for part, gpus in partitions.items():
            rows.append((self.platform, self.cluster, "partition", part, "gpu_pending", at, gpus, "gpus"))
        frame = pd.DataFrame(rows, columns=["platform", "cluster", "entity_kind", "entity_id", "metric", "ts",
                                            "value", "unit"])
        return normalize_samples(frame, where=f"{self.platform} slurm snapshot [{window}]")

    def pressure(self, at: datetime) -> Pressure:
        """Pressure now: node states from Slurm (sinfo or slurmrestd: which nodes are open and
        idle), allocated and pending GPUs from the Slurm exporter by one instant query each
        (the sums of the `gpu_allocated` and `gpu_pending` queries at `at`).

        Without a Prometheus (or without a `gpu_pending` query) allocation comes from Slurm's
        own `gres_used` and pending from `squeue`'s PENDING jobs, and `provenance` says so.
        `at` must be within `live_tolerance` of now: node state is live only.
        """
        at = as_utc(at, "at")
        records = self.inventory(at)
        window = format_window(at)
        prov = {"nodes": self._node_endpoint(), "gpus_capacity": f"{self._node_endpoint()} (open nodes' GRES)"}
        notes: list[str] = []
        allocated = pending = None
        if self._prom is not None:
            for field_, metric in (("gpus_allocated", "gpu_allocated"), ("gpus_pending", "gpu_pending")):
                queries = as_query_tuple(self.queries[metric]) if metric in self.queries else ()
                if not queries:
                    continue
                expr = f"sum({queries[0].expr})"
                value = self._prom.instant_sum(expr, at, metric)
                prov[field_] = f"{self._prom.url}/api/v1/query {expr}"
                if value is None:
                    notes.append(f"{metric}: the exporter answered no series at {window}; read as 0")
                    value = 0.0
                if field_ == "gpus_allocated":
                    allocated = value
                else:
                    pending = value
        if allocated is None:
            prov["gpus_allocated"] = f"{self._node_endpoint()} (gres_used of open nodes)"
        if pending is None:
            jobs = self._read_jobs(window)
            pending = float(sum(job_gpus(j, self.gres_name) for j in jobs if j.get("job_state") == "PENDING"))
            prov["gpus_pending"] = (self._restd.endpoint("jobs") if self._restd
                                    else f"squeue --json (SLURM_CONF={self.slurm_conf or 'default'})")
        return pressure_from_records(self.platform, at, records, pending=pending, provenance=prov, notes=notes,
                                     allocated=allocated)

    def _read_jobs(self, window: str) -> list[Mapping[str, Any]]:
        endpoint = (self._restd.endpoint("jobs") if self._restd
                    else f"squeue --json (SLURM_CONF={self.slurm_conf or 'default'})")

        def describe(exc: BaseException) -> SourceError:
            return SourceError(self.platform, endpoint, window, str(exc))

        if self._restd:
            fetch = lambda: self._restd.get("jobs")  # noqa: E731
        else:
            fetch = lambda: self._run_json(self.squeue)  # noqa: E731
        return call_with_retry(lambda: _payload_list(fetch(), "jobs"), policy=self.retry, describe=describe)

    def _node_endpoint(self) -> str:
        if self._restd:
            return self._restd.endpoint("nodes")
        return f"sinfo --json (SLURM_CONF={self.slurm_conf or 'default'})"

    def _node_record(self, node: Mapping[str, Any]) -> dict[str, Any] | None:
        gpus, model = parse_gres(node.get("gres"), self.gres_name)
        if gpus == 0:
            return None
        used, _ = parse_gres(node.get("gres_used"), self.gres_name)
        state = node["state"]
        state = state if isinstance(state, str) else ",".join(state)
        flags = [str(f).upper() for f in node.get("state_flags") or []]
        base = state.upper().split("+")[0]
        unavailable = {"DOWN", "FUTURE", "UNKNOWN", "ERROR"}
        drain = "DRAIN" in flags or "DRAIN" in state.upper()
        schedulable = not drain and base not in unavailable and "NOT_RESPONDING" not in flags
        reason = (node.get("reason") or "").strip() or None
        if not schedulable and reason is None:
            reason = "drain" if drain else "not responding" if "NOT_RESPONDING" in flags else state.lower()
        return inventory_record(
            node=node["name"],
            platform=self.platform,
            gpus=gpus,
            gpu_model=model,
            mig_layout=None,
            schedulable=schedulable,
            drain_reason=reason if not schedulable else None,
            busy_gpus=min(used, gpus),
        )

    def _read_nodes(self, window: str) -> list[Mapping[str, Any]]:
        endpoint = self._node_endpoint()

        def describe(exc: BaseException) -> SourceError:
            return SourceError(self.platform, endpoint, window, str(exc))

        fetch = (lambda: self._restd.get("nodes")) if self._restd else self._sinfo_nodes
        return call_with_retry(lambda: _payload_list(fetch(), "nodes"), policy=self.retry, describe=describe)

    def _sinfo_nodes(self) -> Any:
        return self._run_json(self.sinfo)

    def _run_json(self, exe: str) -> Any:
        env = dict(os.environ)
        if self.slurm_conf:
            env["SLURM_CONF"] = self.slurm_conf
        try:
            proc = subprocess.run(
                [exe, "--json"], capture_output=True, text=True, timeout=self.timeout, env=env, check=False
            )
        except FileNotFoundError as exc:
            raise PermanentError(f"{exe} not found") from exc
        except subprocess.TimeoutExpired as exc:
            raise TransientError(f"no answer within {self.timeout}s") from exc
        if proc.returncode != 0:
            detail = " ".join(proc.stderr.split())[:300] or f"exit {proc.returncode}"
            # The controller being unreachable is worth a retry; a bad option or config is not.
            if re.search(r"(?i)unable to contact|connection refused|timed out|communication", detail):
                raise TransientError(f"controller unreachable: {detail}")
            raise PermanentError(detail)
        try:
            return json.loads(proc.stdout)
        except ValueError as exc:
            raise PermanentError(f"malformed payload: {exe} output is not JSON") from exc


def _payload_list(payload: Any, key: str) -> list[Mapping[str, Any]]:
    """The `key` list of a Slurm JSON answer.

    Slurm reports a controller it cannot reach inside the document (`errors`, exit 0),
    so errors there are transient; a document without the list is malformed.
    """
    if not isinstance(payload, dict):
        raise PermanentError(f"malformed payload: no '{key}' list")
    errors = payload.get("errors")
    if errors:
        msgs = "; ".join(
            " ".join(str(e.get(k, "")) for k in ("source", "description", "error") if e.get(k))
            if isinstance(e, dict) else str(e)
            for e in errors
        )
        raise TransientError(f"Slurm reported errors: {msgs[:300]}")
    items = payload.get(key)
    if not isinstance(items, list):
        raise PermanentError(f"malformed payload: no '{key}' list")
    return items
