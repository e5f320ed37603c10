"""Parking at fleet scale: the hourly plan with parking and the fast path's tick with it over
12,500 8-GPU nodes of three platforms, beside today's plan and tick, in one run.

    nice -n 5 .venv/bin/python bench/parking_speed.py [--nodes 12500] [--gpus 8] [--repeat 3]
        [--policy predictive] [--pg postgresql://postgres@127.0.0.1:5432] [--db parking_speed_bench]

The world (OpenStack, Slurm and Kubernetes, a third of the nodes each) is seeded straight into a
PostgreSQL database of its own (created for the run, dropped at its end) through the staging
stores, with no hour extracted (``bench/fleet.py`` measures that): each platform's inventory
snapshot at the plan's hour (the loader's ``inventory_node`` slice, as the extract stage writes
it), its platform totals (allocated, pending, capacity every 5 minutes over the history the plan
reads; the loader's ``sample`` slices), the forecasts the ``predictive`` plan reads (an issue
every hour; the forecast store), the fast path's readings over its judge's look-back
(``pressure_sample``), and the parked nodes' power state (``node_power``, written in bulk).
A quarter of each platform's nodes is parked; Slurm has work pending for ``--short`` nodes (its
parked nodes wake), Kubernetes and OpenStack ``--idle`` idle powered nodes each (beyond the
pool's warm buffer: they park).

Legs, each run ``--repeat`` times (the median is printed; a tick is decided once per instant, so
every tick has an instant of its own, 5 minutes apart, today's and parking's alternating):

* plan: today's :func:`gpupool.jobs.allocation.plan_from_staging` (``--policy``) against the plan
  with parking: the same call, then production's :func:`gpupool.jobs.power.plan_power_step` (the
  power step the plan's actuation runs when the fast path does not: the pool's power states and
  readings, the rule, its parks and wakes as a dry run through the power machine, audited; it
  reads each platform through its configured source, which the bench does not serve, so its
  figure is the step's reads and bookkeeping with no platform taking part);
* tick: today's :func:`gpupool.jobs.fastpath.run_fastpath` (dry run, in-process sources as its
  tests use; the platforms' API time is not in the figure) against the same tick on a
  configuration whose platforms have ``power:``, so production's power step runs inside it;
* decide: :func:`gpupool.decisions.parking.decide_parking` alone on the 12,500 nodes.

A first tick after the judge's refit anchor fits and stores its models; it runs once, untimed in
the table (its time is printed), so the ticks compared read stored models, as all ticks but an
anchor's first do. Bars (issue 41): the plan with parking under 30 s, the tick under 10 s.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from datetime import datetime, timedelta, timezone

import numpy as np
import pandas as pd

PLATFORMS = ("openstack", "slurm", "kubernetes")
#: the plan's hour ends here; the ticks follow it, 5 minutes apart
AT = datetime(2026, 6, 3, 12, 0, tzinfo=timezone.utc)
TICK = timedelta(minutes=5)
TARGET_PLAN_S, TARGET_TICK_S = 30.0, 10.0
PARKED_SHARE, BUSY_SHARE = 0.25, 0.70
#: each platform's means to park and wake its nodes (the configuration with parking)
POWER = {"slurm": {"means": "slurm"}, "openstack": {"means": "ironic"},
         "kubernetes": {"means": "redfish", "bmc_address": "https://{name}-bmc.bench.invalid", "bmc_conn_id": "bench_bmc"}}


# --- the world -------------------------------------------------------------------------------


class World:
    """Which node is where and doing what: per platform its busy, idle and parked nodes."""

    def __init__(self, nodes: int, gpus: int, idle: int, short: int):
        self.gpus = gpus
        per = {"openstack": nodes - 2 * (nodes // 3), "slurm": nodes // 3, "kubernetes": nodes // 3}
        self.names, self.parked, self.idle, self.busy = {}, {}, {}, {}
        self.pending = {p: 0.0 for p in PLATFORMS}
        for p, n in per.items():
            names = [f"{p[:3]}-{i:05d}" for i in range(n)]
            k_parked = int(n * PARKED_SHARE)
            k_idle = 0 if p == "slurm" else min(idle, n - k_parked)
            self.names[p] = names
            self.parked[p] = names[n - k_parked:]
            self.idle[p] = names[n - k_parked - k_idle:n - k_parked]
            self.busy[p] = names[:n - k_parked - k_idle]
        self.pending["slurm"] = float(short * gpus)

    def allocated(self, p: str) -> float:
        return float(len(self.busy[p]) * self.gpus)

    def inventory(self, p: str, at: datetime) -> pd.DataFrame:
        """The platform's inventory snapshot (a parked node is its idle, schedulable node, as the
        what-if's plan reads it)."""
        busy = set(self.busy[p])
        return pd.DataFrame({"platform": p, "node": self.names[p], "snapshot_at": pd.Timestamp(at), "gpus": self.gpus,
                             "gpu_model": "NVIDIA A100-SXM4-80GB", "mig_layout": None, "schedulable": True,
                             "drain_reason": None, "busy_gpus": [float(self.gpus if n in busy else 0) for n in self.names[p]]})

    def history(self, p: str, start: datetime, end: datetime, every: timedelta) -> pd.DataFrame:
        """Allocated and pending every ``every`` in ``[start, end)``: a daily swing of 5 % of the
        platform below today's level (back at it by ``end``) and noise; Slurm's pending rising
        over the last hour."""
        ts = pd.date_range(start, end, freq=every, inclusive="left")
        rng = np.random.default_rng(PLATFORMS.index(p))
        day = np.cos(2 * np.pi * ((ts - end) / pd.Timedelta("1D")).to_numpy(float))
        swing = 0.05 * len(self.names[p]) * self.gpus
        alloc = np.clip(self.allocated(p) - swing * (1 - day) / 2 + rng.normal(0, self.gpus, len(ts)), 0, None)
        lead = ((ts - (end - timedelta(hours=1))) / pd.Timedelta("1h")).to_numpy(float)
        pend = np.clip(self.pending[p] * lead, 0, None) + np.abs(rng.normal(0, 1, len(ts)))
        return pd.DataFrame({"ts": ts, "gpu_allocated": alloc.round(), "gpu_pending": pend.round()})


