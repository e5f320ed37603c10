"""``work_started``: the base default (unknown), the pool-name wrapper, the in-memory platform."""

from __future__ import annotations

from datetime import datetime, timezone

from gpupool.actuation.actuators.base import Actuator, NamedActuator
from memplatform import make

T = datetime(2026, 3, 2, 12, 0, tzinfo=timezone.utc)


def test_an_actuator_that_cannot_say_answers_none():
    assert Actuator().work_started("n1") is None


def test_named_actuator_asks_in_the_platform_s_name():
    dc, acts = make(owners={"a01": "slurm"})
    dc.start_job("slurm", "a01", at=T)
    named = NamedActuator(acts["slurm"], {"gpu-a01": "a01"})
    assert named.work_started("gpu-a01") == [T]
    assert named.work_started("gpu-zz") is None  # unknown to the platform under either name


def test_memory_platform_forgets_start_times_with_the_work():
    dc, acts = make()
    slurm = acts["slurm"]
    assert slurm.work_started("n1") == []
    dc.start_job("slurm", "n1", at=T)
    dc.start_job("slurm", "n1")  # a job whose start nobody recorded: the platform cannot say
    assert slurm.work_started("n1") is None
    dc.finish_jobs()
    dc.start_job("slurm", "n1", at=T)
    slurm.release("n1", "gpupool: moving to kubernetes")
    for cmd in slurm.evict_commands("n1"):
        slurm.send(cmd)
    assert slurm.work_started("n1") == [] and slurm.is_released("n1")
