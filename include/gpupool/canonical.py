"""The canonical long format every source returns and staging stores.

One row is one observation of one metric of one entity at one instant:

    platform     configured platform instance name (e.g. "slurm-hpc")
    cluster      cluster / region / partition inside the platform ("" when none)
    entity_kind  "platform" | "node" | "gpu" | "pod" | "job" | "partition"
    entity_id    the entity's name on that platform ("" for entity_kind="platform")
    metric       one of CANONICAL_METRICS (sources may add others)
    ts           tz-aware UTC timestamp
    value        float (NaN is never stored: a missing point is an absent row)
    unit         "gpus" | "percent" | "bytes" | ...

A series is (platform, cluster, entity_kind, entity_id, metric).
"""

from __future__ import annotations

import pandas as pd

from gpupool.errors import UserError

SAMPLE_COLUMNS = ["platform", "cluster", "entity_kind", "entity_id", "metric", "ts", "value", "unit"]
SERIES_KEY = ["platform", "cluster", "entity_kind", "entity_id", "metric"]

#: metric -> unit
CANONICAL_METRICS = {
    "gpu_capacity": "gpus",  # GPUs the platform (or node) can schedule
    "gpu_allocated": "gpus",  # GPUs held by running work
    "gpu_pending": "gpus",  # GPUs wanted by waiting work
    "gpu_util": "percent",  # utilisation per GPU, 0..100
    "gpu_mem_used": "bytes",  # framebuffer in use per GPU
}

#: a platform's demand is allocated + pending
DEMAND_METRICS = ("gpu_allocated", "gpu_pending")

ENTITY_KINDS = ("platform", "node", "gpu", "pod", "job", "partition", "target")

#: how a reading was made, where the platform says so (a health series per target, beside the
#: samples): metric -> unit. A health row's ``entity_kind`` is ``HEALTH_ENTITY_KIND`` and its
#: ``entity_id`` the canonical metric whose readings it vouches for (``health_target``): the
#: target that exported that metric on that platform and cluster, for every entity of it.
HEALTH_METRICS = {
    "health_up": "bool",  # 1: the target answered the scrape / read; 0: it did not
    "health_sample_age_seconds": "seconds",  # evaluation time - the sample's own timestamp
    "health_samples_scraped": "samples",  # samples the target's last scrape returned
    "health_sample_window_seconds": "seconds",  # the span the source averaged the value over
}
#: Prometheus-backed sources stage health per exporter target (``HEALTH_ENTITY_KIND``); the
#: Kubernetes metrics APIs vouch per node, so their rows carry the node's own entity
HEALTH_ENTITY_KIND = "target"
CANONICAL_METRICS.update(HEALTH_METRICS)

#: the ``cluster`` of the rows a node agent stages itself (``gpupool nvml push``): the prefix, then
#: the node's name. They are series of their own beside the platform's exporter series for the
#: same node, each node's health series vouch for that node's readings only, and the platform's
#: extract, which replaces the rows it reads, leaves them alone
COLLECTOR_CLUSTER_PREFIX = "nvml:"


def collector_cluster(node: str) -> str:
    """The ``cluster`` of the rows the node agent on ``node`` stages."""
    return f"{COLLECTOR_CLUSTER_PREFIX}{node}"


def health_target(metric: str) -> str:
    """The ``entity_id`` of the health series that vouches for the readings of ``metric``."""
    return metric


class CanonicalFrameError(UserError, ValueError):
    """A frame that does not follow the canonical format."""


def empty_samples() -> pd.DataFrame:
    """An empty canonical frame with the right dtypes."""
    return normalize_samples(pd.DataFrame({c: [] for c in SAMPLE_COLUMNS}), where="empty frame")


def normalize_samples(df: pd.DataFrame, where: str) -> pd.DataFrame:
    """Check and coerce a frame to the canonical format; returns a new frame.

    Raises CanonicalFrameError naming `where` (platform/series/window) on missing
    columns, unparseable timestamps, NaN/inf values or duplicate (series, ts) keys.
    Duplicates are reported, never silently dropped: a doubled scrape is a fact the
    caller must decide on.
    """
    missing = [c for c in SAMPLE_COLUMNS if c not in df.columns]
    if missing:
        raise CanonicalFrameError(f"{where}: missing columns {missing}")
    out = df[SAMPLE_COLUMNS].copy()
    for col in ("platform", "cluster", "entity_kind", "entity_id", "metric", "unit"):
        out[col] = out[col].fillna("").astype(str)
    try:
        out["ts"] = pd.to_datetime(out["ts"], utc=True)
    except (ValueError, TypeError) as exc:
        raise CanonicalFrameError(f"{where}: unparseable timestamps ({exc})") from exc
    out["ts"] = out["ts"].astype("datetime64[us, UTC]")
    out["value"] = pd.to_numeric(out["value"], errors="coerce").astype("float64")
    bad = ~pd.Series(pd.array(out["value"]).isna(), index=out.index) & ~out["value"].abs().lt(float("inf"))
    nan = out["value"].isna() | bad
    if nan.any():
        first = out.loc[nan].iloc[0]
        raise CanonicalFrameError(
            f"{where}: {int(nan.sum())} non-finite values, first at series "
            f"{tuple(first[SERIES_KEY])} ts={first['ts']}"
        )
    dup = out.duplicated(SERIES_KEY + ["ts"], keep=False)
    if dup.any():
        first = out.loc[dup].iloc[0]
        raise CanonicalFrameError(
            f"{where}: {int(dup.sum())} rows share a (series, ts) key, first "
            f"{tuple(first[SERIES_KEY])} ts={first['ts']}"
        )
    return out.reset_index(drop=True)