class Source:
    """An in-process source of one platform's instant pressure (as the fast path's tests use)."""

    def __init__(self, world: World, platform: str):
        self.world, self.platform = world, platform

    def pressure(self, at):
        from gpupool.sources.base import Pressure

        w, p = self.world, self.platform
        powered = len(w.names[p]) - len(w.parked[p])
        return Pressure(p, at, w.allocated(p), w.pending[p], float(powered * w.gpus), tuple(w.idle[p]),
                        {n: w.gpus for n in w.names[p]}, powered, {"gpus_pending": "bench"})


def config(world: World, power: bool):
    from gpupool.config import parse_config

    return parse_config({"platforms": [
        {"name": p, "kind": p, "conn_id": f"bench_{p}", "min_nodes": 1,
         **({"power": POWER[p], "actuation": True} if power else {})}  # parks and wakes decided; dry runs send nothing
        for p in PLATFORMS]})


def seed(engine, world: World, horizon: int) -> dict:
    """Write the world into staging (module docstring); rows written per table."""
    import sqlalchemy as sa

    from gpupool.decisions.demand import DAILY_HISTORY_HOURS, SPREAD_HISTORY_HOURS
    from gpupool.detect.stage import detect_lookback
    from gpupool.config import default_config
    from gpupool.staging import forecasts, loader
    from gpupool.staging.schema import node_power, pressure_sample

    out = {"inventory_node": 0, "sample": 0, "forecast": 0, "pressure_sample": 0, "node_power": 0}
    start = AT - timedelta(hours=max(SPREAD_HISTORY_HOURS, DAILY_HISTORY_HOURS) + 2)
    router = default_config().detect.router_config()
    judged_from = AT - detect_lookback(router) - timedelta(days=1)
    readings = []
    for p in PLATFORMS:
        inv = world.inventory(p, AT)
        out["inventory_node"] += loader.replace_slice(
            engine, loader.Slice("inventory_node", {"platform": p}, AT, AT + timedelta(microseconds=1), "snapshot_at"), inv)
        h = world.history(p, start, AT, timedelta(minutes=5))
        cap = float((len(world.names[p]) - len(world.parked[p])) * world.gpus)
        long = pd.concat([pd.DataFrame({"ts": h["ts"], "metric": m, "value": h[m]})
                          for m in ("gpu_allocated", "gpu_pending")] + [pd.DataFrame({"ts": h["ts"], "metric": "gpu_capacity",
                                                                                       "value": cap})])
        frame = long.assign(platform=p, cluster="", entity_kind="platform", entity_id="", unit="gpus")
        out["sample"] += loader.replace_slice(engine, loader.Slice("sample", {"platform": p}, start, AT), frame)
        hourly = h.set_index("ts")[["gpu_allocated", "gpu_pending"]].sum(axis=1).resample("1h").mean()
        for issued in pd.date_range(AT - timedelta(hours=DAILY_HISTORY_HOURS + 1), AT, freq="1h"):
            level = float(hourly[:issued].iloc[-1])
            ts = pd.date_range(issued, periods=horizon, freq="1h")
            steps = pd.DataFrame({"ts": ts, "yhat": level, "yhat_lower": level * 0.95, "yhat_upper": level * 1.05})
            out["forecast"] += forecasts.replace_forecast(engine, p, "demand", issued.to_pydatetime(), model="bench",
                                                          summary={}, level=0.9, steps=steps)
        r = world.history(p, judged_from, AT, TICK)
        readings += [{"platform": p, "metric": m, "at": t.to_pydatetime(), "value": float(v)}
                     for m, col in (("gpu_allocated_now", "gpu_allocated"), ("gpu_pending_now", "gpu_pending"))
                     for t, v in zip(r["ts"], r[col])]
        readings += [{"platform": p, "metric": "gpu_capacity_now", "at": t.to_pydatetime(), "value": cap} for t in r["ts"]]
    parked = [{"node": n, "platform": p, "state": "parked", "since": AT - timedelta(hours=6),
               "updated_at": AT - timedelta(hours=6)} for p in PLATFORMS for n in world.parked[p]]
    with engine.begin() as conn:
        conn.execute(pressure_sample.insert(), readings)
        conn.execute(node_power.insert(), parked)
    out["pressure_sample"], out["node_power"] = len(readings), len(parked)
    return out


