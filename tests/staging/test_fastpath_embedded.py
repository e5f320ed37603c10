"""The fast path on the embedded default (platforms of kind `simulator`): each platform's pressure
read from the embedded world as its exporters report it, and a tick that answers a shortage
with a dry-run handover only (simulator platforms are never actuated)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from gpupool.actuation import handover as ho
from gpupool.jobs.fastpath import run_fastpath
from gpupool.config import default_config
from gpupool.pipeline import Context
from gpupool.platforms import EmbeddedWorldSource
from gpupool.staging import fastpath as store
from gpupool.staging.schema import allocation_plan

DAY = pd.Timestamp("2026-03-02", tz="UTC")


def _world():
    return EmbeddedWorldSource("slurm")._world(DAY.to_pydatetime())


def _shortage_instant():
    """The first instant of the day when slurm's exporter reports more pending GPUs than it
    has free, while another platform has an idle whole node to lend."""
    world = _world()
    i0 = int((DAY - world.start) // world.step)
    for i in range(i0 + 1, i0 + 288 * 7):
        at = world.index[i]
        p = EmbeddedWorldSource("slurm").pressure(at.to_pydatetime())
        if p.gpus_pending > p.gpus_free + 8:
            others = [EmbeddedWorldSource(o).pressure(at.to_pydatetime()) for o in ("openstack", "kubernetes")]
            if any(len(o.idle_nodes) >= 2 for o in others):
                return at
    pytest.fail("the embedded world has no slurm shortage beside an idle node in a week")


def test_embedded_pressure_is_what_the_world_reports():
    world = _world()
    at = DAY + pd.Timedelta("10h")
    src = EmbeddedWorldSource("slurm")
    p = src.pressure(at.to_pydatetime())
    samples = src.usage(at - world.step, at)
    last = samples[(samples.entity_kind == "platform")].set_index("metric")["value"]
    assert p.gpus_pending == pytest.approx(last["gpu_pending"]) and p.gpus_allocated == pytest.approx(last["gpu_allocated"])
    inv = src.inventory(at.to_pydatetime())
    open_ = [r for r in inv if r["schedulable"]]
    assert p.gpus_capacity == sum(r["gpus"] for r in open_) and p.nodes_open == len(open_)
    assert set(p.idle_nodes) == {r["node"] for r in open_ if r["busy_gpus"] == 0}
    assert set(p.node_gpus) == {r["node"] for r in inv}
    assert "exporter sample" in p.provenance["gpus_pending"]


def test_embedded_pressure_of_an_exporter_gap_reads_no_pending():
    world = _world()
    gaps = np.flatnonzero(world.exporter_distortion("kubernetes")[1])
    # within the quarter the world is generated for (earlier instants read the quarter before's)
    gaps = gaps[world.index[gaps] >= pd.Timestamp("2026-01-01", tz="UTC")]
    assert len(gaps), "the embedded world injects exporter gaps on kubernetes"
    at = world.index[gaps[0]] + world.step
    p = EmbeddedWorldSource("kubernetes").pressure(at.to_pydatetime())
    assert p.gpus_pending == 0 and p.notes and "gap" in p.provenance["gpus_pending"]


def test_a_tick_on_the_embedded_default_is_a_dry_run(engine):
    """`gpupool fastpath` and the DAG on the default configuration: decided, audited, never sent,
    even with ``dry_run=False`` asked for (the embedded world is rebuilt on every run)."""
    at = _shortage_instant()
    ctx = Context(default_config(), engine)
    with engine.begin() as conn:
        conn.execute(allocation_plan.insert().values(
            decided_at=(at - pd.Timedelta("5min")).to_pydatetime(), policy="predictive", solver="milp",
            dry_run=True, moves=[], summary={"platforms": {}}))
    out = run_fastpath(ctx, at.to_pydatetime(), dry_run=False)
    assert not out["unread"]
    (opened,) = out["opened"]
    assert opened["to"] == "slurm" and opened["dry_run"]
    h = ho.get_handover(engine, opened["id"])
    assert h.dry_run and h.state == ho.DONE
    assert all(r["status"] == "dry_run" for r in ho.audit_rows(engine, h.id))
    rows = store.decisions_at(engine, at.to_pydatetime())
    assert {r["platform"] for r in rows} == {"openstack", "slurm", "kubernetes"}
    move = next(r for r in rows if r["node"])
    assert move["dry_run"] and move["pressure"]["slurm"]["gpus_pending"] > 0
