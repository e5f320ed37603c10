"""NVML: node-local GPUs of a pool node that no platform manages yet.

Reads the GPUs, their MIG slices, running compute processes, utilisation and memory
through `nvidia-ml-py` (`pynvml`). NVML only knows the present: `snapshot(at)` records
it; `usage` for a window raises, because no history exists to recover. Beside the snapshot's
rows, a health series per metric says how the read was made: how old the read is at the
snapshot's instant, and whether an NVML call for a device failed (its value not trusted).
"""

from __future__ import annotations

import time
from datetime import datetime
from types import ModuleType
from typing import Any, Callable

import pandas as pd

from gpupool import mig as mig_table
from gpupool.canonical import HEALTH_ENTITY_KIND, HEALTH_METRICS, health_target, normalize_samples
from gpupool.sources.base import Pressure, SourceError, as_utc, format_window, inventory_record, pressure_from_records

_ENDPOINT = "libnvidia-ml (NVML)"


class NvmlSource:
    """The GPUs of this host as NVML reports them.

    platform: configured platform instance name (e.g. "pool-bare")
    node: the host's name in the pool
    nvml: the NVML binding module; None imports `pynvml` (nvidia-ml-py)
    clock: seconds since the epoch now (the time a read is taken); `time.time` by default
    """

    def __init__(self, platform: str, *, node: str, cluster: str = "", nvml: ModuleType | Any = None,
                 clock: Callable[[], float] = time.time):
        if nvml is None:
            import pynvml as nvml  # noqa: PLC0415 - only needed on a host with a GPU
        self.platform = platform
        self.node = node
        self.cluster = cluster
        self._nvml = nvml
        self._clock = clock

    def _read(self, window: str) -> list[dict[str, Any]]:
        """One dict per physical GPU: index, name, uuid, lost, mig slices, busy, util, mem_used,
        ``failed`` (the measuring calls that raised NVMLError, by the value they read) and
        ``read_at`` (the clock when its calls were done)."""
        nv = self._nvml
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            raise SourceError(self.platform, _ENDPOINT, window, f"nvmlInit failed: {exc}",
                              retryable=exc.value in (nv.NVML_ERROR_TIMEOUT, nv.NVML_ERROR_UNKNOWN)) from exc
        try:
            gpus = []
            for i in range(nv.nvmlDeviceGetCount()):
                gpus.append(self._read_gpu(i, window))
            return gpus
        except nv.NVMLError as exc:
            raise SourceError(self.platform, _ENDPOINT, window, f"NVML error: {exc}") from exc
        finally:
            try:
                nv.nvmlShutdown()
            except nv.NVMLError:
                pass  # nothing more to release

    def _read_gpu(self, i: int, window: str) -> dict[str, Any]:
        nv = self._nvml
        gpu: dict[str, Any] = {"index": i, "lost": None, "mig": {}, "busy": False, "util": None, "mem_used": None,
                               "name": None, "uuid": None, "failed": {}, "read_at": None}
        try:
            self._read_device(gpu, i)
        finally:
            gpu["read_at"] = self._clock()
        return gpu

    def _read_device(self, gpu: dict[str, Any], i: int) -> None:
        nv = self._nvml
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(i)
            gpu["name"] = _text(nv.nvmlDeviceGetName(handle))
            gpu["uuid"] = _text(nv.nvmlDeviceGetUUID(handle))
        except (nv.NVMLError_GpuIsLost, nv.NVMLError_ResetRequired) as exc:
            gpu["lost"] = str(exc)
            return
        mig_on = False
        try:
            current, _pending = nv.nvmlDeviceGetMigMode(handle)
            mig_on = current == nv.NVML_DEVICE_MIG_ENABLE
        except nv.NVMLError_NotSupported:
            pass  # not a MIG-capable GPU
        except nv.NVMLError_GpuIsLost as exc:
            gpu["lost"] = str(exc)
            return
        reads = [("busy", lambda: len(nv.nvmlDeviceGetComputeRunningProcesses(handle)) > 0),
                 ("mem_used", lambda: float(nv.nvmlDeviceGetMemoryInfo(handle).used))]
        reads.append(("mig", lambda: self._mig_slices(handle)) if mig_on else
                     ("util", lambda: float(nv.nvmlDeviceGetUtilizationRates(handle).gpu)))
        for key, read in reads:
            try:
                gpu[key] = read()
            except nv.NVMLError_GpuIsLost as exc:
                gpu["lost"] = str(exc)
                return
            except nv.NVMLError as exc:
                # the device answered its identity but not this measurement: the snapshot
                # says so in its health series rather than losing the node's other readings
                gpu["failed"][key] = str(exc)

    def _mig_slices(self, handle: Any) -> dict[str, int]:
        """MIG profile -> count of instances, e.g. {"1g.10gb": 7}, from the MIG device names."""
        nv = self._nvml
        slices: dict[str, int] = {}
        for j in range(nv.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, j)
            except nv.NVMLError_NotFound:
                continue  # an empty slot
            profile = mig_table.profile_in(_text(nv.nvmlDeviceGetName(mig))) or "unknown"
            slices[profile] = slices.get(profile, 0) + 1
        return slices

    def inventory(self, at: datetime) -> list[dict[str, Any]]:
        """One record for this node; a lost GPU makes it unschedulable with the reason. Raises
        SourceError when the busy state or MIG slices of a GPU could not be read."""
        window = format_window(as_utc(at, "at"))
        gpus = self._read(window)
        failed = [f"GPU {g['index']} {k}: {e}" for g in gpus for k, e in g["failed"].items() if k in ("busy", "mig")]
        if failed:
            raise SourceError(self.platform, _ENDPOINT, window, f"NVML error: {'; '.join(failed)}")
        if not gpus:
            return []
        lost = [f"GPU {g['index']}: {g['lost']}" for g in gpus if g["lost"]]
        slices: dict[str, int] = {}
        for g in gpus:
            for k, v in g["mig"].items():
                slices[k] = slices.get(k, 0) + v
        names = [g["name"] for g in gpus if g["name"]]
        return [
            inventory_record(
                node=self.node,
                platform=self.platform,
                gpus=len(gpus),
                gpu_model=names[0] if names else None,
                mig_layout=slices or None,
                schedulable=not lost,
                drain_reason="; ".join(lost) or None,
                busy_gpus=sum(1 for g in gpus if g["busy"]),
            )
        ]

    def pressure(self, at: datetime) -> Pressure:
        """This node's pressure: capacity = its GPUs when none is lost (a node with a lost GPU
        is not open to work), allocated = GPUs with a compute process, pending 0 (a bare node
        has no queue), idle when open and nothing runs."""
        at = as_utc(at, "at")
        prov = {k: _ENDPOINT for k in ("nodes", "gpus_allocated", "gpus_capacity")}
        prov["gpus_pending"] = "none: a bare node has no queue"
        return pressure_from_records(self.platform, at, self.inventory(at), pending=0.0, provenance=prov,
                                     notes=("a bare node has no queue: pending is 0",))

    def snapshot(self, at: datetime) -> pd.DataFrame:
        """Capacity and busy GPUs of the node, utilisation and memory per GPU, stamped `at`.

        A lost GPU counts in capacity but has no per-GPU rows; a MIG-enabled GPU has no
        utilisation row (NVML does not report whole-GPU utilisation in MIG mode). A GPU whose
        measuring call failed has no row of that value (its busy state counts as idle).

        Beside them, per staged metric, a health series (entity kind ``HEALTH_ENTITY_KIND``,
        entity id ``health_target(metric)``) stamped `at`: ``health_up`` 0 when an NVML call
        reading that metric failed for some GPU (the node's value is then not trusted), and
        ``health_sample_age_seconds``, `at` less the time the oldest GPU's read was taken
        (negative when the read was taken after `at`).
        """
        at = as_utc(at, "at")
        window = format_window(at)
        gpus = self._read(window)
        rows = [
            ("node", self.node, "gpu_capacity", float(len(gpus)), "gpus"),
            ("node", self.node, "gpu_allocated", float(sum(1 for g in gpus if g["busy"])), "gpus"),
        ]
        for g in gpus:
            gid = f"{self.node}/{g['index']}"
            if g["util"] is not None and not g["lost"]:
                rows.append(("gpu", gid, "gpu_util", g["util"], "percent"))
            if g["mem_used"] is not None and not g["lost"]:
                rows.append(("gpu", gid, "gpu_mem_used", g["mem_used"], "bytes"))
        rows += self._health(at, gpus, {r[2] for r in rows})
        frame = pd.DataFrame(
            [(self.platform, self.cluster, k, e, m, at, v, u) for k, e, m, v, u in rows],
            columns=["platform", "cluster", "entity_kind", "entity_id", "metric", "ts", "value", "unit"],
        )
        return normalize_samples(frame, where=f"{self.platform} nvml snapshot [{window}]")

    def _health(self, at: datetime, gpus: list[dict[str, Any]], staged: set[str]) -> list[tuple]:
        """Health rows (kind, id, metric, value, unit) of the metrics read by ``gpus``."""
        taken = min((g["read_at"] for g in gpus), default=None)
        age = at.timestamp() - (self._clock() if taken is None else taken)
        rows = []
        for metric, key in _READ_BY.items():
            failed = key is not None and any(key in g["failed"] for g in gpus)
            if metric not in staged and not failed:
                continue
            target = health_target(metric)
            rows.append((HEALTH_ENTITY_KIND, target, "health_up", 0.0 if failed else 1.0, HEALTH_METRICS["health_up"]))
            rows.append((HEALTH_ENTITY_KIND, target, "health_sample_age_seconds", round(age, 6),
                         HEALTH_METRICS["health_sample_age_seconds"]))
        return rows

    def usage(self, start: datetime, end: datetime, step: str = "5min") -> pd.DataFrame:
        """NVML keeps no history: always raises SourceError naming the window."""
        raise SourceError(self.platform, _ENDPOINT, format_window(start, end),
                          "the window cannot be recovered: NVML reports only the present; "
                          "record snapshot(at) every run instead", unrecoverable=True)


#: canonical metric -> the per-GPU reading it is made of (a key of `_read`'s ``failed``); None:
#: the count of devices, which no measuring call makes
_READ_BY = {"gpu_capacity": None, "gpu_allocated": "busy", "gpu_util": "util", "gpu_mem_used": "mem_used"}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
