"""The shipped alert rules load (`promtool check rules`) and every alert passes its unit tests
(`promtool test rules`); each alert has at least one case that expects it to fire."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

CONFIG = Path(__file__).resolve().parents[3] / "config" / "prometheus"
RULES = CONFIG / "gpupool-alerts.yml"
TESTS = CONFIG / "gpupool-alerts.test.yml"


def _promtool(*args: str) -> subprocess.CompletedProcess:
    promtool = shutil.which("promtool")
    if promtool is None:  # make test installs it (scripts/install-services.sh): fail, never skip
        pytest.fail("promtool not on PATH: run scripts/install-services.sh (Debian's prometheus package)")
    return subprocess.run([promtool, *args], capture_output=True, text=True, timeout=120, cwd=CONFIG)


def test_rules_pass_promtool_check_rules():
    proc = _promtool("check", "rules", str(RULES))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_rules_pass_their_promtool_unit_tests():
    proc = _promtool("test", "rules", str(TESTS))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_alert_has_a_case_where_it_fires():
    rules = [r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    firing = {case["alertname"] for t in yaml.safe_load(TESTS.read_text())["tests"]
              for case in t.get("alert_rule_test", []) if case.get("exp_alerts")}
    assert set(rules) == {"GpupoolHandoverFailed", "GpupoolHandoverPastDeadline", "GpupoolExtractionStale",
                          "GpupoolPendingWhileIdleElsewhere", "GpupoolForecastWorseThanNaive", "GpupoolBelowMinNodes",
                          "GpupoolWakeFailed", "GpupoolWakeLate", "GpupoolReclaimLate", "GpupoolReclaimBlocked"}
    assert firing == set(rules)
