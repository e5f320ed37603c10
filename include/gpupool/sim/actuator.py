"""The virtual datacenter: release and attach nodes of an in-process :class:`~gpupool.sim.world.World`.

Release cordons the node in the world with gpupool's reason; it is released once the world
packs no work on it. Attach hands it to this platform (``World.move``: it serves nobody for the
scenario's move latency) and uncordons it. The world keeps one owner per node, so the
"never in two platforms" rule holds by construction; what this actuator exercises is the
handover state machine itself (audit, steps, rollback) on the simulator's clock.

The pipeline's embedded simulator platforms rebuild their world on every run, so acting on it
would be forgotten by the next run: :mod:`gpupool.jobs.allocation` keeps those platforms
dry-run and this actuator serves closed-loop studies and tests that hold one World. It lives
with the simulator (not in ``gpupool.actuation``, which never knows whether a platform is
simulated); :func:`gpupool.platforms.build_actuator` builds it for ``kind: simulator``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import numpy as np

from gpupool.actuation.actuators.base import ActuationError, Actuator, Command, ForeignHoldError, OwnerState
from gpupool.actuation.marks import REASON_PREFIX


class WorldActuator(Actuator):
    """One platform of a World."""

    attach_brings_node = True  # attach moves the node onto this platform

    def __init__(self, world, platform: str):
        if platform not in world.platforms:
            raise ValueError(f"platform {platform!r} is not in the world ({list(world.platforms)})")
        self.world = world
        self.platform = platform

    def _entry(self, node: str) -> dict[str, Any]:
        for e in self.world.pool():
            if e["name"] == node:
                return e
        raise ActuationError(self.platform, node, "read node", "no such node in the world")

    def owner_state(self, node: str) -> OwnerState:
        """Present when this platform owns the node; held when cordoned."""
        e = self._entry(node)
        if e["platform"] != self.platform:
            return OwnerState(self.platform, node, present=False, schedulable=False,
                              detail={"owner": e["platform"], "in_transit": e["in_transit"]})
        if e["drain_reason"]:
            return OwnerState(self.platform, node, present=True, schedulable=False, hold_reason=e["drain_reason"],
                              busy=int(round(e["busy_gpus"])), detail={"in_transit": e["in_transit"]})
        if e["in_transit"]:  # on its way here after an attach: gpupool's own doing
            return OwnerState(self.platform, node, present=True, schedulable=False,
                              hold_reason=f"{REASON_PREFIX} arriving in {e['available_in_minutes']:.0f} min",
                              detail={"in_transit": True})
        return OwnerState(self.platform, node, present=True, schedulable=True, busy=int(round(e["busy_gpus"])),
                          detail={"in_transit": False})

    def work_started(self, node: str, lookback_steps: int = 288) -> list[datetime]:
        """When each GPU's run of work now on ``node`` began (UTC), one entry per busy GPU, as the
        virtual datacenter's APIs date their jobs (:mod:`gpupool.emulator.state`): GPU slot ``k``
        of a node packed with ``b`` GPUs of work is busy while ``k < ceil(b)``, and its run began
        at the first step of the unbroken stretch it has been busy on this platform. Empty when
        the platform does not hold the node, it is in transit or runs nothing."""
        j = self.world._node(node)
        mine = self.world._pidx[self.platform]
        slots: dict[int, int | None] = {}  # busy slot -> first step of its run (None: busy back to the chunk's start)
        end = self.world.clock_index
        while end > 0:
            begin = max(0, end - lookback_steps)
            busy = np.ceil(self.world.busy_by_node(self.world.index[begin], self._at(end))[j] - 1e-6)
            busy = np.where(self.world.owner_[j, begin:end] == mine, busy, 0.0)
            if end == self.world.clock_index:
                slots = {k: None for k in range(int(busy[-1]))}
            for k in [k for k, first in slots.items() if first is None]:
                idle = np.nonzero(busy <= k)[0]
                slots[k] = begin + int(idle[-1]) + 1 if len(idle) else None
            if all(first is not None for first in slots.values()):
                break
            end = begin
        return [(self.world.start + first * self.world.step).to_pydatetime()
                for first in sorted(first or 0 for first in slots.values())]

    def _at(self, i: int):
        return self.world.index[i] if i < len(self.world.index) else self.world.end

    def is_released(self, node: str) -> bool:
        """Cordoned by gpupool and no work packed on it at the clock."""
        st = self.owner_state(node)
        return st.held_by_gpupool and st.busy == 0

    def release_commands(self, node: str, reason: str) -> list[Command]:
        """Cordon the node with ``reason``."""
        return [Command(self.platform, node, "cordon", {"node": node, "reason": reason})]

    def attach_commands(self, node: str) -> list[Command]:
        """Move the node here (if it is elsewhere) and lift gpupool's cordon."""
        st = self.owner_state(node)
        self.refuse_foreign(st, "uncordon")
        e = self._entry(node)
        cmds = []
        if not st.present:
            cmds.append(Command(self.platform, node, "move", {"node": node, "to": self.platform}))
        if e["drain_reason"]:
            if not st.present and not e["drain_reason"].startswith(REASON_PREFIX):
                raise ForeignHoldError(self.platform, node, "uncordon", f"cordoned by someone else ({e['drain_reason']})")
            cmds.append(Command(self.platform, node, "uncordon", {"node": node}))
        return cmds

    def send(self, command: Command) -> dict[str, Any]:
        """Apply the command to the world at its clock."""
        from gpupool.sim.world import WorldError

        req = command.request
        try:
            if command.action == "cordon":
                self.world.cordon(req["node"], req["reason"])
                return {"cordoned": True}
            if command.action == "move":
                if self._entry(req["node"])["platform"] == req["to"]:
                    return {"moved": False}
                return {"arrive": str(self.world.move(req["node"], req["to"]))}
            if command.action == "uncordon":
                reason = self._entry(command.node)["drain_reason"]
                if reason and not reason.startswith(REASON_PREFIX):
                    raise ForeignHoldError(self.platform, command.node, "uncordon", f"cordoned by someone else ({reason})")
                self.world.uncordon(req["node"])
                return {"cordoned": False}
        except WorldError as exc:
            raise ActuationError(self.platform, command.node, command.action, str(exc)) from exc
        raise ActuationError(self.platform, command.node, command.action, "unknown action")
