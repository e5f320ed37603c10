"""An in-memory datacenter for the handover tests: several platforms that all know the pool
nodes, each with its own schedulable flag, hold reason and running work — and faults on demand.

This models what the state machine may rely on from a platform (holds, reasons, work that
ends by itself) so that its safety properties can be checked over thousands of interleavings;
the real platforms are exercised in tests/integration_actuation/.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from gpupool.actuation.actuators.base import ActuationError, Actuator, Command, OwnerState


@dataclass
class Slot:
    """One node as one platform sees it."""

    schedulable: bool
    reason: str | None = None
    jobs: int = 0
    started: list[datetime] = field(default_factory=list)  # when the jobs began, where a test says


@dataclass
class Datacenter:
    """Every platform's view of every pool node."""

    platforms: tuple[str, ...]
    owners: dict[str, str]
    slots: dict[tuple[str, str], Slot] = field(default_factory=dict)

    def __post_init__(self):
        for node, owner in self.owners.items():
            for p in self.platforms:
                here = p == owner
                self.slots[(p, node)] = Slot(schedulable=here, reason=None if here else "gpupool: held for the pool")

    def open_on(self, node: str) -> list[str]:
        """Platforms on which ``node`` accepts work now."""
        return [p for p in self.platforms if self.slots[(p, node)].schedulable]

    def start_job(self, platform: str, node: str, at: datetime | None = None) -> bool:
        """A job lands on the node if the platform may schedule there (begun ``at``, when given)."""
        slot = self.slots[(platform, node)]
        if slot.schedulable:
            slot.jobs += 1
            if at is not None:
                slot.started.append(at)
            return True
        return False

    def finish_jobs(self) -> None:
        """All running work ends."""
        for slot in self.slots.values():
            slot.jobs = 0
            slot.started.clear()


class Fault(Exception):
    """Injected."""


class MemActuator(Actuator):
    """The actuator of one platform of a :class:`Datacenter`.

    ``fail`` holds one-shot faults: ``(action, when)`` with when = "before" (the API refuses,
    nothing changes) or "after" (the change happens but the answer is lost); action "read"
    fails the next read.
    """

    can_evict = True

    def __init__(self, dc: Datacenter, platform: str):
        self.dc = dc
        self.platform = platform
        self.fail: list[tuple[str, str]] = []
        self.sent: list[Command] = []

    def _maybe_fail(self, action: str, when: str) -> None:
        if (action, when) in self.fail:
            self.fail.remove((action, when))
            raise ActuationError(self.platform, "?", action, f"injected fault {when}")

    def owner_state(self, node: str) -> OwnerState:
        self._maybe_fail("read", "before")
        slot = self.dc.slots.get((self.platform, node))
        if slot is None:  # this platform does not know the node (by this name)
            return OwnerState(self.platform, node, present=False, schedulable=False)
        return OwnerState(self.platform, node, present=True, schedulable=slot.schedulable,
                          hold_reason=None if slot.schedulable else slot.reason, busy=slot.jobs)

    def is_released(self, node: str) -> bool:
        st = self.owner_state(node)
        return st.held_by_gpupool and st.busy == 0

    def work_started(self, node: str) -> list[datetime] | None:
        """When the node's jobs began; None when a job was started without a time (unknown)."""
        self._maybe_fail("read", "before")
        slot = self.dc.slots.get((self.platform, node))
        if slot is None or len(slot.started) != slot.jobs:
            return None
        return list(slot.started)

    def release_commands(self, node: str, reason: str) -> list[Command]:
        return [Command(self.platform, node, "drain", {"node": node, "reason": reason})]

    def evict_commands(self, node: str) -> list[Command]:
        slot = self.dc.slots.get((self.platform, node), Slot(False))
        return [Command(self.platform, node, "evict", {"node": node})] if slot.jobs else []

    def attach_commands(self, node: str) -> list[Command]:
        st = self.owner_state(node)
        self.refuse_foreign(st, "resume")
        return [] if st.schedulable else [Command(self.platform, node, "resume", {"node": node})]

    def send(self, command: Command):
        self._maybe_fail(command.action, "before")
        slot = self.dc.slots.get((self.platform, command.node))
        if slot is None:
            raise ActuationError(self.platform, command.node, command.action, "no such node")
        if command.action == "drain":
            slot.schedulable, slot.reason = False, command.request["reason"]
        elif command.action == "resume":
            self.refuse_foreign(self.owner_state(command.node), "resume")
            slot.schedulable, slot.reason = True, None
        elif command.action == "evict":
            slot.jobs = 0
            slot.started.clear()
        self.sent.append(command)
        self._maybe_fail(command.action, "after")
        return {"ok": True}


def make(platforms=("openstack", "slurm", "kubernetes"), owners=None):
    """A datacenter and its actuators."""
    owners = owners or {"n1": "slurm", "n2": "kubernetes", "n3": "openstack"}
    dc = Datacenter(tuple(platforms), dict(owners))
    return dc, {p: MemActuator(dc, p) for p in platforms}


class Interleave:
    """Runs one writer (``inner``) once, inside the ``at``-th platform call (any actuator's read or
    send) another writer (``outer``) makes: the two-writer tests' deterministic interleaving."""

    def __init__(self, acts):
        self.pending, self.calls = None, 0
        for a in acts.values():
            for method in ("owner_state", "send"):
                setattr(a, method, self._wrap(getattr(a, method)))

    def _wrap(self, real):
        def call(*args, **kw):
            if self.pending is not None:
                at, inner = self.pending
                if self.calls == at:
                    self.pending = None
                    inner()
                self.calls += 1
            return real(*args, **kw)
        return call

    def run(self, outer, inner, at: int) -> bool:
        """Run ``outer`` with ``inner`` inside it; whether ``inner`` ran (``outer`` made fewer calls)."""
        self.pending, self.calls = (at, inner), 0
        try:
            outer()
        finally:
            missed, self.pending = self.pending is not None, None
        return not missed
