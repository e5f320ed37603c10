"""The "GPU pool" API on an `at` that parses but whose window the reads cannot hold: a clear 422
naming the parameter and the range, as for an `at` that does not parse (it was a 500)."""

from __future__ import annotations

import importlib.util

import pytest

fastapi_testclient = pytest.importorskip("fastapi.testclient")


@pytest.fixture
def client(dags_root, monkeypatch, tmp_path):
    from gpupool.cli import main

    monkeypatch.setenv("GPUPOOL_STAGING_URL", f"sqlite:///{tmp_path / 'staging.db'}")
    monkeypatch.delenv("GPUPOOL_CONFIG", raising=False)
    assert main(["db", "upgrade"]) == 0
    spec = importlib.util.spec_from_file_location("gpupool_pool_page_instants", dags_root / "plugins" / "gpupool_pool_page.py")
    plugin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plugin)
    plugin.app.dependency_overrides[plugin._auth] = lambda: None  # an authenticated caller
    return fastapi_testclient.TestClient(plugin.app, raise_server_exceptions=False)


@pytest.mark.parametrize("at", ["0001-01-01T00:00Z", "1677-09-21T12:00Z", "9999-12-31T23:59Z", "2262-04-12T00:00Z"])
def test_an_instant_beyond_the_reads_is_a_clear_422(client, at):
    for path in ("/api/pool", "/"):
        r = client.get(path, params={"at": at})
        assert r.status_code == 422, (path, r.status_code, r.text)
        detail = r.json()["detail"]
        assert "'at'" in detail and at[:4] in detail and "1678-01-01 .. 2262-01-01" in detail


def test_an_ordinary_instant_is_answered(client):
    r = client.get("/api/pool", params={"at": "2026-11-01T00:00Z", "hours": 48})
    assert r.status_code == 200, r.text
    assert r.json()["at"] == "2026-11-01T00:00:00+00:00" and r.json()["hours"] == 48
