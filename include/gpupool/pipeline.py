"""One window through each stage: the functions the DAG's tasks and `gpupool run` call.

Every stage is keyed on an explicit window [start, end), reads only what the stage before
it wrote for that window (plus the history it needs), and replaces its own output slice
in one transaction, so any stage can be rerun. No stage reads the wall clock to decide
what to do.

Orchestration only: every read goes through `gpupool.staging.reads` and every write through
staging's loader and stores (`runs`, `models` by way of `gpupool.detect.stage.model_for`,
`forecasts`, `plans`); this module holds no SQL of its own.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pandas as pd
from sqlalchemy.engine import Engine

from gpupool.values import jsonable
from gpupool.detect.stage import detect_lookback, fit_detector, grid_series, judge_series, model_for
from gpupool.detect.provenance import health_rows, provenance_faults
from gpupool.decisions.policy import PLANNED_KINDS
from gpupool.window import Window, WindowError, parse_time, resolve_window  # the task's window, used here and by callers
from gpupool.forecast.stage import FORECAST_HISTORY, FORECAST_LEVEL, demand_forecast, warm_start
from gpupool.canonical import (COLLECTOR_CLUSTER_PREFIX, HEALTH_ENTITY_KIND, SERIES_KEY, TOTAL_METRICS, add_platform_totals,
                               normalize_samples)
from gpupool.config import ConfigError, GpupoolConfig, default_config, load_config
from gpupool.staging import db, forecasts, loader, plans, reads, runs
from gpupool.summary import window_summary

log = logging.getLogger(__name__)



# --- context --------------------------------------------------------------------------


@dataclass
class Context:
    """Configuration and the staging engine every stage needs."""

    config: GpupoolConfig
    engine: Engine

    @classmethod
    def load(cls, config_path: str | None = None, staging_url: str | None = None, schema: str | None = None) -> "Context":
        path = config_path or os.environ.get("GPUPOOL_CONFIG")
        cfg = load_config(path) if path else default_config()
        engine = db.make_engine(staging_url, schema=schema)
        return cls(cfg, engine)

    def platforms(self, only: list[str] | None = None) -> list[str]:
        names = [p.name for p in self.config.platforms]
        if only:
            unknown = sorted(set(only) - set(names))
            if unknown:
                raise ConfigError(f"unknown platforms {unknown}; configured: {names}")
            names = [n for n in names if n in only]
        return names

    def build_actuators(self, platforms: list[str] | None = None, lookup=None) -> dict:
        """Actuators of the platforms set to actuate (of ``platforms`` if given), from the same
        connection lookup as the sources (:func:`gpupool.platforms.build_actuators`). The
        jobs ask the context for them, so actuation never knows how a platform is reached."""
        from gpupool.platforms import build_actuators

        return build_actuators(self.config, platforms, lookup=lookup)

    def build_power_actuators(self, platforms: list[str] | None = None, dry_run: bool = True, lookup=None) -> dict:
        """Power actuators of the platforms whose parks and wakes are live (of ``platforms`` if
        given; :func:`gpupool.platforms.build_power_actuators`), taking pool node ids."""
        from gpupool.platforms import build_power_actuator, is_live

        return {p.name: build_power_actuator(p, self.config, lookup) for p in self.config.platforms
                if (platforms is None or p.name in platforms) and is_live(self.config, p, dry_run)}

    def build_source(self, platform: str, lookup=None):
        """The source of one configured platform (:func:`gpupool.platforms.build_source`)."""
        from gpupool.platforms import build_source

        return build_source(self.config.platform(platform), self.config, lookup)


# --- extract ---------------------------------------------------------------------------


def extract(ctx: Context, platform: str, window: Window, lookup=None) -> dict:
    """Extract one platform's usage and inventory for the window into staging.

    All or nothing: the window's samples and the inventory snapshot at its end are replaced
    in one transaction, together with the `extract_run` row's `success`; on any failure both
    keep their previous rows and the row says `failed` (or `unrecoverable`) with the error,
    and the error is re-raised. An earlier run of the same window still marked `running`
    (its process died) is marked `interrupted` when this one starts.
    """
    from gpupool.platforms import build_source

    db.require_migrated(ctx.engine)
    pcfg = ctx.config.platform(platform)
    run_id = runs.start_extract_run(ctx.engine, platform, "usage", window.start, window.end)
    inventory_note = None
    try:
        source = build_source(pcfg, ctx.config, lookup)
        raw = source.usage(window.start, window.end, step=ctx.config.step)
        frame = normalize_samples(raw, where=f"platform {platform} window {window}")
        frame = add_platform_totals(frame)
        inv, snapshot, inventory_note = _inventory(source, platform, window)
        parts = [(_sample_slice(platform, window), frame), *snapshot]
        rows = loader.replace_slices(
            ctx.engine, parts,
            then=lambda conn, n: runs.finish_extract_run(conn, run_id, "success", n[0], inventory_note))[0]
    except Exception as exc:
        runs.fail_extract_run(ctx.engine, run_id, exc)
        raise
    out = {"platform": platform, "rows": rows, "nodes": len(inv), "window": window.as_dict()}
    if inventory_note:
        out["inventory"] = inventory_note
    return out


def _sample_slice(platform: str, window: Window) -> loader.Slice:
    """The platform's rows of `sample` in the window an extract replaces: all but those its
    nodes' agents staged (`gpupool nvml push`), which no platform API returns."""
    return loader.Slice("sample", {"platform": platform}, window.start, window.end,
                        foreign=(("cluster", COLLECTOR_CLUSTER_PREFIX),))


