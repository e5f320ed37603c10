"""`gpupool sim serve SCENARIO.yaml`: the virtual datacenter's APIs on loopback ports, one process.

One :class:`~gpupool.emulator.state.SimState` (a World whose clock follows wall time times
``speed``) behind five HTTP servers:

====================  =======================================================================
prometheus            Prometheus HTTP API (DCGM + Slurm exporter series)
kubernetes            Kubernetes API server subset (nodes, pods, eviction, metrics APIs)
openstack             Keystone v3 at ``/identity/v3``, Placement at ``/placement``, Nova at
                      ``/compute/v2.1``, Gnocchi at ``/metric`` (the catalog names them all)
slurm                 slurmrestd ``/slurm/v0.0.38`` (``python -m gpupool.emulator.scontrol``)
control               the simulator's clock and provisioning API (``/sim/v1/...``)
====================  =======================================================================

Programmatic use (tests, the demo)::

    with serve_in_thread(state) as servers:   # ephemeral ports
        servers.urls["prometheus"]

Command line (the ``gpupool sim serve`` subcommand passes its arguments to :func:`main`)::

    python -m gpupool.emulator.serve SCENARIO.yaml [--host 127.0.0.1] [--prometheus-port 9090]
        [--kubernetes-port 6443] [--openstack-port 5000] [--slurm-port 6820] [--control-port 8099]
        [--speed 60] [--start-at 2020-05-02T00:00:00Z] [--env-file sim.env]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pandas as pd

from gpupool.emulator.state import SimState

log = logging.getLogger(__name__)

#: default ports: the platforms' usual ones where they do not clash
DEFAULT_PORTS = {"prometheus": 9090, "kubernetes": 6443, "openstack": 5000, "slurm": 6820, "control": 8099}
#: default password of the simulated Keystone's users (loopback only)
DEFAULT_PASSWORD = "gpupool-sim"


def build_apps(state: SimState, password: str = DEFAULT_PASSWORD) -> dict:
    """The five facade apps over one state (imports here keep `gpupool --help` fast)."""
    from gpupool.emulator import control, kubernetes, openstack, prometheus, slurm

    return {
        "prometheus": prometheus.make_app(state),
        "kubernetes": kubernetes.make_app(state),
        "openstack": openstack.make_app(state, password=password),
        "slurm": slurm.make_app(state),
        "control": control.make_app(state),
    }


def make_state(scenario_path: str | Path, speed: float = 1.0, start_at: str | None = None,
               **kwargs) -> SimState:
    """Load a scenario and put the world's clock at ``start_at``.

    ``start_at`` is an instant, ``"start"``, or None: one day into the window (half of it for
    a window shorter than two days), so there is history to read from the first request.
    """
    from gpupool.sim.scenario import ScenarioError, load_scenario
    from gpupool.sim.world import World

    scenario = load_scenario(scenario_path)
    sliced = [name for name, spec in scenario.platforms.items() if spec.slice_profile]
    if sliced:  # the facades report whole GPUs; only `gpupool simulate` serves slices
        raise ScenarioError(f"{scenario_path}: platforms.{sliced[0]}.slice_profile: the virtual datacenter's "
                            "platform APIs serve whole GPUs; slice_profile is for `gpupool simulate` only")
    world = World(scenario, clock="start")
    if start_at is None:
        span = world.end - world.start
        at = world.start + min(pd.Timedelta(days=1), span / 2)
        at = world.start + ((at - world.start) // world.step) * world.step
    elif start_at == "start":
        at = world.start
    else:
        at = pd.Timestamp(start_at)
        at = at.tz_localize("UTC") if at.tzinfo is None else at.tz_convert("UTC")
        at = world.start + ((at - world.start) // world.step) * world.step
    world.advance(at)
    return SimState(world, speed=speed, **kwargs)


@dataclass
class Servers:
    """Running facade servers: their URLs and a stop handle."""

    host: str
    ports: dict[str, int]
    state: SimState
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)

    @property
    def urls(self) -> dict[str, str]:
        """Base URL of each facade (Keystone's is the ``auth_url`` clients want)."""
        base = {k: f"http://{self.host}:{p}" for k, p in self.ports.items()}
        return {**base, "keystone": f"{base['openstack']}/identity/v3", "slurmrestd": base["slurm"]}

    def env(self) -> dict[str, str]:
        """Environment variables a client configuration can read."""
        u = self.urls
        return {
            "GPUPOOL_SIM_PROMETHEUS_URL": u["prometheus"], "GPUPOOL_SIM_KUBERNETES_URL": u["kubernetes"],
            "GPUPOOL_SIM_KEYSTONE_URL": u["keystone"], "GPUPOOL_SIM_SLURMRESTD_URL": u["slurm"],
            "GPUPOOL_SIM_CONTROL_URL": u["control"], "GPUPOOL_SIM_URL": u["slurm"],
        }

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)


