"""The stores that own staging's writes (extraction runs and plans, fitted models, forecasts,
plans), on SQLite and on the real PostgreSQL: what each writes, what a rerun replaces, and
that a failed write keeps the previous rows."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import numpy as np
import pandas as pd
import pytest
import sqlalchemy as sa

from gpupool.canonical import SERIES_KEY
from gpupool.staging import forecasts, models, plans, reads, runs
from gpupool.staging.schema import allocation_plan, extract_run, forecast, forecast_run, series_profile

T0 = datetime(2026, 11, 3, tzinfo=timezone.utc)
T1 = T0 + timedelta(hours=1)
KEY = ("slurm", "c1", "node", "gpu-01", "gpu_allocated")


def _utc(ts) -> pd.Timestamp:
    t = pd.Timestamp(ts)
    return t.tz_localize("UTC") if t.tzinfo is None else t.tz_convert("UTC")


def _runs(engine) -> dict[int, object]:
    with engine.connect() as conn:
        return {r.id: r for r in conn.execute(sa.select(extract_run).order_by(extract_run.c.id))}


# --- extraction runs ------------------------------------------------------------------


def test_a_run_starts_running_and_supersedes_only_its_own_unfinished_runs(engine):
    dead = runs.start_extract_run(engine, "slurm", "usage", T0, T1)
    part = runs.start_extract_run(engine, "slurm", "usage", T0, T1, part="1/2 a..b (2 nodes) #0")
    other_source = runs.start_extract_run(engine, "slurm", "inventory", T0, T1)
    other_window = runs.start_extract_run(engine, "slurm", "usage", T1, T1 + timedelta(hours=1))
    other_platform = runs.start_extract_run(engine, "kubernetes", "usage", T0, T1)
    new = runs.start_extract_run(engine, "slurm", "usage", T0, T1)
    got = _runs(engine)
    assert new > dead and got[new].status == "running" and got[new].started_at is not None
    assert got[new].finished_at is None and got[new].part is None
    assert got[dead].status == "interrupted" and f"superseded by extract run #{new}" in got[dead].error
    assert got[dead].finished_at is not None
    for untouched in (part, other_source, other_window, other_platform):
        assert got[untouched].status == "running" and got[untouched].error is None
    # a part's rerun supersedes that part only
    again = runs.start_extract_run(engine, "slurm", "usage", T0, T1, part="1/2 a..b (2 nodes) #0")
    got = _runs(engine)
    assert got[part].status == "interrupted" and f"#{again}" in got[part].error
    assert got[new].status == "running"


def test_success_commits_with_the_callers_transaction_and_not_without_it(engine):
    run_id = runs.start_extract_run(engine, "slurm", "usage", T0, T1)
    with pytest.raises(RuntimeError, match="load broke"):
        with engine.begin() as conn:
            runs.finish_extract_run(conn, run_id, "success", 12, None)
            raise RuntimeError("load broke")
    assert _runs(engine)[run_id].status == "running"  # rolled back with the rows it would have recorded
    with engine.begin() as conn:
        runs.finish_extract_run(conn, run_id, "success", 12, "inventory not recoverable")
    row = _runs(engine)[run_id]
    assert (row.status, row.rows, row.error) == ("success", 12, "inventory not recoverable")
    assert row.finished_at is not None


def test_a_failure_is_recorded_with_its_error_and_kind(engine):
    class Unrecoverable(RuntimeError):
        unrecoverable = True

    failed = runs.start_extract_run(engine, "slurm", "usage", T0, T1)
    runs.fail_extract_run(engine, failed, RuntimeError("API answered 500"))
    lost = runs.start_extract_run(engine, "slurm", "usage", T1, T1 + timedelta(hours=1))
    runs.fail_extract_run(engine, lost, Unrecoverable("node state is live-only"))
    got = _runs(engine)
    assert (got[failed].status, got[failed].rows, got[failed].error) == ("failed", None, "RuntimeError: API answered 500")
    assert (got[lost].status, got[lost].error) == ("unrecoverable", "Unrecoverable: node state is live-only")


def test_an_extraction_plan_replaces_the_platforms_earlier_plan_of_the_window(engine):
    first = [("1/3 a..b", ["a", "b"]), ("2/3 c..c", ["c"]), ("3/3 platform-wide", None)]
    runs.replace_extract_plan(engine, "slurm", T0, T1, first)
    runs.replace_extract_plan(engine, "slurm", T1, T1 + timedelta(hours=1), [("1/2 x..x", ["x"]), ("2/2 platform-wide", None)])
    runs.replace_extract_plan(engine, "kubernetes", T0, T1, [("1/2 k..k", ["k"]), ("2/2 platform-wide", None)])
    got = reads.extract_plan(engine, "slurm", T0, T1)
    assert [(r.part, r.position, r.parts, r.nodes) for r in got] == [
        ("1/3 a..b", 0, 3, ["a", "b"]), ("2/3 c..c", 1, 3, ["c"]), ("3/3 platform-wide", 2, 3, None)]
    runs.replace_extract_plan(engine, "slurm", T0, T1, [("1/2 a..c", ["a", "b", "c"]), ("2/2 platform-wide", None)])
    assert [(r.part, r.parts) for r in reads.extract_plan(engine, "slurm", T0, T1)] == [("1/2 a..c", 2), ("2/2 platform-wide", 2)]
    assert reads.planned_part(engine, "slurm", T0, T1, 2) is None  # the old third part is gone
    runs.replace_extract_plan(engine, "slurm", T0, T1, [])  # now extracted whole: no plan
    assert reads.extract_plan(engine, "slurm", T0, T1) == []
    # other windows and platforms keep theirs
    assert len(reads.extract_plan(engine, "slurm", T1, T1 + timedelta(hours=1))) == 2
    assert len(reads.extract_plan(engine, "kubernetes", T0, T1)) == 2


# --- the model store --------------------------------------------------------------------


def _profiles(engine) -> list:
    with engine.connect() as conn:
        return conn.execute(sa.select(series_profile).order_by(series_profile.c.computed_at)).all()


def test_a_model_is_stored_as_text_and_replaced_per_series_and_anchor(engine):
    assert models.model_text(engine, KEY, T0) is None
    text = json.dumps({"format": 1, "detector_name": "svr", "w": [0.5, 1.25]}, separators=(",", ":"))
    models.replace_model(engine, KEY, T0, features={"period": 288}, detector="svr", reason="periodic", model=text)
    assert models.model_text(engine, KEY, T0) == text
    assert models.model_text(engine, KEY, T1) is None  # another anchor
    assert models.model_text(engine, (*KEY[:4], "gpu_util"), T0) is None  # another series
    models.replace_model(engine, KEY, T1, features={}, detector="sr", reason="spiky", model='{"format":1}')
    models.replace_model(engine, KEY, T0, features={"period": 12}, detector="prophet", reason="refit", model='{"b":2}')
    rows = _profiles(engine)
    assert [(_utc(r.computed_at), r.detector, r.model) for r in rows] == [
        (_utc(T0), "prophet", '{"b":2}'), (_utc(T1), "sr", '{"format":1}')]
    assert rows[0].features == {"period": 12} and dict(zip(SERIES_KEY, KEY)) == {c: getattr(rows[0], c) for c in SERIES_KEY}


def test_a_model_that_fails_to_store_keeps_the_previous_row(engine):
    models.replace_model(engine, KEY, T0, features={"period": 288}, detector="svr", reason="periodic", model='{"a":1}')
    with pytest.raises(sa.exc.IntegrityError):
        models.replace_model(engine, KEY, T0, features={}, detector="svr", reason=None, model='{"a":2}')
    (row,) = _profiles(engine)
    assert (row.reason, row.model) == ("periodic", '{"a":1}')


def test_a_dropped_model_reads_as_none_and_a_bad_key_is_refused(engine):
    rec = dict(zip(SERIES_KEY, KEY), computed_at=T0, features={}, detector="svr", reason="old", model=None)
    with engine.begin() as conn:
        conn.execute(series_profile.insert().values(**rec))
    assert models.model_text(engine, KEY, T0) is None
    with pytest.raises(ValueError, match="series key has 5 parts"):
        models.model_text(engine, KEY[:4], T0)


# --- forecasts ----------------------------------------------------------------------------


def _steps(issued: datetime, means: list[float]) -> pd.DataFrame:
    mean = np.asarray(means, dtype="float64")
    ts = pd.date_range(pd.Timestamp(issued), periods=len(means), freq="1h")
    return pd.DataFrame({"ts": ts, "yhat": mean, "yhat_lower": mean - 2.0, "yhat_upper": mean + 2.0})


def test_a_forecast_issue_is_replaced_whole(engine):
    summary = {"model": "arima", "order": [1, 0, 1], "aic": 12.5}
    n = forecasts.replace_forecast(engine, "slurm", "demand", T1, model="arima", summary=summary, level=90.0,
                                   steps=_steps(T1, [10.0, 11.0, 12.0]))
    forecasts.replace_forecast(engine, "slurm", "demand", T0, model="naive", summary={"model": "naive"}, level=80.0,
                               steps=_steps(T0, [5.0]))
    forecasts.replace_forecast(engine, "kubernetes", "demand", T1, model="arima", summary={}, level=90.0,
                               steps=_steps(T1, [3.0, 4.0]))
    assert n == 3
    got = reads.read_forecasts(engine, T1, ["slurm"])
    assert got["step"].tolist() == [1, 2, 3] and got["yhat"].tolist() == [10.0, 11.0, 12.0]
    assert got["yhat_upper"].tolist() == [12.0, 13.0, 14.0]
    assert [_utc(t) for t in got["ts"]] == list(pd.date_range(T1, periods=3, freq="1h"))
    assert {_utc(t) for t in got["issued_at"]} == {_utc(T1)} and set(got["series"]) == {"demand"}
    assert reads.forecast_runs(engine, T1, ["slurm"]) == {"slurm": (90.0, summary)}
    # a rerun of the issue with a shorter horizon leaves no row of the earlier one behind
    forecasts.replace_forecast(engine, "slurm", "demand", T1, model="seasonal_naive", summary={"model": "seasonal_naive"},
                               level=95.0, steps=_steps(T1, [7.0]))
    got = reads.read_forecasts(engine, T1, ["slurm"])
    assert got["step"].tolist() == [1] and got["yhat"].tolist() == [7.0]
    with engine.connect() as conn:
        run = conn.execute(sa.select(forecast_run).where(forecast_run.c.platform == "slurm",
                                                         forecast_run.c.issued_at == T1)).one()
    assert (run.model, run.level, run.summary) == ("seasonal_naive", 95.0, {"model": "seasonal_naive"})
    # other issues and platforms keep theirs
    assert reads.read_forecasts(engine, T0, ["slurm"])["yhat"].tolist() == [5.0]
    assert reads.read_forecasts(engine, T1, ["kubernetes"])["yhat"].tolist() == [3.0, 4.0]


def test_a_forecast_that_fails_to_store_keeps_the_previous_issue(engine):
    forecasts.replace_forecast(engine, "slurm", "demand", T1, model="arima", summary={"model": "arima"}, level=90.0,
                               steps=_steps(T1, [10.0, 11.0]))
    bad = _steps(T1, [20.0, 21.0])
    bad.loc[1, "yhat"] = np.nan  # a mean is required: the insert fails after the deletes
    with pytest.raises(sa.exc.IntegrityError):
        forecasts.replace_forecast(engine, "slurm", "demand", T1, model="naive", summary={"model": "naive"},
                                   level=80.0, steps=bad)
    assert reads.read_forecasts(engine, T1, ["slurm"])["yhat"].tolist() == [10.0, 11.0]
    assert reads.forecast_runs(engine, T1, ["slurm"]) == {"slurm": (90.0, {"model": "arima"})}
    with pytest.raises(ValueError, match=r"slurm/demand .*steps lack columns \['yhat_upper'\]"):
        forecasts.replace_forecast(engine, "slurm", "demand", T1, model="naive", summary={}, level=80.0,
                                   steps=_steps(T1, [1.0]).drop(columns="yhat_upper"))
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(forecast)).scalar() == 2


# --- plans ------------------------------------------------------------------------------


def test_each_plan_is_a_row_of_its_own_with_json_summary_and_moves(engine):
    summary = {"platforms": {"slurm": {"nodes": np.int64(4), "demand_mean": [np.float64(3.5), float("nan")]}},
               "reasons": ("bounded",)}
    moves = [{"node": "gpu-01", "from": "slurm", "to": "kubernetes", "expected_gain": np.float64(1.5)}]
    first = plans.insert_plan(engine, T0, policy="predictive", solver="milp", dry_run=True, summary=summary, moves=moves)
    second = plans.insert_plan(engine, T0 + timedelta(minutes=30), policy="reactive", solver="greedy", dry_run=False, summary={}, moves=[])
    assert second > first
    row = reads.latest_plan(engine, T1)
    assert (row.id, row.policy, row.solver, row.dry_run, row.summary, row.moves) == (second, "reactive", "greedy", False, {}, [])
    ((_, stored_moves, policy),) = reads.plans_between(engine, T0, T0)
    assert policy == "predictive" and stored_moves == [{"node": "gpu-01", "from": "slurm", "to": "kubernetes", "expected_gain": 1.5}]
    with engine.connect() as conn:
        stored = conn.execute(sa.select(allocation_plan.c.summary).where(allocation_plan.c.id == first)).scalar()
    assert stored == {"platforms": {"slurm": {"nodes": 4, "demand_mean": [3.5, None]}}, "reasons": ["bounded"]}
