"""Prometheus HTTP API over the simulated exporters (DCGM on GPU nodes, the Slurm exporter).

Series served (values are what the exporters would have scraped, exporter glitches included):

* ``DCGM_FI_DEV_GPU_UTIL`` (percent) and ``DCGM_FI_DEV_FB_USED`` (MiB) per GPU of every
  Slurm and Kubernetes node, labelled ``gpu``, ``UUID``, ``device``, ``modelName``, ``Hostname``,
  ``instance``, ``job``, ``cluster`` — and, while a job runs on the GPU, ``hpc_job`` (Slurm) or
  ``namespace``/``pod``/``container`` (Kubernetes): a new series per job, as the exporter does.
* ``slurm_gpus_total``, ``slurm_gpus_alloc``, ``slurm_gpus_idle`` per node (``node``,
  ``partition``), ``slurm_gpus_pending`` (GPUs requested by pending jobs, the demand the cluster
  cannot place) and per partition ``slurm_partition_gpus_{total,alloc,idle,pending}``. Totals
  count the GPUs open to new work (a drained node exports 0), like the world's ``gpu_capacity``.

Sample timestamps are the starts of the world's steps; an instant sees the latest sample at or
before it within the lookback (5 minutes or one step, whichever is longer, both ends included as
in Prometheus 2.x). Nothing after the simulated clock exists.

The scenario's telemetry faults (``faults:``, :mod:`gpupool.sim.faults`) are served as a real
exporter's would look, on the Slurm demand series: ``gpu_allocated``'s on the Slurm exporter's
``slurm_gpus_alloc`` / ``slurm_partition_gpus_alloc`` (their sum over nodes reads what the fault
plan says), ``gpu_pending``'s on the pending-GPU exporter's ``slurm_gpus_pending`` /
``slurm_partition_gpus_pending``. Each of the two exporters is a scrape target with ``up`` and
``scrape_samples_scraped`` (labels ``job``, ``instance``, ``cluster``): a stuck exporter keeps
answering ``up = 1`` with its last sample, whose own time (``timestamp()``) stays frozen; a
dropped or restarting one answers ``up = 0`` (and 0 samples scraped) while its gauges read what
the fault plan says; a gap is ``up = 0`` and no sample at all (a staleness marker: the instant
does not look back to an older sample). A spike leaves no trace but the value.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
import pandas as pd
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from gpupool.emulator.promql import (
    PromQLError,
    Selector,
    evaluate,
    format_value,
    parse,
    parse_selector,
)
from gpupool.emulator.state import WORK_NAMESPACE, SimState, stable_uuid
from gpupool.sim.faults import FaultSpec, fault_plan

#: Prometheus refuses a range query with more points than this per series
MAX_POINTS = 11_000
LOOKBACK_S = 300.0
DCGM_FAMILIES = {"DCGM_FI_DEV_GPU_UTIL": "gauge", "DCGM_FI_DEV_FB_USED": "gauge"}
SLURM_NODE_FAMILIES = ("slurm_gpus_total", "slurm_gpus_alloc", "slurm_gpus_idle")
SLURM_PARTITION_FAMILIES = ("slurm_partition_gpus_total", "slurm_partition_gpus_alloc",
                            "slurm_partition_gpus_idle", "slurm_partition_gpus_pending")
#: the scrape targets of the Slurm demand gauges: (job, instance) -> the canonical metric whose
#: fault plan they serve, and the families they export
TARGETS = {
    ("slurm-exporter", "slurmctld:8080"): ("gpu_allocated", ("slurm_gpus_alloc", "slurm_partition_gpus_alloc")),
    ("slurm-pending-exporter", "slurmctld:9341"): ("gpu_pending", ("slurm_gpus_pending", "slurm_partition_gpus_pending")),
}
#: family -> its target
TARGET_OF = {f: t for t, (_, fams) in TARGETS.items() for f in fams}
HEALTH_FAMILIES = ("up", "scrape_samples_scraped")
FAMILIES = (*DCGM_FAMILIES, *SLURM_NODE_FAMILIES, "slurm_gpus_pending", *SLURM_PARTITION_FAMILIES, *HEALTH_FAMILIES)
#: the longest a stuck exporter repeats one sample (steps): how far before a grid its data is read
HOLD_REACH = 25
PARTITION = "gpu"
DRIVER_VERSION = "550.54.15"
BUILD_INFO = {"version": "2.42.0", "revision": "", "branch": "", "buildUser": "", "buildDate": "",
              "goVersion": "go1.19.8"}

_DURATION = re.compile(r"^(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?$")


class BadData(ValueError):
    """A request Prometheus answers with 400 bad_data."""


def _error(message: str, status: int = 400, kind: str = "bad_data") -> JSONResponse:
    return JSONResponse({"status": "error", "errorType": kind, "error": message}, status_code=status)


def _ok(data: Any) -> JSONResponse:
    return JSONResponse({"status": "success", "data": data})


def parse_time(value: str, name: str) -> float:
    """A Prometheus time parameter (unix seconds or RFC 3339) as unix seconds."""
    try:
        return float(value)
    except ValueError:
        pass
    try:
        ts = pd.Timestamp(value)
        ts = ts.tz_localize("UTC") if ts.tzinfo is None else ts
        return ts.timestamp()
    except (ValueError, TypeError):
        raise BadData(f'invalid parameter "{name}": cannot parse "{value}" to a valid timestamp') from None


def parse_duration(value: str, name: str) -> float:
    """A Prometheus duration parameter (float seconds or ``1h30m``) in seconds."""
    try:
        return float(value)
    except ValueError:
        pass
    m = _DURATION.match(value)
    if not value or not m or not any(m.groups()):
        raise BadData(f'invalid parameter "{name}": cannot parse "{value}" to a valid duration')
    y, w, d, h, mi, s, ms = (int(g) if g else 0 for g in m.groups())
    return (((y * 365 + w * 7 + d) * 24 + h) * 60 + mi) * 60 + s + ms / 1000.0


def _format_finite(v: float) -> str:
    """`format_value` of a Python float that is not NaN (the hot path of a range query)."""
    if v.is_integer() and abs(v) < 1e15:
        return str(int(v))
    if v != v or v in (float("inf"), float("-inf")):
        return format_value(v)
    return repr(v)


def _stamp(t: float) -> float | int:
    t = round(t, 3)
    return int(t) if float(t).is_integer() else t


class SeriesStore:
    """Resolves selectors to series of the simulated exporters over a grid of instants."""

    def __init__(self, state: SimState):
        self.state = state
        self._plans: dict[str, dict[str, np.ndarray]] | None = None

    def plans(self) -> dict[str, dict[str, np.ndarray]]:
        """The scenario's fault plan of each Slurm demand metric (none without ``faults:``), drawn
        as the what-if draws them, so a study and the facade show the same faults."""
        if self._plans is None:
            world = self.state.world
            spec = world.scenario.faults or FaultSpec()
            p = self.state.platform("slurm")
            n, spd = len(world.index), pd.Timedelta("1D") / world.step
            self._plans = {m: fault_plan(spec, p, m, n, spd) for m, _ in TARGETS.values()} \
                if spec.any() and p is not None else {}
        return self._plans

    def _steps(self, instants: np.ndarray) -> np.ndarray:
        """The world step of each instant (clipped to the steps before the clock)."""
        st = self.state
        step_s = st.step.total_seconds()
        s = np.floor((instants - st.world.start.timestamp()) / step_s).astype(np.int64)
        return np.minimum(s, st.clock_i - 1)

    def _fault_at(self, metric: str, instants: np.ndarray) -> dict[str, np.ndarray]:
        """The fault plan of ``metric`` at each instant's step (no fault outside the world's steps)."""
        plan = self.plans()[metric]
        s = self._steps(instants)
        inside = (s >= 0) & (s < len(plan["scale"]))
        at = np.clip(s, 0, len(plan["scale"]) - 1)
        return {"scale": np.where(inside, plan["scale"][at], 1.0), "add": np.where(inside, plan["add"][at], 0.0),
                "hold": np.where(inside, plan["hold"][at], -1), "gap": inside & plan["gap"][at], "step": s}

    def _chosen_steps(self, role: str, instants: np.ndarray) -> tuple[dict, np.ndarray]:
        """Exported data around ``instants`` and, per instant, the relative step it reads (-1: none)."""
        st = self.state
        step_s = st.step.total_seconds()
        start_s = st.world.start.timestamp()
        lookback = max(LOOKBACK_S, step_s)
        back = int(math.ceil(lookback / step_s)) + (HOLD_REACH if role == "slurm" and self.plans() else 0)
        s = self._steps(instants)
        lo = int(max(0, (s.min() if len(s) else 0) - back))
        hi = int(max(lo, min(st.clock_i, (s.max() + 1) if len(s) else 0)))
        e = st.exported(role, lo, hi)
        chosen = np.full(len(instants), -1, dtype=np.int64)
        if e["platform"] is None or hi <= lo:
            return e, chosen
        reported = e["reported"]
        for o in range(int(math.ceil(lookback / step_s)) + 1):
            cand = s - o
            ok = (chosen < 0) & (cand >= lo) & (cand < hi)
            ok &= (instants - (start_s + cand * step_s)) <= lookback + 1e-9
            rel = np.clip(cand - lo, 0, max(hi - lo - 1, 0))
            ok &= reported[rel]
            chosen = np.where(ok, rel, chosen)
        return e, chosen

    def resolve(self, sel: Selector, instants: np.ndarray, stamps: bool = False) -> list[tuple[dict, np.ndarray]]:
        """Series matching ``sel`` with values at ``instants`` (NaN: no sample); with ``stamps``,
        the samples' own times (unix seconds) instead of their values."""
        names = [f for f in FAMILIES if any(m.name == "__name__" for m in sel.matchers)
                 and all(m.matches({"__name__": f}) for m in sel.matchers if m.name == "__name__")]
        if not any(m.name == "__name__" for m in sel.matchers):
            names = list(FAMILIES)
        out: list[tuple[dict, np.ndarray]] = []
        cache: dict[str, tuple] = {}
        for name in names:
            roles = ("slurm", "kubernetes") if name in DCGM_FAMILIES else ("slurm",)
            for role in roles:
                if role not in cache:
                    cache[role] = self._chosen_steps(role, instants)
                e, chosen = cache[role]
                if e["platform"] is None:
                    continue
                if name in HEALTH_FAMILIES:
                    series = self._health(name, e, chosen, instants)
                else:
                    series = self._served(name, role, e, chosen, instants, sel, stamps)
                for labels, values in series:
                    if all(m.matches(labels) for m in sel.matchers):
                        out.append((labels, values))
        return out

    def _served(self, name: str, role: str, e: dict, chosen: np.ndarray, instants: np.ndarray,
                sel: Selector, stamps: bool):
        """The series of family ``name`` as its target serves them: its metric's fault plan applied."""
        st = self.state
        step_s = st.step.total_seconds()
        start_s = st.world.start.timestamp()
        target = TARGET_OF.get(name)
        metric = TARGETS[target][0] if target else None
        if metric is None or metric not in self.plans():
            for labels, values in self._family(name, role, e, chosen, sel):
                yield labels, (np.where(np.isnan(values), np.nan, start_s + (e["i0"] + chosen) * step_s)
                               if stamps else values)
            return
        f = self._fault_at(metric, instants)
        held = (f["hold"] >= 0) & (chosen >= 0)
        source = np.where(held, f["hold"] - e["i0"], chosen)
        source = np.where((source >= 0) & (source < e["i1"] - e["i0"]), source, -1)
        series = list(self._family(name, role, e, source, sel))
        counted = np.maximum(sum((~np.isnan(v)).astype(int) for _, v in series) if series else 0, 1)
        for labels, values in series:
            if stamps:
                yield labels, np.where(np.isnan(values) | f["gap"], np.nan, start_s + (e["i0"] + source) * step_s)
                continue
            # the sum over the series reads scale x the true total + add, as the fault plan says
            seen = values * f["scale"] + f["add"] / counted
            yield labels, np.where(f["gap"], np.nan, seen)

    def _health(self, name: str, e: dict, chosen: np.ndarray, instants: np.ndarray):
        """``up`` / ``scrape_samples_scraped`` of the Slurm demand gauges' targets at ``instants``."""
        steps = self._steps(instants)
        answered = steps >= 0
        own = steps - e["i0"]
        inside = (own >= 0) & (own < e["i1"] - e["i0"])
        # the world's own silent exporter steps are failed scrapes too
        reported = inside & e["reported"][np.clip(own, 0, max(e["i1"] - e["i0"] - 1, 0))] if e["i1"] > e["i0"] \
            else np.zeros(len(instants), dtype=bool)
        for (job, instance), (metric, fams) in TARGETS.items():
            up = answered & reported
            if metric in self.plans():
                f = self._fault_at(metric, instants)
                # a scrape that found no exporter, or one restarting: the plan's drops and resets
                failed = f["gap"] | ((f["scale"] != 1.0) & (f["add"] == 0.0))
                up = up & ~failed
            labels = {"__name__": name, "job": job, "instance": instance, "cluster": e["platform"]}
            if name == "up":
                yield labels, np.where(answered, up.astype(float), np.nan)
            else:
                owned = e["owned"][:, np.where(chosen >= 0, chosen, 0)].sum(axis=0) if e["i1"] > e["i0"] else 0
                count = (owned + 1.0) if fams[0] == "slurm_gpus_alloc" else 2.0
                yield labels, np.where(answered, np.where(up, count, 0.0), np.nan)

    def _node_filter(self, sel: Selector | None, labels_of) -> np.ndarray:
        """Which world nodes may have a series matching ``sel``, judged by the matchers on the
        labels ``labels_of(node)`` gives (a node's own labels): a selector naming some nodes
        is answered without building every other node's series, as an index lookup would."""
        nodes = self.state.world.nodes
        keep = np.ones(len(nodes), dtype=bool)
        if sel is None:
            return keep
        known = labels_of(nodes[0]).keys() if nodes else ()
        own = [m for m in sel.matchers if m.name in known]
        if not own:
            return keep
        for j, node in enumerate(nodes):
            labels = labels_of(node)
            keep[j] = all(m.matches(labels) for m in own)
        return keep

    def _family(self, name: str, role: str, e: dict, chosen: np.ndarray, sel: Selector | None = None):
        st = self.state
        has = chosen >= 0
        idx = np.where(has, chosen, 0)
        nodes = st.world.nodes
        if name in DCGM_FAMILIES:
            yield from self._dcgm(name, role, e, idx, has, sel)
            return
        owned = e["owned"][:, idx] & has[None, :]
        sched = owned & ~st.world.cordoned_[:, e["i0"]:e["i1"]][:, idx]
        alloc = e["occ"][:, :, idx].sum(axis=1) * e["factor"][idx][None, :]
        gpus = np.array([n.gpus for n in nodes], dtype=float)[:, None]
        total = np.where(sched, gpus, 0.0)
        job, instance = TARGET_OF.get(name, ("slurm-exporter", "slurmctld:8080"))
        base = {"job": job, "instance": instance, "cluster": e["platform"]}
        if name in SLURM_NODE_FAMILIES:
            value = {"slurm_gpus_total": total, "slurm_gpus_alloc": alloc,
                     "slurm_gpus_idle": np.maximum(total - alloc, 0.0)}[name]
            wanted = self._node_filter(sel, lambda n: {"node": n.name, "partition": PARTITION})
            for j, node in enumerate(nodes):
                if wanted[j] and owned[j].any():
                    labels = {"__name__": name, **base, "node": node.name, "partition": PARTITION}
                    yield labels, np.where(owned[j], value[j], np.nan)
            return
        pending = np.where(has, e["pending"][idx], np.nan)
        if name == "slurm_gpus_pending":
            yield {"__name__": name, **base}, pending
            return
        agg = {"slurm_partition_gpus_total": total, "slurm_partition_gpus_alloc": alloc * owned,
               "slurm_partition_gpus_idle": np.maximum(total - alloc * owned, 0.0)}
        value = pending if name == "slurm_partition_gpus_pending" else np.where(has, agg[name].sum(axis=0), np.nan)
        yield {"__name__": name, **base, "partition": PARTITION}, value

    def _dcgm(self, name: str, role: str, e: dict, idx: np.ndarray, has: np.ndarray, sel: Selector | None = None):
        st = self.state
        platform = e["platform"]
        wanted = self._node_filter(sel, lambda n: {"Hostname": n.name, "instance": f"{n.name}:9400",
                                                   "modelName": n.gpu_model})
        for j, node in enumerate(st.world.nodes):
            if not wanted[j]:
                continue
            owned = e["owned"][j, idx] & has
            if not owned.any():
                continue
            mem_total = 81920.0 if "80" in node.gpu_model else 40960.0 if "40" in node.gpu_model else 24576.0
            for k in range(node.gpus):
                util = e["util"][j, k, idx]
                busy = e["occ"][j, k, idx]
                job = np.where(busy, e["job"][j, k, idx], 0)
                if name == "DCGM_FI_DEV_GPU_UTIL":
                    value = np.round(util, 3)
                else:
                    value = np.round(np.where(busy, mem_total * (0.3 + 0.6 * util / 100.0), 0.0)
                                     * np.where(busy, e["factor"][idx], 1.0))
                base = {
                    "__name__": name, "gpu": str(k), "UUID": "GPU-" + stable_uuid("gpu", node.name, k),
                    "device": f"nvidia{k}", "modelName": node.gpu_model, "Hostname": node.name,
                    "DCGM_FI_DRIVER_VERSION": DRIVER_VERSION, "instance": f"{node.name}:9400",
                    "job": "dcgm-exporter", "cluster": platform,
                }
                for jid in np.unique(job[owned]):
                    labels = dict(base)
                    if jid:
                        if role == "slurm":
                            labels["hpc_job"] = str(int(jid))
                        else:
                            labels.update(namespace=WORK_NAMESPACE, pod=f"gpu-job-{int(jid)}", container="main")
                    mask = owned & (job == jid)
                    yield labels, np.where(mask, value, np.nan)


