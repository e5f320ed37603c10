"""Reclaims end to end (issue 42's bar): the `gpupool_fastpath` DAG, run by Airflow (`dag.test()`,
one run per 5-minute logical date as the simulated clock reaches it), against the virtual
datacenter served by `gpupool sim serve` at a speed-up, with actuation on.

The Kubernetes platform owns its four nodes (`owns: 4`, `reclaim_minutes: 30`,
`min_runtime_minutes: 10`) and admits work through a Kueue ClusterQueue whose `nominalQuota`
follows its nodes (`quota: {kind: kueue}`; the queue is created in the datacenter at the start,
32 GPUs for its four 8-GPU nodes). Slurm starts short by one node, so gpupool lends it an idle
Kubernetes node through a real move: the quota shrinks before the node is cordoned. Slurm's work
then leaves the borrowed node (its demand drops to what its own nodes hold) and comes back onto it
at the very step Kubernetes bursts with pods its three nodes cannot run. The owner wants its node
back while borrowed work on it has run only minutes: the reclaim waits until that work ran
`min_runtime_minutes`, requeues the Slurm jobs (`scontrol requeue`: they wait in Slurm's queue under
their own ids), moves the node home and opens it there, and the quota grows after the uncordon, all
within `reclaim_minutes` of the need; the burst's pods then run.

The second test turns it around: Slurm owns its nodes and lends one to Kubernetes, whose
ClusterQueue grows by the node after its uncordon; Slurm's burst takes it back through the
Eviction API once the pods on it ran `min_runtime_minutes`, the quota shrinking before the cordon.

Staging holds what the hourly pipeline would have left there (a plan that reserves nothing, an
inventory snapshot: the GPUs a node in transit brings). The datacenter between the platforms
(provisioning a released node to its next platform) is datacenter.py's :class:`ProvisionedActuator`,
the one thing this test adds to what the product builds.
"""

from __future__ import annotations

import contextlib
import copy
import json
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pandas as pd
import pytest
import requests
import yaml

import datacenter  # tests/e2e/, on sys.path by conftest.py

pytestmark = pytest.mark.slow

T0 = datetime(2026, 6, 1, tzinfo=timezone.utc)
NOW = T0 + timedelta(days=1)  # where the served clock starts
AWAY = NOW + timedelta(minutes=30)  # slurm's demand drops from 40 to 32 GPUs: the borrowed node runs nothing
BURST = NOW + timedelta(minutes=40)  # kubernetes 8 -> 32 GPUs, and slurm's 40 again: its jobs start on the node
MOVE_MINUTES = 10  # the datacenter's move, and limits.move_minutes
RECLAIM_MINUTES, MIN_RUNTIME_MINUTES = 30, 10
SPEED = 30  # simulated seconds per wall second: a 5-minute tick every 10 s
TICK = timedelta(minutes=5)
LAST = BURST + timedelta(minutes=RECLAIM_MINUTES + 10)  # the last tick run, at most
QUEUE, FLAVOR, GPU = "cluster-queue", "default-flavor", "nvidia.com/gpu"
H100 = "NVIDIA H100 80GB HBM3"  # kubernetes' nodes (datacenter.write_scenario)
RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "recorded"


def _served_scenario(tmp_path: Path, slurm, kubernetes) -> Path:
    """The datacenter's scenario with each platform's demand a function of the step's time."""
    idx = pd.date_range(T0, T0 + timedelta(days=2), freq="5min", inclusive="left")
    none = [0.0] * len(idx)
    traces = [datacenter.write_trace(tmp_path / f"{name}.csv", T0, [float(f(t)) for t in idx], none, 32)
              for name, f in (("slurm", slurm), ("kubernetes", kubernetes))]
    return datacenter.write_scenario(tmp_path, *traces, MOVE_MINUTES)


def _scenario(tmp_path: Path) -> Path:
    return _served_scenario(tmp_path, lambda t: 32 if AWAY <= t < BURST else 40,  # 40: one node more than its four
                            lambda t: 32 if t >= BURST else 8)