# --- the rule's inputs for the decide leg ---------------------------------------------------


def power_nodes(engine, members: dict[str, list[tuple[str, int, float]]], at: datetime) -> list:
    """The rule's nodes: ``members[platform] = [(node, gpus, busy GPUs)]`` with their power states."""
    from gpupool.decisions.parking import PowerNode
    from gpupool.staging import power as power_store

    rows = {r["node"]: r for r in power_store.power_rows(engine)}
    out = []
    for p, nodes in members.items():
        for name, gpus, busy in nodes:
            row = rows.get(name)
            state = "on" if row is None else row["state"]
            changed = row["since"] if row is not None and state == "on" else None
            out.append(PowerNode(name, row["platform"] if row else p, gpus, busy if state == "on" else 0.0, state,
                                 changed_at=changed))
    return out


def pressure_of(engine, platform: str, demand: float, at: datetime, rule):
    """A platform's pressure as production's power step builds it: its readings over the last day
    (:func:`gpupool.decisions.parking.pressure_from_readings`), demand now the last one."""
    from gpupool.decisions.parking import pressure_from_readings
    from gpupool.staging import fastpath as store

    seen = store.pressure_histories(engine, platform, ["gpu_allocated_now", "gpu_pending_now"], at - timedelta(days=1), at)
    series = (seen["gpu_allocated_now"] + seen["gpu_pending_now"]).dropna().to_numpy().tolist()
    return pressure_from_readings(series + [demand], rule, wake_minutes=rule.wake_minutes,
                                  tick_minutes=TICK.total_seconds() / 60)


