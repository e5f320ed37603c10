"""The "GPU pool" plugin's FastAPI app in process: no public schema or docs, a guard that fails
closed, and a clear 422 for a bad `at`. (The running stack is tested in tests/e2e.)"""

from __future__ import annotations

import importlib.util
import sys

import pytest

fastapi_testclient = pytest.importorskip("fastapi.testclient")

GUARD = "airflow.api_fastapi.core_api.security"


def _load(dags_root, name: str):
    spec = importlib.util.spec_from_file_location(name, dags_root / "plugins" / "gpupool_pool_page.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def plugin(dags_root):
    return _load(dags_root, "gpupool_pool_page_under_test")


@pytest.mark.parametrize("path", ["/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect"])
def test_no_public_schema_or_docs(plugin, path):
    client = fastapi_testclient.TestClient(plugin.app)
    assert client.get(path).status_code == 404
    assert plugin.app.openapi_url is None and plugin.app.docs_url is None and plugin.app.redoc_url is None


def test_every_route_is_guarded(plugin):
    from fastapi.routing import APIRoute

    routes = [r for r in plugin.app.routes if isinstance(r, APIRoute)]
    assert {r.path for r in routes} == {"/", "/api/pool", "/metrics"}
    for route in routes:
        assert any(d.call is plugin._auth for d in route.dependant.dependencies), route.path


def test_guard_that_cannot_be_imported_fails_closed(dags_root, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, GUARD, None)  # `from ... import` now raises ImportError
    monkeypatch.setenv("GPUPOOL_STAGING_URL", f"sqlite:///{tmp_path / 'staging.db'}")
    module = _load(dags_root, "gpupool_pool_page_without_guard")
    client = fastapi_testclient.TestClient(module.app)
    for path in ("/", "/api/pool", "/api/pool?at=2026-11-01T00:00Z"):
        r = client.get(path)
        assert r.status_code == 503, (path, r.status_code, r.text)
        assert "authentication unavailable" in r.json()["detail"]
    assert not (tmp_path / "staging.db").exists()  # nothing was served, staging never opened


@pytest.mark.parametrize("at", ["garbage", "2026-13-45", "2026-01-01'; drop table sample;--"])
def test_bad_at_is_a_clear_422(plugin, monkeypatch, tmp_path, at):
    monkeypatch.setenv("GPUPOOL_STAGING_URL", f"sqlite:///{tmp_path / 'staging.db'}")
    plugin.app.dependency_overrides[plugin._auth] = lambda: None  # an authenticated caller
    client = fastapi_testclient.TestClient(plugin.app, raise_server_exceptions=False)
    for path in ("/api/pool", "/"):
        r = client.get(path, params={"at": at})
        assert r.status_code == 422, (path, r.status_code, r.text)
        detail = r.json()["detail"]
        assert "'at'" in detail and "not a time" in detail