def _bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Nagle off: the facades answer a request in more than one write, and a client that
    # reuses its connection would wait out its peer's delayed ACK (40 ms) on every request.
    # asyncio turns it off itself only on sockets it creates; on Linux the accepted
    # connections inherit it from the listening socket
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    sock.listen(128)
    sock.setblocking(False)
    return sock


async def _serve(apps: dict, socks: dict[str, socket.socket], stop: threading.Event,
                 ready: threading.Event | None = None) -> None:
    import uvicorn

    servers = []
    for name, app in apps.items():
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                                timeout_graceful_shutdown=1)
        server = uvicorn.Server(config)
        server.install_signal_handlers = lambda: None  # the process's handlers stay ours
        servers.append((server, socks[name]))
    tasks = [asyncio.create_task(s.serve(sockets=[sock])) for s, sock in servers]
    while not all(s.started for s, _ in servers):
        if any(t.done() for t in tasks):
            for t in tasks:
                if t.done() and t.exception():
                    raise t.exception()
        await asyncio.sleep(0.01)
    if ready is not None:
        ready.set()
    while not stop.is_set():
        await asyncio.sleep(0.05)
    for s, _ in servers:
        s.should_exit = True
    await asyncio.gather(*tasks, return_exceptions=True)


@contextlib.contextmanager
def serve_in_thread(state: SimState, host: str = "127.0.0.1", ports: dict[str, int] | None = None,
                    password: str = DEFAULT_PASSWORD) -> Iterator[Servers]:
    """Run the facades in a background thread (port 0: an ephemeral port) until the block ends."""
    ports = {**{k: 0 for k in DEFAULT_PORTS}, **(ports or {})}
    socks = {k: _bind(host, p) for k, p in ports.items()}
    bound = {k: s.getsockname()[1] for k, s in socks.items()}
    servers = Servers(host, bound, state)
    apps = build_apps(state, password=password)
    ready = threading.Event()
    errors: list[BaseException] = []

    def target() -> None:
        try:
            asyncio.run(_serve(apps, socks, servers._stop, ready))
        except BaseException as exc:  # reported to the caller below
            errors.append(exc)
            ready.set()

    servers._thread = threading.Thread(target=target, name="gpupool-sim-serve", daemon=True)
    servers._thread.start()
    ready.wait(timeout=30)
    if errors:
        raise RuntimeError(f"the facades did not start: {errors[0]!r}") from errors[0]
    try:
        yield servers
    finally:
        servers.stop()
        for s in socks.values():
            s.close()


def serve(scenario_path: str | Path, host: str = "127.0.0.1", ports: dict[str, int] | None = None,
          speed: float = 1.0, start_at: str | None = None, env_file: str | Path | None = None,
          password: str = DEFAULT_PASSWORD) -> None:
    """Serve the scenario's virtual datacenter until SIGINT/SIGTERM (blocking).

    ``ports`` maps prometheus/kubernetes/openstack/slurm/control to a port (0: ephemeral;
    missing: :data:`DEFAULT_PORTS`). Prints one JSON line with the URLs and the simulated clock,
    and writes them as ``KEY=VALUE`` lines to ``env_file`` when given.
    """
    state = make_state(scenario_path, speed=speed, start_at=start_at)
    ports = {**DEFAULT_PORTS, **(ports or {})}
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with serve_in_thread(state, host, ports, password=password) as servers:
        info = {"urls": servers.urls, "clock": str(state.now), "speed": speed,
                "world": [str(state.world.start), str(state.world.end)], "keystone_password": password}
        print(json.dumps(info), flush=True)
        if env_file:
            Path(env_file).write_text("".join(f"{k}={v}\n" for k, v in servers.env().items()))
        while not stop.wait(0.5):
            pass


def main(argv: list[str] | None = None) -> int:
    """Command-line entry: ``SCENARIO.yaml`` and the options of :func:`serve`."""
    ap = argparse.ArgumentParser(prog="gpupool sim serve", description=__doc__.split("\n")[0])
    ap.add_argument("scenario", help="scenario YAML file")
    ap.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback)")
    for name, port in DEFAULT_PORTS.items():
        ap.add_argument(f"--{name}-port", type=int, default=port, help=f"0 = ephemeral (default {port})")
    ap.add_argument("--speed", type=float, default=1.0,
                    help="simulated seconds per wall second (default 1; 0 freezes the clock)")
    ap.add_argument("--start-at", default=None, help='simulated start instant, or "start" (default: 1 day in)')
    ap.add_argument("--env-file", default=None, help="write the URLs as KEY=VALUE lines here")
    ap.add_argument("--password", default=os.environ.get("GPUPOOL_SIM_PASSWORD", DEFAULT_PASSWORD),
                    help="password of the simulated Keystone's users (env GPUPOOL_SIM_PASSWORD)")
    args = ap.parse_args(argv)
    ports = {name: getattr(args, f"{name}_port") for name in DEFAULT_PORTS}
    logging.basicConfig(level=logging.WARNING)
    try:
        serve(args.scenario, args.host, ports, args.speed, args.start_at, args.env_file, args.password)
    except (ValueError, OSError) as exc:
        print(f"gpupool sim serve: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
