"""The small interface every power actuator implements: park a node, wake it, read its power.

A power actuator turns "park this node" and "wake this node" into the commands of one means
(Slurm's own power saving, a Redfish BMC, Ironic), optionally behind the platform's own hold (a
Kubernetes cordon, a disabled nova-compute). As the handover actuators do, it splits writes in
two so that the power state machine (:mod:`gpupool.actuation.power.machine`) can write every
command to ``action_audit`` *before* it is sent:

* ``park_commands(node)`` / ``wake_commands(node)`` say what the park or the wake needs sent
  *now*, given what the platform reports: an empty list means "nothing to send, wait" (a drain
  still waiting for work to end, a BMC still powering the node on) or "already there";
* ``send(command)`` sends one of them and returns the platform's answer;
* ``state(node)`` reads the node's power as the platform sees it (a :class:`PowerReading`).

``park(node)`` and ``wake(node)`` send the commands directly, for callers that audit elsewhere.
Every command is idempotent. Nodes are named by their pool ids; ``names`` maps a pool id to the
platform's own name where they differ.

Safety rules every means keeps: gpupool's park hold carries :data:`PARK_REASON`; a node that
someone else drained, cordoned, disabled or powered down (with a reason that is not gpupool's)
is neither parked nor woken (:class:`~gpupool.actuation.actuators.base.ForeignHoldError`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from gpupool.actuation.actuators.base import REASON_PREFIX, ActuationError, Command, ForeignHoldError

#: the hold reason (drain reason, cordon annotation, service disable reason) of a parked node
PARK_REASON = f"{REASON_PREFIX} parked"

ON, OFF, POWERING_ON, POWERING_OFF, UNKNOWN = "on", "off", "powering_on", "powering_off", "unknown"
#: what a means reports of a node's power
POWER_VALUES = (ON, OFF, POWERING_ON, POWERING_OFF, UNKNOWN)


def short(text: Any, limit: int = 300) -> str:
    """One line of at most ``limit`` characters of ``text`` (an answer, an error), control
    characters escaped: what an error message quotes of a platform's answer."""
    s = str(text).replace("\r", "\\r").replace("\n", "\\n")
    s = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in s)
    return s if len(s) <= limit else s[: limit - 1] + "…"


@dataclass(frozen=True)
class PowerReading:
    """A node's power as the platform sees it now.

    ``power``: one of :data:`POWER_VALUES`. ``ready``: the platform would run work on the node
    now (powered, answering, Ready, not held). ``held``: gpupool's park hold is on it.
    ``foreign``: why someone else holds or powered it down (None: nobody). ``busy``: units of
    work still on it.
    """

    platform: str
    node: str
    present: bool
    power: str
    ready: bool = False
    held: bool = False
    foreign: str | None = None
    busy: int = 0
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def state(self) -> str:
        """The node's power state as this reading alone suggests it: ``parked`` (off),
        ``parking`` (powering off, or on under gpupool's park hold), ``waking`` (powering on, or
        on and not ready yet) or ``on``. A powered node under the park hold may as well be one
        woken and not yet released: the state machine decides with its own record beside it."""
        if self.power == OFF:
            return "parked"
        if self.power == POWERING_OFF or (self.power == ON and self.held):
            return "parking"
        if self.power == POWERING_ON or not self.ready:
            return "waking"
        return "on"

    @property
    def parked(self) -> bool:
        """The park is complete: the node is powered off."""
        return self.present and self.power == OFF

    @property
    def woken(self) -> bool:
        """The wake is complete: powered on, ready for work, gpupool's park hold lifted."""
        return self.present and self.power == ON and self.ready and not self.held

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {"platform": self.platform, "node": self.node, "present": self.present, "power": self.power,
                "ready": self.ready, "held": self.held, "foreign": self.foreign, "busy": self.busy,
                "state": self.state, "detail": self.detail}


class PowerActuator:
    """Base of the power actuators: park and wake a platform's nodes by one means.

    Subclasses set ``platform`` and ``means`` and implement ``state``, ``park_commands``,
    ``wake_commands`` and ``send``.
    """

    platform: str = ""
    #: slurm | redfish | ironic (with a hold: kubernetes+redfish, openstack+ironic, ...)
    means: str = ""
    #: the command actions of the means itself (a hold's own commands are not among them)
    actions: tuple[str, ...] = ()

    def __init__(self, names: Mapping[str, str] | None = None):
        self.names = dict(names or {})

    def name_of(self, node: str) -> str:
        """The platform's own name of pool node ``node``."""
        return self.names.get(node, node)

    # ---- reads
    def state(self, node: str) -> PowerReading:
        """The node's power now."""
        raise NotImplementedError

    # ---- writes, as commands
    def park_commands(self, node: str) -> list[Command]:
        """What parking ``node`` needs sent now ([]: wait, or already parked); raises
        :class:`ForeignHoldError` for a node someone else holds."""
        raise NotImplementedError

    def wake_commands(self, node: str) -> list[Command]:
        """What waking ``node`` needs sent now ([]: wait, or already on); raises
        :class:`ForeignHoldError` for a node someone else powered down or holds."""
        raise NotImplementedError

    def send(self, command: Command) -> Any:
        """Send one command; the platform's answer (JSON-ready), or :class:`ActuationError`."""
        raise NotImplementedError

    # ---- direct helpers (unaudited)
    def park(self, node: str) -> list[Any]:
        """Send what parking ``node`` needs now; the answers."""
        return [self.send(c) for c in self.park_commands(node)]

    def wake(self, node: str) -> list[Any]:
        """Send what waking ``node`` needs now; the answers."""
        return [self.send(c) for c in self.wake_commands(node)]

    # ---- shared guard
    def refuse_foreign(self, reading: PowerReading, action: str) -> None:
        """:class:`ForeignHoldError` when someone else holds or powered down the node."""
        if reading.foreign:
            raise ForeignHoldError(
                self.platform, reading.node, action,
                f"held or powered down by someone else ({short(reading.foreign, 120)}); gpupool parks and wakes "
                f"only nodes it holds itself (reason {PARK_REASON!r})")


__all__ = ["PARK_REASON", "ON", "OFF", "POWERING_ON", "POWERING_OFF", "UNKNOWN", "POWER_VALUES", "PowerReading",
           "PowerActuator", "ActuationError", "ForeignHoldError", "Command", "short"]
