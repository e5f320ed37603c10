"""Staging filled by the pipeline on the embedded virtual datacenter, for the metrics tests:
two days of extracted and cleaned history, then hourly pipeline passes (extract, detect,
forecast, plan) up to ``END``. Shared with tests/integration/test_metrics_prometheus.py."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from gpupool import pipeline
from gpupool.config import default_config

END = datetime(2026, 11, 1, 4, tzinfo=timezone.utc)
HISTORY = timedelta(days=2)


def fill(engine, hours: int = 4) -> pipeline.Context:
    """Stage the history before ``END - hours`` and run the pipeline over each of the last
    ``hours`` hours (plans decided, nothing actuated)."""
    ctx = pipeline.Context(default_config(), engine)
    first = END - timedelta(hours=hours)
    history = pipeline.Window(first - HISTORY, first)
    for p in ctx.platforms():
        pipeline.extract(ctx, p, history)
        pipeline.detect(ctx, p, history)
    for h in range(hours):
        start = first + timedelta(hours=h)
        pipeline.run_window(ctx, pipeline.Window(start, start + timedelta(hours=1)), policy="predictive", dry_run=True)
    return ctx
