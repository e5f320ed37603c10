"""A slurmrestd subset over the simulated Slurm platform.

* ``GET /slurm/v0.0.38/nodes`` and ``/slurm/v0.0.38/node/{name}`` — node objects of the 22.05
  data parser (the shape ``sinfo --json`` and ``scontrol show node --json`` print): ``gres``,
  ``gres_used``, ``state`` (idle/mixed/allocated), ``state_flags`` (``DRAIN``), ``reason``, ...
* ``GET /slurm/v0.0.38/jobs`` and ``/slurm/v0.0.38/job/{id}`` — one running job per busy GPU and
  one pending job (reason ``Resources``) per GPU of demand that does not fit; ``DELETE
  /slurm/v0.0.38/job/{id}`` cancels a running job (the world re-queues the work).
* ``GET /slurm/v0.0.38/ping`` — the controller's ``pings``.
* ``POST /slurm/v0.0.39/node/{name}`` ``{"state": ["DRAIN"|"RESUME"|"UNDRAIN"], "reason": ...}`` —
  the node update v0.0.39 added (22.05's v0.0.38 has none); :mod:`.scontrol` uses it.
* ``POST /sim/slurmctld/requeue/{id}`` — what ``scontrol requeue`` asks of slurmctld (no slurmrestd
  version has it; only :mod:`.scontrol` calls it): a running job leaves its node at once and is
  listed pending under its own id, as slurmctld keeps a requeued job's id, while the platform's
  unmet demand covers it (the fluid model runs that demand again under new ids:
  :meth:`SimState.requeue <gpupool.emulator.state.SimState.requeue>`); a pending job answers "Job
  is pending execution", an unknown one "Invalid job id specified", as slurmctld does.

A drained node takes no new jobs; its running jobs end on their own (``DRAINING`` until then,
``DRAINED`` after). Errors come back as Debian's slurmrestd 22.05.8 writes them (recorded in
tests/fixtures/recorded/slurmrestd_*.json, compared by tests/contract/test_slurm_facade.py): an
unknown node or job is HTTP 500 with an ``errors`` list (``error``/``errno`` for a node,
``error``/``error_number``/``description``/``source`` for a job) and an empty ``nodes``/``jobs``
list; an unknown path is a plain-text 404.
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from gpupool import mig as mig_table
from gpupool.emulator.state import SimConflict, SimNotFound, SimState

ROLE = "slurm"
PARTITION = "gpu"
VERSION = {"major": 22, "micro": 8, "minor": 5}
RELEASE = "22.05.8"
ESLURM_INVALID_NODE_NAME = 2008
#: what 22.05.8's v0.0.38 plugin reports for GET /node/{unknown} (its own errno, not 2008)
V38_NODE_NOT_FOUND_ERRNO = 2018
UNKNOWN_PATH_TEXT = "Unable find requested URL. Please view /openapi/v3 for API reference."
ESLURM_INVALID_JOB_ID = 2017
ESLURM_REST_INVALID_QUERY = 9001


def meta(plugin: str = "v0.0.38") -> dict:
    return {"plugin": {"type": f"openapi/{plugin}", "name": f"Slurm OpenAPI {plugin}"},
            "Slurm": {"version": VERSION, "release": RELEASE}}


def _epoch(ts: pd.Timestamp) -> int:
    return int(pd.Timestamp(ts).timestamp())


def gres_model(gpu_model: str) -> str:
    """The GRES type Slurm sites give a GPU model ("NVIDIA A100-SXM4-80GB" -> "a100")."""
    for word in gpu_model.replace("-", " ").split():
        w = word.lower()
        if w[:1] in "abhlvt" and any(ch.isdigit() for ch in w) and w != "nvidia":
            return w
    return "gpu"


def node_gres(rec: dict) -> tuple[str, int, int]:
    """(GRES type, count, used) of a node as slurmd's NVML autodetection reports it: on a node laid
    out as ``all-<profile>`` every MIG slice is one ``gpu`` typed by its profile (a GPU's work
    takes one slice of it here: the world counts GPUs)."""
    gpus, busy = int(rec["gpus"]), int(rec["busy_gpus"])
    profile = mig_table.layout_profile(rec.get("mig_layout"))
    if profile in mig_table.SLICES_PER_GPU:
        return profile, gpus * mig_table.SLICES_PER_GPU[profile], busy
    return gres_model(rec["gpu_model"]), gpus, busy


def node_state(rec: dict) -> tuple[str, list[str], str]:
    """(base state, flags, scontrol state string) of a node."""
    busy, gpus = int(rec["busy_gpus"]), int(rec["gpus"])
    base = "idle" if busy == 0 else ("allocated" if busy >= gpus else "mixed")
    flags = ["DRAIN"] if rec["cordoned"] else []
    text = base.upper() + ("+DRAIN" if flags else "")
    return base, flags, text


def node_object(state: SimState, rec: dict) -> dict:
    """A node in the v0.0.38 shape."""
    name, gpus, busy = rec["name"], int(rec["gpus"]), int(rec["busy_gpus"])
    model, gpus, busy = node_gres(rec)
    base, flags, _ = node_state(rec)
    used_idx = ",".join(str(w.slot) for w in state.running(ROLE) if w.node == name)
    boot = _epoch(rec["created"])
    alloc_cpus = busy * 8
    return {
        "architecture": "x86_64", "burstbuffer_network_address": "", "boards": 1, "boot_time": boot,
        "comment": "", "cores": 16, "cpu_binding": 0, "cpu_load": alloc_cpus * 100, "extra": "",
        "free_memory": 515000 - busy * 32768, "cpus": 64, "last_busy": _epoch(state.now) if busy else boot,
        "features": "", "active_features": "", "gres": f"gpu:{model}:{gpus}", "gres_drained": "N/A",
        "gres_used": f"gpu:{model}:{busy}(IDX:{used_idx or 'N/A'})", "mcs_label": "", "name": name,
        "next_state_after_reboot": "invalid", "next_state_after_reboot_flags": [], "address": name,
        "hostname": name, "state": base, "state_flags": flags, "operating_system":
        "Linux 5.15.0-113-generic #123-Ubuntu SMP", "owner": None, "partitions": [PARTITION], "port": 6818,
        "real_memory": 515000, "reason": rec["drain_reason"] if rec["cordoned"] else "",
        "reason_changed_at": _epoch(state.now) if rec["cordoned"] else 0,
        "reason_set_by_user": "root" if rec["cordoned"] else None, "slurmd_start_time": boot, "sockets": 2,
        "threads": 2, "temporary_disk": 0, "weight": 1,
        "tres": f"cpu=64,mem=515000M,billing=64,gres/gpu={gpus}",
        "slurmd_version": RELEASE, "alloc_memory": busy * 32768, "alloc_cpus": alloc_cpus,
        "idle_cpus": 64 - alloc_cpus, "tres_used": f"cpu={alloc_cpus},mem={busy * 32768}M,gres/gpu={busy}"
        if busy else None, "tres_weighted": float(alloc_cpus),
    }


def job_object(state: SimState, w) -> dict:
    running = w.state == "Running"
    submit = _epoch(w.start)
    tres = "cpu=8,mem=32G,node=1,billing=8,gres/gpu=1"
    job = {
        "account": "research", "accrue_time": submit, "container": "", "group_name": "research", "prefer": "",
        "admin_comment": "", "array_job_id": 0,
        "array_task_id": None, "array_max_tasks": 0, "array_task_string": "", "association_id": 0,
        "batch_features": "", "batch_flag": True, "batch_host": w.node if running else "", "flags": [],
        "burst_buffer": "", "burst_buffer_state": "", "cluster": "sim", "cluster_features": "", "command":
        "/home/research/train.sh", "comment": "", "contiguous": False, "core_spec": None, "thread_spec": None,
        "cores_per_socket": None, "billable_tres": 8.0, "cpus_per_task": 8, "cpu_frequency_minimum": None,
        "cpu_frequency_maximum": None, "cpu_frequency_governor": None, "cpus_per_tres": "",
        "deadline": 0, "delay_boot": 0, "dependency": "", "derived_exit_code": 0, "eligible_time": submit,
        "end_time": submit + 86400, "excluded_nodes": "", "exit_code": 0, "features": "",
        "federation_origin": "", "federation_siblings_active": "", "federation_siblings_viable": "",
        "gres_detail": [f"gpu:{w.gpus}(IDX:{w.slot})"] if running else [], "group_id": 1000,
        "job_id": w.job_id, "job_resources": {"nodes": w.node, "allocated_cores": 8, "allocated_hosts": 1,
                                               "allocated_nodes": [{
                                                   "sockets": {"0": {"cores": {str(c): "allocated"
                                                                               for c in range(4)}},
                                                               "1": {"cores": {str(c): "allocated"
                                                                               for c in range(4)}}},
                                                   "nodename": w.node, "cpus_used": 0, "memory_used": 0,
                                                   "memory_allocated": 32768}]},
        "job_state": "RUNNING" if running else "PENDING", "last_sched_evaluation": _epoch(state.now),
        "licenses": "", "max_cpus": 0, "max_nodes": 0, "mcs_label": "", "memory_per_tres": "",
        "name": w.name, "nodes": w.node if running else "", "nice": 0, "tasks_per_core": None,
        "tasks_per_node": 0, "tasks_per_socket": None, "tasks_per_board": 0, "cpus": 8, "node_count": 1,
        "tasks": 1, "het_job_id": 0, "het_job_id_set": "", "het_job_offset": 0, "partition": PARTITION,
        "memory_per_node": 32768, "memory_per_cpu": None, "minimum_cpus_per_node": 8,
        "minimum_tmp_disk_per_node": 0, "preempt_time": 0, "pre_sus_time": 0, "priority": 4294901000,
        "profile": None, "qos": "normal", "reboot": False, "required_nodes": "", "requeue": True,
        "resize_time": 0, "restart_cnt": 0, "resv_name": "", "shared": None, "show_flags": ["SHOW_ALL"],
        "sockets_per_board": 0, "sockets_per_node": None, "start_time": submit if running else 0,
        "state_description": "", "state_reason": "None" if running else "Resources", "standard_error": "",
        "standard_input": "/dev/null", "standard_output": "", "submit_time": submit, "suspend_time": 0,
        "system_comment": "", "time_limit": 1440, "time_minimum": 0, "threads_per_core": None,
        "tres_bind": "", "tres_freq": "", "tres_per_job": "", "tres_per_node": "gres:gpu:1",
        "tres_per_socket": "", "tres_per_task": "", "tres_req_str": tres, "tres_alloc_str": tres if running else "",
        "user_id": 1000, "user_name": "research", "wckey": "", "current_working_directory": "/home/research",
    }
    if not running:  # slurmctld has given a pending job no resources and no billing yet
        del job["job_resources"]
        job["billable_tres"] = None
    return job


def error_body(error: str, number: int, description: str, source: str, plugin: str = "v0.0.38") -> dict:
    return {"meta": meta(plugin), "errors": [{"error": error, "error_number": number,
                                              "description": description, "source": source}]}


def make_app(state: SimState) -> Starlette:
    """The slurmrestd app over ``state``."""

    def locked(fn):
        async def handler(request: Request):
            with state.lock:
                state.sync()
                return await fn(request)
        return handler

    @locked
    async def nodes(request):
        return JSONResponse({"meta": meta(), "errors": [],
                             "nodes": [node_object(state, rec) for rec in state.nodes(ROLE)]})

    @locked
    async def node(request):
        name = request.path_params["name"]
        try:
            rec = state.node(ROLE, name)
        except SimNotFound:
            return JSONResponse({"meta": meta(), "errors": [{"error": "Invalid node name specified",
                                                            "errno": V38_NODE_NOT_FOUND_ERRNO}], "nodes": []},
                                status_code=500)
        return JSONResponse({"meta": meta(), "errors": [], "nodes": [node_object(state, rec)]})

    def all_jobs():
        return state.running(ROLE) + state.pending(ROLE)

    @locked
    async def jobs(request):
        return JSONResponse({"meta": meta(), "errors": [], "jobs": [job_object(state, w) for w in all_jobs()]})

    @locked
    async def job(request):
        try:
            jid = int(request.path_params["job_id"])
        except ValueError:
            return JSONResponse(error_body("Invalid job id specified", ESLURM_INVALID_JOB_ID,
                                           "Unable to parse job id", "_handle_job_get"), status_code=400)
        found = [w for w in all_jobs() if w.job_id == jid]
        if not found:
            body = error_body("Invalid job id specified", ESLURM_INVALID_JOB_ID, f"Unable to find JobId={jid}",
                              "slurm_load_job")
            return JSONResponse({**body, "jobs": []}, status_code=500)
        if request.method == "DELETE":
            if found[0].state == "Running":
                state.evict(ROLE, jid)
            return JSONResponse({"meta": meta(), "errors": []})
        return JSONResponse({"meta": meta(), "errors": [], "jobs": [job_object(state, found[0])]})

    @locked
    async def requeue(request):
        try:
            jid = int(request.path_params["job_id"])
        except ValueError:
            return JSONResponse({"errors": [{"error": "Invalid job id specified"}]}, status_code=400)
        found = [w for w in all_jobs() if w.job_id == jid]
        if not found:
            return JSONResponse({"errors": [{"error": "Invalid job id specified"}]}, status_code=404)
        if found[0].state != "Running":
            return JSONResponse({"errors": [{"error": "Job is pending execution"}]}, status_code=409)
        state.requeue(ROLE, jid)
        return JSONResponse({"errors": []})

    @locked
    async def update_node(request):
        name = request.path_params["name"]
        plugin = "v0.0.39"
        try:
            body = json.loads(await request.body())
            if not isinstance(body, dict):
                raise TypeError
        except (ValueError, TypeError):
            return JSONResponse(error_body("Unable to parse query", ESLURM_REST_INVALID_QUERY,
                                           "body must be a JSON object", "_update_node", plugin), status_code=400)
        try:
            state.node(ROLE, name)
        except SimNotFound:
            return JSONResponse(error_body("Invalid node name specified", ESLURM_INVALID_NODE_NAME,
                                           f"Unable to update node {name}", "_update_node", plugin), status_code=404)
        wanted = body.get("state") or []
        wanted = [wanted] if isinstance(wanted, str) else wanted
        wanted = [str(s).upper() for s in wanted]
        reason = body.get("reason") or ""
        if body.get("gres") is not None:  # slurmctld takes only what the node's slurmd detects
            model, count, _ = node_gres(state.node(ROLE, name))
            if str(body["gres"]) not in (f"gpu:{model}:{count}", f"gpu:{count}"):
                return JSONResponse(error_body("Invalid generic resource (gres) specification", 2072,
                                               f"node {name} has gpu:{model}:{count}, not {body['gres']}",
                                               "_update_node", plugin), status_code=400)
        try:
            if "DRAIN" in wanted or "DOWN" in wanted:
                if not reason:
                    return JSONResponse(error_body("Invalid node state specified", 2009,
                                                   "You must specify a reason when DOWNING or DRAINING a node. "
                                                   "Request denied", "_update_node", plugin), status_code=400)
                state.cordon(ROLE, name, reason, via="slurm")
            elif "RESUME" in wanted or "UNDRAIN" in wanted or "IDLE" in wanted:
                state.uncordon(ROLE, name)
            elif wanted:
                return JSONResponse(error_body("Invalid node state specified", 2009,
                                               f"state {wanted} is not one of DRAIN, DOWN, RESUME, UNDRAIN",
                                               "_update_node", plugin), status_code=400)
            elif reason:
                rec = state.node(ROLE, name)
                if rec["cordoned"]:
                    state.cordon(ROLE, name, reason, via="slurm")
        except SimConflict as exc:
            return JSONResponse(error_body("Node update refused", 2009, str(exc), "_update_node", plugin),
                                status_code=409)
        return JSONResponse({"meta": meta(plugin), "errors": [], "warnings": []})

    async def diag(request):
        return JSONResponse({"meta": meta(), "errors": [], "statistics": {"parts_packed": 1}})

    async def ping(request):
        return JSONResponse({"meta": meta(), "errors": [],
                             "pings": [{"hostname": "slurmctld", "ping": "UP", "status": 0, "mode": "primary"}]})

    async def not_found(request, exc):
        return PlainTextResponse(UNKNOWN_PATH_TEXT, status_code=404)

    return Starlette(routes=[
        Route("/slurm/v0.0.38/diag", diag, methods=["GET"]),
        Route("/slurm/v0.0.38/ping", ping, methods=["GET"]),
        Route("/slurm/v0.0.38/nodes", nodes, methods=["GET"]),
        Route("/slurm/v0.0.38/node/{name}", node, methods=["GET"]),
        Route("/slurm/v0.0.38/jobs", jobs, methods=["GET"]),
        Route("/slurm/v0.0.38/job/{job_id}", job, methods=["GET", "DELETE"]),
        Route("/slurm/v0.0.39/node/{name}", update_node, methods=["POST"]),
        Route("/sim/slurmctld/requeue/{job_id}", requeue, methods=["POST"]),
    ], exception_handlers={404: not_found})
