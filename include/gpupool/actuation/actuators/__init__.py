"""Per-platform actuators: release a node at its source, attach it at its target.

``base`` holds the shared interface and safety rules; ``slurm``, ``openstack`` and
``kubernetes`` speak to the real platforms; ``simulator`` acts on an in-process World.
Platform modules import their client libraries lazily, so importing this package is cheap.
"""

from gpupool.actuation.actuators.base import (
    REASON_PREFIX,
    ActuationError,
    Actuator,
    Command,
    ForeignHoldError,
    OwnerState,
    is_gpupool_reason,
    moving_reason,
)

__all__ = [
    "REASON_PREFIX", "ActuationError", "Actuator", "Command", "ForeignHoldError", "OwnerState",
    "is_gpupool_reason", "moving_reason",
]
