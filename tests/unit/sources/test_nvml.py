"""NvmlSource against a fake NVML that follows the real library's rules and error codes."""

from __future__ import annotations

import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pynvml
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fake_nvml import FakeGpu, FakeNvml  # noqa: E402

from gpupool.canonical import SAMPLE_COLUMNS  # noqa: E402
from gpupool.sources.base import INVENTORY_KEYS, SourceError  # noqa: E402
from gpupool.sources.nvml import NvmlSource  # noqa: E402

AT = datetime(2026, 11, 29, 10, tzinfo=timezone.utc)


def _source(fake):
    return NvmlSource("pool-bare", node="spare-07", nvml=fake.module)


def test_whole_gpus_busy_util_and_memory():
    fake = FakeNvml([
        FakeGpu(util=93, mem_used=40 * 2**30, processes=[(4242, 40 * 2**30)]),
        FakeGpu(util=0),
    ])
    rec = _source(fake).inventory(AT)
    assert rec == [{"node": "spare-07", "platform": "pool-bare", "gpus": 2, "gpu_model": "NVIDIA A100-SXM4-80GB",
                    "mig_layout": None, "schedulable": True, "drain_reason": None, "busy_gpus": 1}]
    assert tuple(rec[0]) == INVENTORY_KEYS
    snap = _source(fake).snapshot(AT)
    assert list(snap.columns) == SAMPLE_COLUMNS
    v = {(r.entity_id, r.metric): r.value for r in snap.itertuples()}
    assert v == {("spare-07", "gpu_capacity"): 2, ("spare-07", "gpu_allocated"): 1,
                 ("spare-07/0", "gpu_util"): 93, ("spare-07/0", "gpu_mem_used"): 40 * 2**30,
                 ("spare-07/1", "gpu_util"): 0, ("spare-07/1", "gpu_mem_used"): 0}
    assert fake.init_count == 0  # every read shuts NVML down again


def test_mig_slices_are_counted_and_util_is_not_invented():
    fake = FakeNvml([
        FakeGpu(mig_enabled=True, mig_profiles=["3g.40gb", None, "1g.10gb", "1g.10gb"], mem_used=2**30),
        FakeGpu(mig_enabled=True, mig_profiles=["1g.10gb"]),
        FakeGpu(name="NVIDIA L4", mig_capable=False, util=12),
    ])
    rec = _source(fake).inventory(AT)[0]
    assert rec["mig_layout"] == {"3g.40gb": 1, "1g.10gb": 3} and rec["gpus"] == 3
    snap = _source(fake).snapshot(AT)
    util = snap[snap.metric == "gpu_util"]
    assert list(util["entity_id"]) == ["spare-07/2"]  # NVML refuses whole-GPU util in MIG mode


def test_lost_gpu_makes_the_node_unschedulable():
    fake = FakeNvml([FakeGpu(util=50), FakeGpu(lost=True), FakeGpu(util=10)])
    rec = _source(fake).inventory(AT)[0]
    assert rec["schedulable"] is False and rec["drain_reason"] == "GPU 1: GPU is lost"
    assert rec["gpus"] == 3
    snap = _source(fake).snapshot(AT)
    assert not snap["entity_id"].eq("spare-07/1").any()
    assert fake.init_count == 0


@pytest.mark.parametrize("code,retryable", [(pynvml.NVML_ERROR_DRIVER_NOT_LOADED, False),
                                            (pynvml.NVML_ERROR_NO_PERMISSION, False),
                                            (pynvml.NVML_ERROR_UNKNOWN, True)])
def test_init_failure_is_one_clear_error(code, retryable):
    fake = FakeNvml([FakeGpu()], init_error=code)
    with pytest.raises(SourceError, match="nvmlInit failed") as err:
        _source(fake).inventory(AT)
    assert err.value.retryable is retryable and err.value.window == "2026-11-29T10:00:00Z"
    assert pynvml.NVMLError._errcode_to_string[code] in str(err.value)


def test_unexpected_nvml_error_still_shuts_down():
    fake = FakeNvml([FakeGpu()])
    fake.module.nvmlDeviceGetUUID = lambda h: (_ for _ in ()).throw(pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT))
    with pytest.raises(SourceError, match="NVML error: Timeout"):
        _source(fake).inventory(AT)
    assert fake.init_count == 0


def test_fake_enforces_initialisation_like_the_real_library():
    fake = FakeNvml([FakeGpu()])
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        fake.module.nvmlDeviceGetCount()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        fake.module.nvmlShutdown()


def test_real_pynvml():
    """Without a driver the real binding fails in nvmlInit and the source says so; with one
    (a GPU host) the source reads the real GPUs."""
    try:
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
    except pynvml.NVMLError:
        with pytest.raises(SourceError, match="nvmlInit failed") as err:
            NvmlSource("pool-bare", node="here").inventory(AT)
        assert "NVML" in err.value.endpoint
    else:
        rec = NvmlSource("pool-bare", node="here").inventory(AT)
        assert rec and rec[0]["gpus"] > 0


def test_no_history():
    with pytest.raises(SourceError, match="cannot be recovered"):
        _source(FakeNvml([FakeGpu()])).usage(AT - timedelta(hours=1), AT)


def test_pressure_of_a_bare_node():
    busy = _source(FakeNvml([FakeGpu(util=93, processes=[(4242, 2**30)]), FakeGpu(util=0)])).pressure(AT)
    assert (busy.gpus_capacity, busy.gpus_allocated, busy.gpus_pending, busy.idle_nodes) == (2, 1, 0, ())
    assert busy.node_gpus == {"spare-07": 2} and busy.nodes_open == 1
    assert any("no queue" in n for n in busy.notes)
    idle = _source(FakeNvml([FakeGpu(util=0), FakeGpu(util=0)])).pressure(AT)
    assert idle.idle_nodes == ("spare-07",) and idle.gpus_free == 2