def _inventory(source, platform: str, window: Window) -> tuple[pd.DataFrame, list, str | None]:
    """The inventory at the window's end: its frame, the slice to replace with it (none when
    it cannot be recovered) and a note saying why not."""
    try:
        nodes = source.inventory(window.end)
    except Exception as exc:
        # node state is live-only on most platforms: a past window keeps its usage rows
        # and says that the inventory could not be recovered
        if not getattr(exc, "unrecoverable", False):
            raise
        return _inventory_frame(platform, [], window.end), [], str(exc)
    inv = _inventory_frame(platform, nodes or [], window.end)
    snap = loader.Slice("inventory_node", {"platform": platform}, window.end,
                        window.end + timedelta(microseconds=1), "snapshot_at")
    return inv, [(snap, inv)], None


# --- sharded extract -------------------------------------------------------------------
#
# A platform with more nodes than its `shard_nodes` is extracted in parts that run side by
# side (mapped tasks, spread over workers): one per range of its sorted node names, reading
# the series kept per node (or GPU) of those nodes, and one platform-wide part reading the
# rest (partition, job and platform series). Each part records its own `extract_run` row and
# lands its rows in `part_sample`; `finish_extract` then replaces the platform's window in
# `sample` from them, with the platform totals and the inventory, in one transaction and
# under the platform's own `extract_run` row: all or nothing per platform and window, as an
# unsharded extraction.


class ExtractPartsError(RuntimeError):
    """Some parts of a sharded extraction did not succeed: the platform's window was not replaced."""


