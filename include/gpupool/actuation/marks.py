"""The marks gpupool leaves on a platform when it holds a node, defined once.

A leaf (no import from the package): the actuators write these marks and check them before they
lift a hold, and the platform-API emulator (:mod:`gpupool.emulator`) plays them back as the real
platforms would, so neither needs the other. The Kubernetes annotation that carries the reason is
:data:`gpupool.k8s_keys.HOLD_ANNOTATION`.
"""

from __future__ import annotations

#: every drain / cordon / disable reason gpupool writes starts with this
REASON_PREFIX = "gpupool:"
#: the Placement trait gpupool puts on a resource provider whose GPU inventory it reserved: the
#: marker that says gpupool, not an operator, reserved it
HELD_TRAIT = "CUSTOM_GPUPOOL_HELD"


def is_gpupool_reason(reason: str | None) -> bool:
    """Whether a hold reason was written by gpupool."""
    return bool(reason) and reason.strip().startswith(REASON_PREFIX)


def moving_reason(target: str) -> str:
    """The hold reason gpupool writes on a node it releases towards ``target``."""
    return f"{REASON_PREFIX} moving to {target}"
