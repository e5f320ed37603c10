"""Platform sources: each reads one platform through its own API and returns canonical data.

Every source class takes explicit connection parameters (never Airflow) and offers
`inventory(at)` (GPU node records, keys `base.INVENTORY_KEYS`) and
`usage(start, end, step)` (a canonical frame, see `gpupool.canonical`); the live ones
also offer `snapshot(at)` and `pressure(at)` (a cheap instant read for the fast path:
`base.Pressure`). Failures raise `base.SourceError(platform, endpoint, window,
reason)`. Modules are imported on demand: each pulls in its platform's client library.

    slurm.SlurmSource            Prometheus (Slurm + DCGM exporters) + sinfo/squeue or slurmrestd
    openstack.OpenStackSource    Keystone + Placement (+ Nova) + Gnocchi, via openstacksdk
    kubernetes.KubernetesSource  API server (nodes, pods, custom metrics) + Prometheus for history
    nvml.NvmlSource              node-local GPUs through nvidia-ml-py
"""

#: platform kind -> "module:Class", for code that builds sources from configuration
SOURCE_CLASSES = {
    "slurm": "gpupool.sources.slurm:SlurmSource",
    "openstack": "gpupool.sources.openstack:OpenStackSource",
    "kubernetes": "gpupool.sources.kubernetes:KubernetesSource",
    "nvml": "gpupool.sources.nvml:NvmlSource",
}


def source_class(kind: str) -> type:
    """The source class for a platform kind ("slurm", "openstack", "kubernetes", "nvml")."""
    import importlib

    try:
        module, cls = SOURCE_CLASSES[kind].split(":")
    except KeyError:
        raise ValueError(f"unknown platform kind {kind!r}; known: {sorted(SOURCE_CLASSES)}") from None
    return getattr(importlib.import_module(module), cls)
