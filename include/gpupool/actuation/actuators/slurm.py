"""Slurm: drain with a ``gpupool:`` reason, wait until no job runs, resume on attach.

Writes go through ``scontrol update``: no slurmrestd plugin of Slurm 22.05 has a node update. Its
``/openapi/v3`` (``openapi/v0.0.38``) lists GET only on ``node/{node_name}``, ``nodes``, ``diag``,
``ping``, ``licenses``, ``partitions``, ``partition/{partition_name}``, ``reservations`` and
``reservation/{reservation_name}``; the only writes are POST ``job/submit`` and POST/DELETE
``job/{job_id}``; ``POST node/{node_name}`` answers 405 (v0.0.36 and v0.0.37 likewise).
``POST /slurm/v0.0.39/node/{node_name}`` came with Slurm 23.02. With ``rest_auth/local``
slurmrestd also acts as its own unprivileged user, who may not drain.
MIG (``prepare``): Slurm has no API that lays GPUs out. A node gpupool holds drained and empty is
re-laid out by the connection's ``mig_command``, an argv template run on the gpupool host with
``{node}`` and ``{layout}`` filled in (e.g. ``["ssh", "{node}", "sudo", "nvidia-mig-parted", "apply",
"-c", "{layout}"]``, restarting slurmd there so NVML autodetection reports the new slices), then the
node's GRES is set with ``scontrol update NodeName=.. Gres=gpu:<profile>:<slices>``. The node is
prepared when its GRES is typed by the layout's profile (or by no profile for ``all-disabled``).
Without a ``mig_command`` a layout change is refused with an error naming the key.
Reads go through ``sinfo --json`` and ``squeue --json`` run with an explicit ``SLURM_CONF`` (never
through a shell), or, with ``restd_url``, through slurmrestd's ``/nodes`` and ``/jobs``: the same
v0.0.38 node and job objects, read where no Slurm client is installed.
Evict (a reclaim, or a move the policy lets end work): ``scontrol requeue <jobid>`` per job running
on the node. The job goes back to PENDING with its id and its place in the queue (Slurm holds it
until its new begin time); the drain keeps it from landing on the node again. A job Slurm will not
requeue (submitted with ``--no-requeue``, not a batch job) is refused with the job named, and the
release waits for it.
"""

from __future__ import annotations

import json
import os
import subprocess
from datetime import datetime, timezone
from typing import Any, Mapping, Sequence

from gpupool import mig
from gpupool.actuation.actuators.base import ActuationConfigError, ActuationError, Actuator, Command, OwnerState
from gpupool.sources.base import PermanentError, TransientError
from gpupool.sources.slurm import parse_gres
from gpupool.sources.slurmrestd import SlurmRestd, expand_hostlist

#: job states that still occupy a node
_ACTIVE_JOB_STATES = {"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STAGE_OUT", "SIGNALING"}
#: job states a requeue can still end (a completing job is ending by itself)
_REQUEUE_STATES = {"RUNNING", "CONFIGURING", "SUSPENDED", "SIGNALING"}
#: node state flags that mean "no new jobs"
_HOLD_FLAGS = {"DRAIN", "DRAINING", "DRAINED", "FAIL", "MAINTENANCE", "REBOOT_REQUESTED", "POWER_DOWN"}
_DOWN_STATES = {"down", "future", "unknown"}


def job_nodes(job: Mapping[str, Any]) -> set[str]:
    """Names of the nodes a v0.0.38 job object holds (``job_resources``, else its ``nodes`` hostlist)."""
    res = job.get("job_resources") or {}
    names = {n.get("nodename") for n in res.get("allocated_nodes") or [] if isinstance(n, dict)}
    names.discard(None)
    return names or set(expand_hostlist(str(job.get("nodes") or "")))


