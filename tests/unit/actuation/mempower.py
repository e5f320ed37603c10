"""The power tests' doubles (staging's, the jobs' and the Redfish emulator's): an in-memory power
means, a platform's pressure as its source reads it, and a harness that starts writers at once."""

from __future__ import annotations

import threading

from gpupool.actuation.power.base import PARK_REASON, Command, PowerActuator, PowerReading
from gpupool.sources.base import Pressure


class MemPower(PowerActuator):
    """An in-memory power means with a platform hold. A power change a command asks for shows at
    once, or with ``lag`` only once the test calls :meth:`settle` (the BMC or Slurm took its
    time); ``on_send(command)`` runs inside the next send, before it goes through."""

    means = "mem"
    actions = ("power_off", "power_on")

    def __init__(self, platform: str, nodes, lag: bool = False):
        super().__init__()
        self.platform = platform
        self.lag = lag
        self.nodes = {n: {"power": "on", "held": False, "busy": 0, "foreign": None, "pending": None} for n in nodes}
        self.sent: list[Command] = []
        self.on_send = None

    def state(self, node: str) -> PowerReading:
        n = self.nodes.get(node)
        if n is None:
            return PowerReading(self.platform, node, present=False, power="unknown")
        power = {"on": "on", "off": "off"}[n["power"]] if not n["pending"] else (
            "powering_off" if n["pending"] == "off" else "powering_on")
        return PowerReading(self.platform, node, present=True, power=power, ready=power == "on" and not n["held"],
                            held=n["held"], foreign=n["foreign"], busy=n["busy"])

    def park_commands(self, node):
        r = self.state(node)
        self.refuse_foreign(r, "park")
        if not r.held:
            return [Command(self.platform, node, "hold", {"reason": PARK_REASON})]
        if r.busy or r.power != "on":
            return []
        return [Command(self.platform, node, "power_off", {})]

    def wake_commands(self, node):
        r = self.state(node)
        self.refuse_foreign(r, "wake")
        if r.power == "off":
            return [Command(self.platform, node, "power_on", {})]
        if r.power == "on" and r.held:
            return [Command(self.platform, node, "unhold", {})]
        return []

    def send(self, command):
        if self.on_send is not None:
            hook, self.on_send = self.on_send, None
            hook(command)
        n = self.nodes[command.node]
        if command.action == "hold":
            n["held"] = True
        elif command.action == "unhold":
            n["held"] = False
        elif command.action in ("power_off", "power_on"):
            n["pending"] = command.action.split("_")[1]
            if not self.lag:
                self.settle()
        self.sent.append(command)
        return {"ok": True}

    def settle(self) -> None:
        """Every power change asked for is done."""
        for n in self.nodes.values():
            if n["pending"]:
                n["power"], n["pending"] = n["pending"], None


class HeldSource:
    """A platform's pressure as its source reads it: 8-GPU ``nodes``, ``busy`` ones run work,
    ``held`` ones are closed to work (parked: held by gpupool), the rest open and idle."""

    def __init__(self, platform, nodes, busy=(), held=(), pending=0.0):
        self.platform, self.nodes, self.busy, self.held, self.pending = platform, nodes, set(busy), set(held), pending

    def pressure(self, at):
        open_ = [n for n in self.nodes if n not in self.held]
        return Pressure(self.platform, at, 8.0 * len(self.busy & set(open_)), float(self.pending), 8.0 * len(open_),
                        tuple(n for n in open_ if n not in self.busy), {n: 8 for n in self.nodes}, len(open_),
                        {"gpus_pending": "test"})


def race(n: int, work) -> list:
    """Run ``work(i)`` for i < ``n`` in threads released at once; what each returned or raised."""
    barrier = threading.Barrier(n)
    out: list = [None] * n

    def body(i: int) -> None:
        barrier.wait(timeout=30)
        try:
            out[i] = work(i)
        except Exception as exc:  # noqa: BLE001 - the test reads what each writer met
            out[i] = exc

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a writer hung"
    return out
