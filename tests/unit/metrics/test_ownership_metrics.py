"""The ownership metrics (issue 42) on a staged pool with owners, lent and borrowed nodes and
reclaims (SQLite and PostgreSQL): nodes owned, lent, borrowed and lendable now, reclaim latency,
late reclaims, reclaims past their deadline and reclaims a disruption budget blocks, each the
figure the staging implies; nothing of ownership where no platform sets an ownership key; the
exposition passes `promtool check metrics`."""

from __future__ import annotations

from datetime import timedelta

import pytest

from gpupool import metrics
from gpupool.config import default_config, parse_config

from owners_staged import (AT, BORROWED, CONFIG, HELD, LENDABLE, LENT, M, OWNED, PLATFORMS, RECLAIM_S, config, fill)
from test_collector import promtool_check, scrape, value

OWNERSHIP_FAMILIES = ("gpupool_platform_owned_nodes", "gpupool_platform_lent_nodes", "gpupool_platform_borrowed_nodes",
                      "gpupool_platform_lendable_owned_nodes", "gpupool_reclaim_latency_seconds",
                      "gpupool_reclaim_late", "gpupool_reclaims_past_deadline", "gpupool_reclaims_blocked")


@pytest.fixture
def staged(engine):
    fill(engine)
    return engine


def _per_platform(out, name):
    return {p: value(out, name, platform=p) for p in PLATFORMS}


def test_nodes_owned_lent_borrowed_and_lendable_are_what_staging_implies(staged):
    promtool_check(metrics.exposition(staged, config(), AT))
    out = scrape(staged, config(), AT)
    assert _per_platform(out, "gpupool_platform_owned_nodes") == OWNED
    assert _per_platform(out, "gpupool_platform_held_nodes") == HELD
    assert _per_platform(out, "gpupool_platform_lent_nodes") == LENT
    assert _per_platform(out, "gpupool_platform_borrowed_nodes") == BORROWED
    assert _per_platform(out, "gpupool_platform_lendable_owned_nodes") == LENDABLE
    # held = owned at home + borrowed + the pool's own (p1, nobody's, on openstack)
    for p in PLATFORMS:
        assert HELD[p] == OWNED[p] - LENT[p] + BORROWED[p] + (p == "openstack")


def test_reclaim_latency_late_and_past_deadline(staged):
    out = scrape(staged, config(), AT)
    h = "gpupool_reclaim_latency_seconds"
    assert value(out, f"{h}_count", platform="kubernetes") == 2  # k2 in 45 min, k1 in 12; k3 still open
    assert value(out, f"{h}_sum", platform="kubernetes") == sum(RECLAIM_S)
    buckets = {le: value(out, f"{h}_bucket", platform="kubernetes", le=le)
               for le in ("300.0", "600.0", "900.0", "1800.0", "2700.0", "3600.0", "5400.0", "7200.0", "+Inf")}
    assert buckets == {"300.0": 0, "600.0": 0, "900.0": 1, "1800.0": 1, "2700.0": 2, "3600.0": 2, "5400.0": 2,
                       "7200.0": 2, "+Inf": 2}
    # the dry run and the plain move are not reclaims; s4's reclaim to slurm is still open
    assert value(out, f"{h}_count", platform="slurm") == 0 and value(out, f"{h}_count", platform="openstack") == 0
    assert _per_platform(out, "gpupool_reclaim_late_total") == {"slurm": 0, "kubernetes": 1, "openstack": 0}
    # k3's need began 40 minutes ago (kubernetes promises 30); s4's 10 (slurm promises 60)
    assert _per_platform(out, "gpupool_reclaims_past_deadline") == {"slurm": 0, "kubernetes": 1, "openstack": 0}


def test_an_earlier_instant_sees_the_reclaims_as_they_stood(staged):
    """At AT-4h30m k2's reclaim was open, its need 30 minutes old: past kubernetes' deadline, not done."""
    out = scrape(staged, config(), AT - timedelta(minutes=270))
    assert value(out, "gpupool_reclaim_latency_seconds_count", platform="kubernetes") == 0
    assert value(out, "gpupool_reclaim_late_total", platform="kubernetes") == 0
    assert value(out, "gpupool_reclaims_past_deadline", platform="kubernetes") == 1
    out = scrape(staged, config(), AT - timedelta(minutes=200))  # done late by then; k1's not opened
    assert value(out, "gpupool_reclaim_latency_seconds_count", platform="kubernetes") == 1
    assert value(out, "gpupool_reclaim_late_total", platform="kubernetes") == 1
    assert value(out, "gpupool_reclaims_past_deadline", platform="kubernetes") == 0


def _say(engine, node, error, at=AT - 5 * M):
    """Write ``error`` on the open live reclaim of ``node`` through the handover store, as a step of it would."""
    from gpupool.actuation import handover as ho

    (h,) = [h for h in ho.list_handovers(engine, ho.OPEN_STATES) if h.node == node and not h.dry_run]
    ho.update_handover(engine, h, at, error=error)
    return h