def make_app(state: SimState) -> Starlette:
    """The Prometheus HTTP API app over ``state``."""
    store = SeriesStore(state)

    async def params(request: Request) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for k, v in request.query_params.multi_items():
            out.setdefault(k, []).append(v)
        if request.method == "POST":
            form = await request.form()
            for k, v in form.multi_items():
                out.setdefault(k, []).append(str(v))
        return out

    def one(p: dict, name: str) -> str | None:
        return p[name][0] if name in p and p[name] else None

    def run(expr: str, instants: np.ndarray):
        node = parse(expr)
        with state.lock:
            state.sync()
            return evaluate(node, lambda sel, stamps=False: store.resolve(sel, instants, stamps), len(instants))

    async def query(request: Request):
        p = await params(request)
        try:
            with state.lock:
                now = state.sync().timestamp()
            t = parse_time(one(p, "time"), "time") if one(p, "time") else now
            result = run(one(p, "query") or "", np.array([t]))
        except PromQLError as exc:
            return _error(exc.prometheus_message())
        except BadData as exc:
            return _error(str(exc))
        if isinstance(result, np.ndarray):
            return _ok({"resultType": "scalar", "result": [_stamp(t), format_value(result[0])]})
        vec = [{"metric": lab, "value": [_stamp(t), format_value(v[0])]} for lab, v in result if not np.isnan(v[0])]
        return _ok({"resultType": "vector", "result": sorted(vec, key=lambda r: sorted(r["metric"].items()))})

    async def query_range(request: Request):
        p = await params(request)
        try:
            for name in ("start", "end", "step"):
                if not one(p, name):
                    raise BadData(f'invalid parameter "{name}": cannot parse "" to a valid '
                                  f'{"duration" if name == "step" else "timestamp"}')
            start, end = parse_time(one(p, "start"), "start"), parse_time(one(p, "end"), "end")
            step = parse_duration(one(p, "step"), "step")
            if end < start:
                raise BadData('invalid parameter "end": end timestamp must not be before start time')
            if step <= 0:
                raise BadData('invalid parameter "step": zero or negative query resolution step widths are not '
                              "accepted. Try a positive integer")
            if (end - start) / step > MAX_POINTS:
                raise BadData("exceeded maximum resolution of 11,000 points per timeseries. Try decreasing the "
                              "query resolution (?step=XX)")
            n = int(math.floor((end - start) / step + 1e-9)) + 1
            instants = start + step * np.arange(n)
            result = run(one(p, "query") or "", instants)
        except PromQLError as exc:
            return _error(exc.prometheus_message())
        except BadData as exc:
            return _error(str(exc))
        stamps = [_stamp(t) for t in instants.tolist()]  # once per grid, not once per point
        if isinstance(result, np.ndarray):
            return _ok({"resultType": "matrix", "result": [
                {"metric": {}, "values": [[stamps[i], format_value(v)] for i, v in enumerate(result.tolist())]}]})
        matrix = []
        for lab, v in result:
            keep = np.flatnonzero(~np.isnan(v))
            if len(keep):
                matrix.append({"metric": lab, "values": [[stamps[i], _format_finite(x)]
                                                         for i, x in zip(keep.tolist(), v[keep].tolist())]})
        return _ok({"resultType": "matrix", "result": sorted(matrix, key=lambda r: sorted(r["metric"].items()))})

    def matching(p: dict) -> list[dict]:
        """Label sets of the series matching the match[] selectors between start and end."""
        with state.lock:
            now = state.sync().timestamp()
            end = parse_time(one(p, "end"), "end") if one(p, "end") else now
            start = parse_time(one(p, "start"), "start") if one(p, "start") else end - 86400.0
            if end < start:
                raise BadData('invalid parameter "end": end timestamp must not be before start time')
            step_s = state.step.total_seconds()
            first = math.ceil((start - state.world.start.timestamp()) / step_s)
            last = math.floor((end - state.world.start.timestamp()) / step_s)
            instants = state.world.start.timestamp() + step_s * np.arange(max(first, 0), max(last, first, 0) + 1)
            instants = instants[(instants >= start) & (instants <= end)]
            if not len(instants):
                instants = np.array([end])
            seen: dict[tuple, dict] = {}
            for text in p.get("match[]", []) or ['{__name__=~".+"}']:
                for lab, v in store.resolve(parse_selector(text), instants):
                    if not np.isnan(v).all():
                        seen[tuple(sorted(lab.items()))] = lab
        return sorted(seen.values(), key=lambda lab: sorted(lab.items()))

    async def series(request: Request):
        p = await params(request)
        if not p.get("match[]"):
            return _error("no match[] parameter provided")
        try:
            return _ok(matching(p))
        except PromQLError as exc:
            return _error(exc.prometheus_message().replace('"query"', '"match[]"'))
        except BadData as exc:
            return _error(str(exc))

    async def labels(request: Request):
        p = await params(request)
        try:
            if not p.get("match[]"):
                names = {"__name__"}
                for lab in matching({**p, "match[]": ['{__name__=~".+"}']}):
                    names.update(lab)
                return _ok(sorted(names))
            return _ok(sorted({k for lab in matching(p) for k in lab}))
        except PromQLError as exc:
            return _error(exc.prometheus_message().replace('"query"', '"match[]"'))
        except BadData as exc:
            return _error(str(exc))

    async def label_values(request: Request):
        name = request.path_params["name"]
        p = await params(request)
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            return _error(f'invalid label name: "{name}"')
        try:
            if name == "__name__" and not p.get("match[]"):
                return _ok(sorted(FAMILIES))
            return _ok(sorted({lab[name] for lab in matching(p) if lab.get(name, "") != ""}))
        except PromQLError as exc:
            return _error(exc.prometheus_message().replace('"query"', '"match[]"'))
        except BadData as exc:
            return _error(str(exc))

    async def buildinfo(request: Request):
        return _ok(BUILD_INFO)

    async def ready(request: Request):
        return PlainTextResponse("Prometheus Server is Ready.\n")

    async def healthy(request: Request):
        return PlainTextResponse("Prometheus Server is Healthy.\n")

    async def root(request: Request):
        return PlainTextResponse('<a href="/graph">Found</a>.\n', status_code=200)

    async def not_found(request: Request, exc):
        return PlainTextResponse("404 page not found\n", status_code=404)

    routes = [
        Route("/api/v1/query", query, methods=["GET", "POST"]),
        Route("/api/v1/query_range", query_range, methods=["GET", "POST"]),
        Route("/api/v1/series", series, methods=["GET", "POST"]),
        Route("/api/v1/labels", labels, methods=["GET", "POST"]),
        Route("/api/v1/label/{name}/values", label_values, methods=["GET"]),
        Route("/api/v1/status/buildinfo", buildinfo, methods=["GET"]),
        Route("/-/ready", ready, methods=["GET", "HEAD"]),
        Route("/-/healthy", healthy, methods=["GET", "HEAD"]),
        Route("/", root, methods=["GET", "HEAD"]),
    ]
    return Starlette(routes=routes, exception_handlers={404: not_found})
