"""Every query of the shipped Grafana dashboard (config/grafana/gpupool.json), its template
variables substituted as Grafana would for "All", returns data from a real Prometheus that
scraped `gpupool metrics serve` (the `gpupool_prometheus` fixture of conftest.py); and no panel
names a metric that `gpupool.metrics` does not export. Fails (never skips) without prometheus."""

from __future__ import annotations

import json
import math
import re
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

from gpupool import metrics
from gpupool.config import default_config
from gpupool.staging import db

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "config" / "grafana" / "gpupool.json"
#: Grafana's built-in interval variables, as a one-minute-step range query would set them
BUILTINS = {"__rate_interval": "1m", "__interval": "1m", "__range": "1h", "__range_s": "3600"}
METRIC_NAME = re.compile(r"\bgpupool_[a-z0-9_]+")


def _dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def _panels(dash: dict) -> list[dict]:
    out = []
    for p in dash["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))  # a collapsed row holds its panels
    return [p for p in out if p.get("type") != "row"]


def _substitute(expr: str, dash: dict) -> str:
    """``expr`` with each template variable as Grafana sends it when "All" (or the one
    current value) is selected; a variable the dashboard does not define fails."""
    values = dict(BUILTINS)
    for var in dash["templating"]["list"]:
        if var["type"] == "datasource":
            continue
        values[var["name"]] = var["allValue"] if var.get("includeAll") else var["current"]["value"]

    def one(m: re.Match) -> str:
        name = m.group(1) or m.group(2)
        assert name in values, f"{expr!r}: template variable ${name} is not defined by the dashboard"
        return values[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", one, expr)


def _targets() -> list[tuple[str, str]]:
    dash = _dashboard()
    return [(p["title"], _substitute(t["expr"], dash)) for p in _panels(dash) for t in p["targets"]]


def _query(base: str, expr: str) -> list:
    with urllib.request.urlopen(f"{base}/api/v1/query?query=" + urllib.parse.quote(expr), timeout=30) as r:
        res = json.loads(r.read())
    assert res["status"] == "success", res
    return res["data"]["result"]


def exported_names() -> set[str]:
    """The sample names `gpupool.metrics` exposes (a counter's ``_total``, a histogram's
    ``_bucket``/``_count``/``_sum``), from its families on an empty staging."""
    from tempfile import TemporaryDirectory

    with TemporaryDirectory() as tmp:
        engine = db.make_engine(f"sqlite:///{tmp}/staging.db")
        db.upgrade(engine)
        families = list(metrics.StagingCollector(engine, default_config()).collect())
        engine.dispose()
    names = set()
    for f in families:
        if isinstance(f, HistogramMetricFamily):
            names |= {f.name + s for s in ("_bucket", "_count", "_sum")}
        elif isinstance(f, CounterMetricFamily):
            names.add(f.name + "_total")
        else:
            names.add(f.name)
    return names


def test_the_dashboard_covers_what_on_call_needs():
    """The panels the runbook (docs/operations/metrics.md) points to are there, each with a query."""
    panels = _panels(_dashboard())
    assert all(p["targets"] and all(t["expr"].strip() for t in p["targets"]) for p in panels)
    used = {m for _, expr in _targets() for m in METRIC_NAME.findall(expr)}
    for needed in ("gpupool_platform_held_nodes", "gpupool_platform_lendable_idle_nodes", "gpupool_platform_allocated_gpus",
                   "gpupool_platform_pending_gpus", "gpupool_platform_unmet_gpus", "gpupool_forecast_mean_absolute_error_gpus",
                   "gpupool_plan_expected_unmet_gpu_seconds", "gpupool_plan_realised_unmet_gpu_seconds", "gpupool_alarm_points",
                   "gpupool_cleaned_points", "gpupool_newest_sample_age_seconds", "gpupool_handovers",
                   "gpupool_handover_duration_seconds_bucket", "gpupool_power_nodes",
                   "gpupool_power_saved_energy_joules_total", "gpupool_power_late_wakes_total",
                   "gpupool_power_wakes_failing", "gpupool_power_wake_duration_seconds_bucket"):
        assert needed in used, f"no panel shows {needed}"
    ids = [p["id"] for p in _dashboard()["panels"]]
    assert len(ids) == len(set(ids)), "panel ids repeat"


def test_no_panel_queries_a_metric_gpupool_does_not_export():
    exported = exported_names()
    assert "gpupool_platform_held_nodes" in exported and "gpupool_handover_failures_total" in exported
    unknown = {(title, m) for title, expr in _targets() for m in METRIC_NAME.findall(expr) if m not in exported}
    assert unknown == set()


@pytest.mark.parametrize("title,expr", _targets(), ids=[f"{t}:{e[:40]}" for t, e in _targets()])
def test_every_panel_query_returns_data(gpupool_prometheus, title, expr):
    """Non-empty, with at least one finite value (a series of NaN or +Inf only is no data to
    read). Queries over a range (`increase`) need two scrapes: retried for a few seconds."""
    deadline = time.monotonic() + 30
    while True:
        result = _query(gpupool_prometheus, expr)
        finite = [r for r in result if math.isfinite(float(r["value"][1]))]
        if finite or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert finite, f"panel {title!r}: no data for {expr} (got {result})"
    scraped = {r["metric"]["__name__"] for r in _query(gpupool_prometheus, 'count by (__name__) ({__name__=~"gpupool_.*"})')}
    assert set(METRIC_NAME.findall(expr)) <= scraped, (title, expr)