#: platform totals the pipeline needs; derived from finer entities when a source has none
TOTAL_METRICS = ("gpu_capacity", "gpu_allocated", "gpu_pending")
_TOTAL_FROM = ("node", "partition", "pod", "job")


def add_platform_totals(frame: pd.DataFrame) -> pd.DataFrame:
    """Add platform-level rows of the demand and capacity metrics a source reported only
    per node / partition / pod: their sum at each timestamp.

    A timestamp where fewer entities reported than usually do in the window gets no total
    (a gap), because a partial sum would look like a drop in demand. Existing platform-level
    rows are never replaced. Returns a new frame.
    """
    if frame.empty:
        return frame
    extra = []
    for (platform, cluster), part in frame.groupby(["platform", "cluster"], sort=False):
        for metric in TOTAL_METRICS:
            rows = part[part["metric"] == metric]
            if rows.empty or (rows["entity_kind"] == "platform").any():
                continue
            kind = next((k for k in _TOTAL_FROM if (rows["entity_kind"] == k).any()), None)
            if kind is None:
                continue
            rows = rows[rows["entity_kind"] == kind]
            per_ts = rows.groupby("ts")["value"].agg(["sum", "count"])
            usual = per_ts["count"].median()
            per_ts = per_ts[per_ts["count"] >= usual]
            extra.append(pd.DataFrame({
                "platform": platform, "cluster": cluster, "entity_kind": "platform", "entity_id": "",
                "metric": metric, "ts": per_ts.index, "value": per_ts["sum"].to_numpy(),
                "unit": rows["unit"].iloc[0],
            }))
    if not extra:
        return frame
    return pd.concat([frame, *extra], ignore_index=True)[SAMPLE_COLUMNS]


#: how far back the spread of demand inside an hour is measured
SPREAD_WINDOW = pd.Timedelta(days=1)
#: the span of the latest steps whose mean is the demand's current level
LEVEL_WINDOW = pd.Timedelta(minutes=15)


def demand_of_steps(wide: pd.DataFrame) -> tuple[pd.Series, dict]:
    """Hourly mean demand (allocated + pending) from step-level values, one column per metric.

    A platform with no pending-work metric has no queue to report (zero); a step missing one of
    the metrics the platform does report is no demand figure at all. Also returns
    ``{"within_hour_sd": ...}``: the spread of the step-level demand around its hour's median
    over the last day, estimated robustly (scaled median absolute deviation). The planner serves steps, not hourly means, so it plans on the
    hour's spread as well as the forecast's (a platform given its mean is short at every step
    above it. And ``"level"``: the mean of the steps of the last ``LEVEL_WINDOW`` (None without
    any), the demand as it stands now, which the plan reacts to. Pure: the forecast stage (through ``staging.reads.hourly_demand``) and
    ``gpupool simulate`` both call it.
    """
    import numpy as np

    if wide.empty:
        return pd.Series(dtype="float64"), {"within_hour_sd": 0.0, "level": None}
    demand = _step_demand(wide)
    hourly = demand.resample("1h").mean()
    recent = demand[demand.index >= demand.index.max() - SPREAD_WINDOW].dropna()
    within = 0.0
    latest = demand[demand.index > demand.index.max() - LEVEL_WINDOW].dropna()
    level = float(latest.mean()) if len(latest) else None
    if len(recent) > 2:
        steps = pd.Series(recent.to_numpy(float))
        dev = (steps - steps.groupby(recent.index.floor("1h").to_numpy()).transform("median")).to_numpy()
        # robust (1.4826 x the median absolute deviation from the hour's median): one spike or
        # drop the cleaning missed would otherwise widen a whole day's plans
        within = float(1.4826 * np.median(np.abs(dev)))
    return hourly, {"within_hour_sd": round(within, 6), "level": None if level is None else round(level, 6)}


def _step_demand(wide: pd.DataFrame) -> pd.Series:
    """Demand (allocated + pending) at each step of ``wide``; NaN where a reported metric is missing."""
    import numpy as np

    cols = [wide[m] if m in wide else pd.Series(0.0, index=wide.index) for m in DEMAND_METRICS]
    values = np.column_stack([c.to_numpy(float) for c in cols])
    return pd.Series(np.where(np.isnan(values).any(axis=1), np.nan, values.sum(axis=1)), index=wide.index)


def hourly_levels(wide: pd.DataFrame) -> pd.Series:
    """The ``level`` :func:`demand_of_steps` would give at each hour's start, had ``wide`` ended there.

    For each whole hour ``T`` after the first step: the mean of the demand steps of the last
    ``LEVEL_WINDOW`` up to the last instant before ``T`` (NaN where none of them has a value).
    Indexed by ``T``: it is the naive forecast the reactive plan made of the hour starting at
    ``T``, against which a forecast's record is scored (``decisions.demand.forecast_skill``).
    """
    import numpy as np

    if wide.empty:
        return pd.Series(dtype="float64")
    wide = wide.sort_index()
    demand = _step_demand(wide)
    ts = demand.index
    hours = pd.date_range(ts[0].floor("1h") + pd.Timedelta("1h"), ts[-1].floor("1h") + pd.Timedelta("1h"), freq="1h")
    values = demand.to_numpy(float)
    ok = np.isfinite(values)
    csum = np.r_[0.0, np.cumsum(np.where(ok, values, 0.0))]
    ccount = np.r_[0, np.cumsum(ok)]
    last = ts.searchsorted(hours, side="left") - 1  # the last instant before each hour
    first = ts.searchsorted(ts[last] - LEVEL_WINDOW, side="right")  # the window (last - LEVEL_WINDOW, last]
    n = ccount[last + 1] - ccount[first]
    total = csum[last + 1] - csum[first]
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(n > 0, total / np.maximum(n, 1), np.nan)
    return pd.Series(np.round(out, 6), index=hours, dtype="float64")
