"""The GPU pool page's layout in real headless Chromium, without an Airflow: the page
`poolview.render_html` draws for staged data, opened from a file at 1,300 and 800 px wide. Every
card's chart and tables stay inside the card and the page never scrolls sideways (a chart drawn
at a fixed pixel width ran past a narrower card into the next one)."""

from __future__ import annotations

import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # --import-mode=importlib: the helpers live beside us
from chromium import find_chromium, layout_problems, render  # noqa: E402

from gpupool import poolview  # noqa: E402

AT = datetime(2026, 11, 1, 12, tzinfo=timezone.utc)
WIDTHS = (1300, 800)


def _state() -> dict:
    """Three platforms with a day of demand, a day's forecast band ahead, marked points and a
    plan whose reasons are long sentences."""
    platforms = {}
    for k, name in enumerate(("openstack", "slurm", "kubernetes")):
        past = [AT - timedelta(hours=h) for h in range(24, 0, -1)]
        demand = [{"ts": t.isoformat(), "value": 40.0 + 10 * k + (i % 7)} for i, t in enumerate(past)]
        platforms[name] = {
            "nodes": 8 + 2 * k, "gpus": 64 + 16 * k, "demand": demand,
            "capacity": [{"ts": d["ts"], "value": 64.0 + 16 * k} for d in demand],
            "forecast_issued_at": AT.isoformat(),
            "forecast": [{"ts": (AT + timedelta(hours=h)).isoformat(), "yhat": 50.0, "lower": 35.0, "upper": 80.0 + 5 * h}
                         for h in range(24)],
            "anomalies": [
                {"ts": past[3].isoformat(), "metric": "gpu_allocated", "value": 300.0, "cleaned_to": 44.0,
                 "detector": "svr", "decision": "cleaned", "fault": "spike", "label": "cleaned: telemetry fault (spike)"},
                {"ts": past[15].isoformat(), "metric": "gpu_pending", "value": 30.0, "cleaned_to": None,
                 "detector": "svr", "decision": "kept", "fault": None, "label": "kept: real burst"},
            ],
        }
    reason = ("kubernetes: expected unmet over 2h falls by 3.1 GPU-h net of costs; slurm has 35 idle GPUs "
              "and its forecast stays below what it keeps")
    return {"at": AT.isoformat(), "hours": 24, "platforms": platforms, "handovers": [],
            "plan": {"id": 7, "decided_at": AT.isoformat(), "policy": "predictive", "solver": "milp", "dry_run": True,
                     "moves": [{"node": f"gpu-n00{i}", "from": "slurm", "to": "kubernetes", "expected_gain": 3.1,
                                "reason": reason} for i in range(3)], "platforms": {}}}


def test_every_chart_stays_in_its_card_and_the_page_never_scrolls_sideways(tmp_path):
    chromium = find_chromium()
    assert chromium, "chromium is not installed (scripts/install-test-tools.sh installs it)"
    page = tmp_path / "pool.html"
    page.write_text(poolview.render_html(_state()))
    text, png, geometry = render(chromium, page.as_uri(), widths=WIDTHS)
    assert "GPU pool" in text and "kept: real burst" in text
    for width in WIDTHS:
        g = geometry[width]
        assert g["viewport"] == width
        assert len(g["cards"]) == 3 and all(len(c["charts"]) == 1 for c in g["cards"])
        assert all(c["charts"][0]["width"] > 200 for c in g["cards"])  # a chart, not a collapsed box
        assert layout_problems(g) == [], (width, layout_problems(g))