def _config(tmp_path: Path) -> Path:
    path = datacenter.write_config(tmp_path)
    cfg = yaml.safe_load(path.read_text())
    (k8s,) = [p for p in cfg["platforms"] if p["name"] == "kubernetes"]
    k8s.update({"owns": 4, "reclaim_minutes": RECLAIM_MINUTES, "min_runtime_minutes": MIN_RUNTIME_MINUTES,
                "quota": {"kind": "kueue", "cluster_queue": QUEUE, "flavor": FLAVOR, "resource": GPU}})
    cfg["limits"] = {"move_minutes": MOVE_MINUTES}
    path.write_text(yaml.safe_dump(cfg))
    return path


def _inventory(engine, urls: dict, at: datetime) -> None:
    """The hourly pipeline's inventory snapshot of both platforms at ``at``, as the datacenter
    lists its nodes: what tells the fast path the GPUs a node in transit brings."""
    from gpupool.staging.schema import inventory_node

    with engine.begin() as conn:
        conn.execute(inventory_node.insert(), [
            {"platform": e["platform"], "node": name, "snapshot_at": at, "gpus": e["gpus"], "gpu_model": e["gpu_model"],
             "mig_layout": None, "schedulable": e["schedulable"], "drain_reason": e["drain_reason"] or None,
             "busy_gpus": float(e["busy_gpus"])}
            for name, e in datacenter.pool(urls["control"]).items()])


def _kube(urls: dict):
    from kubernetes import client

    cfg = client.Configuration()
    cfg.host = urls["kubernetes"]
    api = client.ApiClient(cfg)
    return client.CoreV1Api(api), client.CustomObjectsApi(api)


def _queue(custom) -> None:
    """The ResourceFlavor of kubernetes' H100 nodes and a ClusterQueue admitting 32 of their GPUs,
    as an operator creates them (the recorded objects, less what the server sets)."""
    from gpupool.actuation.quota import FLAVORS, KUEUE, quota_entry

    def created(name: str) -> dict:
        obj = copy.deepcopy(json.loads((RECORDED / f"{name}.json").read_text())["body"])
        obj.pop("status", None)
        obj["metadata"] = {"name": obj["metadata"]["name"]}
        return obj

    flavor = created("kueue_resourceflavor")
    flavor["metadata"]["name"] = FLAVOR
    flavor["spec"]["nodeLabels"] = {"nvidia.com/gpu.product": H100.replace(" ", "-")}
    custom.create_cluster_custom_object(*FLAVORS, flavor)
    queue = created("kueue_clusterqueue")
    queue["metadata"]["name"] = QUEUE
    quota_entry(queue, FLAVOR, GPU)["nominalQuota"] = "32"
    custom.create_cluster_custom_object(*KUEUE, queue)


def _quota(custom) -> int:
    from gpupool.actuation.quota import KUEUE, quota_entry

    return int(quota_entry(custom.get_cluster_custom_object(*KUEUE, QUEUE), FLAVOR, GPU)["nominalQuota"])


def _jobs(urls: dict) -> list[dict]:
    """Slurm's jobs as slurmrestd lists them: id, state, node ("" while pending), start (UTC)."""
    jobs = requests.get(f"{urls['slurmrestd']}/slurm/v0.0.38/jobs", timeout=10).json()["jobs"]
    return [{"id": j["job_id"], "state": j["job_state"], "node": j.get("nodes") or "",
             "start": datetime.fromtimestamp(j["start_time"], timezone.utc)} for j in jobs]


@contextlib.contextmanager
def _datacenter(tmp_path: Path, monkeypatch, staging_url: str, scenario: Path, config: Path):
    """The datacenter served from ``scenario`` with gpupool deployed on it by ``config``, staging
    as the hourly pipeline leaves it, the ClusterQueue created: (urls, engine, core, custom)."""
    from gpupool.staging import db

    with datacenter.serve(scenario, NOW, SPEED) as urls:
        datacenter.connect(monkeypatch, tmp_path, urls)
        datacenter.provisioned(monkeypatch, urls["control"])
        monkeypatch.setenv("GPUPOOL_CONFIG", str(config))
        monkeypatch.setenv("GPUPOOL_STAGING_URL", staging_url)
        engine = db.make_engine(staging_url)
        db.upgrade(engine)
        datacenter.record_plan(engine, NOW)
        _inventory(engine, urls, NOW)
        core, custom = _kube(urls)
        _queue(custom)
        yield urls, engine, core, custom


