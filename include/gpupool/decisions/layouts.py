"""The pool's nodes as the planner sees them, and what a node serves in a platform's unit.

A platform asks for whole GPUs (``gpu``) or MIG slices of one profile (``1g.10gb``, ...); a
MIG-capable node serves the one or the other depending on its layout. The MIG table itself lives
in :mod:`gpupool.mig`; this module only says what a node in a layout serves.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import json
import math

import pandas as pd

from gpupool import mig
from gpupool.errors import UserError
from gpupool.values import utc

#: the MIG table lives in gpupool.mig; re-exported here for the planner's callers
SLICES_PER_GPU = mig.SLICES_PER_GPU
WHOLE_LAYOUTS = mig.WHOLE_LAYOUTS
GPU_UNIT = "gpu"
#: a layout that is not one profile on every GPU: ``custom:1g.10gb=14,3g.40gb=4`` (instances of each)
CUSTOM_PREFIX = "custom:"


class PlanningError(UserError, ValueError):
    """Inputs the planner cannot plan from (duplicate nodes, demand of unequal horizons, ...)."""


@dataclass(frozen=True)
class NodeRecord:
    """One pool node as the planner sees it.

    ``owner`` is the platform that holds the node — for a node in a handover, the platform it is
    moving to; ``available_in_minutes`` says when such a node can serve (``None``: a whole move).
    ``home`` is the platform that owns it (``platforms[].owns``, ``pool.nodes[].owner``; None:
    nobody's), which the plan's ``lend_limit`` and ``borrow_limit`` count.
    """

    name: str
    owner: str
    gpus: int
    busy_gpus: float = 0.0
    in_handover: bool = False
    last_moved_at: pd.Timestamp | None = None
    mig_capable: bool = False
    mig_layout: str | None = None
    available_in_minutes: float | None = None
    home: str | None = None

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> "NodeRecord":
        """Build from a dict such as a simulator or platform inventory entry."""
        owner = raw.get("owner", raw.get("platform"))
        if owner is None:
            raise PlanningError(f"node {raw.get('name')!r}: no 'owner' (or 'platform')")
        last = raw.get("last_moved_at")
        return cls(
            name=str(raw["name"]),
            owner=str(owner),
            gpus=int(raw["gpus"]),
            busy_gpus=float(raw.get("busy_gpus", 0.0) or 0.0),
            in_handover=bool(raw.get("in_handover", raw.get("in_transit", False))),
            last_moved_at=None if last is None or pd.isna(last) else utc(last),
            mig_capable=bool(raw.get("mig_capable", False)),
            mig_layout=raw.get("mig_layout"),
            available_in_minutes=raw.get("available_in_minutes"),
            home=raw.get("home"),
        )


def node_records(nodes: Iterable[NodeRecord | Mapping[str, Any]]) -> list[NodeRecord]:
    """The pool as :class:`NodeRecord` sorted by name; duplicate names or impossible GPU counts raise."""
    out = [n if isinstance(n, NodeRecord) else NodeRecord.from_mapping(n) for n in nodes]
    dup = sorted(n for n, k in Counter(r.name for r in out).items() if k > 1)
    if dup:
        raise PlanningError(f"nodes: duplicate names {dup[:5]}")
    for r in out:
        if r.gpus <= 0:
            raise PlanningError(f"node {r.name!r}: gpus must be > 0, got {r.gpus}")
        if r.busy_gpus < 0 or r.busy_gpus > r.gpus + 1e-9:
            raise PlanningError(f"node {r.name!r}: busy_gpus {r.busy_gpus} outside 0..{r.gpus}")
    return sorted(out, key=lambda r: r.name)


def units_per_gpu(unit: str) -> int:
    """Slices of ``unit`` one GPU holds when laid out for it (1 for whole GPUs)."""
    return 1 if unit == GPU_UNIT else SLICES_PER_GPU[unit]


def ideal_layout(node: NodeRecord, unit: str) -> str | None:
    """The MIG layout that serves ``unit`` best on ``node`` (unchanged for a non-MIG node)."""
    if not node.mig_capable:
        return node.mig_layout
    return mig.uniform_layout(None if unit == GPU_UNIT else unit)


def node_capacity(node: NodeRecord, unit: str, layout: str | None) -> float:
    """How many requests of ``unit`` ``node`` serves in ``layout``.

    A whole GPU serves one whole-GPU request or one slice request; a GPU laid out as ``all-X``
    serves ``slices(X)`` requests of a profile no bigger than X, and no whole-GPU request.
    """
    if layout in WHOLE_LAYOUTS or not node.mig_capable:
        return float(node.gpus)
    if layout.startswith(CUSTOM_PREFIX):  # the instances big enough for one request each
        if unit == GPU_UNIT:
            return 0.0
        return float(sum(n for p, n in custom_instances(layout).items() if _compute_size(p) >= _compute_size(unit)))
    profile = mig.layout_profile(layout)
    if profile not in SLICES_PER_GPU:
        return 0.0
    if unit == GPU_UNIT:
        return 0.0
    if _compute_size(profile) >= _compute_size(unit):
        return float(node.gpus * SLICES_PER_GPU[profile])
    return 0.0


def _compute_size(profile: str) -> int:
    return int(profile.split("g.", 1)[0])


def custom_instances(layout: str) -> dict[str, int]:
    """Profile -> instances of a ``custom:`` layout."""
    out: dict[str, int] = {}
    for part in layout[len(CUSTOM_PREFIX):].split(","):
        profile, _, n = part.partition("=")
        if profile in SLICES_PER_GPU and n.isdigit():
            out[profile] = out.get(profile, 0) + int(n)
    return out


def _slice_counts(raw: Mapping[str, Any]) -> dict[str, int]:
    """Profile -> instances from a source's slice dict, whatever names the keys use: the profile
    itself (Kubernetes, NVML) or a resource class naming it (``CUSTOM_MIG_1G_10GB``, OpenStack)."""
    out: dict[str, int] = {}
    for key, n in raw.items():
        profile = mig.profile_in(str(key).lower().replace("_", "."))
        try:
            count = int(n)
        except (TypeError, ValueError):
            continue
        if profile in SLICES_PER_GPU and count > 0:
            out[profile] = out.get(profile, 0) + count
    return out


def layout_from_inventory(raw: Any, gpus: int, gpu_model: str | None) -> tuple[int, bool, str | None]:
    """``(physical GPUs, MIG-capable, layout)`` of a node from its inventory row.

    Sources report MIG as slice counts (``{"1g.10gb": 56}``: Kubernetes' ``nvidia.com/mig-*``
    allocatable, NVML's MIG devices, OpenStack's MIG resource classes), or, as Slurm does, as GPUs
    whose GRES type is a profile (``gpu:1g.10gb:56``: ``gpus`` counts slices then). A stored
    ``{"config": name}`` is a layout name as the GPU operator labels it. One profile on every GPU
    is ``all-<profile>``; anything else ``custom:<profile>=<n>,...``. A node that reports slices can
    do MIG whatever its model is called. A MIG-capable node that reports no slices serves whole
    GPUs (``all-disabled``); a node that cannot do MIG has no layout (``None``).
    """
    if isinstance(raw, str) and raw.startswith("{"):
        raw = json.loads(raw)
    capable = mig.is_mig_capable(gpu_model)
    if isinstance(raw, Mapping) and isinstance(raw.get("config"), str):
        return int(gpus), capable, raw["config"]
    counts = _slice_counts(raw) if isinstance(raw, Mapping) else {}
    model_profile = mig.profile_in(gpu_model or "")
    if not counts and model_profile in SLICES_PER_GPU and gpus > 0:  # Slurm: GRES typed by profile
        counts, gpus = {model_profile: int(gpus)}, 0
    if not counts:  # whole GPUs: MIG off where the GPUs could do it
        if isinstance(raw, str) and raw:
            return int(gpus), capable, raw
        return int(gpus), capable, mig.DISABLED if capable else None
    physical = max(int(gpus), sum(math.ceil(n / SLICES_PER_GPU[p]) for p, n in counts.items()))
    if len(counts) == 1:
        (profile, n), = counts.items()
        if n == physical * SLICES_PER_GPU[profile]:
            return physical, True, mig.uniform_layout(profile)
    return physical, True, CUSTOM_PREFIX + ",".join(f"{p}={n}" for p, n in sorted(counts.items()))
