"""gpupool as Prometheus sees it: metrics computed from staging at scrape time.

A :class:`StagingCollector` holds no state: every scrape reads staging as it stands at one
instant — the ``at`` it was given (a simulated or backfilled history, shown as it was) or the
wall clock at the scrape (a scrape is not a task: it reports the present). Served by the
Airflow plugin's app (``/gpupool/metrics``) and by ``gpupool metrics serve``.

Per platform: the nodes it holds (as the planner assigns them) and of those the idle whole
nodes it could lend now; GPUs allocated, pending and unmet as last reported; the realised error
of the one-hour-ahead demand forecast beside the seasonal naive forecast over the last day and
week; the newest plan whose horizon has passed, its expected unmet demand beside what came;
alarms and cleaned points; the age of the newest staged sample. Handovers: how many are in each
state, how many failed, how many are past their deadline, and how long finished ones took.
Parking (:mod:`gpupool.energy`): nodes per power state, wakes, late wakes, wakes failing now,
wake latency, parked node-seconds and the energy parking saved. Ownership (issue 42, only where
the configuration sets an ownership key): nodes owned, lent, borrowed and lendable now per
platform, reclaim latency, late reclaims and reclaims past their deadline now.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pandas as pd
from pandas.errors import DatabaseError as PandasDatabaseError
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.utils import floatToGoString
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from gpupool.actuation import handover as ho
from gpupool.jobs.pool import pool_nodes
from gpupool import energy
from gpupool.actuation.power.machine import REFUSED_PREFIX, RETRY_PREFIX
from gpupool.canonical import DEMAND_METRICS
from gpupool.config import GpupoolConfig, ownership_of
from gpupool.decisions.ownership import lent_and_borrowed
from gpupool.staging import metrics_reads, ownership_reads, reads
from gpupool.staging import power as power_store
from gpupool.staging.db import StagingUnavailable
from gpupool.values import utc

log = logging.getLogger(__name__)

#: trailing windows the forecast's realised error is scored over (label ``window``)
FORECAST_WINDOWS = {"24h": timedelta(hours=24), "7d": timedelta(days=7)}
#: the seasonal naive forecast repeats the demand seen one season before: a day
SEASON = timedelta(hours=24)
#: trailing windows alarms and cleaned points are counted over (label ``window``)
POINT_WINDOWS = {"1h": timedelta(hours=1), "24h": timedelta(hours=24)}
#: how far back "as last seen" looks for a platform's totals: beyond two hourly extractions a
#: value is no longer current (the staleness alert says so separately)
LAST_SEEN = timedelta(hours=2)
#: handover durations, in seconds: a minute up to the default two-hour deadline and past it
DURATION_BUCKETS = (60.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 14400.0, math.inf)
#: wake latencies, in seconds: a BMC's power-on and a boot take minutes; the default deadline is 15
WAKE_BUCKETS = (60.0, 120.0, 300.0, 600.0, 900.0, 1800.0, 3600.0, math.inf)
#: reclaim latencies, in seconds: 5 minutes to 2 hours, straddling the reclaim_minutes an operator
#: starts with (docs/stages/ownership.md)
RECLAIM_BUCKETS = (300.0, 600.0, 900.0, 1800.0, 2700.0, 3600.0, 5400.0, 7200.0, math.inf)
#: why a wake in progress is failing (label ``cause`` of ``gpupool_power_wakes_failing``)
WAKE_FAILURE_CAUSES = ("refused", "error", "past_deadline")


class StagingCollector:
    """A Prometheus collector that reads staging at every scrape (see the module docstring)."""

    def __init__(self, engine: Engine, config: GpupoolConfig, at: datetime | None = None):
        self.engine = engine
        self.config = config
        self.at = None if at is None else utc(at).to_pydatetime()

    def describe(self) -> list[Metric]:
        """Nothing up front: registering must not read staging."""
        return []

    def collect(self) -> Iterator[Metric]:
        """Every family, read at this scrape's instant; only ``gpupool_staging_up`` = 0 when
        staging cannot be read (the scrape still answers, so Prometheus keeps ``up`` = 1 and
        the cause is visible)."""
        at = self.at if self.at is not None else datetime.now(timezone.utc)
        up = GaugeMetricFamily("gpupool_staging_up", "1 if staging could be read at this scrape, else 0")
        try:
            families = list(self.families(at))
        except (SQLAlchemyError, PandasDatabaseError, StagingUnavailable) as exc:  # pandas wraps the driver's
            log.warning("gpupool metrics: staging unreadable: %s", type(exc).__name__)
            up.add_metric([], 0.0)
            yield up
            return
        up.add_metric([], 1.0)
        yield up
        yield from families

    def families(self, at: datetime) -> Iterable[Metric]:
        """Every metric family as staging stands at ``at`` (UTC)."""
        at = utc(at).to_pydatetime()
        names = [p.name for p in self.config.platforms]
        instant = GaugeMetricFamily("gpupool_metrics_instant_timestamp_seconds",
                                    "The instant these metrics describe (Unix time): the wall clock, or the one served")
        instant.add_metric([], at.timestamp())
        yield instant
        nodes, _ = pool_nodes(self.engine, at, names, self.config)
        yield from _platform_families(self.engine, self.config, names, nodes, at)
        yield from _forecast_families(self.engine, names, at)
        yield from _plan_families(self.engine, self.config, names, at)
        yield from _point_families(self.engine, names, at)
        yield from _freshness_families(self.engine, names, at)
        yield from _handover_families(self.engine, names, at)
        yield from _power_families(self.engine, self.config, names, nodes, at)
        if ownership_configured(self.config):
            yield from _ownership_families(self.engine, self.config, names, nodes, at)


def _gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


def _platform_families(engine: Engine, config: GpupoolConfig, names: list[str], nodes: list, at: datetime) -> Iterable[Metric]:
    held = _gauge("gpupool_platform_held_nodes", "Pool nodes the platform holds (as the planner assigns them)", ["platform"])
    held_gpus = _gauge("gpupool_platform_held_gpus", "GPUs on the pool nodes the platform holds", ["platform"])
    lendable = _gauge("gpupool_platform_lendable_idle_nodes",
                      "Idle whole nodes the platform could lend now: no busy GPU, in no handover, past the "
                      "move cool-down, and above its min_nodes", ["platform"])
    minimum = _gauge("gpupool_platform_min_nodes", "The platform's configured min_nodes", ["platform"])
    cooldown = timedelta(hours=config.limits.cooldown_hours)
    for p in names:
        mine = [n for n in nodes if n.owner == p]
        floor = config.platform(p).min_nodes
        idle = [n for n in mine if _idle(n, cooldown, at)]
        held.add_metric([p], len(mine))
        held_gpus.add_metric([p], sum(n.gpus for n in mine))
        lendable.add_metric([p], min(len(idle), max(0, len(mine) - floor)))
        minimum.add_metric([p], floor)
    yield from (held, held_gpus, lendable, minimum)
    gauges = {
        "gpu_allocated": _gauge("gpupool_platform_allocated_gpus", "GPUs held by running work, as last reported", ["platform"]),
        "gpu_pending": _gauge("gpupool_platform_pending_gpus", "GPUs wanted by waiting work, as last reported", ["platform"]),
        "gpu_capacity": _gauge("gpupool_platform_capacity_gpus", "GPUs the platform can schedule, as last reported", ["platform"]),
    }
    unmet = _gauge("gpupool_platform_unmet_gpus",
                   "Demand (allocated + pending) above capacity at the newest instant reporting all of them", ["platform"])
    for p in names:
        wide = metrics_reads.platform_totals_wide(engine, p, at - LAST_SEEN, at)
        for metric, family in gauges.items():
            if metric in wide and wide[metric].notna().any():
                family.add_metric([p], float(wide[metric].dropna().iloc[-1]))
        points = unmet_points(wide)
        if len(points):
            unmet.add_metric([p], float(points.iloc[-1]))
    yield from gauges.values()
    yield unmet


def _idle(node, cooldown: timedelta, at: datetime) -> bool:
    """Whether the platform holding ``node`` could lend it now: no busy GPU, in no handover (nor
    parked), and past the move cool-down."""
    return (node.busy_gpus <= 0 and not node.in_handover
            and (node.last_moved_at is None or utc(node.last_moved_at) + cooldown <= utc(at)))


def unmet_points(wide: pd.DataFrame) -> pd.Series:
    """Unmet GPUs, ``max(0, allocated + pending - capacity)``, at each instant of a platform's
    totals (:func:`gpupool.staging.metrics_reads.platform_totals_wide`) where capacity and every
    demand metric the platform reports have a value."""
    demand = [m for m in DEMAND_METRICS if m in wide]
    if wide.empty or "gpu_capacity" not in wide or not demand:
        return pd.Series(dtype="float64")
    full = wide[demand + ["gpu_capacity"]].dropna()
    return (full[demand].sum(axis=1) - full["gpu_capacity"]).clip(lower=0.0)


def forecast_errors(hourly: pd.Series, issued: pd.Series, at: datetime, window: timedelta) -> tuple[int, float, float]:
    """(hours scored, MAE of the forecast, MAE of the seasonal naive) over the complete hours
    that started in [at - window, at - 1 h]: ``hourly`` is the demand seen (indexed by the
    hour's start), ``issued`` the one-hour-ahead forecasts indexed by the hour they forecast;
    the naive forecast of an hour is the demand seen one :data:`SEASON` before. Only hours with
    all three are scored; none: (0, nan, nan)."""
    at = utc(at)
    seen = hourly.dropna()
    if seen.empty or issued.dropna().empty:
        return 0, math.nan, math.nan
    naive = seen.copy()
    naive.index = naive.index + pd.Timedelta(SEASON)
    both = pd.DataFrame({"actual": seen, "fc": issued, "naive": naive}).dropna()
    both = both[(both.index >= at - pd.Timedelta(window)) & (both.index + pd.Timedelta(hours=1) <= at)]
    if both.empty:
        return 0, math.nan, math.nan
    return (len(both), float((both["actual"] - both["fc"]).abs().mean()),
            float((both["actual"] - both["naive"]).abs().mean()))


def _forecast_families(engine: Engine, names: list[str], at: datetime) -> Iterable[Metric]:
    mae = _gauge("gpupool_forecast_mean_absolute_error_gpus",
                 "Realised mean absolute error of one-hour-ahead demand forecasts over the window's complete "
                 "hours: forecaster=gpupool (the forecast issued) or seasonal_naive (demand a day before)",
                 ["platform", "window", "forecaster"])
    scored = _gauge("gpupool_forecast_scored_points",
                    "Hours scored in the window (forecast, demand and naive all known)",
                    ["platform", "window"])
    longest = max(FORECAST_WINDOWS.values())
    since = utc(at) - pd.Timedelta(longest) - pd.Timedelta(SEASON) - pd.Timedelta(hours=1)
    rows = reads.forecasts_issued_between(engine, (utc(at) - pd.Timedelta(longest) - pd.Timedelta(hours=1)).to_pydatetime(),
                                          at, step=1)
    rows = rows[rows["series"] == "demand"] if len(rows) else rows
    for p in names:
        mine = rows[rows["platform"] == p] if len(rows) else rows
        issued = pd.Series(mine["yhat"].to_numpy(float) if len(mine) else [],
                           index=pd.DatetimeIndex(mine["ts"] if len(mine) else [], tz="UTC"), dtype="float64")
        hourly, _ = reads.hourly_demand(engine, p, since.floor("1h").to_pydatetime(), at)
        for label, window in FORECAST_WINDOWS.items():
            n, fc_mae, naive_mae = forecast_errors(hourly, issued, at, window)
            scored.add_metric([p, label], n)
            if n:
                mae.add_metric([p, label, "gpupool"], fc_mae)
                mae.add_metric([p, label, "seasonal_naive"], naive_mae)
    yield mae
    yield scored


def plan_outcome(engine: Engine, config: GpupoolConfig, at: datetime) -> dict[str, Any] | None:
    """The newest plan whose horizon had passed at ``at``: ``{decided_at, horizon_hours,
    platforms: {name: (expected unmet GPU-h, realised unmet GPU-h or None)}}``, or None. The
    realised unmet is the mean of the unmet points reported over the horizon times its length."""
    horizon = config.limits.plan_horizon_hours
    row = reads.latest_plan(engine, (utc(at) - pd.Timedelta(hours=horizon)).to_pydatetime())
    if row is None:
        return None
    summary = row.summary if isinstance(row.summary, dict) else {}
    hours = int(summary.get("horizon_hours") or horizon)
    start = utc(row.decided_at)
    end = start + pd.Timedelta(hours=hours)
    out: dict[str, Any] = {"decided_at": start, "horizon_hours": hours, "platforms": {}}
    for p, info in (summary.get("platforms") or {}).items():
        wide = metrics_reads.platform_totals_wide(engine, p, start.to_pydatetime(), end.to_pydatetime())
        points = unmet_points(wide[wide.index < end] if len(wide) else wide)
        realised = float(points.mean()) * hours if len(points) else None
        out["platforms"][p] = (float(info.get("expected_unmet_after") or 0.0), realised)
    return out


def _plan_families(engine: Engine, config: GpupoolConfig, names: list[str], at: datetime) -> Iterable[Metric]:
    expected = _gauge("gpupool_plan_expected_unmet_gpu_seconds",
                      "Unmet demand the newest plan whose horizon has passed expected over that horizon", ["platform"])
    realised = _gauge("gpupool_plan_realised_unmet_gpu_seconds",
                      "Unmet demand reported over that plan's horizon (mean unmet GPUs times the horizon)", ["platform"])
    decided = GaugeMetricFamily("gpupool_plan_scored_decision_timestamp_seconds",
                                "When the plan scored by gpupool_plan_*_unmet_gpu_seconds was decided (Unix time)")
    outcome = plan_outcome(engine, config, at)
    if outcome is not None:
        decided.add_metric([], outcome["decided_at"].timestamp())
        for p, (exp, real) in outcome["platforms"].items():
            if p not in names:
                continue
            expected.add_metric([p], exp * 3600.0)
            if real is not None:
                realised.add_metric([p], real * 3600.0)
    yield from (expected, realised, decided)


def _point_families(engine: Engine, names: list[str], at: datetime) -> Iterable[Metric]:
    alarms = _gauge("gpupool_alarm_points", "Detected points that deviated beyond the threshold (alarms) in the window",
                    ["platform", "window"])
    cleaned = _gauge("gpupool_cleaned_points", "Detected points whose value cleaning replaced in the window",
                     ["platform", "window"])
    for label, window in POINT_WINDOWS.items():
        counts = metrics_reads.point_counts(engine, at - window, at)
        for p in names:
            a, c = counts.get(p, (0, 0))
            alarms.add_metric([p, label], a)
            cleaned.add_metric([p, label], c)
    yield from (alarms, cleaned)


def _freshness_families(engine: Engine, names: list[str], at: datetime) -> Iterable[Metric]:
    newest = metrics_reads.newest_sample_times(engine, at)
    age = _gauge("gpupool_newest_sample_age_seconds",
                 "Seconds from the platform's newest staged sample to this instant (+Inf: none staged)", ["platform"])
    stamp = _gauge("gpupool_newest_sample_timestamp_seconds", "The platform's newest staged sample (Unix time)", ["platform"])
    for p in names:
        if p in newest:
            t = utc(newest[p])
            age.add_metric([p], (utc(at) - t).total_seconds())
            stamp.add_metric([p], t.timestamp())
        else:
            age.add_metric([p], math.inf)
    yield from (age, stamp)


def _handover_families(engine: Engine, names: list[str], at: datetime) -> Iterable[Metric]:
    pairs = [(s, t) for s in names for t in names if s != t]
    counts = {(s, t, m, st): 0 for s, t in pairs for m in ("live", "dry_run") for st in ho.STATES}
    failures = {pair: 0 for pair in pairs}
    for state, src, dst, dry, n in metrics_reads.handover_counts(engine, at):
        mode = "dry_run" if dry else "live"
        counts[(src, dst, mode, state)] = counts.get((src, dst, mode, state), 0) + n
        if not dry and state in (ho.FAILED, ho.ROLLED_BACK):
            failures[(src, dst)] = failures.get((src, dst), 0) + n
    by_state = _gauge("gpupool_handovers", "Handovers by state, source, target and mode (live or dry_run)",
                      ["state", "source", "target", "mode"])
    for (src, dst, mode, state), n in sorted(counts.items()):
        by_state.add_metric([state, src, dst, mode], n)
    yield by_state
    failed = CounterMetricFamily("gpupool_handover_failures", "Live handovers that failed or were rolled back",
                                 labels=["source", "target"])
    for (src, dst), n in sorted(failures.items()):
        failed.add_metric([src, dst], n)
    yield failed
    late = {pair: 0 for pair in pairs}
    for src, dst, n in metrics_reads.handovers_past_deadline(engine, at, ho.OPEN_STATES):
        late[(src, dst)] = n
    past = _gauge("gpupool_handovers_past_deadline", "Open live handovers whose deadline has passed", ["source", "target"])
    for (src, dst), n in sorted(late.items()):
        past.add_metric([src, dst], n)
    yield past
    yield _duration_histogram(metrics_reads.finished_handovers(engine, at, ho.DONE), pairs)


def _duration_histogram(done: pd.DataFrame, pairs: list[tuple[str, str]]) -> HistogramMetricFamily:
    hist = HistogramMetricFamily("gpupool_handover_duration_seconds",
                                 "Time from opening a handover to its end as done", labels=["source", "target", "mode"])
    groups: dict[tuple[str, str, str], list[float]] = {(s, t, "live"): [] for s, t in pairs}
    for r in done.itertuples():
        seconds = max(0.0, (r.updated_at - r.created_at).total_seconds())
        groups.setdefault((r.source, r.target, "dry_run" if r.dry_run else "live"), []).append(seconds)
    for key, values in sorted(groups.items()):
        buckets = [(floatToGoString(b), float(sum(v <= b for v in values))) for b in DURATION_BUCKETS]
        hist.add_metric(list(key), buckets, sum_value=float(sum(values)))
    return hist


def _power_families(engine: Engine, config: GpupoolConfig, names: list[str], nodes: list,
                    at: datetime) -> Iterable[Metric]:
    rows = power_store.live_transitions(engine, at)
    states = energy.states_at(rows, at)
    # every configured platform, and any other a node was parked on (never hidden)
    labels = list(dict.fromkeys([*names, *sorted({str(r["platform"]) for r in rows})]))
    count = {(p, s): 0 for p in labels for s in energy.STATES}
    for n in nodes:  # the pool's nodes as the planner sees them: on unless a transition says otherwise
        if states.get(n.name, {}).get("state", energy.ON) == energy.ON:
            count[(n.owner, energy.ON)] = count.get((n.owner, energy.ON), 0) + 1
    for st in states.values():
        if st["state"] != energy.ON:
            count[(st["platform"], st["state"])] = count.get((st["platform"], st["state"]), 0) + 1
    by_state = _gauge("gpupool_power_nodes", "Pool nodes per power state (on, parking, parked, waking) per platform: "
                      "on as held by the platform, the others on the platform where they wake", ["platform", "state"])
    for (p, s), n in sorted(count.items()):
        by_state.add_metric([p, s], n)
    yield by_state

    woke = energy.wakes(rows)
    wakes = CounterMetricFamily("gpupool_power_wakes", "Live wakes of parked nodes (by gpupool or by the platform)",
                                labels=["platform"])
    late = CounterMetricFamily("gpupool_power_late_wakes",
                               "Live wakes that reached on after their deadline, or are not on past it", labels=["platform"])
    for p in labels:
        mine = [w for w in woke if w.platform == p]
        wakes.add_metric([p], len(mine))
        late.add_metric([p], sum(w.late(at) for w in mine))
    yield from (wakes, late)

    failing = {(p, c): 0 for p in labels for c in WAKE_FAILURE_CAUSES}
    current = {r["node"]: r for r in power_store.power_rows(engine, (energy.WAKING,))}
    for node, st in states.items():
        if st["state"] != energy.WAKING:
            continue
        row = current.get(node)
        # the node's error as it stands, where staging still holds the wake seen at `at`
        error = str(row["error"] or "") if row is not None and row["transition_id"] == st["transition_id"] else ""
        if error.startswith(REFUSED_PREFIX):
            failing[(st["platform"], "refused")] += 1
        elif error.startswith(RETRY_PREFIX):
            failing[(st["platform"], "error")] += 1
        if st["deadline"] is not None and at >= st["deadline"]:
            failing[(st["platform"], "past_deadline")] += 1
    fail = _gauge("gpupool_power_wakes_failing", "Wakes in progress that are failing: refused (someone else holds or "
                  "powered off the node), error (the last command failed; retried) or past_deadline", ["platform", "cause"])
    for (p, c), n in sorted(failing.items()):
        fail.add_metric([p, c], n)
    yield fail

    hist = HistogramMetricFamily("gpupool_power_wake_duration_seconds",
                                 "Time from a wake's start (the node leaving parked) to the node on", labels=["platform"])
    for p in labels:
        values = [w.latency_s for w in woke if w.platform == p and w.latency_s is not None and w.on_at <= at]
        buckets = [(floatToGoString(b), float(sum(v <= b for v in values))) for b in WAKE_BUCKETS]
        hist.add_metric([p], buckets, sum_value=float(sum(values)))
    yield hist

    parked = energy.parked_seconds(rows, None, at)
    seconds = CounterMetricFamily("gpupool_power_parked_node_seconds", "Node-seconds the platform's nodes spent parked",
                                  labels=["platform"])
    saved = CounterMetricFamily("gpupool_power_saved_energy_joules",
                                "Estimated energy parking saved: parked node-seconds times the platform's idle watts "
                                "minus parked watts (power.idle_watts, power.parked_watts)", labels=["platform"])
    for p in labels:
        s = parked.get(p, 0.0)
        seconds.add_metric([p], s)
        saved.add_metric([p], energy.saved_kwh(s, *energy.watts_of(config, p)) * 3.6e6)
    yield from (seconds, saved)


def ownership_configured(config: GpupoolConfig) -> bool:
    """Whether any platform sets an ownership key (``owns``, a limit, ``reclaim_minutes``,
    ``min_runtime_minutes``) or any pool node names its ``owner``: without one the exposition has
    no ownership family (a pool without owners is scraped as before)."""
    return (any(p.owns is not None or ownership_of(p).promises() for p in config.platforms)
            or any(n.owner is not None for n in config.pool.nodes))


def ownership_counts(config: GpupoolConfig, owners: dict[str, str], nodes: list, at: datetime,
                     labels: list[str]) -> dict[str, dict[str, int]]:
    """Per platform of ``labels``: ``owned`` (pool nodes it owns, wherever they are), ``lent``
    (of those, the ones another platform holds), ``borrowed`` (nodes others own that it holds) and
    ``lendable`` (its owned nodes it holds idle, see :func:`_idle`, capped by what its
    ``lend_limit`` leaves: ``min(idle, lend_limit - lent)``, or all of them with no limit).
    ``nodes``: the pool as the planner sees it (``owner`` there is the holder; a node in a
    handover counts with its target), ``owners``: node -> owner."""
    lent, borrowed = lent_and_borrowed((owners.get(n.name), n.owner) for n in nodes)
    cooldown = timedelta(hours=config.limits.cooldown_hours)
    limits = {p.name: p.lend_limit for p in config.platforms}
    out = {}
    for p in labels:
        idle = sum(1 for n in nodes if n.owner == p and owners.get(n.name) == p and _idle(n, cooldown, at))
        limit = limits.get(p)
        out[p] = {"owned": sum(1 for o in owners.values() if o == p), "lent": lent.get(p, 0),
                  "borrowed": borrowed.get(p, 0),
                  "lendable": idle if limit is None else min(idle, max(0, limit - lent.get(p, 0)))}
    return out


def _ownership_families(engine: Engine, config: GpupoolConfig, names: list[str], nodes: list,
                        at: datetime) -> Iterable[Metric]:
    owners = ownership_reads.node_owners(engine, {n.node: n.owner for n in config.pool.nodes if n.owner})
    recl = ownership_reads.reclaims(engine, at, ho.OPEN_STATES, ho.DONE)
    blocked = ownership_reads.blocked_reclaims(engine, at, ho.OPEN_STATES, ho.BLOCKED_BY)
    # every configured platform, and any other that owns a node or reclaims one (never hidden)
    labels = list(dict.fromkeys([*names, *sorted(set(owners.values()) | {r["target"] for r in recl + blocked})]))
    counts = ownership_counts(config, owners, nodes, at, labels)
    docs = {
        "owned": "Pool nodes the platform owns (node_owner, pool.nodes[].owner), wherever they are; those it "
                 "holds are in gpupool_platform_held_nodes beside the others it holds",
        "lent": "Nodes the platform owns that another platform holds (a node in a handover with its target)",
        "borrowed": "Nodes other platforms own that the platform holds (a node in a handover with its target)",
        "lendable": "Nodes the platform owns and holds idle (no busy GPU, in no handover, past the move "
                    "cool-down) that it could lend now: min(those, lend_limit - lent), all of them without a lend_limit",
    }
    for key, doc in docs.items():
        family = _gauge(f"gpupool_platform_{'lendable_owned' if key == 'lendable' else key}_nodes", doc, ["platform"])
        for p in labels:
            family.add_metric([p], counts[p][key])
        yield family

    deadline = {p.name: p.reclaim_minutes for p in config.platforms}
    hist = HistogramMetricFamily("gpupool_reclaim_latency_seconds",
                                 "Live reclaims done: time from the owner's need beginning (need_since) to its "
                                 "node's handover done", labels=["platform"])
    late = CounterMetricFamily("gpupool_reclaim_late", "Live reclaims done later than the owner's reclaim_minutes "
                               "after its need began", labels=["platform"])
    past = _gauge("gpupool_reclaims_past_deadline", "Live reclaims still open past the owner's reclaim_minutes "
                  "from its need", ["platform"])
    stuck = _gauge("gpupool_reclaims_blocked", "Live reclaims open now whose eviction a disruption budget (a "
                   "Kubernetes PodDisruptionBudget) refuses, counted for the owner: the budget must allow the "
                   "eviction before the owner's reclaim_minutes run out", ["platform"])
    for p in labels:
        mine = [r for r in recl if r["target"] == p]
        limit = None if deadline.get(p) is None else float(deadline[p]) * 60.0
        values = [max(0.0, (r["done_at"] - r["need_since"]).total_seconds()) for r in mine if not r["open"]]
        buckets = [(floatToGoString(b), float(sum(v <= b for v in values))) for b in RECLAIM_BUCKETS]
        hist.add_metric([p], buckets, sum_value=float(sum(values)))
        late.add_metric([p], 0 if limit is None else sum(v > limit for v in values))
        past.add_metric([p], 0 if limit is None else sum(
            r["open"] and (at - r["need_since"]).total_seconds() >= limit for r in mine))
        stuck.add_metric([p], sum(r["target"] == p for r in blocked))
    yield from (hist, late, past, stuck)


# --- exposition --------------------------------------------------------------------------


def registry(engine: Engine, config: GpupoolConfig, at: datetime | None = None) -> CollectorRegistry:
    """A registry of its own holding only gpupool's collector (no process metrics of the host)."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(StagingCollector(engine, config, at))
    return reg


def exposition(engine: Engine, config: GpupoolConfig, at: datetime | None = None) -> bytes:
    """The Prometheus text exposition of one scrape."""
    return generate_latest(registry(engine, config, at))


def serve(engine: Engine, config: GpupoolConfig, host: str = "127.0.0.1", port: int = 9809,
          at: datetime | None = None, ready=None) -> None:
    """Serve ``/metrics`` on ``host:port`` until interrupted; ``ready(host, port)`` is called
    once the socket is bound (port 0 binds an ephemeral one)."""
    from gpupool.exposition import serve_registry

    serve_registry(registry(engine, config, at), host, port, "gpupool metrics", ready)


__all__ = ["StagingCollector", "registry", "exposition", "serve", "unmet_points", "forecast_errors", "plan_outcome",
           "ownership_configured", "ownership_counts"]
