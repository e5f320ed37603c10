"""Production's owners on SQLite and the real PostgreSQL (issue 42): :func:`gpupool.jobs.owners.homes_at`
records ``pool.nodes[].owner`` and each platform's first ``owns`` at its first sight once, in
staging, so a restart after nodes moved reshuffles nothing, and two writers seeing a platform at
once record one answer."""

from __future__ import annotations

import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import sqlalchemy as sa

from gpupool.config import parse_config
from gpupool.jobs import owners as job
from gpupool.pipeline import Context
from gpupool.staging import owners as store
from gpupool.staging.schema import node_owner, owner_sight, reclaim_need

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "actuation"))
from mempower import race  # noqa: E402

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=timezone.utc)


def _ctx(engine, slurm=None, k8s=None, nodes=()):
    raw = {"platforms": [{"name": "slurm", "kind": "simulator", **(slurm or {})},
                         {"name": "k8s", "kind": "simulator", **(k8s or {})}],
           "pool": {"nodes": [dict(n, gpus=8) for n in nodes]}}
    return Context(parse_config(raw), engine)


def _rows(engine):
    return {r["node"]: (r["owner"], r["source"]) for r in store.owner_rows(engine)}


def _count(engine, table):
    with engine.connect() as conn:
        return conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one()


def test_first_sight_is_recorded_once_and_a_restart_after_moves_reshuffles_nothing(engine):
    ctx = _ctx(engine, slurm={"owns": 2}, k8s={"owns": 1})
    held = {"slurm": ["n2", "n0", "n1"], "k8s": ["k1", "k0"]}
    homes = job.homes_at(ctx, T0, held)
    assert homes == {"n0": "slurm", "n1": "slurm", "k0": "k8s"}  # the first owns by node id
    assert _rows(engine) == {n: (o, store.FIRST_SIGHT) for n, o in homes.items()}
    assert store.seen_platforms(engine) == {"slurm", "k8s"}
    before = store.owner_rows(engine)
    # a restart after n0 and n2 moved to k8s and k0 to slurm: the same owners, nothing written
    moved = {"slurm": ["k0", "n1", "n3"], "k8s": ["n0", "n2", "k1"]}
    assert job.homes_at(Context(ctx.config, engine), T0 + timedelta(hours=5), moved) == homes
    assert store.owner_rows(engine) == before
    assert _count(engine, owner_sight) == 2


def test_owns_smaller_than_held_takes_the_first_and_larger_takes_what_it_holds(engine):
    ctx = _ctx(engine, slurm={"owns": 1}, k8s={"owns": 5})
    homes = job.homes_at(ctx, T0, {"slurm": ["s1", "s0"], "k8s": ["k0", "k1"]})
    assert homes == {"s0": "slurm", "k0": "k8s", "k1": "k8s"}
    # k8s holds more later (borrowed s1, and a new node): it owns what it held at first sight
    assert job.homes_at(ctx, T0 + timedelta(hours=1), {"slurm": ["s0"], "k8s": ["k0", "k1", "s1", "k2"]}) == homes
    with engine.connect() as conn:
        assert {r.platform: r.owns for r in conn.execute(sa.select(owner_sight))} == {"slurm": 1, "k8s": 5}


def test_a_config_owner_beats_first_sight(engine):
    ctx = _ctx(engine, slurm={"owns": 2}, nodes=[{"node": "n0", "owner": "k8s"}])
    homes = job.homes_at(ctx, T0, {"slurm": ["n0", "n1", "n2", "n3"]})
    # n0 is k8s's by the configuration; slurm's first two of the rest
    assert homes == {"n0": "k8s", "n1": "slurm", "n2": "slurm"}
    assert _rows(engine) == {"n0": ("k8s", store.CONFIG), "n1": ("slurm", store.FIRST_SIGHT),
                             "n2": ("slurm", store.FIRST_SIGHT)}
    # the operator names n1's owner later: it replaces the first sight, and slurm takes no other
    later = _ctx(engine, slurm={"owns": 2}, nodes=[{"node": "n0", "owner": "k8s"}, {"node": "n1", "owner": "k8s"}])
    homes = job.homes_at(later, T0 + timedelta(hours=1), {"slurm": ["n0", "n1", "n2", "n3"]})
    assert homes == {"n0": "k8s", "n1": "k8s", "n2": "slurm"}
    assert _rows(engine)["n1"] == ("k8s", store.CONFIG)
    # a first sight never replaces a config owner, even from a writer that read before it
    store.record_owners(engine, {"n1": ("slurm", store.FIRST_SIGHT)}, T0 + timedelta(hours=2))
    assert _rows(engine)["n1"] == ("k8s", store.CONFIG)


