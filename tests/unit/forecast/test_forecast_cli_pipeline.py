"""The forecast entry points a user meets: `gpupool forecast` on a step-like tenant, and the
pipeline's forecast task recording the per-series choice in forecast_run."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import sqlalchemy as sa

from gpupool.sim.synthetic import step_demand


def test_cli_forecast_follows_a_step_and_records_the_choice(tmp_path):
    y = step_demand("2026-01-01", "2026-01-22", gpus_per_node=8, nodes=1, max_nodes=3, steps_per_week=1, seed=4)
    y.iloc[-5:] = y.iloc[-6] + 8.0  # a step of one node five hours ago
    src, out, summary = tmp_path / "tenant.csv", tmp_path / "fc.csv", tmp_path / "model.json"
    pd.DataFrame({"time": y.index.strftime("%Y-%m-%dT%H:%M:%SZ"), "gpus": y.to_numpy()}).to_csv(src, index=False)
    done = subprocess.run(
        [sys.executable, "-c", "import sys; from gpupool.cli import main; sys.exit(main())", "forecast", str(src),
         "--horizon", "24", "--out", str(out), "--level", "90", "--summary-json", str(summary)],
        capture_output=True, text=True,
    )
    assert done.returncode == 0, done.stderr
    table = pd.read_csv(out)
    assert len(table) == 24 and np.allclose(table["yhat"], y.iloc[-1])
    model = json.loads(summary.read_text())
    sel = model["selection"]
    assert model["model"] == "naive" and sel["profile"]["kind"] == "step"
    assert {"arima", "seasonal_naive", "naive"} <= set(sel["validation_mae"]) and sel["reason"]


@pytest.mark.slow
def test_pipeline_forecast_run_holds_the_chosen_model_and_its_validation(tmp_path, monkeypatch, capsys):
    from gpupool.cli import main
    from gpupool.staging.schema import forecast_run

    url = f"sqlite:///{tmp_path / 'staging.db'}"
    monkeypatch.setenv("GPUPOOL_STAGING_URL", url)
    monkeypatch.delenv("GPUPOOL_CONFIG", raising=False)
    assert main(["db", "upgrade"]) == 0
    assert main(["run", "--start", "2026-11-01T09:00Z", "--end", "2026-11-01T12:00Z", "--policy", "reactive"]) == 0
    capsys.readouterr()
    with sa.create_engine(url).connect() as conn:
        rows = conn.execute(sa.select(forecast_run.c.platform, forecast_run.c.model, forecast_run.c.summary)).all()
    assert {r.platform for r in rows} == {"openstack", "slurm", "kubernetes"}
    for r in rows:
        summary = r.summary if isinstance(r.summary, dict) else json.loads(r.summary)
        assert r.model == summary["model"]
        sel = summary["selection"]
        assert sel["chosen"] and sel["reason"] and "profile" in sel