# --- the legs --------------------------------------------------------------------------------


def plan_leg(ctx, world: World, policy: str, parking: bool) -> dict:
    from gpupool.jobs.allocation import plan_from_staging
    from gpupool.window import Window

    t0 = time.perf_counter()
    out = plan_from_staging(ctx, Window(AT - timedelta(hours=1), AT), list(PLATFORMS), policy)
    res = {"plan": time.perf_counter() - t0, "moves": len(out["moves"]), "result": out}
    if parking:  # production's power step of the plan's actuation (the fast path has not run yet)
        from gpupool.jobs.power import plan_power_step

        t = time.perf_counter()
        step = plan_power_step(ctx, AT, dry_run=True)
        res.update(parking=time.perf_counter() - t, wakes=len(step.get("wakes", ())), parks=len(step.get("parks", ())),
                   refused=len(step.get("refused", ())))
    res["total"] = time.perf_counter() - t0
    return res


def tick_leg(ctx, world: World, at: datetime) -> dict:
    from gpupool.jobs.fastpath import run_fastpath

    sources = {p: Source(world, p) for p in PLATFORMS}
    t0 = time.perf_counter()
    out = run_fastpath(ctx, at, dry_run=True, sources=sources)
    power = out.get("power") or {}
    return {"total": time.perf_counter() - t0, "opened": len(out.get("opened", [])), "refits": out.get("refits", 0),
            "wakes": len(power.get("wakes", ())), "parks": len(power.get("parks", ()))}


def decide_leg(ctx, world: World, at: datetime) -> dict:
    from gpupool.decisions.parking import decide_parking
    from gpupool.sim.power import ParkingSpec

    rule = ParkingSpec()
    idle = {n for p in PLATFORMS for n in world.idle[p]}
    members = {p: [(n, world.gpus, 0.0 if n in idle else float(world.gpus)) for n in world.names[p]] for p in PLATFORMS}
    nodes = power_nodes(ctx.engine, members, at)
    pressures = {p: pressure_of(ctx.engine, p, world.allocated(p) + world.pending[p], at, rule) for p in PLATFORMS}
    t0 = time.perf_counter()
    d = decide_parking(nodes, pressures, rule, at, wake_minutes=rule.wake_minutes, tick_minutes=TICK.total_seconds() / 60)
    return {"decide": time.perf_counter() - t0, "wakes": len(d.wakes), "parks": len(d.parks), "nodes": len(nodes)}