#: what a reclaim's handover says once its eviction was refused with a budget named (handover._blocked_said)
REFUSED = ("will retry: k8s-ai/evict: eviction refused by a disruption budget (429); blocked by disruption "
           "budget(s) ml/train-pdb; the reclaim's deadline falls at 2026-11-01T04:10:00+00:00 "
           "(kubernetes's reclaim_minutes 30)")


def test_reclaims_blocked_by_a_disruption_budget(staged):
    """k3's reclaim (for kubernetes) had its eviction refused by a budget: blocked; s4's (for
    slurm) waits on something else: not blocked; a dry-run reclaim refused alike never counts."""
    from gpupool.actuation import handover as ho

    out = scrape(staged, config(), AT)
    assert _per_platform(out, "gpupool_reclaims_blocked") == {"slurm": 0, "kubernetes": 0, "openstack": 0}
    _say(staged, "k3", REFUSED)
    _say(staged, "s4", "waiting: kubernetes still runs work on node 's4'")
    dry = ho.open_handover(staged, "o2", "kubernetes", "openstack", AT - 20 * M, dry_run=True, kind=ho.RECLAIM,
                           need_since=AT - 25 * M, state=ho.RELEASING)
    ho.update_handover(staged, ho.get_handover(staged, dry), AT - 5 * M, error=REFUSED)
    promtool_check(metrics.exposition(staged, config(), AT))
    out = scrape(staged, config(), AT)
    assert _per_platform(out, "gpupool_reclaims_blocked") == {"slurm": 0, "kubernetes": 1, "openstack": 0}
    assert value(out, "gpupool_reclaims_past_deadline", platform="kubernetes") == 1  # both: it is late too
    # before k3's reclaim opened (AT-38m) nothing was blocked
    assert value(scrape(staged, config(), AT - 39 * M), "gpupool_reclaims_blocked", platform="kubernetes") == 0
    # the budget allows it, the eviction goes through: the handover's next step says so, and it is not blocked
    _say(staged, "k3", "waiting: openstack still reports node 'k3' busy", at=AT - 2 * M)
    assert value(scrape(staged, config(), AT), "gpupool_reclaims_blocked", platform="kubernetes") == 0


def test_a_longer_promise_makes_no_reclaim_late(staged):
    cfg = dict(CONFIG, platforms=[{**p, "reclaim_minutes": 50} if p["name"] == "kubernetes" else p
                                  for p in CONFIG["platforms"]])
    out = scrape(staged, parse_config(cfg), AT)
    assert value(out, "gpupool_reclaim_late_total", platform="kubernetes") == 0
    assert value(out, "gpupool_reclaims_past_deadline", platform="kubernetes") == 0
    assert value(out, "gpupool_reclaim_latency_seconds_count", platform="kubernetes") == 2


def test_without_a_lend_limit_every_idle_owned_node_at_home_is_lendable(staged):
    cfg = dict(CONFIG, platforms=[{k: v for k, v in p.items() if k != "lend_limit"} for p in CONFIG["platforms"]])
    out = scrape(staged, parse_config(cfg), AT)
    assert value(out, "gpupool_platform_lendable_owned_nodes", platform="openstack") == 1  # o1


def test_no_ownership_key_leaves_the_exposition_as_it_was(engine):
    """A fresh install's config: owners and reclaims in staging change nothing the scrape says
    beyond the handover families every handover is counted in, and no ownership family appears."""
    fill(engine, with_owners=False, with_reclaims=False)
    before = metrics.exposition(engine, default_config(), AT)
    fill_owners_only(engine)
    assert metrics.exposition(engine, default_config(), AT) == before
    text = before.decode()
    assert not [f for f in OWNERSHIP_FAMILIES if f in text]
    assert not metrics.ownership_configured(default_config())
    with_key = metrics.exposition(engine, config(), AT).decode()
    assert all(f"# HELP {f}" in with_key for f in OWNERSHIP_FAMILIES)


def fill_owners_only(engine) -> None:
    from gpupool.staging import owners

    owners.record_owners(engine, {"s1": ("slurm", owners.FIRST_SIGHT), "k2": ("kubernetes", owners.CONFIG)}, AT)


@pytest.mark.parametrize("key", [{"owns": 2}, {"borrow_limit": 0}, {"min_runtime_minutes": 5}])
def test_any_ownership_key_turns_the_families_on(key):
    cfg = parse_config({"platforms": [{"name": "slurm", "kind": "simulator", **key}, {"name": "k", "kind": "simulator"}]})
    assert metrics.ownership_configured(cfg)
    owner_only = parse_config({"platforms": [{"name": "slurm", "kind": "simulator"}],
                               "pool": {"nodes": [{"node": "a", "gpus": 8, "owner": "slurm"}]}})
    assert metrics.ownership_configured(owner_only)