def _ticks(dag, urls: dict, engine):
    """Run the DAG for each 5-minute logical date once the served clock reaches it, each run a
    success, until ``LAST`` or a tick after the first reclaim is done; yields (logical date, wall
    clock before the run, after it)."""
    from gpupool.actuation import handover as ho
    from gpupool.staging import fastpath as store

    at, done_at = NOW, None
    while at < LAST:
        at += TICK
        while datacenter.sim_now(urls) < at:  # the run for a logical date starts once the clock reached it
            time.sleep(0.2)
        began = datetime.now(timezone.utc)
        run = dag.test(logical_date=at, run_conf={"dry_run": False})
        assert str(run.state).endswith("success"), (at, run.state, store.decisions_at(engine, at))
        yield at, began, datetime.now(timezone.utc)
        back = [h for h in ho.list_handovers(engine) if h.kind == ho.RECLAIM and h.state == ho.DONE]
        if back and done_at is None:
            done_at = at
        elif done_at is not None and at >= done_at + TICK:
            return  # a tick after the node came home: its work was placed


@pytest.fixture(scope="module")
def dag(dags_root, airflow_home, tmp_path_factory):
    """The fast-path DAG after one run on the embedded default (imports and serialization warm)."""
    return datacenter.warm_dag(dags_root, "gpupool_fastpath", tmp_path_factory.mktemp("warm"), NOW - TICK,
                               {"dry_run": True})


