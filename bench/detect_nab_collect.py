"""Run the streaming detector (what `gpupool detect` runs) over NAB files and cache what the
scoring needs: per-point scores and each refit's thresholds and history score tails.

Used by bench/detect_nab.py; a cache entry is keyed by file, detector and RouterConfig, so
re-scoring with other flagging settings never reruns a detector.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from gpupool.detect._robust import as_sorted_unique
from gpupool.detect.clean import RESIDUAL_DETECTORS, stream_detect
from gpupool.detect.router import RouterConfig
from gpupool.tsio import read_series_csv


#: settings that change what is cleaned, never what is flagged: not part of the cache key
CLEANING_ONLY = ("max_fault_run", "fault_drop_share")


def cache_key(rel: str, method: str, config: RouterConfig) -> str:
    settings = {k: v for k, v in config.model_dump().items() if k not in CLEANING_ONLY}
    blob = json.dumps([rel, method, settings], sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:16]


def collect(path: Path, rel: str, method: str, config: RouterConfig, cache: Path | None) -> dict:
    """One file through stream_detect with one detector (or "auto"); cached."""
    key = cache_key(rel, method, config)
    if cache is not None:
        f = cache / f"{key}.pkl"
        if f.exists():
            return pickle.loads(f.read_bytes())
    warnings.simplefilter("ignore")
    y = as_sorted_unique(read_series_csv(path))
    fits: dict = {}

    def model_for(anchor, history):
        from gpupool.detect.clean import fit_series_model

        m = fit_series_model(history, config, detector=method)
        fits[anchor] = m
        return m

    t0 = time.perf_counter()
    out = stream_detect(y, config, detector=method, model_for=model_for)
    seconds = time.perf_counter() - t0
    anchors = sorted(fits)
    model_id = np.full(len(y), -1, dtype=np.int64)
    from gpupool.detect.clean import refit_anchors

    row_anchor = refit_anchors(pd.DatetimeIndex(y.index), np.isfinite(y.to_numpy()), config)
    pos = {a: i for i, a in enumerate(anchors)}
    for i, a in enumerate(row_anchor):
        if not pd.isna(a):
            model_id[i] = pos.get(a, -1)
    models = []
    for a in anchors:
        m = fits[a]
        models.append(
            {
                "anchor": str(a),
                "detector": m.detector_name,
                "residual": m.detector_name in RESIDUAL_DETECTORS,
                "threshold": m.threshold_,
                "tau": m.tau_,
                "residual_scale": m.residual_scale_,
                "quantiles": m.extra.get("history_quantiles"),
            }
        )
    res = {
        "rel": rel,
        "method": method,
        "index": pd.DatetimeIndex(y.index),
        "value": y.to_numpy(dtype="float64"),
        "expected": out["expected"].to_numpy(dtype="float64"),
        "score": out["score"].to_numpy(dtype="float64"),
        "alarm": out["is_anomaly"].to_numpy(dtype=bool),
        "cleaned": out["cleaned"].to_numpy(dtype=bool),
        "model_id": model_id,
        "models": models,
        "seconds": seconds,
    }
    if cache is not None:
        cache.mkdir(parents=True, exist_ok=True)
        tmp = cache / f"{key}.tmp"
        tmp.write_bytes(pickle.dumps(res))
        tmp.replace(cache / f"{key}.pkl")
    return res