def test_a_platform_not_read_or_holding_nothing_is_not_sighted(engine):
    ctx = _ctx(engine, slurm={"owns": 2}, k8s={"owns": 2})
    assert job.homes_at(ctx, T0, {"slurm": ["s0"]}) == {"s0": "slurm"}
    assert job.homes_at(ctx, T0 + timedelta(minutes=5), {"slurm": ["s0"], "k8s": []}) == {"s0": "slurm"}
    assert store.seen_platforms(engine) == {"slurm"}
    # read at last: k8s owns its first two of what nobody owns (s0 is slurm's, wherever it is)
    homes = job.homes_at(ctx, T0 + timedelta(hours=1), {"slurm": ["s1"], "k8s": ["s0", "k1", "k0", "k2"]})
    assert homes == {"s0": "slurm", "k0": "k8s", "k1": "k8s"}
    assert store.seen_platforms(engine) == {"slurm", "k8s"}


@pytest.mark.parametrize("keys", [{}, {"lend_limit": 0, "reclaim_minutes": 30}])
def test_no_owner_keys_write_nothing(engine, keys):
    ctx = _ctx(engine, slurm=keys)
    assert job.homes_at(ctx, T0, {"slurm": ["s0", "s1"], "k8s": ["k0"]}) == {}
    for table in (node_owner, owner_sight, reclaim_need):
        assert _count(engine, table) == 0
    assert set(job.ownership_settings(ctx.config)) == ({"slurm"} if keys else set())


def test_two_writers_seeing_a_platform_at_once_record_one_answer(engine, monkeypatch):
    """Both read that slurm was not seen yet (the read slowed so they overlap), each from its own
    reading of what slurm holds, then record: one reading's owners stand, never a mix of both."""
    real = store.seen_platforms

    def slow(*a, **kw):
        seen = real(*a, **kw)
        time.sleep(0.3)
        return seen

    monkeypatch.setattr(store, "seen_platforms", slow)
    ctx = _ctx(engine, slurm={"owns": 2}, nodes=[{"node": "c0", "owner": "k8s"}])
    readings = [{"slurm": ["n0", "n1", "n5"]}, {"slurm": ["n1", "n2", "n3"]}]
    answers = [{"c0": "k8s", "n0": "slurm", "n1": "slurm"}, {"c0": "k8s", "n1": "slurm", "n2": "slurm"}]
    got = race(2, lambda i: job.homes_at(ctx, T0, readings[i]))
    assert not any(isinstance(g, Exception) for g in got), got
    final = store.owners(engine)
    assert final in answers, final
    assert got == [final, final]
    assert _count(engine, owner_sight) == 1


def test_two_writers_recording_at_once_record_one_answer(engine):
    """The store alone, many rounds: two writers record different first sights of one platform."""
    for r in range(6):
        p = f"p{r}"
        rows = [{f"{p}-a": (p, store.FIRST_SIGHT)}, {f"{p}-b": (p, store.FIRST_SIGHT)}]
        got = race(2, lambda i: store.record_owners(engine, rows[i], T0, {p: 1}))
        assert not any(isinstance(g, Exception) for g in got), got
        mine = {n for n, o in store.owners(engine).items() if o == p}
        assert mine in ({f"{p}-a"}, {f"{p}-b"}), (r, mine)
    assert _count(engine, owner_sight) == 6