class SlurmActuator(Actuator):
    """Release and attach nodes of one Slurm cluster; evict by requeueing the node's jobs.

    Parameters
    ----------
    platform:
        The configured platform name (written in audit rows).
    slurm_conf:
        Path of the cluster's ``slurm.conf`` (``SLURM_CONF``); ``None`` keeps the environment's.
    bin_dir:
        Directory of ``scontrol``/``sinfo``/``squeue`` (default: found on ``PATH``).
    names:
        Pool node name -> Slurm node name, where they differ.
    timeout_s:
        Limit per command.
    restd_url, restd_user, restd_token, restd_version:
        Read node state and jobs from slurmrestd (``http(s)://host:port`` with a JWT, or
        ``unix:/path/to/slurmrestd.sock``) instead of ``sinfo``/``squeue``.
    mig_command:
        The node-side MIG command, an argv template with ``{node}`` and ``{layout}``; ``None``: this
        cluster's nodes are never re-laid out.
    """

    can_evict = True

    def __init__(
        self,
        platform: str = "slurm",
        slurm_conf: str | None = None,
        bin_dir: str | None = None,
        names: Mapping[str, str] | None = None,
        timeout_s: float = 20.0,
        restd_url: str | None = None,
        restd_user: str | None = None,
        restd_token: str | None = None,
        restd_version: str = "v0.0.38",
        mig_command: Sequence[str] | None = None,
    ):
        self.platform = platform
        self.slurm_conf = slurm_conf
        self.bin_dir = bin_dir
        self.names = dict(names or {})
        self.timeout_s = timeout_s
        self.mig_command = [str(a) for a in mig_command] if mig_command else None
        self.can_relayout = self.mig_command is not None
        if mig_command is not None and (isinstance(mig_command, str) or not any("{layout}" in a for a in self.mig_command)):
            raise ActuationConfigError(
                f"platform {platform!r}: mig_command must be a list of arguments with {{layout}} in one")
        self.restd = (SlurmRestd(restd_url, user=restd_user, token=restd_token, version=restd_version,
                                 timeout=timeout_s) if restd_url else None)

    # ---- plumbing
    def _name(self, node: str) -> str:
        return self.names.get(node, node)

    def _bin(self, tool: str) -> str:
        return os.path.join(self.bin_dir, tool) if self.bin_dir else tool

    def _run(self, argv: Sequence[str], node: str, action: str, slurm_tool: bool = True) -> str:
        env = dict(os.environ)
        if self.slurm_conf:
            env["SLURM_CONF"] = self.slurm_conf
        try:
            proc = subprocess.run(
                [self._bin(argv[0]) if slurm_tool else argv[0], *argv[1:]], env=env, capture_output=True, text=True,
                timeout=self.timeout_s
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ActuationError(self.platform, node, action, f"{argv[0]}: {exc}") from exc
        if proc.returncode != 0:
            msg = (proc.stderr or proc.stdout).strip() or f"exit status {proc.returncode}"
            raise ActuationError(self.platform, node, action, f"{' '.join(argv[:2])}: {msg}")
        return proc.stdout

    def _restd_list(self, rel: str, key: str, node: str, action: str) -> list[dict[str, Any]]:
        try:
            doc = self.restd.get(rel)
        except (TransientError, PermanentError) as exc:
            raise ActuationError(self.platform, node, action, f"slurmrestd {self.restd.endpoint(rel)}: {exc}") from exc
        errors = doc.get("errors") if isinstance(doc, dict) else None
        items = doc.get(key) if isinstance(doc, dict) else None
        if errors or not isinstance(items, list):
            detail = "; ".join(str(e.get("description") or e.get("error")) for e in errors or [] if isinstance(e, dict))
            raise ActuationError(self.platform, node, action,
                                 f"slurmrestd {self.restd.endpoint(rel)}: {detail or f'no {key!r} list'}")
        return items

    def _node_record(self, node: str) -> dict[str, Any] | None:
        name = self._name(node)
        if self.restd:
            # /nodes, not /node/{name}: 22.05 answers an unknown name with HTTP 500
            nodes = self._restd_list("nodes", "nodes", node, "read node")
        else:
            out = self._run(["sinfo", "--json", "-n", name], node, "read node")
            nodes = json.loads(out).get("nodes", [])
        nodes = [n for n in nodes if n.get("name") == name]
        return nodes[0] if nodes else None

    def running_jobs(self, node: str) -> list[dict[str, Any]]:
        """Jobs that still occupy ``node`` (running, completing, suspended...)."""
        name = self._name(node)
        if self.restd:
            jobs = [j for j in self._restd_list("jobs", "jobs", node, "read jobs") if name in job_nodes(j)]
        else:
            out = self._run(["squeue", "--json", "-w", name], node, "read jobs")
            jobs = json.loads(out).get("jobs", [])
        return [
            {"job_id": j.get("job_id"), "state": str(j.get("job_state", "")).upper(), "name": j.get("name"),
             "start_time": j.get("start_time")}
            for j in jobs
            if str(j.get("job_state", "")).upper() in _ACTIVE_JOB_STATES
        ]

    # ---- reads
    def owner_state(self, node: str) -> OwnerState:
        """Node state from ``sinfo --json``; busy = jobs occupying it."""
        rec = self._node_record(node)
        if rec is None:
            return OwnerState(self.platform, node, present=False, schedulable=False)
        flags = {str(f).upper() for f in rec.get("state_flags") or []}
        state = str(rec.get("state", "")).lower()
        held = bool(flags & _HOLD_FLAGS) or state in _DOWN_STATES
        jobs = self.running_jobs(node)
        return OwnerState(
            self.platform,
            node,
            present=True,
            schedulable=not held,
            hold_reason=(rec.get("reason") or None) if held else None,
            busy=len(jobs),
            detail={"state": state, "flags": sorted(flags), "jobs": [j["job_id"] for j in jobs],
                    "gres_used": rec.get("gres_used")},
        )

    def work_started(self, node: str) -> list[datetime]:
        """Start times (UTC) of the jobs occupying ``node``: their ``start_time`` (epoch seconds)."""
        out = []
        for j in self.running_jobs(node):
            t = j.get("start_time")
            if isinstance(t, dict):  # later plugins wrap numbers as {"set", "number"}
                t = t.get("number") if t.get("set", True) else None
            if isinstance(t, (int, float)) and not isinstance(t, bool) and t > 0:
                out.append(datetime.fromtimestamp(t, tz=timezone.utc))
        return out

    def is_released(self, node: str) -> bool:
        """Drained by gpupool and no job occupies the node."""
        st = self.owner_state(node)
        return st.held_by_gpupool and st.busy == 0

    def _gres(self, node: str) -> tuple[int, str | None]:
        """(GRES count, type) the node reports; (0, None) for a node Slurm does not know."""
        rec = self._node_record(node)
        return parse_gres(rec.get("gres") if rec else None)

    def is_prepared(self, node: str, mig_layout: str | None) -> bool:
        """The node's GRES is typed by the layout's profile (by none for whole GPUs)."""
        if not mig_layout:
            return True
        _, typ = self._gres(node)
        have = typ if typ in mig.SLICES_PER_GPU else None
        return have == mig.layout_profile(mig_layout)

    def prepare_commands(self, node: str, mig_layout: str | None) -> list[Command]:
        """The node-side ``mig_command``, then ``scontrol update .. Gres=``, unless the node has the layout."""
        if not mig_layout or self.is_prepared(node, mig_layout):
            return []
        if not self.mig_command:
            raise ActuationError(self.platform, node, "mig_layout",
                                 f"no mig_command in the platform's connection: gpupool cannot lay {node} out as "
                                 f"{mig_layout} (Slurm has no API for MIG)")
        count, typ = self._gres(node)
        gpus = count // mig.SLICES_PER_GPU[typ] if typ in mig.SLICES_PER_GPU else count
        profile = mig.layout_profile(mig_layout)
        if profile is not None and profile not in mig.SLICES_PER_GPU:
            raise ActuationError(self.platform, node, "mig_layout", f"{mig_layout} is not one MIG profile on every GPU")
        gres = f"gpu:{profile}:{gpus * mig.SLICES_PER_GPU[profile]}" if profile else f"gpu:{gpus}"
        name = self._name(node)
        argv = [a.replace("{node}", name).replace("{layout}", mig_layout) for a in self.mig_command]
        return [Command(self.platform, node, "mig_layout", {"argv": argv, "layout": mig_layout}),
                Command(self.platform, node, "gres", {"argv": ["scontrol", "update", f"NodeName={name}", f"Gres={gres}"]})]

    # ---- writes
    def release_commands(self, node: str, reason: str) -> list[Command]:
        """``scontrol update NodeName=.. State=DRAIN Reason="gpupool: ..."`` (running jobs finish)."""
        argv = ["scontrol", "update", f"NodeName={self._name(node)}", "State=DRAIN", f"Reason={reason}"]
        return [Command(self.platform, node, "drain", {"argv": argv})]

    def evict_commands(self, node: str) -> list[Command]:
        """``scontrol requeue <jobid>``, one per job still running on ``node``."""
        return [Command(self.platform, node, "requeue", {"argv": ["scontrol", "requeue", str(j["job_id"])],
                                                         "job_id": j["job_id"]})
                for j in self.running_jobs(node) if j["state"] in _REQUEUE_STATES]

    def attach_commands(self, node: str) -> list[Command]:
        """``scontrol update NodeName=.. State=RESUME``, only for a node gpupool drained."""
        st = self.owner_state(node)
        self.refuse_foreign(st, "resume")
        if st.schedulable:
            return []
        argv = ["scontrol", "update", f"NodeName={self._name(node)}", "State=RESUME"]
        return [Command(self.platform, node, "resume", {"argv": argv})]

    def send(self, command: Command) -> dict[str, Any]:
        """Run the command's argv; resume re-checks the reason right before it is sent."""
        argv = list(command.request["argv"])
        if command.action == "resume":
            self.refuse_foreign(self.owner_state(command.node), "resume")
        if command.action == "mig_layout":  # GPUs in use would fail the node-side tool: never try
            st = self.owner_state(command.node)
            if not st.held_by_gpupool or st.busy:
                raise ActuationError(self.platform, command.node, "mig_layout",
                                     f"node must be drained by gpupool and empty first ({st.busy} job(s), "
                                     f"hold: {st.hold_reason or 'none'})")
        if command.action == "requeue":
            return self._requeue(command)
        out = self._run(argv, command.node, command.action, slurm_tool=command.action != "mig_layout")
        return {"stdout": out.strip()}

    def _requeue(self, command: Command) -> dict[str, Any]:
        """Requeue one job; a job that no longer runs on the node (pending again, requeued by an
        earlier send, ended, unknown) answers ok, so sending twice is sending once."""
        job_id = command.request["job_id"]
        try:
            out = self._run(list(command.request["argv"]), command.node, "requeue")
        except ActuationError as exc:
            if any(j["job_id"] == job_id and j["state"] in _REQUEUE_STATES for j in self.running_jobs(command.node)):
                raise ActuationError(self.platform, command.node, "requeue",
                                     f"job {job_id} was not requeued: {exc.reason}") from exc
            return {"job_id": job_id, "requeued": False, "detail": f"no longer running ({exc.reason})"}
        return {"job_id": job_id, "requeued": True, "stdout": out.strip()}
