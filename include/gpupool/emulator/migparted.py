"""A node-side MIG tool for the simulated nodes, shaped like ``nvidia-mig-parted apply``.

    python -m gpupool.emulator.migparted NODE apply -c CONFIG

A real site runs ``nvidia-mig-parted apply -c all-1g.10gb`` on the node (through ssh or its own
remote-command tool; the Slurm actuator's ``mig_command``); here NODE names the simulated node and
the layout is applied through the simulator's control API (``$GPUPOOL_SIM_CONTROL_URL``, default
``http://127.0.0.1:8099``). Like the real tool it returns when the layout is applied and exits 1
with the reason on stderr when it cannot be (GPUs still in use, no MIG on the GPU).
"""

from __future__ import annotations

import argparse
import os
import sys

import requests

DEFAULT_URL = "http://127.0.0.1:8099"


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``NODE apply -c CONFIG``."""
    ap = argparse.ArgumentParser(prog="migparted", description=__doc__.splitlines()[0])
    ap.add_argument("node")
    ap.add_argument("command", choices=["apply"])
    ap.add_argument("-c", "--selected-config", required=True, dest="config")
    args = ap.parse_args(argv)
    url = os.environ.get("GPUPOOL_SIM_CONTROL_URL", DEFAULT_URL).rstrip("/")
    try:
        resp = requests.post(f"{url}/sim/v1/nodes/{args.node}/mig", json={"layout": args.config}, timeout=30)
    except requests.RequestException as exc:
        print(f"Error: cannot reach the node: {exc}", file=sys.stderr)
        return 1
    if resp.status_code >= 400:
        try:
            msg = resp.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            msg = resp.text.strip()
        print(f"Error applying MIG configuration: {msg}", file=sys.stderr)
        return 1
    print(f"MIG configuration {args.config} applied")
    return 0


if __name__ == "__main__":
    sys.exit(main())