def test_an_owner_reclaims_its_lent_node_from_borrowed_work_within_its_deadline(dag, tmp_path, monkeypatch,
                                                                                staging_url):
    from gpupool.actuation import handover as ho
    from gpupool.staging import fastpath as store
    from gpupool.values import utc_datetime

    with _datacenter(tmp_path, monkeypatch, staging_url, _scenario(tmp_path), _config(tmp_path)) as (
            urls, engine, core, custom):
        assert _quota(custom) == 32  # the operator's quota for kubernetes' four nodes
        seen: list[dict] = []  # per tick: its logical date, the wall clock around its run, what the world shows after
        jobs: dict[int, dict] = {}  # slurm's jobs ever seen on the lent node
        lent = None
        for at, began, ended in _ticks(dag, urls, engine):
            pool = datacenter.pool(urls["control"])
            if lent is None:
                lent = next((h.node for h in ho.list_handovers(engine) if h.kind != ho.RECLAIM and not h.dry_run), None)
            listed = _jobs(urls)
            for j in listed:
                if lent is not None and j["node"] == lent:
                    jobs.setdefault(j["id"], j)
            seen.append({"at": at, "began": began, "ended": ended,
                         "lag": datacenter.sim_now(urls) - at, "quota": _quota(custom),
                         "slurm_jobs": {j["id"]: j["state"] for j in listed},
                         "pool": {n: (e["platform"], e["schedulable"], e["busy_gpus"]) for n, e in pool.items()}})
        node_obj = core.read_node(lent) if lent else None
        pending = [p.metadata.name for p in core.list_pod_for_all_namespaces().items if p.status.phase == "Pending"]

    trail = [(s["at"].strftime("%H:%M"), s["quota"], s["pool"].get(lent), str(s["lag"])) for s in seen]
    live = [h for h in ho.list_handovers(engine) if not h.dry_run]
    # the lend: a real move of an idle kubernetes node to slurm, the quota shrunk before the cordon
    (lend,) = [h for h in live if h.kind != ho.RECLAIM]
    assert (lend.from_platform, lend.to_platform, lend.state) == ("kubernetes", "slurm", ho.DONE), lend
    lend_sent = [(r["platform"], r["action"]) for r in ho.audit_rows(engine, lend.id)]
    # the queue stops admitting onto the node, then it is cordoned, then it leaves for slurm
    assert lend_sent[:3] == [("kubernetes", "quota_shrink"), ("kubernetes", "cordon"), ("slurm", "provision")], lend_sent
    shrink = next(r for r in ho.audit_rows(engine, lend.id) if r["action"] == "quota_shrink")
    assert shrink["status"] == "ok" and json.loads(shrink["response"])["nominal_quota"] == "24", shrink
    on_slurm = [s for s in seen if s["pool"][lent][0] == "slurm"]
    assert on_slurm and all(s["quota"] == 24 for s in on_slurm), trail  # the queue admitted 24 while it was away

    # the reclaim: one, kubernetes taking its node back from slurm, done, never late
    (rec,) = [h for h in live if h.kind == ho.RECLAIM]
    assert (rec.node, rec.from_platform, rec.to_platform, rec.state) == (lent, "slurm", "kubernetes", ho.DONE), rec
    readings = {s["at"]: _reading(store.decisions_at(engine, s["at"]), "kubernetes") for s in seen}
    need = next(t for t, r in readings.items() if t >= BURST and r and r["gpus_pending"] > 0)
    assert rec.need_since == need, (rec.need_since, readings)  # the tick whose reading first showed the burst
    assert rec.updated_at - rec.need_since <= timedelta(minutes=RECLAIM_MINUTES), (rec, trail)
    # no ReclaimLate: a live tick raises it and fails its run, and every run above succeeded

    # the borrowed work: slurm's jobs started on the node at the burst, so the owner first waited
    # for them to run min_runtime_minutes; the reclaim opened on the first tick after that whose
    # reading the rule accepts (one the detect rules flag waits for the next, unless that is late)
    borrowed = [j for j in jobs.values() if j["start"] >= AWAY]
    assert len(borrowed) == 8 and all(j["start"] == BURST for j in borrowed), jobs
    ran_enough = BURST + timedelta(minutes=MIN_RUNTIME_MINUTES)
    assert need < ran_enough, (need, ran_enough)  # the need came while the work was young
    waits = [d["reason"] for t in readings if need <= t < rec.created_at for d in store.decisions_at(engine, t)
             if d["platform"] == "kubernetes" and d["node"] is None and "reclaim waits" in d["reason"]]
    assert any("min_runtime_minutes" in w for w in waits), waits
    deadline = need + timedelta(minutes=RECLAIM_MINUTES)
    accepted = min(t for t, r in readings.items() if t >= ran_enough and (
        not r["anomalous"] or t + TICK + timedelta(minutes=MOVE_MINUTES) > deadline))
    assert rec.created_at == accepted, (rec.created_at, accepted, readings)
    requeues = [r for r in ho.audit_rows(engine, rec.id) if r["action"] == "requeue"]
    assert {r["request"]["job_id"] for r in requeues} == {j["id"] for j in borrowed}, (requeues, borrowed)
    assert all(r["status"] == "ok" and json.loads(r["response"])["requeued"] for r in requeues), requeues
    for r in requeues:  # sent during the run of a tick at or after the work had run min_runtime_minutes
        tick = next(s for s in seen if s["began"] <= utc_datetime(r["created_at"]) <= s["ended"])
        assert tick["at"] - BURST >= timedelta(minutes=MIN_RUNTIME_MINUTES), (tick["at"], r)
    # requeued, not cancelled: each job waits in slurm's queue under its own id (slurm, 8 GPUs short
    # again without the node, cannot run them) from the tick that requeued them on
    after = [s for s in seen if s["at"] >= rec.created_at]
    assert all(s["slurm_jobs"].get(j["id"]) == "PENDING" for s in after for j in borrowed), (
        [(str(s["at"]), {j["id"]: s["slurm_jobs"].get(j["id"]) for j in borrowed}) for s in after])

    # home again: uncordoned and Ready on kubernetes, the quota grown after the uncordon, the burst running
    sent = [(r["platform"], r["action"]) for r in ho.audit_rows(engine, rec.id)]
    order = [sent.index(c) for c in (("slurm", "drain"), ("kubernetes", "uncordon"), ("kubernetes", "quota_grow"))]
    assert order == sorted(order), sent
    grow = next(r for r in ho.audit_rows(engine, rec.id) if r["action"] == "quota_grow")
    assert grow["status"] == "ok" and json.loads(grow["response"])["nominal_quota"] == "32", grow
    assert seen[-1]["quota"] == 32, trail
    assert not node_obj.spec.unschedulable, node_obj.spec
    assert {c.type: c.status for c in node_obj.status.conditions}["Ready"] == "True"
    platform, schedulable, busy = seen[-1]["pool"][lent]
    assert (platform, schedulable, busy) == ("kubernetes", True, 8), trail
    assert pending == [], pending  # the burst's 32 GPUs run on the four nodes


