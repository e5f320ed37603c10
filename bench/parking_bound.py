"""How far a parking rule that reacts can go on the Helios traces: a hindsight bound.

    nice -n 10 .venv/bin/python bench/parking_bound.py [--days 31] [--groupings G1,G2,G3,G4,G5]

A rule that sees demand up to now and wakes a node in ``--wake`` minutes (plus the tick that reads
the jump) loses the part of every jump above the warm room it kept. This bench gives such a rule
every advantage the what-if does not: each platform's capacity is its own nodes (no moves, so
``off`` serves ``min(demand, capacity)``); a node with work a step ago stays on; a powered node
stays on while the platform's demand needed it in the last ``--hold`` minutes (the
``idle_minutes`` before parking); no cooldown after a wake; and the room, in nodes, is chosen per
platform and hour of the day KNOWING the whole run (greedy: the room that removes the most unmet
per kWh first). Idle energy is that of powered nodes without work at 1.4 kW; parked nodes draw
nothing. It prints, per grouping, the saving of such a rule at each bar of unmet added
(``--bars``, GPU-hours over the run); ``-`` where no room of up to 12 nodes per platform and hour
reaches the bar; the last column is the least unmet any such room reaches (what is left: jumps of
more than 96 GPUs within the wake, or beyond the platform's nodes). ``--foresight M`` gives the rule
M minutes of perfect foresight of demand (it reads the jump M minutes before it comes): how far
ahead a wake would have to be foreseen. ``--signals`` prints, instead, whether the readings foresee
the jumps that cost: of the steps whose demand passes the level read a wake and a tick before
plus ``--room`` nodes, the share that a rise in the 15 minutes before the read announced, and the
share that a jump within 30 minutes of the same time on one of the 3 days before announced, each
beside how often that signal fires and how often a jump follows it. On the tune grouping G1 over 6 days the what-if with a room of one node per
platform (``r1 b0`` of bench/parking_helios.py) saved 63 % for +42 GPU-h where this bound says
79 % for +19: the bound is kinder than the what-if, so a bar the bound misses, the what-if misses.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from allocate_helios import DATA, PLATFORMS, groupings, pool_nodes

from gpupool.sim.traces import read_helios

NODE_GPUS, IDLE_KW, STEP_H = 8, 1.4, 5 / 60
MAX_ROOM = 12


def platform_cells(demand: np.ndarray, hours: np.ndarray, nodes: int, lag: int, hold: int):
    """Per room (0..MAX_ROOM nodes) and hour of the day: unmet added (GPU-h) and idle kWh."""
    cap = nodes * NODE_GPUS
    served = np.minimum(demand, cap)
    busy = np.ceil(served / NODE_GPUS - 1e-9)
    level = np.ceil(demand / NODE_GPUS - 1e-9)
    # the level the rule could have powered by step j: demand read at j - lag or before, held `hold` steps
    pad = np.concatenate([np.full(lag + hold, level[0]), level])
    track = sliding_window_view(pad, hold + 1)[: len(demand)].max(axis=1)
    before = np.concatenate([[busy[0]], busy[:-1]])
    unmet = np.zeros((MAX_ROOM + 1, 24))
    idle = np.zeros((MAX_ROOM + 1, 24))
    for room in range(MAX_ROOM + 1):
        powered = np.maximum(np.minimum(nodes, track + room), before)
        lost = np.clip(served - powered * NODE_GPUS, 0, None) * STEP_H
        spent = (powered - np.minimum(busy, powered)) * IDLE_KW * STEP_H
        unmet[room] = np.bincount(hours, lost, minlength=24)
        idle[room] = np.bincount(hours, spent, minlength=24)
    off_idle = float((nodes - busy).sum() * IDLE_KW * STEP_H)
    return unmet, idle, off_idle


def frontier(cells):
    """(idle kWh, unmet added) as room is added where it removes the most unmet per kWh."""
    room = {(k, h): 0 for k in range(len(cells)) for h in range(24)}
    unmet = sum(c[0][0].sum() for c in cells)
    idle = sum(c[1][0].sum() for c in cells)
    out = [(idle, unmet)]
    while True:
        best = None
        for (k, h), r in room.items():
            if r >= MAX_ROOM:
                continue
            gain = cells[k][0][r, h] - cells[k][0][r + 1, h]
            cost = cells[k][1][r + 1, h] - cells[k][1][r, h]
            if gain > 1e-9 and (best is None or gain / max(cost, 1e-9) > best[0]):
                best = (gain / max(cost, 1e-9), k, h, gain, cost)
        if best is None:
            return out
        _, k, h, gain, cost = best
        room[(k, h)] += 1
        unmet, idle = unmet - gain, idle + cost
        out.append((idle, unmet))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--days", type=float, default=31)
    ap.add_argument("--data", default=str(DATA))
    ap.add_argument("--groupings", default="G1,G2,G3,G4,G5")
    ap.add_argument("--wake", type=float, default=10.0)
    ap.add_argument("--hold", type=float, default=30.0)
    ap.add_argument("--bars", default="60,30,15")
    ap.add_argument("--foresight", type=float, default=0.0, help="minutes of perfect foresight of demand")
    ap.add_argument("--signals", action="store_true", help="whether a rise or the daily rhythm foresees the jumps")
    ap.add_argument("--room", type=int, default=2, help="nodes of room kept above the level (--signals)")
    args = ap.parse_args(argv)
    from pathlib import Path
    data, rounds = Path(args.data), groupings()
    lag = max(0, int(np.ceil((args.wake + 5 - args.foresight) / 5 - 1e-9)))  # the step of the jump, then the wake
    hold = int(np.ceil(args.hold / 5 - 1e-9))
    if args.signals:
        return signals(args, data, rounds, lag)
    bars = [float(b) for b in args.bars.split(",")]
    ahead = f", foresight {args.foresight:g} min" if args.foresight else ""
    print(f"Parking bound: {args.days:g} days, wake {args.wake:g} min{ahead}, hold {args.hold:g} min, room chosen per "
          f"platform and hour knowing the run; pool 100 %\n")
    print("| grouping | idle kWh off | no room: saved / +unmet | " + " | ".join(
        f"+unmet <= {b:g}: saved" for b in bars) + f" | least +unmet: saved / +unmet |")
    print("|---|---:|---:|" + "---:|" * (len(bars) + 1))
    for g in [x.strip() for x in args.groupings.split(",") if x.strip()]:
        nodes = pool_nodes(rounds[g], data, 100)
        cells, off_idle = [], 0.0
        for platform, pair in zip(PLATFORMS, rounds[g]):
            frame = read_helios([data / f"{t}.csv" for t in pair], "5min")
            n = int(round(args.days * 288))
            unmet, idle, off = platform_cells(frame["demand"].to_numpy()[:n], frame.index[:n].hour.to_numpy(),
                                              nodes[platform], lag, hold)
            cells.append((unmet, idle))
            off_idle += off
        curve = frontier(cells)
        cols = []
        for b in bars:
            fit = [e for e, u in curve if u <= b + 1e-9]
            cols.append(f"{1 - min(fit) / off_idle:.0%}" if fit else "-")
        print(f"| {g} | {off_idle:.0f} | {1 - curve[0][0] / off_idle:.0%} / +{curve[0][1]:.0f} | " + " | ".join(cols)
              + f" | {1 - curve[-1][0] / off_idle:.0%} / +{curve[-1][1]:.0f} |")
    return 0


def jump_steps(served: np.ndarray, lag: int, room: int) -> np.ndarray:
    """The steps whose served demand passes the level read ``lag`` steps before plus ``room`` nodes."""
    level = np.ceil(served / NODE_GPUS - 1e-9)
    out = np.zeros(len(served), bool)
    out[lag:] = served[lag:] > (level[:len(served) - lag] + room) * NODE_GPUS + 1e-9
    return out


def signals(args, data, rounds, lag: int) -> int:
    """The ``--signals`` table (module docstring)."""
    day, before, near = 288, 3, 6  # steps a day, 15 min before the read, +-30 min
    print(f"Jump foresight: {args.days:g} days, wake {args.wake:g} min, room {args.room} node(s); a jump: demand "
          f"above the level read {lag * 5} min before plus the room\n")
    print("| grouping | jump steps | GPU-h above the room | after a rise: share (GPU-h) | rise fires on | jump after a rise "
          "| same time, last 3 days: share | it fires on | jump after it |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for g in [x.strip() for x in args.groupings.split(",") if x.strip()]:
        nodes = pool_nodes(rounds[g], data, 100)
        c = dict(n=0, gpuh=0.0, rise=0, rise_gpuh=0.0, rise_on=0, rise_hit=0, daily=0, daily_on=0, daily_hit=0, steps=0,
                 dsteps=0, dn=0)
        for platform, pair in zip(PLATFORMS, rounds[g]):
            frame = read_helios([data / f"{t}.csv" for t in pair], "5min")
            n = int(round(args.days * 288))
            served = np.minimum(frame["demand"].to_numpy()[:n], nodes[platform] * NODE_GPUS)
            level = np.ceil(served / NODE_GPUS - 1e-9)
            jump = jump_steps(served, lag, args.room)
            short = np.clip(served - (np.concatenate([np.full(lag, level[0]), level])[:len(served)] + args.room)
                            * NODE_GPUS, 0, None) * STEP_H
            j0 = lag + before
            rise = np.zeros(len(served), bool)
            rise[j0:] = level[j0 - lag:len(served) - lag] > level[j0 - lag - before:len(served) - lag - before]
            c["steps"] += len(served) - j0
            c["n"] += int(jump[j0:].sum())
            c["gpuh"] += float(short[j0:][jump[j0:]].sum())
            c["rise"] += int((jump & rise)[j0:].sum())
            c["rise_gpuh"] += float(short[j0:][(jump & rise)[j0:]].sum())
            c["rise_on"] += int(rise[j0:].sum())
            c["rise_hit"] += int((jump & rise)[j0:].sum())
            window = sliding_window_view(np.concatenate([np.zeros(near, bool), jump, np.zeros(near, bool)]),
                                         2 * near + 1).any(axis=1)  # a jump within +-30 min of each step
            for j in range(before * day, len(served)):
                daily = any(window[j - k * day] for k in range(1, before + 1))
                c["dsteps"] += 1
                c["daily_on"] += daily
                if jump[j]:
                    c["dn"] += 1
                    c["daily"] += daily
                c["daily_hit"] += daily and jump[j]
        pct = lambda a, b: f"{a / b:.0%}" if b else "-"  # noqa: E731
        print(f"| {g} | {c['n']} | {c['gpuh']:.0f} | {pct(c['rise'], c['n'])} ({c['rise_gpuh']:.0f}) | "
              f"{pct(c['rise_on'], c['steps'])} | {pct(c['rise_hit'], c['rise_on'])} | "
              f"{pct(c['daily'], c['dn'])} | {pct(c['daily_on'], c['dsteps'])} | "
              f"{pct(c['daily_hit'], c['daily_on'])} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
