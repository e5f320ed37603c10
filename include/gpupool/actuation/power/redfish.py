"""Redfish: park and wake any node with a BMC, through ``sushy`` (the OpenStack Ironic team's
Redfish client).

* park: ``ComputerSystem.Reset`` with ``GracefulShutdown`` (the operating system shuts down;
  ``ForceOff`` with ``power_off: force``), sent once, while the BMC reports the system ``On``;
* wake: ``ComputerSystem.Reset`` with ``On``, while the BMC reports it ``Off``;
* state: the system's ``PowerState`` (``On``, ``Off``, ``PoweringOn``, ``PoweringOff``).

Each node's BMC is found by pattern: ``address`` is the Redfish service root (e.g.
``https://{name}-bmc.mgmt.example/redfish/v1``) and ``system`` the ComputerSystem's path on it
(e.g. ``/redfish/v1/Systems/{name}``; None: the BMC's only system), with ``{node}`` the pool
node id and ``{name}`` the platform's name of the node filled in. Credentials are one user and
password for every BMC of the platform (an Airflow connection's login and password).

A BMC does not say who powered a system off: gpupool wakes only nodes its own record says it
parked (the state machine's rule); a bare BMC node is ready as soon as it is on. A platform
that runs work on the node (Kubernetes, OpenStack) wraps this in its hold
(:mod:`gpupool.actuation.power.holds`), which decides when the node is ready.
"""

from __future__ import annotations

import threading
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

ACTIONS = ("redfish_reset",)
#: ``power_off`` setting -> Redfish ResetType
OFF_RESET = {"graceful": "GracefulShutdown", "force": "ForceOff"}
_POWER = {"on": ON, "off": OFF, "powering on": POWERING_ON, "powering off": POWERING_OFF,
          "poweringon": POWERING_ON, "poweringoff": POWERING_OFF}


def fill(pattern: str, node: str, name: str) -> str:
    """``pattern`` with ``{node}`` (pool node id) and ``{name}`` (the platform's name) filled in."""
    return pattern.replace("{node}", node).replace("{name}", name)


class RedfishPower(PowerActuator):
    """Park and wake nodes through their BMCs' Redfish API.

    Parameters
    ----------
    platform:
        The configured platform name (written in audit rows).
    address, system:
        The patterns of each node's Redfish service root and ComputerSystem path (see the module).
    username, password:
        The BMC user.
    verify:
        Verify the BMCs' TLS certificates (or a CA bundle path).
    power_off:
        ``graceful`` or ``force``.
    names:
        Pool node id -> the platform's name, where they differ.
    timeout_s:
        Limit per HTTP request.
    """

    means = "redfish"
    actions = ACTIONS

    def __init__(self, platform: str, address: str, system: str | None = None, username: str | None = None,
                 password: str | None = None, verify: bool | str = True, power_off: str = "graceful",
                 names: Mapping[str, str] | None = None, timeout_s: float = 20.0):
        super().__init__(names)
        if power_off not in OFF_RESET:
            raise ValueError(f"power_off must be one of {sorted(OFF_RESET)}, got {power_off!r}")
        self.platform = platform
        self.address, self.system = address, system
        self.username, self.password, self.verify = username, password, verify
        self.off_reset = OFF_RESET[power_off]
        self.timeout_s = timeout_s
        self._roots: dict[str, Any] = {}
        self._lock = threading.Lock()

    # ---- plumbing
    def where(self, node: str) -> tuple[str, str | None]:
        """(service root URL, system path or None) of ``node``'s BMC."""
        name = self.name_of(node)
        return fill(self.address, node, name), (fill(self.system, node, name) if self.system else None)

    def _root(self, url: str):
        import sushy
        from sushy import auth

        with self._lock:
            root = self._roots.get(url)
            if root is None:
                # basic auth: no Redfish session is left open on each BMC between ticks; few
                # retries of a BMC's 5xx: a tick must not hang on one BMC
                root = sushy.Sushy(url, auth=auth.BasicAuth(self.username, self.password), verify=self.verify,
                                   read_timeout=self.timeout_s, connect_timeout=min(10.0, self.timeout_s),
                                   server_side_retries=2, server_side_retries_delay=1)
                self._roots[url] = root
        return root

    def _call(self, node: str, action: str, fn):
        from sushy import exceptions as sx

        try:
            return fn()
        except sx.SushyError as exc:
            raise ActuationError(self.platform, node, action, f"Redfish: {short(exc)}") from exc
        except Exception as exc:  # connection refused, timeouts, TLS (requests)
            raise ActuationError(self.platform, node, action, f"Redfish: {type(exc).__name__}: {short(exc)}") from exc

    def _system(self, node: str, action: str, missing_ok: bool = False):
        """The node's ComputerSystem (None when the BMC has no such system and ``missing_ok``)."""
        from sushy import exceptions as sx

        url, path = self.where(node)

        def get():
            root = self._root(url)
            try:
                return root.get_system(path) if path else root.get_system()
            except sx.ResourceNotFoundError:
                if missing_ok:
                    return None
                raise

        return self._call(node, action, get)

    # ---- reads
    def state(self, node: str) -> PowerReading:
        """The system's ``PowerState`` from its BMC (not present: the BMC has no such system)."""
        system = self._system(node, "read power", missing_ok=True)
        if system is None:
            return PowerReading(self.platform, node, present=False, power=UNKNOWN)
        raw = getattr(system.power_state, "value", system.power_state)
        power = _POWER.get(str(raw).lower(), UNKNOWN)
        return PowerReading(self.platform, node, present=True, power=power, ready=power == ON,
                            detail={"bmc": self.where(node)[0], "system": system.path, "power_state": raw})

    # ---- writes
    def _reset(self, node: str, reset_type: str) -> Command:
        url, path = self.where(node)
        return Command(self.platform, node, "redfish_reset", {"bmc": url, "system": path, "ResetType": reset_type})

    def park_commands(self, node: str) -> list[Command]:
        """``GracefulShutdown`` (or ``ForceOff``) while the system is on."""
        r = self.state(node)
        return [self._reset(node, self.off_reset)] if r.present and r.power == ON else []

    def wake_commands(self, node: str) -> list[Command]:
        """``On`` while the system is off."""
        r = self.state(node)
        return [self._reset(node, "On")] if r.present and r.power == OFF else []

    def send(self, command: Command) -> dict[str, Any]:
        """POST the system's ``ComputerSystem.Reset`` action."""
        if command.action not in ACTIONS:
            raise ActuationError(self.platform, command.node, command.action, "unknown action")
        from sushy import ResetType

        reset = ResetType(command.request["ResetType"])
        system = self._system(command.node, command.action)
        self._call(command.node, command.action, lambda: system.reset_system(reset))
        return {"system": system.path, "ResetType": reset.value}
