"""A platform's own hold around a power means: no work lands on a node while it parks, is off,
or wakes, and the hold is lifted only once the platform reports the node ready again.

* Kubernetes (:class:`KubernetesHold`): the node is cordoned (``spec.unschedulable``, gpupool's
  hold annotation ``gpupool: parked``, the owner label kept on this platform: a parked node
  wakes here) before it is powered off; once powered on, it is uncordoned when its kubelet
  reports the ``Ready`` condition again. A thin layer over the handover's
  :class:`~gpupool.actuation.actuators.kubernetes.KubernetesActuator` (its patch, its reads, its
  refusal of someone else's cordon).
* OpenStack (:class:`OpenStackHold`): the host's nova-compute service is disabled with the
  reason ``gpupool: parked`` and its GPU inventory reserved, exactly as a handover holds it
  (:class:`~gpupool.actuation.actuators.openstack.OpenStackActuator`); once powered on, both
  are lifted when the service reports ``up`` again.

:class:`HeldPower` puts a hold and a means together. Parking: hold first; power off only once
no work is left on the node (GPU pods, Placement allocations), so a park of a node with work
waits (the state machine's deadline reports it) and never cuts work off. Waking: power on,
wait for the platform to see the node ready, lift the hold.
"""

from __future__ import annotations

from typing import Any, Mapping

from gpupool.actuation.power.base import ON, PARK_REASON, Command, ForeignHoldError, PowerActuator, PowerReading
from gpupool.actuation.actuators.base import REASON_PREFIX, OwnerState
from gpupool.k8s_keys import HOLD_ANNOTATION, OWNER_LABEL

_MOVING = f"{REASON_PREFIX} moving to"


class KubernetesHold:
    """Cordon for parking, uncordon when Ready, through a ``KubernetesActuator`` (built without
    a names mapping: it is called with the platform's node names)."""

    kind = "kubernetes"

    def __init__(self, kube):
        self.kube = kube
        self.platform = kube.platform

    def owner(self, name: str) -> OwnerState:
        return self.kube.owner_state(name)

    def hold_commands(self, name: str) -> list[Command]:
        body = {"spec": {"unschedulable": True},
                "metadata": {"labels": {OWNER_LABEL: self.platform}, "annotations": {HOLD_ANNOTATION: PARK_REASON}}}
        return [Command(self.platform, name, "cordon", {"node": name, "patch": body})]

    def release_commands(self, name: str) -> list[Command]:
        return self.kube.attach_commands(name)

    def ready(self, name: str) -> bool:
        """The node's ``Ready`` condition is ``True`` (its kubelet is back)."""
        obj = self.kube._read_node(name)
        conditions = (obj.status.conditions if obj is not None and obj.status else None) or []
        return any(c.type == "Ready" and str(c.status) == "True" for c in conditions)

    def send(self, command: Command) -> Any:
        return self.kube.send(command)


class OpenStackHold:
    """Disable nova-compute and reserve the GPU inventory for parking, lift both when the
    service is up again, through an ``OpenStackActuator`` (built without a names mapping)."""

    kind = "openstack"

    def __init__(self, openstack):
        self.os = openstack
        self.platform = openstack.platform

    def owner(self, name: str) -> OwnerState:
        return self.os.owner_state(name)

    def hold_commands(self, name: str) -> list[Command]:
        return self.os.release_commands(name, PARK_REASON)

    def release_commands(self, name: str) -> list[Command]:
        return self.os.attach_commands(name)

    def ready(self, name: str) -> bool:
        """The host's nova-compute reports ``up`` (always, where gpupool does not manage it)."""
        if not self.os.manage_compute_service:
            return True
        svc = self.os._compute_service(name, "read service")
        return svc is not None and str(getattr(svc, "state", "")) == "up"

    def send(self, command: Command) -> Any:
        return self.os.send(command)


class HeldPower(PowerActuator):
    """A power means (Redfish, Ironic) behind a platform's hold (Kubernetes, OpenStack)."""

    def __init__(self, hold, means: PowerActuator, names: Mapping[str, str] | None = None):
        super().__init__(names if names is not None else means.names)
        self.hold, self.inner = hold, means
        self.platform = means.platform
        self.means = f"{hold.kind}+{means.means}"
        self.actions = tuple(means.actions)

    def _parking_hold(self, o: OwnerState) -> bool:
        return o.held_by_gpupool and not str(o.hold_reason or "").startswith(_MOVING)

    # ---- reads
    def state(self, node: str) -> PowerReading:
        """The means' power reading, with the platform's hold, work and readiness beside it."""
        r = self.inner.state(node)
        name = self.name_of(node)
        o = self.hold.owner(name)
        held = self._parking_hold(o)
        foreign = r.foreign or (o.hold_reason if o.foreign_hold else None) or (
            o.hold_reason if o.held_by_gpupool and not held else None)
        platform_ready = r.power == ON and o.present and self.hold.ready(name)
        return PowerReading(self.platform, node, present=r.present and o.present, power=r.power,
                            ready=platform_ready and o.schedulable, held=held, foreign=foreign, busy=o.busy,
                            detail={**r.detail, "hold_reason": o.hold_reason, "schedulable": o.schedulable,
                                    "platform_ready": platform_ready, "platform_name": name})

    # ---- writes
    def _ours(self, cmds: list[Command], node: str) -> list[Command]:
        return [Command(c.platform, node, c.action, c.request) for c in cmds]

    def park_commands(self, node: str) -> list[Command]:
        """The hold first; the power-off once no work is left on the node."""
        name = self.name_of(node)
        o = self.hold.owner(name)
        if not o.present:
            return []
        if o.foreign_hold:
            raise ForeignHoldError(self.platform, node, "park", f"held by someone else ({o.hold_reason})")
        if o.held_by_gpupool and not self._parking_hold(o):
            raise ForeignHoldError(self.platform, node, "park", f"held by gpupool for a handover ({o.hold_reason})")
        if not o.held_by_gpupool:
            return self._ours(self.hold.hold_commands(name), node)
        if o.busy:
            return []  # work still on the node: the power-off waits for it to end
        return self.inner.park_commands(node)

    def wake_commands(self, node: str) -> list[Command]:
        """Power on; once the platform reports the node ready, lift gpupool's hold."""
        r = self.inner.state(node)
        self.refuse_foreign(r, "wake")
        if r.power != ON:
            return self.inner.wake_commands(node)
        name = self.name_of(node)
        if not self.hold.ready(name):
            return []  # booting: the kubelet / nova-compute is not back yet
        o = self.hold.owner(name)
        if o.foreign_hold:
            raise ForeignHoldError(self.platform, node, "wake",
                                   f"powered on, but held by someone else now ({o.hold_reason}); left as it is")
        if o.held_by_gpupool:
            return self._ours(self.hold.release_commands(name), node)
        return []

    def send(self, command: Command) -> Any:
        """The means' commands to the means; the hold's to the platform, in its own node names."""
        if command.action in self.inner.actions:
            return self.inner.send(command)
        return self.hold.send(Command(command.platform, self.name_of(command.node), command.action, command.request))
