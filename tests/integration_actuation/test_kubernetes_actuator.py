"""The Kubernetes actuator through the official client against an emulated API server (kmock):
cordon + owner label + hold annotation, GPU pods waited for or evicted under PodDisruptionBudgets,
MIG layout via the GPU operator's labels, uncordon only gpupool's cordons."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from gpupool.actuation import handover as ho
from gpupool.actuation.actuators.base import ActuationError, ForeignHoldError
from gpupool.actuation.actuators.kubernetes import (
    HOLD_ANNOTATION,
    MIG_CONFIG_LABEL,
    MIG_STATE_LABEL,
    OWNER_LABEL,
    KubernetesActuator,
)
from gpupool.staging.schema import allocation_plan
from memplatform import Datacenter, MemActuator

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=timezone.utc)


def _node(name, **labels):
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": dict(labels)}, "spec": {}}


def _pod(name, node, gpu=True, ns="ml", labels=None, daemon=False, phase="Running"):
    res = {"limits": {"nvidia.com/gpu": "1"}} if gpu else {"requests": {"cpu": "1"}}
    meta = {"name": name, "namespace": ns, "labels": labels or {"app": name}}
    if daemon:
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "dcgm", "uid": "u1"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x", "resources": res}]},
            "status": {"phase": phase}}


@pytest.fixture
def cluster(kube):
    kube.put("nodes", None, "k8s-gpu-01", _node("k8s-gpu-01", **{"nvidia.com/gpu.product": "H100"}))
    kube.put("nodes", None, "k8s-gpu-02", _node("k8s-gpu-02"))
    kube.put("pods", "ml", "train-0", _pod("train-0", "k8s-gpu-01", labels={"app": "train"}))
    kube.put("pods", "kube-system", "dcgm-x", _pod("dcgm-x", "k8s-gpu-01", gpu=True, ns="kube-system", daemon=True))
    kube.put("pods", "web", "api-0", _pod("api-0", "k8s-gpu-01", gpu=False, ns="web"))
    kube.put("pods", "ml", "done-0", _pod("done-0", "k8s-gpu-01", phase="Succeeded"))
    kube.put("pods", "ml", "other-0", _pod("other-0", "k8s-gpu-02"))
    return kube, KubernetesActuator(kube.api_client(), "kubernetes")


def test_cordon_label_and_wait_for_gpu_pods(cluster):
    kube, act = cluster
    st = act.owner_state("k8s-gpu-01")
    assert st.schedulable and st.busy == 1 and st.detail["gpu_pods"] == ["ml/train-0"]
    act.release("k8s-gpu-01", "gpupool: moving to slurm")
    node = kube.get("nodes", None, "k8s-gpu-01")
    assert node["spec"]["unschedulable"] is True
    assert node["metadata"]["labels"][OWNER_LABEL] == "slurm"
    assert node["metadata"]["annotations"][HOLD_ANNOTATION] == "gpupool: moving to slurm"
    assert act.owner_state("k8s-gpu-01").held_by_gpupool and not act.is_released("k8s-gpu-01")
    kube.patch("pods", "ml", "train-0", {"status": {"phase": "Succeeded"}})  # the job ends
    assert act.is_released("k8s-gpu-01")  # DaemonSet and CPU pods do not hold the node
    act.attach("k8s-gpu-01")
    node = kube.get("nodes", None, "k8s-gpu-01")
    assert not node["spec"].get("unschedulable")
    assert node["metadata"]["labels"][OWNER_LABEL] == "kubernetes"
    assert HOLD_ANNOTATION not in (node["metadata"].get("annotations") or {})


def test_eviction_respects_pod_disruption_budget(cluster):
    kube, act = cluster
    kube.put("poddisruptionbudgets", "ml", "train-pdb", {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "train-pdb", "namespace": "ml"},
        "spec": {"selector": {"matchLabels": {"app": "train"}}, "minAvailable": 1},
        "status": {"disruptionsAllowed": 0}})
    act.release("k8s-gpu-01", "gpupool: moving to slurm")
    cmds = act.evict_commands("k8s-gpu-01")
    assert [(c.action, c.request) for c in cmds] == [("evict", {"namespace": "ml", "pod": "train-0"})]
    kube.put("poddisruptionbudgets", "ml", "serve-pdb", {  # another budget, not the pod's: not named
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "serve-pdb", "namespace": "ml"},
        "spec": {"selector": {"matchLabels": {"app": "serve"}}, "maxUnavailable": 0},
        "status": {"disruptionsAllowed": 0}})
    with pytest.raises(ActuationError) as refused:
        act.send(cmds[0])
    assert str(refused.value).endswith(
        "pod ml/train-0: eviction refused by PodDisruptionBudget ml/train-pdb (disruptionsAllowed 0) (429)")
    assert kube.get("pods", "ml", "train-0") is not None
    kube.put("poddisruptionbudgets", "ml", "train-pdb", {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "train-pdb", "namespace": "ml"},
        "spec": {"selector": {"matchLabels": {"app": "train"}}}, "status": {"disruptionsAllowed": 1}})
    assert act.send(cmds[0]) == {"evicted": True}
    assert kube.get("pods", "ml", "train-0") is None
    assert act.is_released("k8s-gpu-01")
    assert [e[2] for e in kube.evictions] == [429, 201]


def test_budget_selectors_match_as_kubernetes_does():
    from kubernetes.client import V1LabelSelector, V1LabelSelectorRequirement

    from gpupool.actuation.actuators.kubernetes import selector_matches

    pod = {"app": "train", "tier": "gpu"}
    req = V1LabelSelectorRequirement
    assert selector_matches(V1LabelSelector(), pod)  # policy/v1: an empty selector selects every pod
    assert not selector_matches(None, pod)
    assert selector_matches(V1LabelSelector(match_labels={"app": "train"}), pod)
    assert not selector_matches(V1LabelSelector(match_labels={"app": "train", "tier": "cpu"}), pod)
    assert selector_matches(V1LabelSelector(match_expressions=[req(key="tier", operator="In", values=["gpu"]),
                                                               req(key="team", operator="NotIn", values=["a"]),
                                                               req(key="app", operator="Exists")]), pod)
    assert not selector_matches(V1LabelSelector(match_expressions=[req(key="app", operator="DoesNotExist")]), pod)


def test_work_started_reads_gpu_pods_start_times(cluster):
    from gpupool.actuation.actuators.base import NamedActuator

    kube, act = cluster
    assert act.work_started("k8s-gpu-01") == []  # the GPU pod has not reported a start yet
    kube.patch("pods", "ml", "train-0", {"status": {"startTime": "2026-03-02T11:15:00Z"}})
    kube.patch("pods", "kube-system", "dcgm-x", {"status": {"startTime": "2026-03-01T00:00:00Z"}})  # DaemonSet
    kube.put("pods", "ml", "train-1", {**_pod("train-1", "k8s-gpu-01"),
                                       "status": {"phase": "Running", "startTime": "2026-03-02T11:45:30Z"}})
    started = sorted(act.work_started("k8s-gpu-01"))
    assert started == [datetime(2026, 3, 2, 11, 15, tzinfo=timezone.utc),
                       datetime(2026, 3, 2, 11, 45, 30, tzinfo=timezone.utc)]
    assert all(t.utcoffset() == timedelta(0) for t in started)
    named = NamedActuator(act, {"gpu-k01": "k8s-gpu-01"})
    assert sorted(named.work_started("gpu-k01")) == started


def test_never_uncordons_a_foreign_cordon(cluster):
    kube, act = cluster
    kube.patch("nodes", None, "k8s-gpu-02", {"spec": {"unschedulable": True}})  # kubectl cordon
    assert act.owner_state("k8s-gpu-02").foreign_hold
    with pytest.raises(ForeignHoldError):
        act.attach("k8s-gpu-02")
    assert kube.get("nodes", None, "k8s-gpu-02")["spec"]["unschedulable"] is True


def test_handover_into_kubernetes_with_mig_layout(cluster, sqlite_engine):
    kube, k8s = cluster
    kube.put("nodes", None, "gpu-n07", {**_node("gpu-n07"), "spec": {"unschedulable": True},
                                        "metadata": {"name": "gpu-n07", "labels": {OWNER_LABEL: "slurm"},
                                                     "annotations": {HOLD_ANNOTATION: "gpupool: held for the pool"}}})
    dc = Datacenter(("slurm",), {"gpu-n07": "slurm"})  # the source side, in memory
    acts = {"slurm": MemActuator(dc, "slurm"), "kubernetes": k8s}
    with sqlite_engine.begin() as conn:
        pid = conn.execute(allocation_plan.insert().values(
            decided_at=T0, policy="predictive", solver="milp", dry_run=False, summary={},
            moves=[{"node": "gpu-n07", "from": "slurm", "to": "kubernetes", "mig_layout": "all-1g.10gb"}],
        )).inserted_primary_key[0]
    hid = ho.open_handover(sqlite_engine, "gpu-n07", "slurm", "kubernetes", T0, plan_id=pid, dry_run=False)
    ho.advance_all(sqlite_engine, acts, T0, dry_run=False)
    h = ho.get_handover(sqlite_engine, hid)
    assert h.state == ho.ATTACHING and "MIG layout all-1g.10gb" in h.error
    node = kube.get("nodes", None, "gpu-n07")
    assert node["metadata"]["labels"][MIG_CONFIG_LABEL] == "all-1g.10gb"
    assert node["spec"]["unschedulable"] is True  # still cordoned while the GPUs are re-laid out
    kube.patch("nodes", None, "gpu-n07", {"metadata": {"labels": {MIG_STATE_LABEL: "success"}}})  # GPU operator
    ho.advance_all(sqlite_engine, acts, T0, dry_run=False)
    assert ho.get_handover(sqlite_engine, hid).state == ho.DONE
    node = kube.get("nodes", None, "gpu-n07")
    assert not node["spec"].get("unschedulable") and node["metadata"]["labels"][OWNER_LABEL] == "kubernetes"
    assert [(r["platform"], r["action"]) for r in ho.audit_rows(sqlite_engine, hid)] == [
        ("slurm", "drain"), ("kubernetes", "mig_config"), ("kubernetes", "uncordon")]


def _pdb(name, ns, selector, allowed):
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": name, "namespace": ns},
            "spec": {"selector": selector, "maxUnavailable": 0}, "status": {"disruptionsAllowed": allowed}}


def test_blocking_budgets_names_the_budgets_of_the_nodes_gpu_pods_that_allow_no_disruption(cluster):
    """Read before an eviction is tried (a reclaim reports them at once): only budgets that select
    a GPU pod on the node, in its namespace, with ``disruptionsAllowed`` 0."""
    from gpupool.actuation.actuators.base import NamedActuator

    kube, act = cluster
    kube.put("poddisruptionbudgets", "ml", "serve-pdb", _pdb("serve-pdb", "ml", {"matchLabels": {"app": "serve"}}, 0))
    assert act.blocking_budgets("k8s-gpu-01") == []  # no budget of its pods
    kube.put("poddisruptionbudgets", "ml", "train-pdb", _pdb("train-pdb", "ml", {"matchLabels": {"app": "train"}}, 0))
    kube.put("poddisruptionbudgets", "ml", "loose-pdb", _pdb("loose-pdb", "ml", {"matchLabels": {"app": "train"}}, 1))
    kube.put("poddisruptionbudgets", "ml", "other-pdb", _pdb("other-pdb", "ml", {"matchLabels": {"app": "other-0"}}, 0))
    kube.put("poddisruptionbudgets", "web", "web-pdb", _pdb("web-pdb", "web", {}, 0))  # selects the CPU pod only
    kube.put("poddisruptionbudgets", "kube-system", "ds-pdb", _pdb("ds-pdb", "kube-system", {}, 0))  # the DaemonSet's
    kube.put("poddisruptionbudgets", "lab", "train-pdb", _pdb("train-pdb", "lab", {"matchLabels": {"app": "train"}}, 0))
    assert act.blocking_budgets("k8s-gpu-01") == ["ml/train-pdb"]
    assert act.blocking_budgets("k8s-gpu-02") == ["ml/other-pdb"]
    assert NamedActuator(act, {"gpu-k01": "k8s-gpu-01"}).blocking_budgets("gpu-k01") == ["ml/train-pdb"]
    kube.put("poddisruptionbudgets", "ml", "train-pdb", _pdb("train-pdb", "ml", {"matchLabels": {"app": "train"}}, 1))
    assert act.blocking_budgets("k8s-gpu-01") == []  # the budget allows one now: the eviction would go through
    assert MemActuator(Datacenter(("a",), {"n": "a"}), "a").blocking_budgets("n") == []  # other platforms: none
