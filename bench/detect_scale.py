"""Benchmark the detect stage's operational shape: daily refit and hourly scoring at scale.

    .venv/bin/python bench/detect_scale.py [--series 1000] [--days 7] [--workers 2]

Generates `--series` synthetic GPU-platform series (5-minute steps, `--days` days: daily
utilisation cycles, allocation step functions, flat capacity with rare changes, noisy
counters, with spikes, exporter zeros and short gaps injected), then times in one process:

1. the daily refit: profile, route and fit every series on all but its newest hour, in
   `--workers` processes over shards (as the DAG's mapped tasks would);
2. the hourly run: rebuild every series' cached model from its stored JSON parameters
   (as the pipeline does from `series_profile`) and score the newest hour, the history it
   needs passed as context;
3. a rolling median/MAD baseline scoring the same newest hours.

Bars (issue 5): hourly scoring < 60 s and daily refit < 15 min on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from collections import Counter
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pandas as pd

from gpupool.detect.clean import FittedSeriesModel, fit_series_model, score_window
from gpupool.detect.settings import RouterConfig

STEP = pd.Timedelta(minutes=5)
HOUR_POINTS = 12
BASE_WINDOW = 96
BASE_K = 4.0


def synthetic_series(i: int, days: int, end: pd.Timestamp) -> pd.Series:
    """One synthetic series; the kind cycles with i so every run has the same mix."""
    rng = np.random.default_rng(1000 + i)
    n = days * 288
    idx = pd.date_range(end=end - STEP, periods=n, freq=STEP, tz="UTC")
    t = np.arange(n)
    kind = i % 5
    if kind == 0:  # GPU utilisation with a daily cycle
        y = 50 + 30 * np.sin(2 * np.pi * t / 288 + rng.uniform(0, 6)) + rng.normal(0, 4, n)
        y = np.clip(y, 0, 100)
    elif kind == 1:  # allocated GPUs: a step function of jobs starting and ending
        y = np.cumsum(rng.choice([0, 0, 0, 0, 0, 0, 1, -1], n)).astype(float)
        y = np.clip(y - y.min(), 0, None)
    elif kind == 2:  # capacity: flat with one change
        y = np.full(n, float(rng.choice([8, 16, 64])))
        y[rng.integers(n // 2, n) :] += rng.choice([-8, 8])
    elif kind == 3:  # noisy memory use
        y = 4e10 + rng.normal(0, 2e9, n)
    else:  # pending GPUs: weekday-ish daily demand with bursts
        y = np.maximum(0, 10 + 8 * np.sin(2 * np.pi * t / 288) + rng.poisson(2, n) - 2).astype(float)
    spikes = rng.integers(0, n, 3)
    y[spikes] = y[spikes] * 3 + 10
    zeros = rng.integers(0, n, 2)
    y[zeros] = 0.0
    gap = int(rng.integers(0, n - 3))
    y[gap : gap + 2] = np.nan
    return pd.Series(y, index=idx, name=f"s{i}")


def refit_shard(args: tuple[list[int], int, pd.Timestamp, pd.Timestamp, RouterConfig]) -> dict[int, str]:
    """Fit the models of one shard of series (what one mapped task does each day), as stored JSON."""
    ids, days, end, cut, config = args
    warnings.simplefilter("ignore")
    models = {}
    for i in ids:
        y = synthetic_series(i, days, end)
        models[i] = json.dumps(fit_series_model(y[y.index < cut], config).to_params(), allow_nan=False)
    return models


def baseline_window(y: pd.Series, start: pd.Timestamp) -> np.ndarray:
    """Rolling median/MAD over the previous BASE_WINDOW points, for the points from `start`."""
    part = y.iloc[-(HOUR_POINTS + BASE_WINDOW) :]
    s = pd.Series(part.to_numpy())
    past = s.shift(1).rolling(BASE_WINDOW, min_periods=BASE_WINDOW // 2)
    med = past.median()
    mad = (s.shift(1) - med).abs().rolling(BASE_WINDOW, min_periods=BASE_WINDOW // 2).median() * 1.4826
    flags = ((s - med).abs() > BASE_K * mad.where(mad > 0)).to_numpy()
    return flags[part.index >= start]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--series", type=int, default=1000)
    ap.add_argument("--days", type=int, default=7)
    ap.add_argument("--workers", type=int, default=2, help="processes for the daily refit (2 cores)")
    ap.add_argument("--shards", type=int, default=16, help="shards of series, like mapped tasks")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")

    end = pd.Timestamp("2025-03-10T00:00:00Z")
    cut = end - HOUR_POINTS * STEP  # the newest hour is what the hourly run scores
    config = RouterConfig()
    t0 = time.perf_counter()
    series = {i: synthetic_series(i, args.days, end) for i in range(args.series)}
    t_gen = time.perf_counter() - t0

    shards = [list(range(args.series))[k :: args.shards] for k in range(args.shards)]
    t0 = time.perf_counter()
    stored: dict[int, str] = {}
    work = [(ids, args.days, end, cut, config) for ids in shards if ids]
    if args.workers > 1:
        with ProcessPoolExecutor(max_workers=args.workers) as pool:
            for part in pool.map(refit_shard, work):
                stored.update(part)
    else:
        for item in work:
            stored.update(refit_shard(item))
    t_refit = time.perf_counter() - t0

    t0 = time.perf_counter()
    flagged = 0
    models = {}
    for i, y in series.items():
        models[i] = FittedSeriesModel.from_params(json.loads(stored[i]))
        frame = score_window(models[i], y, cut, end, config)
        flagged += int(frame["is_anomaly"].sum())
    t_hourly = time.perf_counter() - t0

    t0 = time.perf_counter()
    base_flagged = 0
    for y in series.values():
        base_flagged += int(np.nansum(baseline_window(y, cut)))
    t_base = time.perf_counter() - t0

    routes = Counter(m.detector_name for m in models.values())
    size = sum(len(text) for text in stored.values())
    print(f"{args.series} series x {args.days} days at 5 min ({args.series * args.days * 288} points), generated in {t_gen:.1f}s")
    print(f"routes: {dict(routes)}")
    print(f"daily refit (profile+route+fit, {args.workers} workers, {len(work)} shards): {t_refit:.1f} s  (bar < 900 s)")
    print(f"hourly run (rebuild cached models from JSON, score the newest hour): {t_hourly:.2f} s  (bar < 60 s), {flagged} points flagged")
    print(f"baseline rolling median/MAD on the same hours: {t_base:.3f} s, {base_flagged} points flagged")
    print(f"ratio hourly/baseline: {t_hourly / t_base:.1f}x   ratio refit/baseline: {t_refit / t_base:.0f}x")
    print(f"cached models: {size / 1e6:.1f} MB of JSON ({size / max(len(stored), 1) / 1e3:.1f} kB per series)")
    return 0


if __name__ == "__main__":
    from _tables import record_run  # bench/ is sys.path[0] when a bench is run

    sys.exit(record_run("detect_scale", main))
