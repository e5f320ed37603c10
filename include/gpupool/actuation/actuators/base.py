"""The small interface every platform actuator implements, and the safety rules they share.

An actuator turns "release this node" and "attach this node" into the platform's own commands
(``scontrol``, the Kubernetes API, nova/Placement). Writes are split in two so that the
handover state machine can put every command in ``action_audit`` *before* it is sent:

* ``release_commands(node, reason)``, ``evict_commands(node)``, ``prepare_commands(node, layout)``
  and ``attach_commands(node)`` say what would be sent (a list of :class:`Command`);
* ``send(command)`` sends one of them and returns the platform's answer.

Reads are plain methods: ``owner_state(node)`` (who holds the node, why, how busy),
``is_released(node)`` (drained *and* empty of work), ``work_started(node)`` (when each unit of
work on the node began: a reclaim lets borrowed work run a minimum time before it ends it) and
``blocking_budgets(node)`` (the disruption budgets that would refuse ending that work now).
``release(node, reason)`` and ``attach(node)`` send their commands directly, for callers that audit
elsewhere (tests, tools).

Every command is idempotent: sending it twice leaves the platform as sending it once, so a run
that died between "audited" and "answered" can simply send again.

Safety rule shared by all platforms: gpupool marks every hold it places with a reason that
starts with ``gpupool:`` (:mod:`gpupool.actuation.marks`); it never lifts a hold it did not place
(:class:`ForeignHoldError`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Mapping

from gpupool.actuation.marks import REASON_PREFIX, is_gpupool_reason, moving_reason  # noqa: F401 - the shared marks
from gpupool.errors import UserError


class ActuationError(RuntimeError):
    """A platform refused or failed a command; the message names platform, node and action."""

    def __init__(self, platform: str, node: str, action: str, reason: str):
        super().__init__(f"{platform}: {action} of node {node!r} failed: {reason}")
        self.platform = platform
        self.node = node
        self.action = action
        self.reason = reason


class ForeignHoldError(ActuationError):
    """The node is drained/cordoned/disabled by someone else than gpupool: hands off."""


class ActuationConfigError(UserError, ValueError):
    """A platform set to actuate whose connection cannot be turned into an actuator."""


@dataclass(frozen=True)
class Command:
    """One write to a platform: what is sent, in a JSON-ready ``request``."""

    platform: str
    node: str
    action: str
    request: dict[str, Any]


@dataclass(frozen=True)
class OwnerState:
    """How a platform sees a node right now.

    ``present``: the platform knows the node. ``schedulable``: it accepts new work.
    ``hold_reason``: why it does not (drain reason, cordon annotation, service disable reason).
    ``busy``: units of work still running on it (jobs, GPU pods, consumers' allocations).
    """

    platform: str
    node: str
    present: bool
    schedulable: bool
    hold_reason: str | None = None
    busy: int = 0
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def held_by_gpupool(self) -> bool:
        """Not schedulable, and the hold is gpupool's."""
        return self.present and not self.schedulable and is_gpupool_reason(self.hold_reason)

    @property
    def foreign_hold(self) -> bool:
        """Not schedulable because of someone else (an operator, another tool, the platform)."""
        return self.present and not self.schedulable and not is_gpupool_reason(self.hold_reason)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "platform": self.platform,
            "node": self.node,
            "present": self.present,
            "schedulable": self.schedulable,
            "hold_reason": self.hold_reason,
            "busy": self.busy,
            "held_by_gpupool": self.held_by_gpupool,
            "detail": self.detail,
        }


