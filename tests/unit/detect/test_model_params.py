"""Fitted models are stored as data: JSON round-trips, strict checks, no pickle in the package."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import gpupool
from gpupool.detect.base import StreamingContext
from gpupool.detect.clean import FittedSeriesModel, fit_series_model, score_window
from gpupool.detect.params import ModelParamsError, decode, encode
from gpupool.detect.prophet import ProphetDetector
from gpupool.detect.sr import SpectralResidualDetector
from gpupool.detect.svr import RBFSupportVectors, SVRDetector

DETECTORS = {
    "sr": lambda: SpectralResidualDetector(window=60),
    "svr": lambda: SVRDetector(n_lags=12, period=288),
    "prophet": lambda: ProphetDetector(daily=True, max_train=300),
}


def _through_json(params: dict) -> dict:
    # strict JSON (no NaN/inf tokens), as PostgreSQL and any other reader would take it
    return json.loads(json.dumps(params, allow_nan=False))


@pytest.mark.parametrize("name", list(DETECTORS))
def test_each_detector_round_trips_through_json(name, spiky):
    y, _ = spiky
    y = y.copy()
    y.iloc[620] = np.nan  # a gap in the remembered context survives the trip
    det = DETECTORS[name]().fit(y.iloc[:640])
    again = decode(_through_json(encode(det)), name)
    pd.testing.assert_frame_equal(det.score(y.iloc[640:900]), again.score(y.iloc[640:900]), rtol=0, atol=1e-9)
    assert encode(again) == _through_json(encode(det))


def test_unfitted_detectors_round_trip():
    for make in DETECTORS.values():
        det = make()
        again = decode(_through_json(encode(det)), det.name)
        assert encode(again) == encode(det)
        assert not hasattr(again, "context_")


def test_svr_support_vectors_predict_like_sklearn(spiky):
    y, _ = spiky
    det = SVRDetector(n_lags=12).fit(y.iloc[:900])
    X, _, _, ok = det._design(y.iloc[900:1300], 0)
    rebuilt = decode(_through_json(encode(det)), "svr").model_
    assert isinstance(rebuilt, RBFSupportVectors)
    np.testing.assert_allclose(rebuilt.predict(X[ok]), det.model_.predict(X[ok]), rtol=0, atol=1e-9)


def test_context_keeps_timestamps_zone_and_gaps():
    idx = pd.date_range("2026-03-29 00:00", periods=6, freq="30min", tz="Europe/Paris")
    det = SpectralResidualDetector(window=60)
    det.context_ = StreamingContext()
    det.context_.remember(pd.Series([1.0, np.nan, np.inf, -np.inf, 0.0, -2.5], index=idx), 6)
    again = decode(_through_json(encode(det)), "sr")
    pd.testing.assert_series_equal(again.context_.tail_, det.context_.tail_, check_freq=False)


@pytest.mark.parametrize("name", ["sr", "svr", "prophet"])
def test_series_model_round_trips_and_scores_the_same(name, spiky):
    y, _ = spiky
    cut = y.index[1400]
    model = fit_series_model(y[y.index < cut], detector=name)
    again = FittedSeriesModel.from_params(_through_json(model.to_params()))
    assert (again.detector_name, again.reason, again.metric, again.repeats) == (
        model.detector_name,
        model.reason,
        model.metric,
        model.repeats,
    )
    assert "config" not in _through_json(model.to_params())  # a stored model carries no settings
    start, end = y.index[1750], y.index[1850]
    pd.testing.assert_frame_equal(score_window(again, y, start, end), score_window(model, y, start, end), rtol=0, atol=1e-9)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda p: p.update(format=99), "format"),
        (lambda p: p.update(format=True), "format"),
        (lambda p: p.update(detector_name="os.system"), "unknown detector"),
        (lambda p: p["detector"].update(detector="sr"), "expected detector 'svr'"),
        (lambda p: p["detector"].update(n_lags="12"), "n_lags"),
        (lambda p: p["detector"]["svm"].update(dual_coef=[1.0]), "one coefficient per support vector"),
        (lambda p: p["detector"]["svm"]["support_vectors"].append(1.0), "features"),
        (lambda p: p["detector"]["svm"].update(n_features=3), "features"),
        (lambda p: p["detector"]["svm"]["support_vectors"].__setitem__(0, "1.0"), "support_vectors"),
        (lambda p: p["detector"]["svm"]["support_vectors"].__setitem__(0, 10**400), "float range"),
        (lambda p: p["detector"]["svm"]["support_vectors"].__setitem__(0, None), "finite"),
        (lambda p: p["detector"]["svm"].update(gamma=-1.0), "gamma"),
        (lambda p: p["detector"]["svm"].update(intercept=True), "intercept"),
        (lambda p: p["detector"]["context"]["tail"].update(ts_ns=["x"]), "ts_ns"),
        (lambda p: p["detector"].update(format=2), "format"),
        (lambda p: p.update(repeat_levels={"edges": [1.0], "runs": ["x"]}), "repeat_levels"),
        (lambda p: p.update(fitted_through="not a time"), "fitted_through"),
        (lambda p: p["detector"].update(gamma="__import__('os')"), "gamma"),
        (lambda p: p.update(score_scale=0.0), "score_scale"),
        (lambda p: p.pop("tau"), "tau"),
    ],
)
def test_malformed_params_are_a_clear_error(spiky, mutate, message):
    y, _ = spiky
    params = _through_json(fit_series_model(y.iloc[:800], detector="svr").to_params())
    mutate(params)
    with pytest.raises(ModelParamsError, match=message):
        FittedSeriesModel.from_params(params)


def test_malformed_prophet_state_is_a_clear_error(seasonal):
    det = ProphetDetector(max_train=200).fit(seasonal.iloc[:600])
    params = _through_json(encode(det))
    params["prophet"]["history"] = "not a frame"
    with pytest.raises(ModelParamsError, match="prophet"):
        decode(params, "prophet")


@pytest.mark.parametrize("payload", [None, [], "x", 3, {"format": 1}])
def test_non_objects_are_rejected(payload):
    with pytest.raises(ModelParamsError):
        FittedSeriesModel.from_params(payload)


def test_the_package_never_evaluates_code():
    """No module of the package calls eval/exec or imports by computed name (which modules it
    imports, pickle's kin among them, is checked by tests/unit/core/test_imports.py)."""
    root = Path(gpupool.__file__).parent
    found = []
    files = sorted(root.rglob("*.py"))
    assert len(files) > 20
    for path in files:
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in {"eval", "exec", "__import__"}:
                found.append(f"{path.relative_to(root)}:{node.lineno} {node.func.id}()")
    assert found == []
