"""How far pooling can keep issue 42's "no regret" promise on the Helios traces: a hindsight bound.

    nice -n 10 .venv/bin/python bench/ownership_bound.py [--days 31] [--groupings G1,...] [--regret 5]
        [--learn DAYS]

A platform that lends its idle nodes gets one back ``--lag`` minutes after it needs it (a reading,
then a move: 5 + 30 by default), so every jump of its demand above what it kept at home costs it
that long, where keeping its own nodes (``static``) would have served it at once: that is its
regret. Lending less lowers the regret and leaves the others' queues unserved. This bench gives
pooling every advantage the what-if does not, and asks whether any split meets both bars at once:

* each platform keeps at home the nodes its demand needed ``--lag`` minutes ago (held ``--hold``
  minutes), plus a *reserve* chosen per platform and hour of the day KNOWING the whole run (the
  reserve that removes the most regret per node-hour kept first), and lends the rest;
* what is lent serves the other platforms' demand above their own nodes at once (no move time, no
  budget, any platform's surplus to any platform's shortage);
* regret: the owner's demand (up to its own nodes) above what it kept, for the lag.

It prints, per grouping, the least reserve that brings every platform's regret to ``--regret``
GPU-hours and the total unmet left then (regret included), beside ``static`` (nothing lent) and
``free`` (everything idle lent, no regret counted): if the total at the regret bar is above the
bar on the total (``--total``), no lending rule that reacts to demand meets both.

``--learn DAYS`` asks whether the hindsight reserve carries to days it did not see: each day's
reserve per hour is the one chosen the same way on the ``DAYS`` days before it (its bar pro rata),
and the regret is counted on the days after the first ``DAYS`` only, against the bar pro rata.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from allocate_helios import DATA, PLATFORMS, groupings, pool_nodes

from gpupool.sim.traces import read_helios

NODE_GPUS, STEP_H = 8, 5 / 60


def home_level(demand: np.ndarray, nodes: int, lag: int, hold: int) -> np.ndarray:
    """Nodes a platform keeps at home with no reserve: its demand's level read ``lag`` steps before,
    held ``hold`` steps, and every node with work a step ago (work is never moved), at most ``nodes``."""
    level = np.ceil(np.minimum(demand, nodes * NODE_GPUS) / NODE_GPUS - 1e-9)
    pad = np.concatenate([np.full(lag + hold, level[0]), level])
    track = sliding_window_view(pad, hold + 1)[: len(demand)].max(axis=1)
    before = np.concatenate([[level[0]], level[:-1]])
    return np.minimum(nodes, np.maximum(track, before))


def regret_cells(demand: np.ndarray, hours: np.ndarray, nodes: int, base: np.ndarray) -> np.ndarray:
    """Regret (GPU-h) per reserve 0..nodes and hour of the day."""
    served = np.minimum(demand, nodes * NODE_GPUS)
    out = np.zeros((nodes + 1, 24))
    for r in range(nodes + 1):
        kept = np.minimum(nodes, base + r)
        out[r] = np.bincount(hours, np.clip(served - kept * NODE_GPUS, 0, None) * STEP_H, minlength=24)
    return out


def least_reserve(cells: np.ndarray, hours_count: np.ndarray, bar: float) -> np.ndarray:
    """Reserve per hour of the day: added where it removes the most regret per node-hour kept, until
    the regret is at most ``bar`` (or every hour keeps every node)."""
    nodes = cells.shape[0] - 1
    reserve = np.zeros(24, int)
    while cells[reserve, np.arange(24)].sum() > bar + 1e-9:
        gain = np.array([cells[reserve[h], h] - cells[reserve[h] + 1, h] if reserve[h] < nodes else -1.0
                         for h in range(24)])
        per = gain / np.maximum(hours_count, 1)
        h = int(np.argmax(per))
        if gain[h] <= 1e-12:
            break
        reserve[h] += 1
    return reserve


def learned_reserve(d: np.ndarray, hours: np.ndarray, n: int, base: np.ndarray, learn: int, bar: float,
                    steps: int) -> np.ndarray:
    """Nodes kept above ``base`` at each step, each day's reserve per hour chosen on the ``learn``
    days before it (its bar ``bar`` pro rata over the run's ``steps``); the first ``learn`` days keep
    none (they are not counted)."""
    day = 288
    extra = np.zeros(len(d), int)
    for start in range(learn * day, len(d), day):
        w = slice(start - learn * day, start)
        cells = regret_cells(d[w], hours[w], n, base[w])
        reserve = least_reserve(cells, np.bincount(hours[w], minlength=24), bar * learn * day / steps)
        extra[start:start + day] = reserve[hours[start:start + day]]
    return extra


def grouping_row(g: str, rounds, data: Path, steps: int, lag: int, hold: int, bar: float,
                 learn: int = 0) -> dict:
    nodes = pool_nodes(rounds[g], data, 100)
    frames = {p: read_helios([data / f"{t}.csv" for t in pair], "5min") for p, pair in zip(PLATFORMS, rounds[g])}
    hours = frames[PLATFORMS[0]].index[:steps].hour.to_numpy()
    hours_count = np.bincount(hours, minlength=24)
    out = {"static": 0.0, "free": 0.0, "bar": 0.0, "regret": {}, "reserve": {}}
    excess, lend_free, lend_bar, regret = [], [], [], 0.0
    for p in PLATFORMS:
        d = frames[p]["demand"].to_numpy()[:steps]
        n = nodes[p]
        over = np.clip(d - n * NODE_GPUS, 0, None)
        out["static"] += float(over[learn * 288:].sum() * STEP_H)
        excess.append(over)
        base = home_level(d, n, lag, hold)
        if learn:  # counted after the first days: what the reserve learnt before them carries, or not
            kept = np.minimum(n, base + learned_reserve(d, hours, n, base, learn, bar, steps))
            counted = np.arange(len(d)) >= learn * 288
            served = np.minimum(d, n * NODE_GPUS)
            r = float((np.clip(served - kept * NODE_GPUS, 0, None) * STEP_H)[counted].sum())
        else:
            cells = regret_cells(d, hours, n, base)
            reserve = least_reserve(cells, hours_count, bar)
            kept = np.minimum(n, base + reserve[hours])
            r = float(cells[reserve, np.arange(24)].sum())
        out["regret"][p], out["reserve"][p] = r, float((kept - base).mean())
        regret += r
        busy = np.ceil(np.minimum(d, n * NODE_GPUS) / NODE_GPUS - 1e-9)
        lend_free.append((n - busy) * NODE_GPUS)
        lend_bar.append((n - kept) * NODE_GPUS)
    need = np.sum(excess, axis=0)
    out["free"] = float(np.clip(need - np.sum(lend_free, axis=0), 0, None)[learn * 288:].sum() * STEP_H)
    # what is lent serves the others' shortage: a platform's own surplus never serves itself
    left = 0.0
    for t in range(learn * 288, steps):
        short = [e[t] for e in excess]
        supply = [lb[t] for lb in lend_bar]
        left += max(0.0, sum(short) - _served(short, supply))
    out["bar"] = left * STEP_H + regret
    return out


def _served(short: list[float], supply: list[float]) -> float:
    """The most of ``short`` the others' ``supply`` can serve (a platform's supply never serves
    itself): the max flow of the transportation problem without its diagonal, as its min cut over
    the sets S of short platforms: what is short outside S plus the supply of every platform that
    can serve one in S."""
    k = len(short)
    best = float("inf")
    for mask in range(1 << k):
        inside = [j for j in range(k) if mask >> j & 1]
        feeders = {i for i in range(k) for j in inside if i != j}
        cut = sum(short[j] for j in range(k) if j not in inside) + sum(supply[i] for i in feeders)
        best = min(best, cut)
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--days", type=float, default=31)
    ap.add_argument("--data", default=str(DATA))
    ap.add_argument("--groupings", default="G1,G2,G3,G4,G5")
    ap.add_argument("--lag", type=float, default=35.0, help="minutes from need to a lent node back (reading + move)")
    ap.add_argument("--hold", type=float, default=30.0, help="minutes a node stays home after its work")
    ap.add_argument("--regret", type=float, default=5.0, help="the bar on each platform's regret, GPU-h")
    ap.add_argument("--total", type=float, default=110.0, help="the bar on the total unmet, GPU-h")
    ap.add_argument("--learn", type=int, default=0,
                    help="days before each day on which its reserve is chosen (0: chosen knowing the run)")
    args = ap.parse_args(argv)
    data, rounds = Path(args.data), groupings()
    steps = int(round(args.days * 288))
    lag = int(np.ceil(args.lag / 5 - 1e-9))
    hold = int(np.ceil(args.hold / 5 - 1e-9))
    counted = args.days - args.learn
    bar = args.regret * (counted / args.days if args.learn else 1.0)
    chosen = (f"chosen each day on the {args.learn} days before it, counted over the {counted:g} days after the "
              f"first {args.learn} (regret bar pro rata: {bar:.2f} GPU-h)" if args.learn else "chosen knowing the run")
    print(f"Ownership bound: {args.days:g} days, a lent node back {args.lag:g} min after the need, kept home "
          f"{args.hold:g} min after its work, reserve per platform and hour {chosen}; pool 100 %\n")
    print(f"| grouping | static: unmet | free lending: unmet (no regret counted) | reserve for regret <= "
          f"{args.regret:g}: mean nodes kept per platform | regret per platform | total unmet then | "
          f"<= {args.total:g} |")
    print("|---|---:|---:|---|---|---:|---|")
    for g in [x.strip() for x in args.groupings.split(",") if x.strip()]:
        row = grouping_row(g, rounds, data, steps, lag, hold, args.regret, args.learn)
        kept = ", ".join(f"{p[:3]} {row['reserve'][p]:.1f}" for p in PLATFORMS)
        regret = ", ".join(f"{p[:3]} {row['regret'][p]:.1f}" + ("" if row["regret"][p] <= bar + 1e-9 else " (over)")
                           for p in PLATFORMS)
        ok = "met" if row["bar"] <= args.total + 1e-9 else "NOT met"
        print(f"| {g} | {row['static']:.0f} | {row['free']:.0f} | {kept} | {regret} | {row['bar']:.0f} | {ok} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
