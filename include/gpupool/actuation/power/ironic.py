"""Ironic: park and wake OpenStack bare-metal nodes through ``openstacksdk``'s bare-metal power API.

* park: ``conn.baremetal.set_node_power_state(node, "soft power off")`` (or ``"power off"`` with
  ``power_off: force``), while Ironic reports the node ``power on`` and no power change is
  under way; Ironic itself talks to the BMC (IPMI, Redfish, ...);
* wake: ``set_node_power_state(node, "power on")`` while it reports ``power off``;
* state: the node's ``power_state`` and ``target_power_state`` (a change under way).

A node in maintenance (someone else's) is neither parked nor woken. The platform's hold (a
disabled nova-compute and reserved GPU inventory, as a handover holds a node) wraps this in
:mod:`gpupool.actuation.power.holds`. ``ironic_node`` is the pattern of the node's Ironic name
or UUID, ``{node}`` (pool node id) and ``{name}`` (the platform's name) filled in.
"""

from __future__ import annotations

from typing import Any, Mapping

from gpupool.actuation.power.base import (
    OFF,
    ON,
    POWERING_OFF,
    POWERING_ON,
    UNKNOWN,
    ActuationError,
    Command,
    PowerActuator,
    PowerReading,
    short,
)
from gpupool.actuation.power.redfish import fill

ACTIONS = ("ironic_power",)
#: ``power_off`` setting -> Ironic power target
OFF_TARGET = {"graceful": "soft power off", "force": "power off"}


class IronicPower(PowerActuator):
    """Park and wake the bare-metal nodes of one OpenStack cloud through Ironic.

    ``conn`` is an ``openstack.connection.Connection`` (the platform's own); ``ironic_node`` the
    pattern of each node's Ironic name or UUID.
    """

    means = "ironic"
    actions = ACTIONS

    def __init__(self, conn, platform: str = "openstack", ironic_node: str = "{name}", power_off: str = "graceful",
                 names: Mapping[str, str] | None = None):
        super().__init__(names)
        if power_off not in OFF_TARGET:
            raise ValueError(f"power_off must be one of {sorted(OFF_TARGET)}, got {power_off!r}")
        self.conn = conn
        self.platform = platform
        self.ironic_node = ironic_node
        self.off_target = OFF_TARGET[power_off]

    def ironic_id(self, node: str) -> str:
        """The Ironic name or UUID of pool node ``node``."""
        return fill(self.ironic_node, node, self.name_of(node))

    def _call(self, node: str, action: str, fn):
        try:
            return fn()
        except Exception as exc:  # the SDK's own exceptions (HTTP, auth), connection errors
            raise ActuationError(self.platform, node, action, f"Ironic: {type(exc).__name__}: {short(exc)}") from exc

    # ---- reads
    def state(self, node: str) -> PowerReading:
        """``power_state`` / ``target_power_state`` / maintenance of the Ironic node."""
        from openstack import exceptions as ox

        def get():
            try:
                return self.conn.baremetal.get_node(self.ironic_id(node))
            except ox.NotFoundException:
                return None

        obj = self._call(node, "read power", get)
        if obj is None:
            return PowerReading(self.platform, node, present=False, power=UNKNOWN)
        now, target = getattr(obj, "power_state", None), getattr(obj, "target_power_state", None)
        if target and "off" in str(target):
            power = POWERING_OFF
        elif target and "on" in str(target):
            power = POWERING_ON
        elif now == "power on":
            power = ON
        elif now == "power off":
            power = OFF
        else:
            power = UNKNOWN
        foreign = None
        if getattr(obj, "maintenance", False):
            foreign = f"maintenance: {getattr(obj, 'maintenance_reason', None) or 'no reason given'}"
        return PowerReading(self.platform, node, present=True, power=power, ready=power == ON and not foreign,
                            foreign=foreign,
                            detail={"ironic_node": self.ironic_id(node), "power_state": now,
                                    "target_power_state": target, "provision_state": getattr(obj, "provision_state", None)})

    # ---- writes
    def _power(self, node: str, target: str) -> Command:
        return Command(self.platform, node, "ironic_power", {"node": self.ironic_id(node), "target": target})

    def park_commands(self, node: str) -> list[Command]:
        """``soft power off`` (or ``power off``) of a node that is on."""
        r = self.state(node)
        self.refuse_foreign(r, "ironic_power")
        return [self._power(node, self.off_target)] if r.present and r.power == ON else []

    def wake_commands(self, node: str) -> list[Command]:
        """``power on`` of a node that is off."""
        r = self.state(node)
        self.refuse_foreign(r, "ironic_power")
        return [self._power(node, "power on")] if r.present and r.power == OFF else []

    def send(self, command: Command) -> dict[str, Any]:
        """``set_node_power_state`` without waiting (the state machine reads the outcome)."""
        if command.action not in ACTIONS:
            raise ActuationError(self.platform, command.node, command.action, "unknown action")
        req = command.request
        self._call(command.node, command.action,
                   lambda: self.conn.baremetal.set_node_power_state(req["node"], req["target"], wait=False))
        return {"node": req["node"], "target": req["target"]}
