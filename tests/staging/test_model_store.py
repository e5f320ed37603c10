"""The detect stage's model store (one model per series and refit anchor) keeps fitted models as
JSON and never unpickles a row."""

from __future__ import annotations

import json
import logging
import pickle
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pandas as pd
import sqlalchemy as sa
from alembic import command

import pytest

from gpupool.canonical import SERIES_KEY
from gpupool.detect.clean import fit_series_model, score_window
from gpupool.detect.model import PARAMS_FORMAT
from gpupool.detect.stage import model_for
from gpupool.staging import db
from gpupool.staging.schema import series_profile

KEY = ("sim", "c1", "platform", "", "gpu_allocated")
T0 = datetime(2026, 11, 3, tzinfo=timezone.utc)
#: models as the code before the stored layout dropped the router's settings wrote them (format 1,
#: `config` and `extra` inside), fitted on ``_series()`` before T0, and what ``score_window`` gave
#: with each on ``_planted(_series())``'s last hour then
FORMAT_1 = Path(__file__).resolve().parents[1] / "fixtures" / "detect"


class _Marker:
    """Unpickling this creates a file: proof that a row was unpickled."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _series() -> pd.Series:
    idx = pd.date_range(T0 - timedelta(days=3), T0 + timedelta(hours=1), freq="5min", inclusive="left")
    rng = np.random.default_rng(3)
    t = np.arange(idx.size)
    return pd.Series(40 + 8 * np.sin(2 * np.pi * t / 288) + rng.normal(0, 0.5, idx.size), index=idx)


def _fit(calls):
    def fit(history):
        calls.append(len(history))
        return fit_series_model(history, detector="svr")

    return fit


def _stored(engine):
    with engine.connect() as conn:
        return conn.execute(sa.select(series_profile.c.computed_at, series_profile.c.model)).all()


def _write_model(engine, value, at):
    rec = dict(zip(SERIES_KEY, KEY), computed_at=at, features={}, detector="svr", reason="planted", model=value)
    with engine.begin() as conn:
        conn.execute(series_profile.insert().values(**rec))


def _before(y: pd.Series, at: datetime) -> pd.Series:
    return y.loc[y.index < pd.Timestamp(at)]


def _planted(y: pd.Series) -> pd.Series:
    v = y.to_numpy().copy()
    v[-9] += 25.0  # a spike
    v[-5:-3] = 0.0  # a drop to zero
    return pd.Series(v, index=y.index)


@pytest.mark.parametrize("detector", ["zscore", "sr", "svr", "prophet"])
def test_a_model_stored_with_the_router_settings_inside_loads_and_judges_as_before(engine, detector):
    text = (FORMAT_1 / f"model-format1-{detector}.json").read_text()
    stored = json.loads(text)
    assert stored["format"] == 1 and stored["config"]["cleaning"] and stored["extra"]["excursions"]
    # a setting renamed or dropped since the model was stored changes nothing: the settings are not read
    stored["config"]["cleaning"]["a_setting_renamed_since"] = stored["config"]["cleaning"].pop("max_anomaly_run")
    _write_model(engine, json.dumps(stored), T0)
    calls = []
    model, fresh = model_for(engine, KEY, pd.Timestamp(T0), _before(_series(), T0), _fit(calls))
    assert not fresh and not calls and model.detector_name == detector
    y = _planted(_series())
    window = score_window(model, y, y.index[-12], y.index[-1] + pd.Timedelta("5min"))
    expected = json.loads((FORMAT_1 / "model-format1-scored.json").read_text())[detector]
    assert window["cleaned"].any()  # the planted faults are cleaned: the rules are at work
    for col, values in expected.items():
        got = window[col].to_numpy()
        if col in ("is_anomaly", "cleaned", "sustained"):
            assert got.tolist() == values, col
        else:
            np.testing.assert_array_equal(got, np.array([np.nan if v is None else v for v in values]), err_msg=col)
    again = json.loads(json.dumps(model.to_params()))
    assert again["format"] == PARAMS_FORMAT and "config" not in again and "extra" not in again


def test_model_is_stored_as_json_and_reused_for_its_anchor(engine):
    y, calls = _series(), []
    model, fresh = model_for(engine, KEY, pd.Timestamp(T0), _before(y, T0), _fit(calls))
    assert fresh and calls
    (row,) = _stored(engine)
    params = json.loads(row.model)
    assert params["detector_name"] == "svr" and params["detector"]["svm"]["support_vectors"]
    # a later window with the same refit anchor rebuilds the stored model instead of refitting
    again, fresh = model_for(engine, KEY, pd.Timestamp(T0), _before(y, T0), _fit(calls))
    assert not fresh and len(calls) == 1
    start, end = y.index[-12], y.index[-1] + pd.Timedelta("5min")
    pd.testing.assert_frame_equal(score_window(again, y, start, end), score_window(model, y, start, end), rtol=0, atol=1e-9)


def test_a_pickle_in_the_column_is_never_unpickled(engine, tmp_path, caplog):
    probe = tmp_path / "probe"
    pickle.loads(pickle.dumps(_Marker(probe), protocol=0))
    assert probe.exists()  # the payload does run code when unpickled
    marker = tmp_path / "unpickled"
    payload = pickle.dumps(_Marker(marker), protocol=0).decode("ascii")  # text a writer could store
    _write_model(engine, payload, T0)
    calls = []
    with caplog.at_level(logging.WARNING, logger="gpupool.detect.stage"):
        model, fresh = model_for(engine, KEY, pd.Timestamp(T0), _before(_series(), T0), _fit(calls))
    assert fresh and calls and model.detector_name == "svr"
    assert not marker.exists()
    assert "sim/c1/platform//gpu_allocated" in caplog.text and "refitting" in caplog.text
    newest = max(_stored(engine), key=lambda r: pd.Timestamp(r.computed_at))
    assert json.loads(newest.model)["format"] == PARAMS_FORMAT  # the refit is stored as JSON


def test_garbage_and_malformed_params_get_a_refit_not_a_crash(engine, caplog):
    y = _series()
    good = json.loads(json.dumps(fit_series_model(y.iloc[:600], detector="svr").to_params()))
    good["detector"]["svm"]["dual_coef"] = good["detector"]["svm"]["dual_coef"][:-1]
    bad_values = ["not json {", "[]", json.dumps({"format": 1}), json.dumps(good), "[" * 100000]
    for i, value in enumerate(bad_values):
        at = T0 + timedelta(days=2 * i)
        _write_model(engine, value, at)
        calls = []
        with caplog.at_level(logging.WARNING, logger="gpupool.detect.stage"):
            _, fresh = model_for(engine, KEY, pd.Timestamp(at), _before(y, T0), _fit(calls))
        assert fresh and calls, value[:40]
    assert caplog.text.count("refitting") == len(bad_values)


def test_upgrade_drops_stored_pickles(engine):
    cfg = db.alembic_config()
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0001")
    assert db.current_revision(engine) == "0001"
    old = sa.Table("series_profile", sa.MetaData(), sa.Column("model", sa.LargeBinary), *[sa.Column(c, sa.String) for c in SERIES_KEY], sa.Column("computed_at", sa.DateTime(timezone=True)), sa.Column("features", sa.JSON), sa.Column("detector", sa.String), sa.Column("reason", sa.String), schema=series_profile.schema)
    rec = dict(zip(SERIES_KEY, KEY), computed_at=T0, features={}, detector="svr", reason="old", model=pickle.dumps({"a": 1}))
    with engine.begin() as conn:
        conn.execute(old.insert().values(**rec))
    assert db.upgrade(engine) == db.head_revision()
    (row,) = _stored(engine)
    assert row.model is None  # a cache: the next run refits
    _, fresh = model_for(engine, KEY, pd.Timestamp(T0), _before(_series(), T0), _fit([]))
    assert fresh


def test_a_database_behind_the_package_schema_is_refused(engine):
    cfg = db.alembic_config()
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0001")
    try:
        db.require_migrated(engine)
    except db.StagingError as exc:
        assert "revision 0001" in str(exc) and "gpupool db upgrade" in str(exc)
    else:
        raise AssertionError("a schema at 0001 was accepted")