def split_nodes(names: list[str], per_shard: int) -> list[tuple[str, ...]]:
    """Sorted, de-duplicated `names` cut into consecutive ranges of at most `per_shard`,
    as even as possible: every name falls in exactly one range."""
    if per_shard < 1:
        raise ValueError(f"nodes per shard must be >= 1, got {per_shard}")
    ordered = sorted(set(names))
    if not ordered:
        return []
    count = -(-len(ordered) // per_shard)
    size, extra = divmod(len(ordered), count)
    out, at = [], 0
    for i in range(count):
        n = size + (1 if i < extra else 0)
        out.append(tuple(ordered[at:at + n]))
        at += n
    return out


def part_label(index: int, count: int, nodes: tuple[str, ...] | None) -> str:
    """The name of one part of a sharded extraction, as `extract_run.part` records it."""
    import hashlib

    if nodes is None:
        return f"{index + 1}/{count} platform-wide"
    digest = hashlib.sha256("\n".join(nodes).encode()).hexdigest()[:8]
    first, last = nodes[0][:48], nodes[-1][:48]
    return f"{index + 1}/{count} {first}..{last} ({len(nodes)} nodes) #{digest}"


def plan_extract(ctx: Context, window: Window, platforms: list[str] | None = None, lookup=None) -> list[dict]:
    """The extraction parts of the window: per platform `{"platform": p}` (one part: the
    whole platform, extracted by :func:`extract`), or, for a platform configured with
    `shard_nodes` whose source lists more nodes than that for the window, one part per node
    range and a platform-wide part, each `{"platform", "index", "count"}`, extracted by
    :func:`extract_part`.

    The plan itself (each part's name and node range) is written to staging's
    `extract_part`, replacing the platform's earlier plan of the window (a platform planned
    whole has none): what is returned, and travels in XCom, names no node.
    """
    from gpupool.platforms import build_source

    db.require_migrated(ctx.engine)
    out: list[dict] = []
    for name in ctx.platforms(platforms):
        pcfg = ctx.config.platform(name)
        ranges: list = []
        if pcfg.shard_nodes:
            source = build_source(pcfg, ctx.config, lookup)
            lister = getattr(source, "node_names", None)
            if lister is None:
                log.warning("platform %s: its source cannot read a range of nodes; extracted as one part", name)
            else:
                ranges = split_nodes(lister(window.start, window.end, ctx.config.step), pcfg.shard_nodes)
        planned = [] if len(ranges) <= 1 else [*ranges, None]
        count = len(planned)
        labelled = [(part_label(i, count, r), None if r is None else list(r)) for i, r in enumerate(planned)]
        runs.replace_extract_plan(ctx.engine, name, window.start, window.end, labelled)
        if not labelled:
            out.append({"platform": name})
            continue
        log.info("platform %s window %s: %d parts planned: %s", name, window, count, ", ".join(p for p, _ in labelled))
        out.extend({"platform": name, "index": i, "count": count} for i in range(count))
    return out


def _planned(ctx: Context, platform: str, window: Window, index: int, count: int):
    """The staged plan row of part `index` of `count` of the platform's window."""
    row = reads.planned_part(ctx.engine, platform, window.start, window.end, index)
    if row is None or row.parts != count:
        have = "no plan" if row is None else f"a plan of {row.parts} parts"
        raise ExtractPartsError(
            f"platform {platform} window {window}: part {index + 1}/{count} is not in the extraction plan "
            f"in staging (it holds {have}): rerun extract_parts and the parts")
    return row


def extract_part(ctx: Context, part: dict, window: Window, lookup=None) -> dict:
    """Extract one part planned by :func:`plan_extract` for the window.

    A whole platform (`{"platform": p}`) is :func:`extract`. A part of a sharded platform
    (`{"platform", "index", "count"}`) reads its name and node range from the staged plan,
    and replaces its own rows in `part_sample` together with its `extract_run` row's
    `success` in one transaction; on failure it keeps its previous rows, its row says
    `failed` with the error, and the error is re-raised: the other parts are not touched.
    """
    from gpupool.platforms import build_source
    from gpupool.sources.base import NodeShard

    platform = part["platform"]
    if "index" not in part:
        return extract(ctx, platform, window, lookup=lookup)
    db.require_migrated(ctx.engine)
    planned = _planned(ctx, platform, window, int(part["index"]), int(part["count"]))
    label = planned.part
    pcfg = ctx.config.platform(platform)
    run_id = runs.start_extract_run(ctx.engine, platform, "usage", window.start, window.end, part=label)
    try:
        source = build_source(pcfg, ctx.config, lookup)
        nodes = planned.nodes
        raw = source.usage(window.start, window.end, step=ctx.config.step,
                           shard=NodeShard(None if nodes is None else tuple(nodes)))
        frame = normalize_samples(raw, where=f"platform {platform} part {label} window {window}")
        frame.insert(0, "part", label)
        sl = loader.Slice("part_sample", {"platform": platform, "part": label}, window.start, window.end)
        rows = loader.replace_slices(
            ctx.engine, [(sl, frame)],
            then=lambda conn, n: runs.finish_extract_run(conn, run_id, "success", n[0], None))[0]
    except Exception as exc:
        runs.fail_extract_run(ctx.engine, run_id, exc)
        raise
    log.info("platform %s window %s: part %s landed %d rows", platform, window, label, rows)
    return {"platform": platform, "index": planned.position, "count": planned.parts, "rows": rows,
            "window": window.as_dict()}


def finish_extract(ctx: Context, platform: str, window: Window, parts: list[dict], lookup=None) -> dict:
    """Replace the platform's window in `sample` by what its parts landed, once every part
    of the plan succeeded (`parts` as :func:`plan_extract` returned them; each part's name is
    read from the staged plan; their newest `extract_run` rows say so), with the platform
    totals and the inventory at the window's end, in one transaction under the platform's
    own `extract_run` row. A platform extracted whole has nothing to finish.

    When a part did not succeed, nothing is replaced: the platform's previous rows stay, the
    parts that succeeded stay in `part_sample` (a rerun of the failed ones and of this step
    completes the window), the platform's row says `failed` naming each missing part and
    why, and :class:`ExtractPartsError` is raised.
    """
    from gpupool.platforms import build_source

    mine = [p for p in parts if p.get("platform") == platform and "index" in p]
    if not mine:
        # extracted whole: nothing to promote, but what runs next must not run on a failed one
        run = reads.platform_run(ctx.engine, platform, window.start, window.end)
        if run is None or run.status != "success":
            state = "never ran" if run is None else run.status + (f" ({run.error})" if run.error else "")
            raise ExtractPartsError(f"platform {platform} window {window}: its extraction did not succeed: {state}")
        return {"platform": platform, "sharded": False, "rows": run.rows}
    db.require_migrated(ctx.engine)
    run_id = runs.start_extract_run(ctx.engine, platform, "usage", window.start, window.end)
    inventory_note = None
    try:
        labels = [_planned(ctx, platform, window, int(p["index"]), int(p["count"])).part for p in mine]
        landed = reads.part_runs(ctx.engine, platform, window.start, window.end, labels)
        bad = [(label, landed.get(label)) for label in labels if landed.get(label) is None or landed[label].status != "success"]
        if bad:
            why = "; ".join(f"part {label}: " + ("never ran" if r is None else f"{r.status}" + (f" ({r.error})" if r.error else ""))
                            for label, r in bad)
            raise ExtractPartsError(
                f"platform {platform} window {window}: {len(bad)} of {len(labels)} parts did not succeed, "
                f"the platform's previous rows are kept and the parts that did stay staged: {why}")
        counts = reads.part_samples(ctx.engine, platform, window.start, window.end, labels, metrics=TOTAL_METRICS)
        totals = add_platform_totals(counts).iloc[len(counts):]
        source = build_source(ctx.config.platform(platform), ctx.config, lookup)
        inv, snapshot, inventory_note = _inventory(source, platform, window)
        rows = loader.promote_parts(
            ctx.engine, _sample_slice(platform, window), labels,
            extra=normalize_samples(totals, where=f"platform {platform} totals window {window}"), also=snapshot,
            then=lambda conn, n: runs.finish_extract_run(conn, run_id, "success", n, inventory_note),
            expect=sum(int(landed[label].rows or 0) for label in labels))
    except Exception as exc:
        runs.fail_extract_run(ctx.engine, run_id, exc)
        raise
    out = {"platform": platform, "rows": rows, "parts": len(labels), "nodes": len(inv), "window": window.as_dict()}
    if inventory_note:
        out["inventory"] = inventory_note
    return out


def _inventory_frame(platform: str, nodes: list[dict], at: datetime) -> pd.DataFrame:
    cols = ["node", "gpus", "gpu_model", "mig_layout", "schedulable", "drain_reason", "busy_gpus"]
    frame = pd.DataFrame([{c: n.get(c) for c in cols} for n in nodes], columns=cols)
    frame.insert(0, "platform", platform)
    frame["snapshot_at"] = pd.Timestamp(at)
    frame["gpu_model"] = frame["gpu_model"].fillna("")
    frame["schedulable"] = frame["schedulable"].fillna(True).astype(bool)
    frame["mig_layout"] = frame["mig_layout"].astype(object).where(frame["mig_layout"].notna(), None)
    return frame


# --- detect / clean --------------------------------------------------------------------

def detect(ctx: Context, platform: str, window: Window) -> dict:
    """Profile, route, score and clean every series of one platform for the window.

    The same streaming judgement as `gpupool detect` (`stream_detect`): each point is
    judged on its past only by the model of its refit anchor (daily by default, fitted on
    the newest `history_days`); models are stored per anchor and reused by later windows.
    """
    db.require_migrated(ctx.engine)
    router = ctx.config.detect.router_config()
    # the oldest refit a window's points (and the alarm look-back before it) can need
    hist = reads.read_samples(ctx.engine, window.start - detect_lookback(router), window.end, platform)
    health = hist[hist["entity_kind"] == HEALTH_ENTITY_KIND]  # how the readings were made, where the source says
    hist = hist[hist["entity_kind"].isin(ctx.config.detect.entity_kinds) & (hist["entity_kind"] != HEALTH_ENTITY_KIND)]
    in_window = hist[hist["ts"] >= pd.Timestamp(window.start)]
    keys = in_window[SERIES_KEY].drop_duplicates().itertuples(index=False, name=None)
    out, anomalies, refits, routes, by_provenance = [], 0, 0, {}, 0
    freq = pd.Timedelta(ctx.config.step)
    for key in keys:
        series = grid_series(hist, key, freq)
        fresh = []

        def anchored(anchor, history, key=key, fresh=fresh):
            model, new = model_for(ctx.engine, key, anchor, history, lambda h: fit_detector(h, router, key[4]))
            fresh.append(new)
            return model

        known = provenance_faults(series.index, health_rows(health, key), freq) if len(health) else None
        scored = judge_series(series, router, key[4], window.start, window.end, anchored, known_faults=known)
        refits += sum(fresh)
        by_provenance += int(scored.attrs.get("provenance_faults", 0))
        frame = scored.reset_index(names="ts")
        frame["detector"] = frame["detector"].replace("", "none")
        for col, val in zip(SERIES_KEY, key):
            frame[col] = val
        out.append(frame)
        anomalies += int(frame["is_anomaly"].sum())
        name = frame["detector"].iloc[-1] if len(frame) else "none"
        routes[name] = routes.get(name, 0) + 1
    cols = SERIES_KEY + ["ts", "value", "expected", "score", "is_anomaly", "cleaned", "filled", "detector", "clean_value"]
    frame = pd.concat(out, ignore_index=True)[cols] if out else pd.DataFrame(columns=cols)
    rows = loader.replace_slice(ctx.engine, loader.Slice("clean_sample", {"platform": platform}, window.start, window.end), frame)
    return {"platform": platform, "series": len(out), "rows": rows, "anomalies": anomalies, "refits": refits,
            "detectors": routes, "provenance_faults": by_provenance}


# --- forecast --------------------------------------------------------------------------

def forecast_demand(ctx: Context, platform: str, window: Window, horizon: int | None = None, level: float = FORECAST_LEVEL) -> dict:
    """Forecast one platform's hourly demand from the window's end; store run and rows."""
    horizon = horizon or ctx.config.limits.horizon_hours
    end = pd.Timestamp(window.end).floor("1h")
    history, info = reads.hourly_demand(ctx.engine, platform, (end - FORECAST_HISTORY).to_pydatetime(), end.to_pydatetime())
    history = history[history.index < end]
    if history.notna().sum() == 0:
        raise ValueError(f"platform {platform}: no demand history before {end.isoformat()} to forecast from")
    # orders searched in the last day are reused (coefficients are re-estimated, the search is
    # not: ForecastTuning.order_search_every)
    warm = _recent_summary(ctx.engine, platform, window.end)
    # the model is chosen by validation inside the history; the choice and every candidate's
    # error go into the summary
    fc, model_summary = demand_forecast(history, horizon, level, warm)
    summary = jsonable({**model_summary, **info, "history_hours": int(history.notna().sum())})
    forecasts.replace_forecast(ctx.engine, platform, "demand", window.end, model=str(summary.get("model") or "arima"),
                               summary=summary, level=level, steps=fc)
    first = fc.iloc[0]
    return {
        "platform": platform,
        "horizon": len(fc),
        "next_hour": [round(float(first["yhat_lower"]), 1), round(float(first["yhat"]), 1), round(float(first["yhat_upper"]), 1)],
        "model": summary.get("model", summary.get("order")),
        "warm_start": warm is not None,
    }


def _recent_summary(engine: Engine, platform: str, at: datetime) -> dict | None:
    """The model summary of the platform's last forecast issued within a day before `at`,
    unless that one fell back (a fallback is no order to start from)."""
    return warm_start(reads.recent_forecast_summary(engine, platform, at, within=timedelta(days=1)))


# --- plan ------------------------------------------------------------------------------


def plan(ctx: Context, window: Window, policy: str = "predictive", dry_run: bool = True, platforms: list[str] | None = None) -> dict:
    """Decide which platform should hold each pool node from the window's end; store the plan."""
    from gpupool.jobs.allocation import plan_from_staging

    if policy not in PLANNED_KINDS:
        raise ValueError(f"policy must be one of {PLANNED_KINDS}, got {policy!r}")
    names = ctx.platforms(platforms)
    result = plan_from_staging(ctx, window, names, policy)
    plan_id = plans.insert_plan(ctx.engine, window.end, policy=policy, solver=result["solver"], dry_run=dry_run,
                                summary=result["summary"], moves=result["moves"])
    return {"plan_id": plan_id, "solver": result["solver"], "moves": result["moves"], "summary": result["summary"]}


# --- one pass --------------------------------------------------------------------------


def run_window(
    ctx: Context,
    window: Window,
    platforms: list[str] | None = None,
    policy: str = "predictive",
    dry_run: bool = True,
    progress=None,
) -> dict:
    """One pipeline pass outside Airflow: extract, detect/clean, forecast, plan."""
    names = ctx.platforms(platforms)
    report: dict[str, Any] = {"window": window.as_dict(), "extract": [], "detect": [], "forecast": []}
    for p in names:
        report["extract"].append(extract(ctx, p, window))
        _tick(progress, f"extract {p}")
    for p in names:
        report["detect"].append(detect(ctx, p, window))
        _tick(progress, f"detect {p}")
    for p in names:
        report["forecast"].append(forecast_demand(ctx, p, window))
        _tick(progress, f"forecast {p}")
    report["plan"] = plan(ctx, window, policy=policy, dry_run=dry_run, platforms=names)
    _tick(progress, "plan")
    return report


def _tick(progress, label: str) -> None:
    if progress is not None:
        progress(label)


def summary(ctx: Context, window: Window) -> dict:
    """What each stage left in staging for the window (read back, not remembered)."""
    return window_summary(reads.window_record(ctx.engine, window.start, window.end), window.as_dict())
