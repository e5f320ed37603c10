"""The KAI-Scheduler Queue paths gpupool's queue quota reads and writes (gpupool.actuation.quota,
:class:`KaiQuota`) exist in KAI's published answer (tests/fixtures/recorded/kai_queue.json,
written from its CRD and docs), and a change keeps the shape: the same keys and types, the
annotation gpupool adds aside. The integration tests
(tests/integration_actuation/test_kai_quota.py, test_queue_quota.py) serve this same answer."""

from __future__ import annotations

import copy
from decimal import Decimal
from types import SimpleNamespace

import pytest

from gpupool.actuation.quota import GROW, KAI, NODES_ANNOTATION, SHRINK, KaiQuota, kai_gpu_units
from tests.contract.conftest import recorded
from tests.contract.shapes import shape_diff


@pytest.fixture
def real() -> dict:
    return recorded("kai_queue")["body"]


def _quota(name="team-ai") -> KaiQuota:
    return KaiQuota(None, "kubernetes", SimpleNamespace(kind="kai", queue=name))


def test_the_object_is_the_one_the_client_asks_for(real):
    group, version, plural = KAI
    assert real["apiVersion"] == f"{group}/{version}" and real["kind"] == "Queue" and plural == "queues"
    assert "namespace" not in real["metadata"]  # cluster-scoped: the client's *_cluster_custom_object calls
    assert isinstance(real["metadata"]["resourceVersion"], str)  # what a replace carries back


def test_the_quota_is_where_the_code_looks(real):
    q = _quota()
    holder, key = q.slot(real)
    assert holder is real["spec"]["resources"]["gpu"] and key == "quota"
    assert q.parse(holder[key]) == 16 and isinstance(holder[key], int)  # the CRD's type: number
    assert {"limit", "overQuotaWeight"} <= set(holder)  # beside it, left alone


def test_unlimited_and_unset_quotas(real):
    q = _quota()
    with pytest.raises(ValueError, match="unlimited"):
        q.parse(real["spec"]["resources"]["cpu"]["quota"])  # -1, as the docs' unlimited queue
    with pytest.raises(ValueError, match="not a number"):
        q.parse("16")
    bare = copy.deepcopy(real)
    del bare["spec"]["resources"]["gpu"]
    assert q.change(bare, {}, "gpu-a", GROW, 8) == (0, 8)  # unset: 0 (KAI's default), created on write
    assert bare["spec"]["resources"]["gpu"] == {"quota": 8}


@pytest.mark.parametrize("action, gpus, after", [(SHRINK, 0, 8), (GROW, 8, 24)])
def test_a_change_keeps_the_shape(real, action, gpus, after):
    obj = copy.deepcopy(real)
    counted = {"gpu-a": 8} if action == SHRINK else {}
    before, new = _quota().change(obj, counted, "gpu-a", action, gpus)
    assert before == 16 and new == after and obj["spec"]["resources"]["gpu"]["quota"] == after
    annotations = obj["metadata"].pop("annotations")
    assert set(annotations) == {NODES_ANNOTATION}
    assert shape_diff(real, obj) == []
    assert obj["status"] == real["status"]
    assert obj["spec"]["resources"]["gpu"]["limit"] == -1 and obj["spec"]["resources"]["cpu"] == real["spec"]["resources"]["cpu"]


def test_a_fractional_quota_stays_a_number(real):
    obj = copy.deepcopy(real)
    obj["spec"]["resources"]["gpu"]["quota"] = 2.5  # GPU resources in fractions (the CRD)
    before, after = _quota().change(obj, {}, "gpu-a", GROW, 8)
    assert before == Decimal("2.5") and obj["spec"]["resources"]["gpu"]["quota"] == 10.5


def test_gpu_units_count_as_kai_counts_them():
    """A whole GPU 1, a mig-<X>g device X (KAI's docs/queues: GPU units)."""
    assert kai_gpu_units({"cpu": "64", "nvidia.com/gpu": "8"}) == 8
    assert kai_gpu_units({"nvidia.com/mig-1g.10gb": "56"}) == 56
    assert kai_gpu_units({"nvidia.com/mig-3g.40gb": "8", "nvidia.com/mig-2g.20gb": "4", "nvidia.com/gpu": "1"}) == 33
    assert kai_gpu_units({"cpu": "64", "amd.com/gpu": "8"}) == 0
