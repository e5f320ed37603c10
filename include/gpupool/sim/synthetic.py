"""A seeded synthetic GPU demand generator with ground-truth anomalies.

The demand of one platform is built as

    base * (1 + trend*days) * (1 + daily(t) + weekly(t)) * (1 + AR(1) noise) + bursts + point anomalies

where ``daily`` peaks at ``peak_hour`` and ``weekly`` dips on weekends. Bursts are part of the
workload (a team launching a sweep): they last hours and are *not* anomalies. Two kinds of
anomalies are injected and returned as ground truth:

* ``layer="demand"`` — real one-step surges of demand (``point``); the platform really saw them.
* ``layer="exporter"`` — glitches of the metrics pipeline that change what is *reported*, not
  what was demanded: ``drop`` (reported as zero), ``spike`` (reported multiplied), ``gap``
  (nothing reported) and ``counter_reset`` (an exporter restart that re-discovers running work
  and ramps from zero back to the truth).

The same ``(spec, start, end, step, seed)`` always gives the same frames.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field
from scipy.signal import lfilter

from gpupool.values import utc
from gpupool.sim.traces import TRACE_COLUMNS

#: columns of the ground-truth anomalies frame
ANOMALY_COLUMNS = ("start", "end", "kind", "layer", "magnitude")

EXPORTER_KINDS = ("drop", "spike", "gap", "counter_reset")


class AnomalyRates(BaseModel):
    """Expected number of injected anomalies per simulated day, per kind."""

    model_config = ConfigDict(extra="forbid")

    point: float = Field(0.5, ge=0)
    drop: float = Field(0.2, ge=0)
    spike: float = Field(0.3, ge=0)
    gap: float = Field(0.1, ge=0)
    counter_reset: float = Field(0.05, ge=0)


class SyntheticSpec(BaseModel):
    """Shape of one platform's synthetic demand (all amplitudes are fractions of ``base``)."""

    model_config = ConfigDict(extra="forbid")

    base: float = Field(40.0, gt=0, description="mean demand in GPUs")
    daily_amplitude: float = Field(0.3, ge=0, le=1)
    weekly_amplitude: float = Field(0.15, ge=0, le=1)
    peak_hour: float = Field(15.0, ge=0, lt=24, description="hour of day (UTC) of the daily peak")
    trend_per_day: float = Field(0.0, ge=-0.05, le=0.05)
    noise: float = Field(0.08, ge=0, le=1, description="sd of the multiplicative AR(1) noise")
    noise_persistence: float = Field(0.97, ge=0, lt=1, description="AR(1) coefficient per step")
    bursts_per_day: float = Field(0.5, ge=0)
    burst_size: float = Field(0.5, ge=0, description="burst height as a fraction of base")
    burst_hours: float = Field(3.0, gt=0)
    total_gpus: int | None = Field(None, gt=0, description="GPUs of the traced cluster; default 1.2 x base")
    utilization: float = Field(0.75, ge=0, le=1, description="mean utilisation of a busy GPU")
    anomalies: AnomalyRates = Field(default_factory=AnomalyRates)