class Actuator:
    """Base of the platform actuators: the command-building contract plus the direct helpers.

    Subclasses set ``platform`` (the configured platform name) and implement
    ``owner_state``, ``is_released``, ``release_commands``, ``attach_commands`` and ``send``;
    ``evict_commands`` and the MIG pair ``prepare_commands`` / ``is_prepared`` default to
    "nothing to do", ``work_started`` to "unknown" (None).
    """

    platform: str = ""
    #: whether this actuator can evict running work (used only when the policy allows it)
    can_evict: bool = False
    #: whether attach itself brings a node the platform does not know yet (provisioning)
    attach_brings_node: bool = False
    #: whether the platform takes a node out of service itself while it changes its MIG layout
    #: (the GPU operator's mig-manager): an in-place re-layout is then the prepare commands alone
    relayout_holds_itself: bool = False
    #: whether this actuator can change a node's MIG layout at all (``prepare_commands``)
    can_relayout: bool = False

    # ---- reads
    def owner_state(self, node: str) -> OwnerState:
        """How the platform sees ``node`` now."""
        raise NotImplementedError

    def is_released(self, node: str) -> bool:
        """Whether ``node`` is held (drained/cordoned/disabled) and empty of work."""
        raise NotImplementedError

    def is_prepared(self, node: str, mig_layout: str | None) -> bool:
        """Whether ``node`` has the MIG layout it should arrive with (True when none is asked)."""
        return True

    def work_started(self, node: str) -> list[datetime] | None:
        """When each unit of work now on ``node`` began (UTC-aware; empty when none runs), or
        None where the platform cannot say: a reclaim then cannot know how long work has run."""
        return None

    def blocking_budgets(self, node: str) -> list[str]:
        """The disruption budgets that would refuse ending the work on ``node`` now ("ns/name"),
        so a reclaim can say what blocks before its deadline; empty where the platform has none
        (Kubernetes alone has PodDisruptionBudgets)."""
        return []

    # ---- writes, as commands
    def release_commands(self, node: str, reason: str) -> list[Command]:
        """Commands that stop new work landing on ``node`` (drain / cordon / disable)."""
        raise NotImplementedError

    def evict_commands(self, node: str) -> list[Command]:
        """Commands that evict the work still running on ``node`` (empty when not supported)."""
        return []

    def prepare_commands(self, node: str, mig_layout: str | None) -> list[Command]:
        """Commands that give ``node`` its arrival MIG layout while it is still held."""
        return []

    def attach_commands(self, node: str) -> list[Command]:
        """Commands that open ``node`` for work; raises :class:`ForeignHoldError` when the
        node is held by someone else than gpupool."""
        raise NotImplementedError

    def send(self, command: Command) -> Any:
        """Send one command; return the platform's answer (JSON-ready) or raise ActuationError."""
        raise NotImplementedError

    # ---- direct helpers (unaudited)
    def release(self, node: str, reason: str) -> list[Any]:
        """Send the release commands of ``node`` now; returns the answers."""
        return [self.send(c) for c in self.release_commands(node, reason)]

    def attach(self, node: str) -> list[Any]:
        """Send the attach commands of ``node`` now; returns the answers."""
        return [self.send(c) for c in self.attach_commands(node)]

    # ---- shared guard
    def refuse_foreign(self, state: OwnerState, action: str) -> None:
        """Raise :class:`ForeignHoldError` when ``state`` shows a hold gpupool did not place."""
        if state.foreign_hold:
            raise ForeignHoldError(
                self.platform, state.node, action,
                f"held by someone else ({state.hold_reason or 'no reason given'}); gpupool only lifts "
                f"holds whose reason starts with {REASON_PREFIX!r}",
            )


class NamedActuator(Actuator):
    """An actuator that takes pool node ids and speaks to its platform in the platform's names.

    One machine may be ``gpu-a01`` in the pool, ``a01`` in Slurm and ``compute-gpu-a01.dc1`` in
    OpenStack (``pool.nodes[].names``). The handover state machine and the planner speak pool
    ids; every call that names a node is mapped here, so each platform only ever hears its own
    name. Commands carry the platform's name (that is what is audited and sent); states read
    back carry the pool id.
    """

    def __init__(self, inner: Actuator, names: dict[str, str]):
        self.inner = inner
        self.names = dict(names)

    @property
    def platform(self) -> str:  # type: ignore[override]
        return self.inner.platform

    @property
    def can_evict(self) -> bool:  # type: ignore[override]
        return self.inner.can_evict

    @property
    def attach_brings_node(self) -> bool:  # type: ignore[override]
        return self.inner.attach_brings_node

    @property
    def relayout_holds_itself(self) -> bool:  # type: ignore[override]
        return self.inner.relayout_holds_itself

    @property
    def can_relayout(self) -> bool:  # type: ignore[override]
        return self.inner.can_relayout

    def name_of(self, node: str) -> str:
        """The platform's own name of pool node ``node``."""
        return self.names.get(node, node)

    def owner_state(self, node: str) -> OwnerState:
        st = self.inner.owner_state(self.name_of(node))
        return OwnerState(st.platform, node, st.present, st.schedulable, st.hold_reason, st.busy,
                          {**st.detail, "platform_name": self.name_of(node)})

    def is_released(self, node: str) -> bool:
        return self.inner.is_released(self.name_of(node))

    def is_prepared(self, node: str, mig_layout: str | None) -> bool:
        return self.inner.is_prepared(self.name_of(node), mig_layout)

    def work_started(self, node: str) -> list[datetime] | None:
        return self.inner.work_started(self.name_of(node))

    def blocking_budgets(self, node: str) -> list[str]:
        return self.inner.blocking_budgets(self.name_of(node))

    def release_commands(self, node: str, reason: str) -> list[Command]:
        return self.inner.release_commands(self.name_of(node), reason)

    def evict_commands(self, node: str) -> list[Command]:
        return self.inner.evict_commands(self.name_of(node))

    def prepare_commands(self, node: str, mig_layout: str | None) -> list[Command]:
        return self.inner.prepare_commands(self.name_of(node), mig_layout)

    def attach_commands(self, node: str) -> list[Command]:
        return self.inner.attach_commands(self.name_of(node))

    def send(self, command: Command) -> Any:
        return self.inner.send(command)


def with_pool_names(cfg, actuators: Mapping[str, Any]) -> dict:
    """Wrap each actuator so that it takes pool node ids and speaks to its platform in the
    platform's own node names (``pool.nodes[].names``). Already wrapped ones are left as they are."""
    out = {}
    for platform, act in actuators.items():
        names = {n.node: n.names[platform] for n in cfg.pool.nodes if n.names.get(platform, n.node) != n.node}
        out[platform] = NamedActuator(act, names) if names and not isinstance(act, NamedActuator) else act
    return out