def median(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def main() -> int:
    import sqlalchemy as sa

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=12_500)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--policy", default="predictive", choices=["predictive", "reactive"])
    ap.add_argument("--idle", type=int, default=25, help="idle powered nodes on OpenStack and on Kubernetes")
    ap.add_argument("--short", type=int, default=20, help="nodes' worth of GPUs pending on Slurm")
    ap.add_argument("--pg", default=os.environ.get("GPUPOOL_BENCH_PG_SERVER", "postgresql://postgres@127.0.0.1:5432"))
    ap.add_argument("--db", default="parking_speed_bench")
    args = ap.parse_args()

    from gpupool.pipeline import Context
    from gpupool.staging import db, plans

    server = args.pg.replace("postgresql://", "postgresql+psycopg://", 1).rstrip("/")
    admin = sa.create_engine(f"{server}/postgres", isolation_level="AUTOCOMMIT")
    engine = None
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{args.db}" WITH (FORCE)'))
            conn.execute(sa.text(f'CREATE DATABASE "{args.db}"'))
        engine = db.make_engine(f"{server}/{args.db}")
        db.upgrade(engine)
        world = World(args.nodes, args.gpus, args.idle, args.short)
        today, with_power = Context(config(world, False), engine), Context(config(world, True), engine)
        t = time.perf_counter()
        rows = seed(engine, world, today.config.limits.horizon_hours)
        print(f"parking at fleet scale: {args.nodes:,} nodes x {args.gpus} GPUs over {', '.join(PLATFORMS)} "
              f"({', '.join(f'{p} {len(world.names[p]):,}' for p in PLATFORMS)}); {PARKED_SHARE:.0%} of each parked; "
              f"Slurm short {args.short} nodes, {args.idle} idle powered nodes on OpenStack and Kubernetes; "
              f"plan policy {args.policy}; seeded in {time.perf_counter() - t:.0f} s: "
              + ", ".join(f"{k} {v:,}" for k, v in rows.items()))
        print("plan with parking: plan_from_staging, then production's plan_power_step; tick with parking: "
              "run_fastpath with production's power step inside (both dry runs)")

        plan_today, plan_park, ticks_today, ticks_park, decides = [], [], [], [], []
        for i in range(args.repeat):
            plan_today.append(plan_leg(today, world, args.policy, parking=False))
            plan_park.append(plan_leg(with_power, world, args.policy, parking=True))
        stored = plan_today[0]["result"]
        plans.insert_plan(engine, AT, policy=args.policy, solver=stored["solver"], dry_run=True,
                          summary=stored["summary"], moves=stored["moves"])
        first = tick_leg(today, world, AT + TICK)  # fits and stores the judge's models
        for i in range(args.repeat):
            at = AT + TICK * (2 + 2 * i)
            ticks_today.append(tick_leg(today, world, at))
            ticks_park.append(tick_leg(with_power, world, at + TICK))
            decides.append(decide_leg(today, world, at + TICK))

        pp, tp = plan_park[0], ticks_park[0]
        print()
        print(f"first tick after the judge's anchor (fits {first['refits']} models): {first['total']:.1f} s")
        print(f"plan with parking, each part (median of {args.repeat}): plan {median(plan_park, 'plan'):.2f} s; "
              f"its power step {median(plan_park, 'parking'):.2f} s ({pp['wakes']} wakes, {pp['parks']} parks, "
              f"{pp['refused']} refused, dry run); {pp['moves']} moves planned; the tick with parking: "
              f"{tp['wakes']} wakes, {tp['parks']} parks, {tp['opened']} moves opened")
        print()
        print(f"| leg ({args.nodes:,} nodes, median of {args.repeat}) | today | with parking | of it parking | "
              "ratio | target | met |")
        print("|---|---:|---:|---:|---:|---:|---|")
        a, b = median(plan_today, "total"), median(plan_park, "total")
        own = median(plan_park, "parking")
        print(f"| hourly plan ({args.policy}) | {a:.2f} s | {b:.2f} s | {own:.2f} s | {b / a:.2f} | "
              f"< {TARGET_PLAN_S:.0f} s | {'MET' if b < TARGET_PLAN_S else 'NOT MET'} |")
        a, b = median(ticks_today, "total"), median(ticks_park, "total")
        own = "in the tick"
        print(f"| fast-path tick (read, judge, decide, wake; dry run) | {a:.2f} s | {b:.2f} s | {own} | {b / a:.2f} | "
              f"< {TARGET_TICK_S:.0f} s | {'MET' if b < TARGET_TICK_S else 'NOT MET'} |")
        d = median(decides, "decide")
        print(f"| decide_parking alone ({decides[0]['wakes']} wakes, {decides[0]['parks']} parks) | | {d * 1000:.0f} ms "
              f"| | {d / a:.1%} of today's tick | | |")
        print()
        print("today: the call on a configuration without power:; with parking: the plan and then its power step, "
              "and the tick with its power step inside. Ratio: with parking / today, measured in this run, legs "
              "alternating.")
        print(f"\nload average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        return 0
    finally:
        if engine is not None:
            engine.dispose()
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{args.db}" WITH (FORCE)'))
        admin.dispose()


if __name__ == "__main__":
    from _tables import record_run  # bench/ is sys.path[0] when a bench is run

    raise SystemExit(record_run("parking_speed", main))
