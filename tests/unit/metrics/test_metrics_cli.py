"""`gpupool metrics serve`: serves /metrics from staging on the port it was given (0: any
free one, printed), and refuses bad options in one line with exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from gpupool.staging import db

ROOT = Path(__file__).resolve().parents[3]


def _env():
    return {**os.environ, "PYTHONPATH": str(ROOT / "include")}


def test_serve_answers_metrics_on_an_ephemeral_port(tmp_path):
    url = f"sqlite:///{tmp_path / 'staging.db'}"
    db.upgrade(db.make_engine(url))
    proc = subprocess.Popen([sys.executable, "-m", "gpupool.cli", "metrics", "serve", "--port", "0", "--staging", url,
                             "--at", "2026-11-01T04:00:00Z"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=_env())
    try:
        line = proc.stdout.readline()
        assert line.startswith("gpupool metrics: serving http://127.0.0.1:"), line + proc.stderr.read()
        endpoint = line.split()[-1]
        with urllib.request.urlopen(endpoint, timeout=30) as r:
            body = r.read().decode()
            assert r.headers["Content-Type"].startswith("text/plain")
        assert "gpupool_staging_up 1.0" in body
        assert 'gpupool_platform_min_nodes{platform="slurm"} 1.0' in body
        assert "gpupool_metrics_instant_timestamp_seconds 1.7935056e+09" in body  # the --at served: 1793505600
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(endpoint.replace("/metrics", "/other"), timeout=30)
        assert err.value.code == 404
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.parametrize("args, message", [
    (["--at", "yesterday-ish"], "gpupool metrics: error:"),
    (["--port", "70000"], "--port 70000: must be 0 to 65535"),
])
def test_bad_options_are_one_line_and_exit_2(tmp_path, args, message):
    url = f"sqlite:///{tmp_path / 'staging.db'}"
    proc = subprocess.run([sys.executable, "-m", "gpupool.cli", "metrics", "serve", "--staging", url, *args],
                          capture_output=True, text=True, timeout=120, env=_env())
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
