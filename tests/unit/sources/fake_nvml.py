"""A fake NVML that behaves like libnvidia-ml through the real `pynvml` binding's types.

It exposes the same module surface the source uses, with pynvml's own constants, error
classes (`NVMLError(code)` maps to `NVMLError_GpuIsLost`, ...) and ctypes structures,
and it enforces NVML's rules: calls before `nvmlInit` fail with UNINITIALIZED, init is
reference counted, a bad index is INVALID_ARGUMENT, a lost GPU fails every device call
with GPU_IS_LOST, whole-GPU utilisation is NOT_SUPPORTED in MIG mode, empty MIG slots
are NOT_FOUND, MIG mode on a GPU without MIG is NOT_SUPPORTED.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field

import pynvml


@dataclass
class FakeGpu:
    """One physical GPU as the fake driver knows it."""

    name: str = "NVIDIA A100-SXM4-80GB"
    mem_total: int = 80 * 2**30
    mem_used: int = 0
    util: int = 0
    processes: list[tuple[int, int]] = field(default_factory=list)  # (pid, bytes)
    mig_capable: bool = True
    mig_enabled: bool = False
    mig_profiles: list[str | None] = field(default_factory=list)  # per slot; None = empty slot
    lost: bool = False


class FakeNvml:
    """Build with the GPUs of a host; `module` is what NvmlSource takes as `nvml`."""

    def __init__(self, gpus: list[FakeGpu], init_error: int | None = None):
        self.gpus = gpus
        self.init_error = init_error
        self.init_count = 0
        self.calls: list[str] = []
        self.module = self._build()

    def _check(self) -> None:
        if self.init_count == 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)

    def _gpu(self, handle) -> FakeGpu:
        self._check()
        if not isinstance(handle, tuple) or handle[0] != "gpu":
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.gpus[handle[1]]
        if gpu.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return gpu

    def _build(self) -> types.ModuleType:
        mod = types.ModuleType("fake_pynvml")
        for name in dir(pynvml):  # constants, error classes, structures
            if name.startswith(("NVML_", "NVMLError", "c_nvml")):
                setattr(mod, name, getattr(pynvml, name))
        fake = self

        def logged(fn):
            def wrapper(*args):
                fake.calls.append(fn.__name__)
                return fn(*args)
            wrapper.__name__ = fn.__name__
            setattr(mod, fn.__name__, wrapper)
            return wrapper

        @logged
        def nvmlInit():
            if fake.init_error is not None:
                raise pynvml.NVMLError(fake.init_error)
            fake.init_count += 1

        @logged
        def nvmlShutdown():
            fake._check()
            fake.init_count -= 1

        @logged
        def nvmlDeviceGetCount():
            fake._check()
            return len(fake.gpus)

        @logged
        def nvmlDeviceGetHandleByIndex(index):
            fake._check()
            if not 0 <= index < len(fake.gpus):
                raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            if fake.gpus[index].lost:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
            return ("gpu", index)

        @logged
        def nvmlDeviceGetName(handle):
            if isinstance(handle, tuple) and handle[0] == "mig":
                fake._check()
                parent = fake.gpus[handle[1]]
                return f"{parent.name} MIG {parent.mig_profiles[handle[2]]}"
            return fake._gpu(handle).name

        @logged
        def nvmlDeviceGetUUID(handle):
            fake._gpu(handle)
            return f"GPU-{handle[1]:08x}-fake-0000-0000-000000000000"

        @logged
        def nvmlDeviceGetMigMode(handle):
            gpu = fake._gpu(handle)
            if not gpu.mig_capable:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
            mode = pynvml.NVML_DEVICE_MIG_ENABLE if gpu.mig_enabled else pynvml.NVML_DEVICE_MIG_DISABLE
            return [mode, mode]

        @logged
        def nvmlDeviceGetMaxMigDeviceCount(handle):
            gpu = fake._gpu(handle)
            if not gpu.mig_capable:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
            return 7

        @logged
        def nvmlDeviceGetMigDeviceHandleByIndex(handle, index):
            gpu = fake._gpu(handle)
            if not gpu.mig_enabled:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            if index >= 7:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            if index >= len(gpu.mig_profiles) or gpu.mig_profiles[index] is None:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
            return ("mig", handle[1], index)

        @logged
        def nvmlDeviceGetMemoryInfo(handle):
            gpu = fake._gpu(handle)
            mem = pynvml.c_nvmlMemory_t()
            mem.total, mem.used, mem.free = gpu.mem_total, gpu.mem_used, gpu.mem_total - gpu.mem_used
            return mem

        @logged
        def nvmlDeviceGetUtilizationRates(handle):
            gpu = fake._gpu(handle)
            if gpu.mig_enabled:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
            util = pynvml.c_nvmlUtilization_t()
            util.gpu, util.memory = gpu.util, min(100, gpu.util // 2)
            return util

        @logged
        def nvmlDeviceGetComputeRunningProcesses(handle):
            gpu = fake._gpu(handle)
            out = []
            for pid, used in gpu.processes:
                proc = pynvml.c_nvmlProcessInfo_v3_t()
                proc.pid, proc.usedGpuMemory = pid, used
                out.append(proc)
            return out

        return mod
