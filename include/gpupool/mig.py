"""NVIDIA Multi-Instance GPU (MIG), defined once for the whole package.

Which GPU models can be partitioned, the MIG profiles and how many instances of each one GPU
holds, the layouts in which a node serves whole GPUs, and the names Kubernetes (the NVIDIA GPU
operator and device plugin) gives layouts and slices. Sources, the planner, the actuators and
the simulator all read these, so a new GPU generation is added here and nowhere else.
"""

from __future__ import annotations

import re

#: GPU model tags that support MIG (matched as substrings of the reported model name)
MIG_MODELS: tuple[str, ...] = ("A100", "A30", "H100", "H200", "H20", "B200", "GB200")

#: MIG profile -> instances of that profile one GPU holds (A100/H100/H200 families)
SLICES_PER_GPU: dict[str, int] = {
    "1g.5gb": 7, "1g.10gb": 7, "1g.12gb": 7, "1g.18gb": 7, "1g.20gb": 4, "1g.24gb": 4,
    "2g.10gb": 3, "2g.20gb": 3, "2g.24gb": 3, "2g.35gb": 3,
    "3g.20gb": 2, "3g.40gb": 2, "3g.47gb": 2, "3g.71gb": 2,
    "4g.20gb": 1, "4g.40gb": 1, "4g.47gb": 1, "4g.71gb": 1,
    "7g.40gb": 1, "7g.80gb": 1, "7g.94gb": 1, "7g.141gb": 1,
}



def check_profile(value: str | None) -> str | None:
    """``value`` if it is None or a known MIG profile (a :data:`SLICES_PER_GPU` key); else ValueError."""
    if value is not None and value not in SLICES_PER_GPU:
        raise ValueError(f"unknown MIG profile {value!r}; known: {', '.join(SLICES_PER_GPU)}")
    return value


#: the layout of a MIG-capable node with MIG off (whole GPUs)
DISABLED = "all-disabled"
#: layouts in which a MIG-capable node serves whole GPUs
WHOLE_LAYOUTS: tuple[str | None, ...] = (None, "", DISABLED)

#: the node label the GPU operator's mig-manager applies, and the state label it writes back
CONFIG_LABEL = "nvidia.com/mig.config"
STATE_LABEL = "nvidia.com/mig.config.state"
#: extended resources of MIG slices are this prefix + the profile (``nvidia.com/mig-1g.10gb``)
RESOURCE_PREFIX = "nvidia.com/mig-"
#: a profile inside a MIG device name ("NVIDIA H100 80GB HBM3 MIG 1g.10gb")
PROFILE_RE = re.compile(r"(\d+g\.\d+gb)")


def is_mig_capable(gpu_model: str | None) -> bool:
    """Whether a GPU model supports MIG partitioning."""
    return any(tag in (gpu_model or "").upper() for tag in MIG_MODELS)


def uniform_layout(profile: str | None) -> str:
    """The layout that cuts every GPU into ``profile`` (``None``: whole GPUs, MIG off)."""
    return DISABLED if not profile else f"all-{profile}"


def layout_profile(layout: str | None) -> str | None:
    """The profile of a uniform layout (``all-1g.10gb`` -> ``1g.10gb``); ``None`` for whole GPUs."""
    if layout in WHOLE_LAYOUTS:
        return None
    return layout[4:] if layout.startswith("all-") else layout


def profile_in(device_name: str) -> str | None:
    """The MIG profile named in a device name, or ``None``."""
    m = PROFILE_RE.search(device_name or "")
    return m.group(1) if m else None


__all__ = ["MIG_MODELS", "SLICES_PER_GPU", "DISABLED", "WHOLE_LAYOUTS", "CONFIG_LABEL", "STATE_LABEL",
           "RESOURCE_PREFIX", "PROFILE_RE", "is_mig_capable", "uniform_layout", "layout_profile", "profile_in"]
