"""The Volcano Queue paths gpupool's queue quota reads and writes (gpupool.actuation.quota,
:class:`VolcanoQuota`) exist in Volcano's published answer (tests/fixtures/recorded/volcano_queue.json,
written from its CRD and docs, not recorded from a live Volcano), and a change keeps the shape:
the same keys and types, the annotation gpupool adds aside. The integration tests
(tests/integration_actuation/test_volcano_quota.py, test_queue_quota.py) serve this same answer."""

from __future__ import annotations

import copy
from decimal import Decimal
from types import SimpleNamespace

import pytest

from gpupool.actuation.quota import GROW, NODES_ANNOTATION, SHRINK, VOLCANO, VolcanoQuota, queue_quota
from tests.contract.conftest import recorded
from tests.contract.shapes import shape_diff

GPU = "nvidia.com/gpu"


@pytest.fixture
def real() -> dict:
    return recorded("volcano_queue")["body"]


def _quota(name="team-ai", resource=GPU) -> VolcanoQuota:
    return VolcanoQuota(None, "kubernetes", SimpleNamespace(kind="volcano", queue=name, resource=resource))


def test_the_object_is_the_one_the_client_asks_for(real):
    group, version, plural = VOLCANO
    assert real["apiVersion"] == f"{group}/{version}" and real["kind"] == "Queue" and plural == "queues"
    assert "namespace" not in real["metadata"]  # cluster-scoped: the client's *_cluster_custom_object calls
    assert isinstance(real["metadata"]["resourceVersion"], str)  # what a replace carries back
    assert isinstance(queue_quota(None, "kubernetes", SimpleNamespace(kind="volcano", queue="q", resource=GPU)),
                      VolcanoQuota)


def test_the_quota_is_where_the_code_looks(real):
    slots = _quota().slots(real)
    spec = real["spec"]
    assert [(holder, key, called) for holder, key, called in slots] == [
        (spec["capability"], GPU, "spec.capability"), (spec["deserved"], GPU, "spec.deserved"),
        (spec["guarantee"]["resource"], GPU, "spec.guarantee.resource")]
    assert [holder[key] for holder, key, _ in slots] == ["16", "16", "8"]  # int-or-string quantities


@pytest.mark.parametrize("value, number", [("16", 16), (16, 16), ("16000m", 16), ("1k", 1000), ("2.5", Decimal("2.5"))])
def test_quantities_parse(value, number):
    assert _quota().parse(value) == number


@pytest.mark.parametrize("value, message", [
    (None, "no 'nvidia.com/gpu' (unlimited): it cannot follow nodes"),
    ("sixteen", "'sixteen' is not a quantity"),
    (True, "True is not a quantity"),
    ("-1", "below 0"),
])
def test_what_cannot_follow_nodes(value, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _quota().parse(value)


@pytest.mark.parametrize("edit, message", [
    (lambda s: s.pop("capability"), "spec.capability: no 'nvidia.com/gpu' (unlimited)"),
    (lambda s: s["capability"].pop(GPU), "spec.capability: no 'nvidia.com/gpu' (unlimited)"),
    (lambda s: s.update(capability=["16"]), "spec.capability is not a map of resources"),
    (lambda s: s.update(deserved="16"), "spec.deserved is not a map of resources"),
    (lambda s: s["guarantee"].update(resource={GPU: "x"}), "spec.guarantee.resource: nvidia.com/gpu: 'x' is not a quantity"),
])
def test_a_queue_that_cannot_follow_says_where(real, edit, message):
    obj = copy.deepcopy(real)
    edit(obj["spec"])
    read = copy.deepcopy(obj)
    counted = {}
    with pytest.raises(ValueError) as err:
        _quota().change(obj, counted, "gpu-a", GROW, 8)
    assert message in str(err.value)
    assert obj == read and counted == {}  # nothing changed


@pytest.mark.parametrize("action, gpus, after", [(SHRINK, 0, ("8", "8", "0")), (GROW, 8, ("24", "24", "16"))])
def test_a_change_keeps_the_shape(real, action, gpus, after):
    obj = copy.deepcopy(real)
    counted = {"gpu-a": 8} if action == SHRINK else {}
    before, new = _quota().change(obj, counted, "gpu-a", action, gpus)
    assert before == 16 and str(new) == after[0]
    spec = obj["spec"]
    assert (spec["capability"][GPU], spec["deserved"][GPU], spec["guarantee"]["resource"][GPU]) == after
    annotations = obj["metadata"].pop("annotations")
    assert set(annotations) == {NODES_ANNOTATION}
    assert shape_diff(real, obj) == []
    assert obj["status"] == real["status"]


def test_a_number_is_written_back_as_a_string(real):
    obj = copy.deepcopy(real)
    obj["spec"]["capability"][GPU] = 16  # applied from YAML as a bare number
    _quota().change(obj, {}, "gpu-a", GROW, 8)
    assert obj["spec"]["capability"][GPU] == "24"
