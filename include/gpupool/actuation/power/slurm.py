"""Slurm: park and wake through Slurm's own power saving.

* park: ``scontrol update NodeName=.. State=POWER_DOWN_ASAP Reason="gpupool: parked"``. Slurm
  drains the node, lets its running jobs finish, then runs its ``SuspendProgram`` on it (which
  powers the machine off: IPMI, Redfish, a cloud API — the site's own script) and marks it
  ``POWERED_DOWN``. Slurm knows the node is off: ``sinfo`` shows ``idle~``.
* wake: ``scontrol update NodeName=.. State=POWER_UP``; Slurm runs its ``ResumeProgram`` and
  the node is on again once its slurmd registers (``POWERING_UP`` until then, ``DOWN`` after
  ``ResumeTimeout``). A job sent to a powered-down node wakes it too (Slurm's own wake on
  demand): the state machine sees that as a node woken by the platform.
* reads: ``sinfo --json`` (or slurmrestd's ``/nodes``), through the handover actuator's own
  reading code: the flags ``POWER_DOWN`` (power-down pending, the drain still waiting for
  jobs), ``POWERING_DOWN``, ``POWERED_DOWN``, ``POWERING_UP`` and ``NOT_RESPONDING``.

In Slurm 22.05 a pending ``POWER_DOWN_ASAP`` cannot be taken back (``POWER_UP`` is ignored
until the node is powered down, ``RESUME`` lifts the drain but not the power-down): a wake of
a node still parking waits until it is down, then powers it up. Slurm refuses every power
command while power saving is off (a cluster-wide ``SuspendTime`` of ``INFINITE``); a
partition's ``SuspendTime=INFINITE`` keeps Slurm from powering its nodes down on its own while
gpupool's commands still work.
"""

from __future__ import annotations

from typing import Any, Mapping

from gpupool.actuation.power.base import (
    OFF,
    ON,
    PARK_REASON,
    POWERING_OFF,
    POWERING_ON,
    Command,
    PowerActuator,
    PowerReading,
)
from gpupool.actuation.actuators.base import ForeignHoldError, is_gpupool_reason
from gpupool.actuation.actuators.slurm import SlurmActuator

#: flags of a node Slurm will not run new work on, besides the power flags
_HOLD_FLAGS = {"DRAIN", "DRAINING", "DRAINED", "FAIL", "MAINTENANCE", "REBOOT_REQUESTED"}
_DOWN_STATES = {"down", "future", "unknown"}
ACTIONS = ("power_down_asap", "power_up")


class SlurmPower(PowerActuator):
    """Park and wake the nodes of one Slurm cluster with its power saving.

    ``slurm`` is the cluster's :class:`~gpupool.actuation.actuators.slurm.SlurmActuator` (its
    ``slurm.conf``, client directory, optional slurmrestd): its plumbing runs the commands and
    reads the nodes. ``names``: pool node id -> Slurm node name, where they differ.
    """

    means = "slurm"
    actions = ACTIONS

    def __init__(self, slurm: SlurmActuator, names: Mapping[str, str] | None = None):
        super().__init__(names)
        self.slurm = slurm
        self.platform = slurm.platform

    def _record(self, node: str) -> dict[str, Any] | None:
        return self.slurm._node_record(self.name_of(node))

    # ---- reads
    def state(self, node: str) -> PowerReading:
        """The node's power flags, drain, responsiveness and jobs from ``sinfo --json``."""
        rec = self._record(node)
        if rec is None:
            return PowerReading(self.platform, node, present=False, power="unknown")
        flags = {str(f).upper() for f in rec.get("state_flags") or []}
        base = str(rec.get("state", "")).lower()
        reason = rec.get("reason") or None
        if "POWERED_DOWN" in flags:
            power = OFF
        elif "POWERING_DOWN" in flags:
            power = POWERING_OFF
        elif "POWERING_UP" in flags:
            power = POWERING_ON
        else:
            power = ON
        ours = is_gpupool_reason(reason) and str(reason).strip() == PARK_REASON
        pending = "POWER_DOWN" in flags  # POWER_DOWN_ASAP accepted, the drain still waiting for jobs
        held = ours and (pending or power in (OFF, POWERING_OFF))
        drained = bool(flags & _HOLD_FLAGS)
        foreign = None
        if reason and not ours and (drained or power in (OFF, POWERING_OFF) or pending):
            foreign = reason
        elif base in ("down", "fail") and not ours:
            foreign = reason or f"node {base}"
        busy = len(self.slurm.running_jobs(self.name_of(node)))
        ready = (power == ON and not pending and not drained and "NOT_RESPONDING" not in flags
                 and base not in _DOWN_STATES)
        return PowerReading(self.platform, node, present=True, power=power, ready=ready, held=held, foreign=foreign,
                            busy=busy, detail={"state": base, "flags": sorted(flags), "reason": reason,
                                               "platform_name": self.name_of(node)})

    # ---- writes
    def _argv(self, node: str, *settings: str) -> list[str]:
        return ["scontrol", "update", f"NodeName={self.name_of(node)}", *settings]

    def park_commands(self, node: str) -> list[Command]:
        """``POWER_DOWN_ASAP`` with gpupool's reason, unless Slurm is already powering it down."""
        r = self.state(node)
        if not r.present:
            return []
        self.refuse_foreign(r, "power_down_asap")
        if r.held or r.power in (OFF, POWERING_OFF):
            return []
        if r.detail["reason"] and is_gpupool_reason(r.detail["reason"]) and set(r.detail["flags"]) & _HOLD_FLAGS:
            raise ForeignHoldError(self.platform, node, "power_down_asap",
                                   f"drained by gpupool for another purpose ({r.detail['reason']}); not parked")
        return [Command(self.platform, node, "power_down_asap",
                        {"argv": self._argv(node, "State=POWER_DOWN_ASAP", f"Reason={PARK_REASON}")})]

    def wake_commands(self, node: str) -> list[Command]:
        """``POWER_UP`` of a node gpupool powered down; nothing while Slurm is still powering it
        down (it would ignore the command) or up."""
        r = self.state(node)
        if not r.present:
            return []
        self.refuse_foreign(r, "power_up")
        if r.power == OFF:
            return [Command(self.platform, node, "power_up", {"argv": self._argv(node, "State=POWER_UP")})]
        return []

    def send(self, command: Command) -> dict[str, Any]:
        """Run the command's argv; a power-up re-checks, right before, that the node is gpupool's."""
        if command.action not in ACTIONS:
            from gpupool.actuation.actuators.base import ActuationError

            raise ActuationError(self.platform, command.node, command.action, "unknown action")
        if command.action == "power_up":
            self.refuse_foreign(self.state(command.node), "power_up")
        out = self.slurm._run(list(command.request["argv"]), command.node, command.action)
        return {"stdout": out.strip()}
