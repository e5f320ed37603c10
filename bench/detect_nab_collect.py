"""Run the streaming detector (what `gpupool detect` runs) over NAB files and cache what the
scoring needs: per-point scores and each refit's thresholds and history score tails.

Used by bench/detect_nab.py; a cache entry is keyed by file (its name and the content the
detectors read), detector and RouterConfig, so re-scoring with other flagging settings never
reruns a detector.

A few NAB files repeat timestamps (a DST change, a re-sent hour). `gpupool detect` refuses
such a file (which of two values is the genuine one cannot be known), so the bench reads a
copy keeping the first row of each timestamp (`dedupe_csv`) and says which rows it dropped;
NAB's labels are timestamps, so they are scored on the copy unchanged.
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
from gpupool.detect.clean import stream_detect
from gpupool.detect.model import RESIDUAL_DETECTORS
from gpupool.detect.settings import RouterConfig
from gpupool.tsio import read_series_csv


#: settings (section, field of RouterConfig) that change what is cleaned, never what is flagged:
#: not part of the cache key
CLEANING_ONLY = (("cleaning", "max_fault_run"),)
#: settings that move only the alarm threshold, which the bench reads again from what the
#: cache keeps (scores, each model's history tails and largest excursions): not part of the key
ALARM_ONLY = (("alarms", "history_skip_per_day"), ("alarms", "history_skip_per_1000_points"),
              ("alarms", "run_points"), ("alarms", "run_share"))


def dedupe_csv(path: Path, workdir: Path) -> tuple[Path, list[int]]:
    """`path`, or a copy in `workdir` keeping the first row of each repeated timestamp.

    Returns the file to read and the dropped rows' file lines (line 1 is the header; empty
    when nothing repeats). The time column is NAB's first column.
    """
    raw = pd.read_csv(path, dtype=str, keep_default_na=False)
    times = pd.to_datetime(raw.iloc[:, 0], errors="coerce", format="mixed")
    dup = (times.duplicated(keep="first") & times.notna()).to_numpy()
    if not dup.any():
        return path, []
    out = workdir / path.parent.name / path.name
    out.parent.mkdir(parents=True, exist_ok=True)
    raw[~dup].to_csv(out, index=False)
    return out, [int(i) + 2 for i in np.flatnonzero(dup)]


def line_ranges(lines: list[int]) -> str:
    """`[2119, 2120, 2121, 2130]` as "2119-2121, 2130"."""
    parts, start = [], None
    for i, n in enumerate(lines):
        if start is None:
            start = n
        if i + 1 == len(lines) or lines[i + 1] != n + 1:
            parts.append(str(start) if start == n else f"{start}-{n}")
            start = None
    return ", ".join(parts)


def cache_key(rel: str, method: str, config: RouterConfig, content: bytes = b"") -> str:
    settings = config.model_dump()
    for section, name in CLEANING_ONLY + ALARM_ONLY:
        settings[section] = {k: v for k, v in settings[section].items() if k != name}
    blob = json.dumps([rel, method, settings, hashlib.sha1(content).hexdigest()], sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:16]


def collect(path: Path, rel: str, method: str, config: RouterConfig, cache: Path | None) -> dict:
    """One file through stream_detect with one detector (or "auto"); cached.

    `path` is the file the detectors read (`dedupe_csv`'s copy where NAB's file repeats a
    timestamp); `rel` its NAB name, under which it is scored.
    """
    key = cache_key(rel, method, config, path.read_bytes())
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
                "quantiles": m.budget.quantiles,
                "excursions": m.budget.excursions,
                "run_excursions": m.budget.run_excursions,
                "run_threshold": m.run_threshold_,
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
