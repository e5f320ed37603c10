"""A real Prometheus scrapes `gpupool metrics serve`, loads the shipped alert rules, and every
alert's expression returns data on staging arranged so that each should fire; the plugin's
/metrics route answers the same exposition. Fails (never skips) without prometheus."""

from __future__ import annotations

import json
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from gpupool.staging import db

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "config" / "prometheus" / "gpupool-alerts.yml"


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def served(gpupool_prometheus):
    """Prometheus scraping gpupool on staging where every alert should fire (tests/integration/conftest.py)."""
    return gpupool_prometheus


def _query(base: str, expr: str) -> list:
    res = _get(f"{base}/api/v1/query?query=" + urllib.parse.quote(expr))
    assert res["status"] == "success", res
    return res["data"]["result"]


def test_prometheus_scrapes_gpupool(served):
    held = {r["metric"]["platform"]: float(r["value"][1]) for r in _query(served, "gpupool_platform_held_nodes")}
    assert set(held) == {"openstack", "slurm", "kubernetes", "lab"} and held["lab"] == 0 and held["slurm"] > 0
    assert _query(served, 'gpupool_staging_up == 1')
    assert _query(served, 'gpupool_handover_duration_seconds_bucket{le="+Inf"}')
    assert _query(served, 'gpupool_power_nodes{platform="kubernetes", state="waking"} == 1')
    assert _query(served, 'gpupool_power_parked_node_seconds_total{platform="kubernetes"} > 0')
    assert _query(served, 'gpupool_reclaims_past_deadline{platform="kubernetes"} == 1')
    assert _query(served, 'gpupool_reclaims_blocked{platform="kubernetes"} == 1')
    assert _query(served, 'gpupool_reclaims_blocked{platform="slurm"} == 0')
    assert _query(served, 'gpupool_platform_owned_nodes{platform="slurm"} == 0')
    assert _query(served, 'gpupool_reclaim_latency_seconds_count{platform="kubernetes"} == 0')


def test_the_rules_load_and_every_alert_expression_returns_data(served):
    groups = yaml.safe_load(RULES.read_text())["groups"]
    rules = [r for g in groups for r in g["rules"]]
    loaded = [r for g in _get(f"{served}/api/v1/rules")["data"]["groups"] for r in g["rules"]]
    assert sorted(r["name"] for r in loaded) == sorted(r["alert"] for r in rules)
    assert all(r["health"] in ("ok", "unknown") for r in loaded), loaded
    expected = {
        "GpupoolHandoverFailed": {("slurm", "kubernetes")},
        "GpupoolHandoverPastDeadline": {("openstack", "kubernetes")},
        "GpupoolExtractionStale": {"lab"},
        "GpupoolPendingWhileIdleElsewhere": {"slurm"},
        "GpupoolForecastWorseThanNaive": {"kubernetes"},
        "GpupoolBelowMinNodes": {"lab"},
        "GpupoolWakeFailed": {"kubernetes"},
        "GpupoolWakeLate": {"kubernetes"},
        "GpupoolReclaimLate": {"kubernetes"},
        "GpupoolReclaimBlocked": {"kubernetes"},
    }
    for rule in rules:
        result = _query(served, rule["expr"])
        assert result, f"{rule['alert']}: no data for {rule['expr']}"
        labels = [r["metric"] for r in result]
        got = {(m["source"], m["target"]) if "source" in m else m["platform"] for m in labels}
        assert got == expected[rule["alert"]], (rule["alert"], labels)


def test_plugin_route_serves_the_same_exposition(dags_root, monkeypatch, tmp_path):
    """The Airflow plugin's /metrics (behind Airflow's guard, overridden here as an
    authenticated caller) answers text that passes promtool check metrics."""
    import importlib.util

    from fastapi.testclient import TestClient

    url = f"sqlite:///{tmp_path / 'staging.db'}"
    db.upgrade(db.make_engine(url))
    monkeypatch.setenv("GPUPOOL_STAGING_URL", url)
    monkeypatch.delenv("GPUPOOL_CONFIG", raising=False)
    spec = importlib.util.spec_from_file_location("gpupool_pool_page_metrics", dags_root / "plugins" / "gpupool_pool_page.py")
    plugin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plugin)
    client = TestClient(plugin.app)
    plugin.app.dependency_overrides[plugin._auth] = lambda: None
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    assert "gpupool_staging_up 1.0" in r.text and 'gpupool_platform_held_nodes{platform="slurm"} 0.0' in r.text
    check = subprocess.run(["promtool", "check", "metrics"], input=r.content, capture_output=True)
    assert check.returncode == 0, check.stdout + check.stderr
    plugin.app.dependency_overrides.clear()
    assert TestClient(plugin.app, raise_server_exceptions=False).get("/metrics").status_code in (401, 403)
