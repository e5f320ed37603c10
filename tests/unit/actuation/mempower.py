"""An in-memory power means for the power machine's tests (staging's and the jobs')."""

from __future__ import annotations

from gpupool.actuation.power.base import PARK_REASON, Command, PowerActuator, PowerReading


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
