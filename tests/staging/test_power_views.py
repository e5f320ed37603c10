"""What the operator sees of parking outside Prometheus: the pool page's parked, parking and
waking nodes, and the report's energy panel, on a staged history of parks and wakes (SQLite
and PostgreSQL)."""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

import pandas as pd
import pytest

from gpupool import energy, poolview, report
from gpupool.staging import loader

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "metrics"))

from power_staged import AT, PARKED_S, T0, fill  # noqa: E402

PLATFORMS = ("kubernetes", "openstack", "slurm")


def _samples(engine) -> None:
    """Platform totals every 5 minutes over [T0, AT) for each platform: what the page and the
    report need to show a platform at all."""
    ts = pd.date_range(T0, AT, freq="5min", inclusive="left")
    for p in PLATFORMS:
        rows = [(m, t, v) for t in ts for m, v in (("gpu_allocated", 8.0), ("gpu_pending", 0.0), ("gpu_capacity", 40.0))]
        frame = pd.DataFrame(rows, columns=["metric", "ts", "value"]).assign(
            platform=p, cluster="", entity_kind="platform", entity_id="", unit="gpus")
        loader.replace_slice(engine, loader.Slice("sample", {"platform": p}, T0, AT), frame)


@pytest.fixture
def staged(engine):
    _samples(engine)
    fill(engine)
    return engine


def test_the_pool_page_lists_each_node_not_on_with_its_state(staged):
    state = poolview.pool_state(staged, at=AT, hours=6)
    by_node = {n["node"]: n for n in state["power"]}
    assert {n: (v["platform"], v["state"]) for n, v in by_node.items()} == {
        "n3": ("kubernetes", "parked"), "n4": ("kubernetes", "waking"),
        "n5": ("openstack", "parking"), "n8": ("openstack", "waking")}
    assert by_node["n4"]["late"] and not by_node["n8"]["late"] and not by_node["n5"]["late"]
    assert by_node["n4"]["error"].startswith("left alone") and by_node["n8"]["error"].startswith("will retry")
    assert by_node["n3"]["since"] == (T0 + timedelta(minutes=60)).isoformat()
    assert state["platforms"]["kubernetes"]["power"] == {"parking": 0, "parked": 1, "waking": 1}
    assert state["platforms"]["slurm"]["power"] == {"parking": 0, "parked": 0, "waking": 0}

    page = poolview.render_html(state)
    for node, st in (("n3", "parked"), ("n4", "waking"), ("n5", "parking"), ("n8", "waking")):
        assert f"<tr data-power='{st}'><td>{node}</td>" in page
    for st in ("parked", "parking", "waking"):  # each state its own mark
        assert f"<span class='pw pw-{st}'>{st}</span>" in page and f".pw-{st}{{background:" in page
    assert page.count("<span class='late'>late</span>") == 1
    assert "power: 1 parked, 1 waking" in page


def test_the_pool_page_as_it_stood_earlier(staged):
    """Four hours before AT: n1 waking, n2 and n6 parked on slurm; nothing of n4's wake yet."""
    state = poolview.pool_state(staged, at=AT - timedelta(hours=4), hours=2)
    assert {n["node"]: n["state"] for n in state["power"]} == {
        "n1": "waking", "n2": "parked", "n6": "parked", "n3": "parked", "n4": "parked", "n8": "parked"}
    assert next(n for n in state["power"] if n["node"] == "n4")["error"] is None


def test_without_power_rows_the_page_says_every_node_is_on(engine):
    _samples(engine)
    state = poolview.pool_state(engine, at=AT, hours=6)
    assert state["power"] == []
    assert "none: every node is on" in poolview.render_html(state)


def test_the_energy_panel_counts_the_period(staged):
    rows = {r["platform"]: r for r in report.energy_panel(staged, T0, AT, list(PLATFORMS))}
    assert {p: rows[p]["wakes"] for p in PLATFORMS} == {"slurm": 3, "kubernetes": 1, "openstack": 1}
    assert {p: rows[p]["late_wakes"] for p in PLATFORMS} == {"slurm": 1, "kubernetes": 1, "openstack": 0}
    for p in PLATFORMS:
        assert rows[p]["parked_node_hours"] == pytest.approx(PARKED_S[p] / 3600)
        assert rows[p]["saved_kwh"] == pytest.approx(PARKED_S[p] / 3600 * (energy.IDLE_WATTS - energy.PARKED_WATTS) / 1000)
    assert rows["total"]["wakes"] == 5 and rows["total"]["parked_node_hours"] == pytest.approx(sum(PARKED_S.values()) / 3600)
    # one hour inside: parked time clipped to it, a wake counted where it started
    hour = {r["platform"]: r for r in report.energy_panel(staged, T0 + timedelta(hours=2), T0 + timedelta(hours=3),
                                                          ["slurm"])}
    assert hour["slurm"]["parked_node_hours"] == pytest.approx(2.0)  # n2 and n6; n1 woke at its start
    assert hour["slurm"]["wakes"] == 1 and hour["slurm"]["late_wakes"] == 0


def test_the_report_shows_the_energy_panel(staged, tmp_path):
    page = report.write_report(staged, T0, AT, tmp_path / "r", whatif=False).read_text()
    assert "<h2 id='energy'>Energy: parked nodes</h2>" in page
    saved = PARKED_S["slurm"] / 3600 * (energy.IDLE_WATTS - energy.PARKED_WATTS) / 1000
    assert (f"<tr data-platform='slurm'><td>slurm</td><td>{PARKED_S['slurm'] / 3600:.1f}</td><td>3</td><td>1</td>"
            f"<td>{saved:.1f}</td></tr>") in page
    assert "<tr data-platform='total'>" in page and "No node was parked" not in page


def test_with_no_power_rows_the_panel_says_nothing_was_parked(engine, tmp_path):
    _samples(engine)
    page = report.write_report(engine, T0, AT, tmp_path / "r", whatif=False).read_text()
    assert "No node was parked in this period: parking saved nothing." in page
    assert "<table class='energy'>" not in page
