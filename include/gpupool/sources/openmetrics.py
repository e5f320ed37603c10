"""Exporter-shaped history as OpenMetrics text, for `promtool tsdb create-blocks-from openmetrics`.

Prometheus can only be given history by backfilling blocks. `write_openmetrics` writes
any set of gauge series in the form promtool accepts (a `# TYPE` line per family, each
family's samples together, each series in time order, timestamps in seconds, `# EOF`).
`exporter_history` makes the series a Slurm cluster's exporters would have produced:
the Slurm exporter's per-node GPU gauges and pending GPUs per partition, and the DCGM
exporter's per-GPU fields labelled with the Slurm job (`hpc_job`) running on the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Iterable, Iterator, TextIO

import numpy as np

from gpupool.sources.base import as_utc, step_seconds

#: DCGM fields written besides utilisation and framebuffer (for wider benchmarks)
EXTRA_DCGM_FIELDS = ("DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_SM_CLOCK")


@dataclass
class Series:
    """One gauge series: labels, timestamps (epoch seconds) and values of equal length."""

    labels: dict[str, str]
    ts: np.ndarray
    values: np.ndarray


@dataclass
class Family:
    """All series of one metric name."""

    name: str
    help: str
    series: list[Series] = field(default_factory=list)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _render_labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(str(v))}"' for k, v in sorted(labels.items())) + "}"


def write_openmetrics(out: TextIO, families: Iterable[Family]) -> int:
    """Write `families` as OpenMetrics gauges to `out`; returns the number of samples."""
    n = 0
    for fam in families:
        out.write(f"# HELP {fam.name} {fam.help}\n# TYPE {fam.name} gauge\n")
        for s in fam.series:
            if len(s.ts) != len(s.values):
                raise ValueError(f"{fam.name}{s.labels}: {len(s.ts)} timestamps, {len(s.values)} values")
            order = np.argsort(s.ts, kind="stable")
            prefix = fam.name + _render_labels(s.labels) + " "
            lines = [f"{prefix}{v:.6g} {int(t)}\n" for t, v in zip(s.ts[order], s.values[order])]
            out.writelines(lines)
            n += len(lines)
    out.write("# EOF\n")
    return n


@dataclass(frozen=True)
class ClusterShape:
    """The synthetic cluster `exporter_history` describes."""

    nodes: int = 4
    gpus_per_node: int = 8
    partition: str = "gpu"
    gpu_model: str = "NVIDIA A100-SXM4-80GB"
    node_prefix: str = "gpu"
    job_steps: int = 30  # a job holds a GPU for this many steps
    extra_dcgm: bool = False  # also write EXTRA_DCGM_FIELDS

    def node_name(self, i: int) -> str:
        """Name of node i, e.g. gpu0001."""
        return f"{self.node_prefix}{i:04d}"


def exporter_history(
    shape: ClusterShape, start: datetime, end: datetime, step: str = "1min", seed: int = 0
) -> tuple[list[Family], dict[str, np.ndarray]]:
    """Synthetic Slurm + DCGM exporter series for `[start, end)` on the epoch grid of `step`.

    Returns the families to backfill and the truth they encode, as arrays indexed
    `[node, t]` (`alloc`, `total`) or `[node, gpu, t]` (`util`, `fb_mib`), plus `ts`
    (epoch seconds) and `pending` (`[t]`), so tests can compare what a source reads
    back with what was written.
    """
    step_s = step_seconds(step)
    s = int(np.ceil(as_utc(start).timestamp() / step_s) * step_s)
    e = int(as_utc(end).timestamp())
    ts = np.arange(s, e, step_s, dtype=np.int64)
    rng = np.random.default_rng(seed)
    n, g, T = shape.nodes, shape.gpus_per_node, len(ts)
    # GPU j of a node is busy when j < alloc: jobs fill GPUs from index 0, like Slurm's gres.
    walk = rng.integers(-1, 2, size=(n, T)).cumsum(axis=1) + rng.integers(0, g + 1, size=(n, 1))
    alloc = np.clip(walk, 0, g).astype(np.int64)
    busy = np.arange(g)[None, :, None] < alloc[:, None, :]
    util = np.where(busy, rng.uniform(35, 100, size=(n, g, T)), 0.0).round(0)
    fb_mib = np.where(busy, rng.uniform(2_000, 80_000, size=(n, g, T)), 0.0).round(0)
    pending = np.clip(rng.integers(-2, 3, size=T).cumsum() + 8, 0, None).astype(np.int64)
    total = np.full((n, T), g, dtype=np.int64)

    fam_total = Family("slurm_gpus_total", "Total GPUs")
    fam_alloc = Family("slurm_gpus_alloc", "Allocated GPUs")
    fam_pending = Family("slurm_partition_gpus_pending", "GPUs requested by pending jobs")
    fam_pending.series.append(Series({"partition": shape.partition}, ts, pending.astype(float)))
    dcgm = {
        "DCGM_FI_DEV_GPU_UTIL": Family("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %)."),
        "DCGM_FI_DEV_FB_USED": Family("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB)."),
    }
    extra_values = {}
    if shape.extra_dcgm:
        for name in EXTRA_DCGM_FIELDS:
            dcgm[name] = Family(name, f"DCGM field {name}")
            extra_values[name] = rng.uniform(30, 400, size=(n, g, T)).round(0)
    for i in range(n):
        node = shape.node_name(i)
        base = {"node": node, "model": shape.gpu_model}
        fam_total.series.append(Series(base, ts, total[i].astype(float)))
        fam_alloc.series.append(Series(base, ts, alloc[i].astype(float)))
        for j in range(g):
            gl = {
                "gpu": str(j),
                "UUID": f"GPU-{i:04x}{j:04x}-0000-0000-0000-000000000000",
                "device": f"nvidia{j}",
                "modelName": shape.gpu_model,
                "Hostname": node,
            }
            # One series per (GPU, job): the hpc_job label changes when the job does.
            for lo, hi, job in _job_segments(busy[i, j], shape.job_steps, base_id=(i * g + j) * 10_000):
                labels = dict(gl, hpc_job=job)
                sl = slice(lo, hi)
                dcgm["DCGM_FI_DEV_GPU_UTIL"].series.append(Series(labels, ts[sl], util[i, j, sl]))
                dcgm["DCGM_FI_DEV_FB_USED"].series.append(Series(labels, ts[sl], fb_mib[i, j, sl]))
                for name, vals in extra_values.items():
                    dcgm[name].series.append(Series(labels, ts[sl], vals[i, j, sl]))
    truth = {"ts": ts, "alloc": alloc, "total": total, "util": util, "fb_mib": fb_mib, "pending": pending}
    return [fam_total, fam_alloc, fam_pending, *dcgm.values()], truth


def _job_segments(busy: np.ndarray, job_steps: int, base_id: int) -> Iterator[tuple[int, int, str]]:
    """Contiguous runs of the timeline with the hpc_job label of each ("" when idle)."""
    T = len(busy)
    lo = 0
    seq = 0
    while lo < T:
        hi = lo + 1
        while hi < T and busy[hi] == busy[lo] and (not busy[lo] or hi - lo < job_steps):
            hi += 1
        job = str(base_id + seq) if busy[lo] else ""
        seq += 1
        yield lo, hi, job
        lo = hi


def write_exporter_history(
    path: str | Path, shape: ClusterShape, start: datetime, end: datetime, step: str = "1min", seed: int = 0
) -> dict[str, np.ndarray]:
    """Write `exporter_history(...)` to `path` as OpenMetrics; returns its truth arrays."""
    families, truth = exporter_history(shape, start, end, step, seed)
    with open(path, "w", encoding="utf-8") as out:
        truth["samples"] = np.array(write_openmetrics(out, families))
    return truth
