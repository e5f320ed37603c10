"""NvmlSource against a fake NVML that follows the real library's rules and error codes."""

from __future__ import annotations

import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pandas as pd
import pynvml
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fake_nvml import FakeGpu, FakeNvml  # noqa: E402

from gpupool.canonical import HEALTH_ENTITY_KIND, SAMPLE_COLUMNS, normalize_samples  # noqa: E402
from gpupool.detect.provenance import health_rows, judge_known_faults, provenance_faults  # noqa: E402
from gpupool.sources.base import INVENTORY_KEYS, SourceError  # noqa: E402
from gpupool.sources.nvml import NvmlSource  # noqa: E402

AT = datetime(2026, 11, 29, 10, tzinfo=timezone.utc)


def _source(fake, read_at=AT):
    return NvmlSource("pool-bare", node="spare-07", nvml=fake.module, clock=lambda: read_at.timestamp())


def _values(snap):
    """The snapshot's readings, without its health series."""
    return snap[snap["entity_kind"] != HEALTH_ENTITY_KIND]


def _health(snap):
    rows = snap[snap["entity_kind"] == HEALTH_ENTITY_KIND]
    return {(r.entity_id, r.metric): r.value for r in rows.itertuples()}


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
    v = {(r.entity_id, r.metric): r.value for r in _values(snap).itertuples()}
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
    snap = _values(_source(fake).snapshot(AT))
    util = snap[snap.metric == "gpu_util"]
    assert list(util["entity_id"]) == ["spare-07/2"]  # NVML refuses whole-GPU util in MIG mode


def test_lost_gpu_makes_the_node_unschedulable():
    fake = FakeNvml([FakeGpu(util=50), FakeGpu(lost=True), FakeGpu(util=10)])
    rec = _source(fake).inventory(AT)[0]
    assert rec["schedulable"] is False and rec["drain_reason"] == "GPU 1: GPU is lost"
    assert rec["gpus"] == 3
    snap = _values(_source(fake).snapshot(AT))
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


def test_snapshot_says_how_old_its_read_is():
    fake = FakeNvml([FakeGpu(util=40, processes=[(1, 2**20)]), FakeGpu(util=0)])
    snap = _source(fake, read_at=AT - timedelta(seconds=90)).snapshot(AT)
    health = _health(snap)
    assert health == {(m, h): v for m in ("gpu_capacity", "gpu_allocated", "gpu_util", "gpu_mem_used")
                      for h, v in (("health_up", 1.0), ("health_sample_age_seconds", 90.0))}
    assert snap.loc[snap["entity_kind"] == HEALTH_ENTITY_KIND, "ts"].eq(AT).all()
    assert normalize_samples(snap, where="nvml snapshot").equals(snap)  # canonical rows, staged as they are


def _fail_on(fake, name, index, code=pynvml.NVML_ERROR_TIMEOUT):
    real = getattr(fake.module, name)

    def failing(handle, *rest):
        if handle == ("gpu", index):
            raise pynvml.NVMLError(code)
        return real(handle, *rest)

    setattr(fake.module, name, failing)


def test_a_failed_device_call_marks_the_metric_untrusted_and_keeps_the_others():
    fake = FakeNvml([FakeGpu(util=40, mem_used=2**30), FakeGpu(util=70, processes=[(9, 2**20)])])
    _fail_on(fake, "nvmlDeviceGetUtilizationRates", 1)
    _fail_on(fake, "nvmlDeviceGetComputeRunningProcesses", 0, pynvml.NVML_ERROR_UNKNOWN)
    snap = _source(fake).snapshot(AT)
    health = _health(snap)
    assert health[("gpu_util", "health_up")] == 0 and health[("gpu_allocated", "health_up")] == 0
    assert health[("gpu_capacity", "health_up")] == 1 and health[("gpu_mem_used", "health_up")] == 1
    util = _values(snap).query("metric == 'gpu_util'")
    assert list(util["entity_id"]) == ["spare-07/0"]  # no value where the call failed
    assert fake.init_count == 0
    # the inventory cannot count busy GPUs it could not read: one clear error, as before
    with pytest.raises(SourceError, match="GPU 0 busy: Unknown Error"):
        _source(fake).inventory(AT)


def test_a_failed_read_is_cleaned_by_provenance_not_alarmed():
    """Hourly snapshots of the node's allocation; the one whose process listing failed is a
    fault by provenance whatever its value: cleaned, never an alarm."""
    frames = []
    for h in range(12):
        at = AT + timedelta(hours=h)
        fake = FakeNvml([FakeGpu(processes=[(1, 2**20)]), FakeGpu(processes=[(2, 2**20)])])
        if h == 7:
            _fail_on(fake, "nvmlDeviceGetComputeRunningProcesses", 1)  # reads as one busy GPU, not two
        frames.append(_source(fake, read_at=at).snapshot(at))
    staged = pd.concat(frames, ignore_index=True)
    key = ("pool-bare", "", "node", "spare-07", "gpu_allocated")
    series = staged[(staged["entity_kind"] == "node") & (staged["metric"] == "gpu_allocated")].set_index("ts")["value"]
    known = provenance_faults(series.index, health_rows(staged, key), pd.Timedelta("1h"))
    assert np.flatnonzero(known).tolist() == [7]

    def alarm_on_change(s):
        diff = s.diff().abs().fillna(0.0)
        return pd.DataFrame({"value": s, "expected": s, "score": diff, "is_anomaly": diff > 0, "cleaned": False,
                             "filled": False, "detector": "test", "clean_value": s}, index=s.index)

    assert alarm_on_change(series)["is_anomaly"].iloc[7]  # from its value alone the failed read is an alarm
    judged = judge_known_faults(series, known, alarm_on_change)
    assert judged["cleaned"].iloc[7] and not judged["is_anomaly"].any()
    assert judged["clean_value"].iloc[7] == 2.0 and judged["value"].iloc[7] == 1.0
