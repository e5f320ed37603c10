"""HTTP facades of the virtual datacenter: the platforms' own wire formats over one :class:`World`.

Each facade is a small Starlette app speaking one real API closely enough that the unchanged
client libraries work against it:

* :mod:`.prometheus` — Prometheus HTTP API (DCGM and Slurm exporter series),
* :mod:`.kubernetes` — the core/v1 nodes and pods, eviction, metrics.k8s.io, custom.metrics.k8s.io,
* :mod:`.openstack` — Keystone v3, Placement, Nova os-services/os-hypervisors, Gnocchi,
* :mod:`.slurm` — the slurmrestd v0.0.38 subset, with :mod:`.scontrol` as its command shim,
* :mod:`.control` — the simulator's own clock and provisioning API (moving a released node).

All of them read and change one :class:`~gpupool.emulator.state.SimState`, which keeps the
rules a real datacenter imposes: a drained node takes no new work and empties as its jobs end,
only an empty released node may change platform, a MIG change needs an empty node and takes time.
"""

__all__ = ["SimState", "SimConflict", "SimNotFound", "SimInvalid"]


def __getattr__(name: str):
    # Lazy, so `python -m gpupool.emulator.scontrol` starts without numpy/pandas.
    if name in __all__:
        from gpupool.emulator import state

        return getattr(state, name)
    raise AttributeError(name)