def _reading(rows: list[dict], platform: str) -> dict | None:
    """The platform's judged reading a tick's decisions were made on (``anomalous``: what the
    detect rules flagged), from its recorded decision rows."""
    for d in rows:
        pressure = d.get("pressure") or {}
        if d["node"] is None and d["platform"] == platform and pressure:
            return pressure
        if d["node"] is not None and pressure.get(platform):
            return pressure[platform]
    return None


# ------------------------------------------------------------------ the borrower is Kubernetes

#: slurm's burst, as the lent node opens on kubernetes and its pods start (its need is read a tick later)
SLURM_BURST = NOW + timedelta(minutes=15)


def _scenario_k8s_borrows(tmp_path: Path) -> Path:
    return _served_scenario(tmp_path, lambda t: 32 if t >= SLURM_BURST else 8,
                            lambda t: 40)  # kubernetes: one node more than its own four, all along


def _config_k8s_borrows(tmp_path: Path) -> Path:
    path = datacenter.write_config(tmp_path)
    cfg = yaml.safe_load(path.read_text())
    by = {p["name"]: p for p in cfg["platforms"]}
    by["slurm"].update({"owns": 4, "reclaim_minutes": RECLAIM_MINUTES, "min_runtime_minutes": MIN_RUNTIME_MINUTES})
    by["kubernetes"]["quota"] = {"kind": "kueue", "cluster_queue": QUEUE, "flavor": FLAVOR, "resource": GPU}
    cfg["limits"] = {"move_minutes": MOVE_MINUTES}
    path.write_text(yaml.safe_dump(cfg))
    return path


def _pods_on(core, node: str) -> dict[str, datetime]:
    """The running pods the API server lists on ``node``: name -> its start time."""
    return {p.metadata.name: p.status.start_time for p in core.list_pod_for_all_namespaces().items
            if p.spec and p.spec.node_name == node and p.status.phase == "Running"}


