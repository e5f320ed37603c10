"""A real Prometheus scrapes `gpupool metrics serve`, loads the shipped alert rules, and every
alert's expression returns data on staging arranged so that each should fire; the plugin's
/metrics route answers the same exposition. Fails (never skips) without prometheus."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml

from gpupool.allocate import handover as ho
from gpupool.staging import db
from gpupool.staging.schema import forecast, handover, sample

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "config" / "prometheus" / "gpupool-alerts.yml"
sys.path.insert(0, str(ROOT / "tests" / "unit" / "metrics"))

import metrics_staged  # noqa: E402

END = metrics_staged.END
AT = END + timedelta(minutes=5)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def _arrange(engine) -> None:
    """Staging where every shipped alert should fire at AT (with the config of `_config`):
    slurm's newest total says 6 GPUs pending (the others can lend idle nodes); kubernetes'
    one-hour-ahead forecasts of the last day all said 0 GPUs, far worse than repeating
    yesterday; one live handover failed and one is past its deadline; the config names a
    platform `lab` that was never extracted (stale, and below its min_nodes)."""
    with engine.begin() as conn:
        newest = conn.execute(sa.select(sa.func.max(sample.c.ts)).where(
            sample.c.platform == "slurm", sample.c.metric == "gpu_pending", sample.c.entity_kind == "platform")).scalar()
        conn.execute(sample.update().where(sample.c.platform == "slurm", sample.c.metric == "gpu_pending",
                                           sample.c.entity_kind == "platform", sample.c.ts == newest).values(value=6.0))
        conn.execute(forecast.delete().where(forecast.c.platform == "kubernetes", forecast.c.step == 1))
        hours = [END - timedelta(hours=h) for h in range(1, 25)]
        conn.execute(forecast.insert(), [dict(platform="kubernetes", series="demand", issued_at=t, step=1, ts=t, yhat=0.0,
                                              yhat_lower=0.0, yhat_upper=0.0) for t in hours])
    hid = ho.open_handover(engine, "gpu-x1", "slurm", "kubernetes", END - timedelta(hours=1), dry_run=False)
    with engine.begin() as conn:
        conn.execute(handover.update().where(handover.c.id == hid).values(state=ho.FAILED, error="attach refused"))
    ho.open_handover(engine, "gpu-x2", "openstack", "kubernetes", END - timedelta(hours=3), dry_run=False,
                     timeout=timedelta(hours=1))


def _config(path: Path) -> Path:
    platforms = [{"name": p, "kind": "simulator", "min_nodes": 1} for p in ("openstack", "slurm", "kubernetes")]
    path.write_text(yaml.safe_dump({"platforms": platforms + [{"name": "lab", "kind": "simulator", "min_nodes": 2}]}))
    return path


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """`gpupool metrics serve` at AT on arranged staging, scraped every second by a Prometheus
    that loads the shipped rules: yields Prometheus' base URL."""
    for tool in ("prometheus", "promtool"):
        if shutil.which(tool) is None:  # make test installs them: fail, never skip
            pytest.fail(f"{tool} not on PATH: run scripts/install-services.sh (Debian's prometheus package)")
    tmp = tmp_path_factory.mktemp("metrics_prometheus")
    url = f"sqlite:///{tmp / 'staging.db'}"
    engine = db.make_engine(url)
    db.upgrade(engine)
    metrics_staged.fill(engine, hours=1)
    _arrange(engine)
    engine.dispose()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "include")}
    gp = subprocess.Popen([sys.executable, "-m", "gpupool.cli", "metrics", "serve", "--port", "0", "--staging", url,
                           "--config", str(_config(tmp / "platforms.yaml")), "--at", AT.isoformat()],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    prom = None
    try:
        line = gp.stdout.readline()
        assert line.startswith("gpupool metrics: serving "), line + gp.stderr.read()
        target = urllib.parse.urlparse(line.split()[-1]).netloc
        config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                  "rule_files": [str(RULES)],
                  "scrape_configs": [{"job_name": "gpupool", "static_configs": [{"targets": [target]}]}]}
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
        check = subprocess.run(["promtool", "check", "config", str(tmp / "prometheus.yml")], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
        port = _free_port()
        log = open(tmp / "prometheus.log", "w")
        prom = subprocess.Popen(["prometheus", f"--config.file={tmp / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
                                 "--log.level=warn"], stdout=log, stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 90
        while True:  # until the first scrape is in
            try:
                res = _get(f"{base}/api/v1/query?query=" + urllib.parse.quote('up{job="gpupool"} == 1'))
                if res["data"]["result"]:
                    break
            except OSError:
                pass
            assert prom.poll() is None and time.monotonic() < deadline, (tmp / "prometheus.log").read_text()[-3000:]
            time.sleep(0.5)
        yield base
    finally:
        for proc in (prom, gp):
            if proc is not None:
                proc.terminate()
                proc.wait(timeout=30)


def _query(base: str, expr: str) -> list:
    res = _get(f"{base}/api/v1/query?query=" + urllib.parse.quote(expr))
    assert res["status"] == "success", res
    return res["data"]["result"]


def test_prometheus_scrapes_gpupool(served):
    held = {r["metric"]["platform"]: float(r["value"][1]) for r in _query(served, "gpupool_platform_held_nodes")}
    assert set(held) == {"openstack", "slurm", "kubernetes", "lab"} and held["lab"] == 0 and held["slurm"] > 0
    assert _query(served, 'gpupool_staging_up == 1')
    assert _query(served, 'gpupool_handover_duration_seconds_bucket{le="+Inf"}')


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
