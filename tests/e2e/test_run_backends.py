"""`gpupool run` on the embedded virtual datacenter with staging on the real PostgreSQL: every stage
leaves rows; and the same run on SQLite (the embedded default of `make demo`) leaves the same rows."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import sqlalchemy as sa

from gpupool.cli import main
from gpupool.staging import db
from gpupool.staging.schema import allocation_plan, clean_sample, forecast, inventory_node, sample

START, END = "2026-11-01T09:00Z", "2026-11-01T12:00Z"

#: each table's content, without ids or times of creation, in a stable order
KEYS = {
    "sample": (sample, ["platform", "cluster", "entity_kind", "entity_id", "metric", "ts"]),
    "inventory_node": (inventory_node, ["platform", "node", "snapshot_at"]),
    "clean_sample": (clean_sample, ["platform", "cluster", "entity_kind", "entity_id", "metric", "ts"]),
    "forecast": (forecast, ["platform", "series", "issued_at", "step"]),
}


def _run(url: str, monkeypatch, capsys) -> str:
    monkeypatch.setenv("GPUPOOL_STAGING_URL", url)
    monkeypatch.delenv("GPUPOOL_CONFIG", raising=False)
    assert main(["db", "upgrade"]) == 0
    capsys.readouterr()
    assert main(["run", "--start", START, "--end", END, "--policy", "predictive"]) == 0
    return capsys.readouterr().out


def _content(url: str) -> dict[str, object]:
    engine = db.make_engine(url)
    out: dict[str, object] = {}
    with engine.connect() as conn:
        for name, (table, key) in KEYS.items():
            frame = pd.read_sql(sa.select(table), conn)
            for c in frame.columns:
                if isinstance(table.c[c].type, sa.DateTime):
                    frame[c] = pd.to_datetime(frame[c], utc=True)
            if name == "inventory_node":
                frame["mig_layout"] = [json.dumps(v, sort_keys=True) for v in frame["mig_layout"]]
            out[name] = frame.sort_values(key).reset_index(drop=True)
        plans = conn.execute(sa.select(allocation_plan).order_by(allocation_plan.c.id)).all()
    engine.dispose()
    out["plans"] = [(pd.Timestamp(p.decided_at).tz_localize("UTC") if pd.Timestamp(p.decided_at).tzinfo is None
                     else pd.Timestamp(p.decided_at), p.policy, p.solver, p.dry_run, p.moves) for p in plans]
    return out


@pytest.mark.slow
def test_gpupool_run_on_postgresql(staging_url, monkeypatch, capsys):
    text = _run(staging_url, monkeypatch, capsys)
    assert "plan #1" in text
    content = _content(staging_url)
    for name in KEYS:
        assert len(content[name]) > 0, name
    assert content["inventory_node"]["mig_layout"].str.contains("config").any()  # JSON staged
    assert main(["summary", "--start", START, "--end", END, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert {e["status"] for e in summary["extract"].values()} == {"success"}


@pytest.mark.slow
def test_gpupool_run_leaves_the_same_rows_on_postgresql_and_sqlite(tmp_path, staging_url, monkeypatch, capsys):
    lite = f"sqlite:///{tmp_path / 'staging.db'}"
    _run(lite, monkeypatch, capsys)
    _run(staging_url, monkeypatch, capsys)
    a, b = _content(lite), _content(staging_url)
    for name in KEYS:
        assert len(a[name]) > 0, name
        pd.testing.assert_frame_equal(a[name], b[name], check_dtype=False, rtol=1e-9, obj=name)
    assert a["plans"] == b["plans"] and len(a["plans"]) == 1
