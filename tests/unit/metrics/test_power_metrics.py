"""The parking metrics on a staged history of parks and wakes (SQLite and PostgreSQL): nodes
per power state, wakes, late and failing wakes, wake latency, parked node-seconds and the energy
saved, each the figure the history implies; the exposition passes `promtool check metrics`."""

from __future__ import annotations

from datetime import timedelta

import pytest

from gpupool import energy, metrics
from gpupool.config import default_config, parse_config

from power_staged import AT, PARKED_S, fill
from test_collector import promtool_check, scrape, value

PLATFORMS = ("slurm", "kubernetes", "openstack")


@pytest.fixture
def staged(engine):
    fill(engine)
    return engine


def test_power_metrics_are_what_the_history_implies(staged):
    cfg = default_config()
    promtool_check(metrics.exposition(staged, cfg, AT))
    out = scrape(staged, cfg, AT)
    nodes = {(p, s): value(out, "gpupool_power_nodes", platform=p, state=s) for p in PLATFORMS for s in energy.STATES}
    assert nodes == {
        ("slurm", "on"): 5, ("slurm", "parking"): 0, ("slurm", "parked"): 0, ("slurm", "waking"): 0,
        # n3 parked (out of the planner's pool), n4 held but waking: neither counts as on
        ("kubernetes", "on"): 1, ("kubernetes", "parking"): 0, ("kubernetes", "parked"): 1, ("kubernetes", "waking"): 1,
        ("openstack", "on"): 1, ("openstack", "parking"): 1, ("openstack", "parked"): 0, ("openstack", "waking"): 1,
    }
    assert {p: value(out, "gpupool_power_wakes_total", platform=p) for p in PLATFORMS} == {
        "slurm": 3, "kubernetes": 1, "openstack": 1}
    assert {p: value(out, "gpupool_power_late_wakes_total", platform=p) for p in PLATFORMS} == {
        "slurm": 1, "kubernetes": 1, "openstack": 0}
    failing = {(p, c): value(out, "gpupool_power_wakes_failing", platform=p, cause=c)
               for p in PLATFORMS for c in metrics.WAKE_FAILURE_CAUSES}
    assert {k: v for k, v in failing.items() if v} == {
        ("kubernetes", "refused"): 1, ("kubernetes", "past_deadline"): 1, ("openstack", "error"): 1}
    h = "gpupool_power_wake_duration_seconds"
    assert value(out, f"{h}_count", platform="slurm") == 2  # n1 in 4 min, n2 in 20; n6 was seen on already
    assert value(out, f"{h}_sum", platform="slurm") == 240 + 1200
    assert value(out, f"{h}_bucket", platform="slurm", le="120.0") == 0
    assert value(out, f"{h}_bucket", platform="slurm", le="300.0") == 1
    assert value(out, f"{h}_bucket", platform="slurm", le="900.0") == 1
    assert value(out, f"{h}_bucket", platform="slurm", le="1800.0") == 2
    assert value(out, f"{h}_bucket", platform="slurm", le="+Inf") == 2
    assert value(out, f"{h}_count", platform="kubernetes") == 0
    for p in PLATFORMS:
        assert value(out, "gpupool_power_parked_node_seconds_total", platform=p) == pytest.approx(PARKED_S[p])
        joules = PARKED_S[p] * (energy.IDLE_WATTS - energy.PARKED_WATTS)
        assert value(out, "gpupool_power_saved_energy_joules_total", platform=p) == pytest.approx(joules)


def test_an_earlier_instant_sees_the_parks_and_wakes_made_by_then(staged):
    at = AT - timedelta(hours=4)  # T0+2h: n1 waking since this minute, n2 parked, n6 parked
    out = scrape(staged, default_config(), at)
    assert value(out, "gpupool_power_nodes", platform="slurm", state="waking") == 1
    assert value(out, "gpupool_power_nodes", platform="slurm", state="parked") == 2
    assert value(out, "gpupool_power_nodes", platform="slurm", state="on") == 2  # s1, s2
    assert value(out, "gpupool_power_wakes_total", platform="slurm") == 1
    assert value(out, "gpupool_power_late_wakes_total", platform="slurm") == 0
    assert value(out, "gpupool_power_wake_duration_seconds_count", platform="slurm") == 0
    # n4's wake (and its error, which staging holds for the wake after this instant) is not there yet
    assert value(out, "gpupool_power_wakes_failing", platform="kubernetes", cause="refused") == 0
    assert value(out, "gpupool_power_parked_node_seconds_total", platform="slurm") == pytest.approx((115 + 110 + 60) * 60)


def test_a_platforms_watts_come_from_its_power_settings(staged):
    cfg = parse_config({"platforms": [
        {"name": "slurm", "kind": "slurm", "conn_id": "slurm_hpc", "power": {"means": "slurm", "idle_watts": 2000, "parked_watts": 0}},
        {"name": "kubernetes", "kind": "simulator"}, {"name": "openstack", "kind": "simulator"}]})
    out = scrape(staged, cfg, AT)
    assert value(out, "gpupool_power_saved_energy_joules_total", platform="slurm") == pytest.approx(PARKED_S["slurm"] * 2000)
    assert value(out, "gpupool_power_saved_energy_joules_total", platform="kubernetes") == pytest.approx(
        PARKED_S["kubernetes"] * (energy.IDLE_WATTS - energy.PARKED_WATTS))


def test_without_power_rows_every_pool_node_is_on_and_nothing_was_saved(engine):
    out = scrape(engine, default_config(), AT)
    for p in PLATFORMS:
        assert value(out, "gpupool_power_nodes", platform=p, state="parked") == 0
        assert value(out, "gpupool_power_wakes_total", platform=p) == 0
        assert value(out, "gpupool_power_saved_energy_joules_total", platform=p) == 0
        assert value(out, "gpupool_power_wake_duration_seconds_count", platform=p) == 0
