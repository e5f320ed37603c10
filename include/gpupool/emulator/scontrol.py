"""An ``scontrol``-compatible shim that talks to the simulated slurmrestd.

    python -m gpupool.emulator.scontrol show node [NAME] [--json]
    python -m gpupool.emulator.scontrol update NodeName=NAME State=DRAIN|RESUME|UNDRAIN [Reason="..."]
    python -m gpupool.emulator.scontrol update NodeName=NAME Gres=gpu:1g.10gb:56
    python -m gpupool.emulator.scontrol requeue JOBID[,JOBID...]

The server is ``$GPUPOOL_SIM_SLURMRESTD_URL`` (default ``http://127.0.0.1:6820``). Output and exit
codes follow scontrol: ``show node`` prints the ``NodeName=...`` blocks (or, with ``--json``, the
``{"meta", "errors", "nodes"}`` document), ``update`` prints nothing on success, and failures print
``slurm_update error: ...`` to stderr and exit 1; ``requeue`` prints, per job it cannot requeue,
``<error> for job <id>`` to stderr and exits 1 (a pending job: "Job is pending execution").
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from datetime import datetime, timezone

import requests

DEFAULT_URL = "http://127.0.0.1:6820"


def _url() -> str:
    return os.environ.get("GPUPOOL_SIM_SLURMRESTD_URL", DEFAULT_URL).rstrip("/")


def _when(epoch: int | None) -> str:
    if not epoch:
        return "None"
    return datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")


def format_node(n: dict) -> str:
    """One node as ``scontrol show node`` prints it."""
    state = n["state"].upper() + "".join(f"+{f}" for f in n.get("state_flags") or [])
    lines = [
        f"NodeName={n['name']} Arch={n['architecture']} CoresPerSocket={n['cores']} ",
        f"   CPUAlloc={n['alloc_cpus']} CPUEfctv={n['cpus']} CPUTot={n['cpus']} CPULoad={n['cpu_load'] / 100:.2f}",
        f"   AvailableFeatures={n['features'] or '(null)'}",
        f"   ActiveFeatures={n['active_features'] or '(null)'}",
        f"   Gres={n['gres']}",
        f"   NodeAddr={n['address']} NodeHostName={n['hostname']} Version={n['slurmd_version']}",
        f"   OS={n['operating_system']} ",
        f"   RealMemory={n['real_memory']} AllocMem={n['alloc_memory']} FreeMem={n['free_memory']} "
        f"Sockets={n['sockets']} Boards={n['boards']}",
        f"   State={state} ThreadsPerCore={n['threads']} TmpDisk={n['temporary_disk']} Weight={n['weight']} "
        "Owner=N/A MCS_label=N/A",
        f"   Partitions={','.join(n['partitions'])} ",
        f"   BootTime={_when(n['boot_time'])} SlurmdStartTime={_when(n['slurmd_start_time'])}",
        f"   LastBusyTime={_when(n['last_busy'])}",
        f"   CfgTRES={n['tres']}",
        f"   AllocTRES={n['tres_used'] or ''}",
        "   CapWatts=n/a",
        "   CurrentWatts=0 AveWatts=0",
        "   ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s",
    ]
    if n.get("reason"):
        lines.append(f"   Reason={n['reason']} [{n.get('reason_set_by_user') or 'root'}@"
                     f"{_when(n.get('reason_changed_at'))}]")
    return "\n".join(lines) + "\n"


def _fail(message: str, code: int = 1) -> int:
    print(message, file=sys.stderr)
    return code


def show_node(args: list[str]) -> int:
    as_json = "--json" in args
    names = [a for a in args if not a.startswith("-")]
    name = names[0] if names else None
    try:
        if name:
            resp = requests.get(f"{_url()}/slurm/v0.0.38/node/{name}", timeout=30)
        else:
            resp = requests.get(f"{_url()}/slurm/v0.0.38/nodes", timeout=30)
    except requests.RequestException:
        return _fail("slurm_load_node error: Unable to contact slurm controller (connect failure)")
    doc = resp.json()
    errors = doc.get("errors") or [{}]
    if name and resp.status_code >= 400 and errors[0].get("error") == "Invalid node name specified":
        if as_json:
            print(json.dumps(doc, indent=2))
        return _fail(f"Node {name} not found")
    if resp.status_code >= 400:
        return _fail(f"slurm_load_node error: {doc.get('errors', [{}])[0].get('error', resp.status_code)}")
    if as_json:
        print(json.dumps(doc, indent=2))
        return 0
    if not doc["nodes"]:
        print("No nodes in the system")
        return 0
    print("\n".join(format_node(n) for n in doc["nodes"]))
    return 0


def update(args: list[str]) -> int:
    fields: dict[str, str] = {}
    for token in args:
        if "=" not in token:
            return _fail(f"scontrol: error: Invalid input: {token}\nRequest aborted")
        key, value = token.split("=", 1)
        fields[key.lower()] = value
    if "nodename" not in fields:
        return _fail("scontrol: error: Invalid input: " + " ".join(args) + "\nRequest aborted")
    state = fields.get("state", "").upper()
    body: dict = {}
    if state:
        body["state"] = [state]
    if "reason" in fields:
        body["reason"] = fields["reason"]
    if "gres" in fields:
        body["gres"] = fields["gres"]
    if state in ("DRAIN", "DOWN") and not fields.get("reason"):
        return _fail("You must specify a reason when DOWNING or DRAINING a node. Request denied")
    rc = 0
    for name in _expand(fields["nodename"]):
        try:
            resp = requests.post(f"{_url()}/slurm/v0.0.39/node/{name}", json=body, timeout=30)
        except requests.RequestException:
            return _fail("slurm_update error: Unable to contact slurm controller (connect failure)")
        if resp.status_code >= 400:
            err = (resp.json().get("errors") or [{}])[0]
            rc = _fail(f"slurm_update error: {err.get('error', 'Unknown error')}")
    return rc


def requeue(args: list[str]) -> int:
    ids = [i for a in args if not a.startswith("-") for i in a.split(",") if i]
    if not ids:
        return _fail("scontrol: error: Invalid job id specified")
    rc = 0
    for jid in ids:
        try:
            resp = requests.post(f"{_url()}/sim/slurmctld/requeue/{jid}", timeout=30)
        except requests.RequestException:
            return _fail("slurm_requeue error: Unable to contact slurm controller (connect failure)")
        if resp.status_code >= 400:
            err = (resp.json().get("errors") or [{}])[0]
            rc = _fail(f"{err.get('error', 'Unknown error')} for job {jid}")
    return rc


def _expand(hostlist: str) -> list[str]:
    """A Slurm hostlist (``gpu-n[001-003,007],other``) as names."""
    out = []
    for part in re.split(r",(?![^\[]*\])", hostlist):
        m = re.fullmatch(r"(.*)\[([^\]]+)\](.*)", part)
        if not m:
            out.append(part)
            continue
        prefix, ranges, suffix = m.groups()
        for r in ranges.split(","):
            if "-" in r:
                lo, hi = r.split("-", 1)
                out += [f"{prefix}{i:0{len(lo)}d}{suffix}" for i in range(int(lo), int(hi) + 1)]
            else:
                out.append(f"{prefix}{r}{suffix}")
    return out


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``show node ...`` or ``update NodeName=...``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) == 1 and " " in args[0]:
        args = shlex.split(args[0])
    if len(args) >= 2 and args[0] == "show" and args[1] in ("node", "nodes"):
        return show_node(args[2:])
    if len(args) >= 2 and args[0] == "--json" and args[1:3] == ["show", "node"]:
        return show_node(["--json", *args[3:]])
    if args and args[0] == "update":
        return update(args[1:])
    if args and args[0] == "requeue":
        return requeue(args[1:])
    return _fail(f"invalid keyword: {' '.join(args[:2]) or '(none)'}")


if __name__ == "__main__":
    sys.exit(main())
