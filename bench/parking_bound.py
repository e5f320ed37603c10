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
more than 96 GPUs within the wake, or beyond the platform's nodes). On the tune grouping G1 over 6 days the what-if with a room of one node per
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
    args = ap.parse_args(argv)
    from pathlib import Path
    data, rounds = Path(args.data), groupings()
    lag = int(np.ceil((args.wake + 5) / 5 - 1e-9))  # the step of the jump, then the wake
    hold = int(np.ceil(args.hold / 5 - 1e-9))
    bars = [float(b) for b in args.bars.split(",")]
    print(f"Parking bound: {args.days:g} days, wake {args.wake:g} min, hold {args.hold:g} min, room chosen per "
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


if __name__ == "__main__":
    sys.exit(main())