def test_an_owner_reclaims_its_node_from_kubernetes_by_eviction_and_the_quota_follows(dag, tmp_path, monkeypatch,
                                                                                      staging_url):
    """Slurm owns its four nodes and lends an idle one to Kubernetes, short by a node; the
    ClusterQueue grows by the node after its uncordon (a flavor without node labels counts every
    node). Kubernetes' pods start on it; minutes later Slurm bursts. The reclaim waits for the
    pods' minimum runtime, shrinks the quota before the cordon, ends the pods through the Eviction
    API (audited, one per pod), and the node is Slurm's again within the deadline."""
    from gpupool.actuation import handover as ho
    from gpupool.actuation.quota import FLAVORS
    from gpupool.staging import fastpath as store

    with _datacenter(tmp_path, monkeypatch, staging_url, _scenario_k8s_borrows(tmp_path),
                     _config_k8s_borrows(tmp_path)) as (urls, engine, core, custom):
        flavor = custom.get_cluster_custom_object(*FLAVORS, FLAVOR)
        flavor["spec"].pop("nodeLabels", None)  # one flavor for the whole cluster: every node counts
        custom.replace_cluster_custom_object(*FLAVORS, FLAVOR, flavor)
        seen: list[dict] = []
        pods: dict[str, datetime] = {}  # kubernetes' pods ever seen running on the lent node, their start
        lent = None
        for at, _, _ in _ticks(dag, urls, engine):
            pool = datacenter.pool(urls["control"])
            if lent is None:
                lent = next((h.node for h in ho.list_handovers(engine) if h.kind != ho.RECLAIM and not h.dry_run), None)
            on_node = _pods_on(core, lent) if lent is not None and pool[lent]["platform"] == "kubernetes" else {}
            pods.update(on_node)
            seen.append({"at": at, "quota": _quota(custom), "pods": on_node,
                         "pool": {n: (e["platform"], e["schedulable"], e["busy_gpus"]) for n, e in pool.items()}})
        still = [p for p in core.list_pod_for_all_namespaces().items if p.spec and p.spec.node_name == lent]

    trail = [(s["at"].strftime("%H:%M"), s["quota"], s["pool"].get(lent), len(s["pods"])) for s in seen]
    live = [h for h in ho.list_handovers(engine) if not h.dry_run]
    # the lend: slurm's idle node to kubernetes; the quota grows only after the uncordon
    (lend,) = [h for h in live if h.kind != ho.RECLAIM]
    assert (lend.from_platform, lend.to_platform, lend.state) == ("slurm", "kubernetes", ho.DONE), lend
    sent = [(r["platform"], r["action"]) for r in ho.audit_rows(engine, lend.id)]
    assert sent.index(("kubernetes", "uncordon")) < sent.index(("kubernetes", "quota_grow")), sent
    grow = next(r for r in ho.audit_rows(engine, lend.id) if r["action"] == "quota_grow")
    assert grow["status"] == "ok" and json.loads(grow["response"])["nominal_quota"] == "40", grow
    on_k8s = [s for s in seen if s["pool"][lent][0] == "kubernetes" and s["pool"][lent][1]]
    assert on_k8s and all(s["quota"] == 40 for s in on_k8s), trail

    # the reclaim: slurm takes it back from kubernetes, within its deadline
    (rec,) = [h for h in live if h.kind == ho.RECLAIM]
    assert (rec.node, rec.from_platform, rec.to_platform, rec.state) == (lent, "kubernetes", "slurm", ho.DONE), rec
    assert rec.need_since >= SLURM_BURST and rec.updated_at - rec.need_since <= timedelta(minutes=RECLAIM_MINUTES), (
        rec, trail)
    # the pods on the node were young when slurm's need came: the reclaim waited for their minimum runtime
    assert len(pods) == 8, (trail, pods)
    started = max(pods.values())
    assert rec.need_since < started + timedelta(minutes=MIN_RUNTIME_MINUTES) <= rec.created_at, (rec, pods)
    waits = [d["reason"] for t in (s["at"] for s in seen) if rec.need_since <= t < rec.created_at
             for d in store.decisions_at(engine, t)
             if d["platform"] == "slurm" and d["node"] is None and "reclaim waits" in d["reason"]]
    assert any("min_runtime_minutes" in w for w in waits), waits
    sent = [(r["platform"], r["action"]) for r in ho.audit_rows(engine, rec.id)]
    # the queue stops admitting onto the node before it is cordoned; then each pod is evicted
    assert sent.index(("kubernetes", "quota_shrink")) < sent.index(("kubernetes", "cordon")) < sent.index(
        ("kubernetes", "evict")), sent
    evictions = [r for r in ho.audit_rows(engine, rec.id) if r["action"] == "evict"]
    assert {r["request"]["pod"] for r in evictions} == set(pods), (evictions, pods)
    assert all(r["status"] == "ok" for r in evictions), evictions
    shrink = next(r for r in ho.audit_rows(engine, rec.id) if r["action"] == "quota_shrink")
    assert shrink["status"] == "ok" and json.loads(shrink["response"])["nominal_quota"] == "32", shrink
    assert seen[-1]["quota"] == 32, trail
    # slurm's own again, open, running the burst; nothing of kubernetes' left on it
    platform, schedulable, busy = seen[-1]["pool"][lent]
    assert (platform, schedulable, busy) == ("slurm", True, 8), trail
    assert still == [], [p.metadata.name for p in still]