def generate(
    spec: SyntheticSpec | dict,
    start: str | pd.Timestamp,
    end: str | pd.Timestamp,
    step: str | pd.Timedelta = "5min",
    seed: int = 0,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Generate one platform's demand on ``[start, end)`` and the anomalies injected into it.

    Returns
    -------
    demand:
        Frame indexed by UTC ``ts`` (one row per step) with the columns of
        :func:`gpupool.sim.traces.read_helios` (``running, pending, demand, total, util``; the
        true values, point anomalies included) plus ``observed``: demand as the exporter would
        report it (exporter glitches applied, NaN in gaps).
    anomalies:
        Ground truth, one row per injected anomaly: ``start`` (first step), ``end`` (exclusive),
        ``kind``, ``layer`` (``demand`` or ``exporter``) and ``magnitude``.
    """
    spec = SyntheticSpec.model_validate(spec)
    step = pd.Timedelta(step)
    index = pd.date_range(utc(start), utc(end), freq=step, inclusive="left", name="ts").astype(
        "datetime64[us, UTC]"
    )
    n = len(index)
    if n == 0:
        raise ValueError(f"empty window [{start}, {end}) at step {step}")
    rng = np.random.default_rng(seed)
    steps_per_day = pd.Timedelta("1D") / step
    hours = (index - index[0]).total_seconds().to_numpy() / 3600.0
    hour_of_day = index.hour.to_numpy() + index.minute.to_numpy() / 60.0
    days = hours / 24.0

    daily = spec.daily_amplitude * np.cos(2 * np.pi * (hour_of_day - spec.peak_hour) / 24.0)
    weekend = (index.dayofweek.to_numpy() >= 5).astype(float)
    weekly = spec.weekly_amplitude * (0.4 - weekend * 1.4)  # mean over a week ~ 0
    noise = _ar1(rng, n, spec.noise_persistence, spec.noise)
    level = spec.base * (1.0 + spec.trend_per_day * days) * np.clip(1.0 + daily + weekly, 0.05, None)
    demand = level * np.clip(1.0 + noise, 0.0, None)

    # bursts: Poisson starts, a plateau with a soft decay
    n_bursts = rng.poisson(spec.bursts_per_day * n / steps_per_day)
    burst_len = max(1, int(round(spec.burst_hours * 3600 / step.total_seconds())))
    for s in np.sort(rng.integers(0, n, size=n_bursts)):
        height = spec.base * spec.burst_size * rng.uniform(0.5, 1.5)
        length = max(1, int(burst_len * rng.uniform(0.5, 1.5)))
        shape = np.minimum(1.0, np.linspace(1.6, 0.0, length))
        stop = min(n, s + length)
        demand[s:stop] += height * shape[: stop - s]

    rows: list[dict] = []
    for s in _starts(rng, spec.anomalies.point, n, steps_per_day):
        mag = float(rng.uniform(0.6, 1.5))
        demand[s] += spec.base * mag
        rows.append({"start": index[s], "end": _end(index, s + 1, step), "kind": "point", "layer": "demand",
                     "magnitude": mag})
    demand = np.round(np.clip(demand, 0.0, None), 2)

    observed = demand.copy()
    for kind in EXPORTER_KINDS:
        for s in _starts(rng, getattr(spec.anomalies, kind), n, steps_per_day):
            if kind == "drop":
                length, mag = int(rng.integers(1, 4)), 0.0
            elif kind == "spike":
                length, mag = 1, float(rng.uniform(3.0, 6.0))
            elif kind == "gap":
                length, mag = int(rng.integers(3, 25)), float("nan")
            else:
                length, mag = int(rng.integers(6, 37)), 0.0
            stop = min(n, s + length)
            rows.append({"start": index[s], "end": _end(index, stop, step), "kind": kind, "layer": "exporter",
                         "magnitude": mag})
    anomalies = pd.DataFrame(rows, columns=list(ANOMALY_COLUMNS))
    if not anomalies.empty:
        anomalies["start"] = pd.to_datetime(anomalies["start"], utc=True).astype("datetime64[us, UTC]")
        anomalies["end"] = pd.to_datetime(anomalies["end"], utc=True).astype("datetime64[us, UTC]")
        anomalies = anomalies.sort_values(["start", "kind"], kind="stable").reset_index(drop=True)
    else:
        anomalies = anomalies.astype({"start": "datetime64[us, UTC]", "end": "datetime64[us, UTC]",
                                      "kind": object, "layer": object, "magnitude": float})
    factor, gap = glitch_factors(index, anomalies)
    observed = np.where(gap, np.nan, observed * factor)

    total = float(spec.total_gpus if spec.total_gpus is not None else np.ceil(1.2 * spec.base))
    running = np.minimum(demand, total)
    util = np.clip(spec.utilization + _ar1(rng, n, 0.99, 0.05), 0.0, 1.0)
    frame = pd.DataFrame(
        {"running": running, "pending": demand - running, "demand": demand, "total": total,
         "util": np.where(running > 0, util, 0.0), "observed": observed},
        index=index,
    )
    return frame[[*TRACE_COLUMNS, "observed"]], anomalies


def step_demand(
    start: str | pd.Timestamp,
    end: str | pd.Timestamp,
    step: str | pd.Timedelta = "1h",
    gpus_per_node: int = 8,
    nodes: int = 1,
    max_nodes: int = 3,
    steps_per_week: float = 1.0,
    seed: int = 0,
) -> pd.Series:
    """The demand of a small tenant: a whole number of nodes' GPUs, flat for days, moving in rare
    steps of one node (Poisson, ``steps_per_week`` on average) between 0 and ``max_nodes``.

    ``nodes=0`` with a low ``steps_per_week`` gives intermittent demand (mostly zero). The series
    is indexed by UTC ``ts``; the same arguments always give the same series.
    """
    step = pd.Timedelta(step)
    index = pd.date_range(utc(start), utc(end), freq=step, inclusive="left", name="ts")
    n = len(index)
    if n == 0:
        raise ValueError(f"empty window [{start}, {end}) at step {step}")
    if not 0 <= nodes <= max_nodes:
        raise ValueError(f"nodes={nodes} outside [0, max_nodes={max_nodes}]")
    rng = np.random.default_rng(seed)
    steps_per_week_grid = pd.Timedelta("7D") / step
    count = np.full(n, int(nodes))
    current = int(nodes)
    for s in np.sort(rng.integers(1, n, size=rng.poisson(steps_per_week * n / steps_per_week_grid))):
        move = int(rng.choice([-1, 1]))
        if not 0 <= current + move <= max_nodes:
            move = -move
        current += move
        count[s:] = current
    return pd.Series(count * float(gpus_per_node), index=index, name="demand")


def glitch_factors(index: pd.DatetimeIndex, anomalies: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """How exporter anomalies distort reported values at each step of ``index``.

    Returns ``(factor, gap)``: a reported value is ``true * factor`` and nothing is reported
    where ``gap`` is True. Demand-layer anomalies are real and change nothing here.
    """
    factor = np.ones(len(index))
    gap = np.zeros(len(index), dtype=bool)
    if anomalies is None or anomalies.empty:
        return factor, gap
    exporter = anomalies[anomalies["layer"] == "exporter"]
    starts = index.searchsorted(pd.DatetimeIndex(exporter["start"]))
    ends = index.searchsorted(pd.DatetimeIndex(exporter["end"]))
    for (kind, mag), s, e in zip(exporter[["kind", "magnitude"]].itertuples(index=False), starts, ends):
        if e <= s:
            continue
        if kind == "drop":
            factor[s:e] = 0.0
        elif kind == "spike":
            factor[s:e] *= mag
        elif kind == "gap":
            gap[s:e] = True
        elif kind == "counter_reset":
            factor[s:e] *= np.linspace(0.0, 1.0, e - s, endpoint=False)
    return factor, gap


def save_ground_truth(anomalies: pd.DataFrame, path) -> None:
    """Write a ground-truth anomalies frame (possibly with a ``platform`` column) as CSV."""
    out = anomalies.copy()
    for col in ("start", "end"):
        out[col] = pd.DatetimeIndex(out[col]).strftime("%Y-%m-%dT%H:%M:%SZ")
    out.to_csv(path, index=False)


def load_ground_truth(path) -> pd.DataFrame:
    """Read a ground-truth anomalies CSV written by :func:`save_ground_truth`."""
    out = pd.read_csv(path)
    for col in ("start", "end"):
        out[col] = pd.to_datetime(out[col], utc=True).astype("datetime64[us, UTC]")
    return out


def _ar1(rng: np.random.Generator, n: int, phi: float, sd: float) -> np.ndarray:
    """A stationary AR(1) path with marginal standard deviation ``sd``."""
    if sd == 0:
        return np.zeros(n)
    eps = rng.normal(0.0, sd * np.sqrt(1 - phi**2), size=n)
    out = np.empty(n)
    out[0] = rng.normal(0.0, sd)
    out[1:] = lfilter([1.0], [1.0, -phi], eps[1:], zi=[phi * out[0]])[0]
    return out


def _starts(rng: np.random.Generator, per_day: float, n: int, steps_per_day: float) -> np.ndarray:
    count = rng.poisson(per_day * n / steps_per_day)
    return np.sort(rng.integers(0, n, size=count))


def _end(index: pd.DatetimeIndex, stop: int, step: pd.Timedelta) -> pd.Timestamp:
    return index[stop] if stop < len(index) else index[-1] + step

