"""The "GPU pool" page shows who owns each node and who holds it (issue 42): each owned node with
its owner and holder ("lent to X" where another platform holds it), and per platform a line of
what it owns, lends and borrows; on a staged pool with owners (SQLite and PostgreSQL), and through
the plugin's routes. A pool without owners shows no such section."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from gpupool import poolview
from gpupool.staging import loader

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "metrics"))

from owners_staged import AT, BORROWED, CONFIG, LENT, OWNED, PLATFORMS, config, fill  # noqa: E402

#: node -> (owner, holder, note) at AT (owners_staged's docstring)
EXPECTED = {
    "s1": ("slurm", "slurm", "at home"), "s2": ("slurm", "slurm", "at home"), "s3": ("slurm", "slurm", "at home"),
    "s4": ("slurm", "slurm", "coming home"),
    "k1": ("kubernetes", "kubernetes", "at home"), "k2": ("kubernetes", "slurm", "lent to slurm"),
    "k3": ("kubernetes", "kubernetes", "coming home"),
    "o1": ("openstack", "openstack", "at home"), "o2": ("openstack", "kubernetes", "lent to kubernetes"),
}


def _samples(engine) -> None:
    """Platform totals every 5 minutes over the last six hours: what the page needs to show a platform."""
    t0 = AT - pd.Timedelta(hours=6)
    ts = pd.date_range(t0, AT, freq="5min", inclusive="left")
    for p in PLATFORMS:
        rows = [(m, t, v) for t in ts for m, v in (("gpu_allocated", 8.0), ("gpu_pending", 0.0), ("gpu_capacity", 40.0))]
        frame = pd.DataFrame(rows, columns=["metric", "ts", "value"]).assign(
            platform=p, cluster="", entity_kind="platform", entity_id="", unit="gpus")
        loader.replace_slice(engine, loader.Slice("sample", {"platform": p}, t0, AT), frame)


@pytest.fixture
def staged(engine):
    _samples(engine)
    fill(engine)
    return engine


def _note(n) -> str:
    if n["holder"] != n["owner"]:
        return f"lent to {n['holder']}"
    return "coming home" if n["moving"] else "at home"


def test_each_owned_node_shows_its_owner_and_holder(staged):
    state = poolview.pool_state(staged, at=AT, hours=6, config=config())
    assert {n["node"]: (n["owner"], n["holder"], _note(n)) for n in state["owners"]} == EXPECTED
    for p in PLATFORMS:
        own = state["platforms"][p]["ownership"]
        assert (own["owned"], own["lent"], own["borrowed"]) == (OWNED[p], LENT[p], BORROWED[p]), p
    assert state["platforms"]["kubernetes"]["ownership"]["borrowed_nodes"] == [("o2", "openstack")]

    page = poolview.render_html(state)
    assert "<h2>Owners</h2>" in page
    for node, (owner, holder, note) in EXPECTED.items():
        assert f"<tr data-owner='{owner}'><td>{node}</td><td>{owner}</td><td>{holder}</td><td>{note}</td></tr>" in page
    assert "owns 3 · lent 1 · borrowed 1 (o2 from openstack)</div>" in page
    assert "owns 4 · lent 0 · borrowed 1 (k2 from kubernetes)</div>" in page
    assert "owns 2 · lent 1 · borrowed 0</div>" in page


def test_without_the_config_the_page_shows_what_staging_records(staged):
    """o1's owner is only in platforms.yaml, and k2's first sight said openstack."""
    state = poolview.pool_state(staged, at=AT, hours=6)
    owners = {n["node"]: n["owner"] for n in state["owners"]}
    assert "o1" not in owners and owners["k2"] == "openstack"
    assert state["platforms"]["openstack"]["ownership"]["owned"] == 2  # k2 and o2


def test_a_pool_without_owners_shows_no_owners(engine):
    _samples(engine)
    fill(engine, with_owners=False)
    state = poolview.pool_state(engine, at=AT, hours=6)
    assert state["owners"] == [] and all("ownership" not in p for p in state["platforms"].values())
    page = poolview.render_html(state)
    assert "<h2>Owners</h2>" not in page and "data-ownership" not in page


def test_the_plugin_serves_the_owners(dags_root, monkeypatch, tmp_path):
    from fastapi.testclient import TestClient

    from gpupool.staging import db

    url = f"sqlite:///{tmp_path / 'staging.db'}"
    engine = db.make_engine(url)
    db.upgrade(engine)
    _samples(engine)
    fill(engine)
    engine.dispose()
    (tmp_path / "platforms.yaml").write_text(yaml.safe_dump(CONFIG))
    monkeypatch.setenv("GPUPOOL_STAGING_URL", url)
    monkeypatch.setenv("GPUPOOL_CONFIG", str(tmp_path / "platforms.yaml"))
    spec = importlib.util.spec_from_file_location("gpupool_pool_page_owners", dags_root / "plugins" / "gpupool_pool_page.py")
    plugin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plugin)
    plugin.app.dependency_overrides[plugin._auth] = lambda: None  # an authenticated caller
    client = TestClient(plugin.app)
    r = client.get("/api/pool", params={"at": AT.isoformat(), "hours": 6})
    assert r.status_code == 200, r.text
    got = {n["node"]: (n["owner"], n["holder"]) for n in r.json()["owners"]}
    assert got == {n: (o, h) for n, (o, h, _) in EXPECTED.items()}  # o1 and k2 from platforms.yaml
    page = client.get("/", params={"at": AT.isoformat(), "hours": 6}).text
    assert "<tr data-owner='openstack'><td>o2</td><td>openstack</td><td>kubernetes</td><td>lent to kubernetes</td></tr>" in page
