"""The parking rules the Helios benches compare, and the energy table both print.

``bench/allocate_helios.py`` (its energy columns) and ``bench/parking_helios.py`` run each regime
(grouping and pool) with ``parking: off``, with gpupool's rule (the product defaults of the
scenario's ``parking:`` key, :class:`gpupool.sim.power.ParkingSpec`) and with the Slurm-style rule
per platform, all at the same ``wake_minutes``; this module names those rules and turns the
studies' totals (``idle_kwh``, ``parked_kwh``, ``wakes``, ``late_wakes``, ``unmet_gpu_hours``)
into the figures and the bars of issue 41.

Saved is ``1 - (idle_kwh + parked_kwh) / idle_kwh(off)``: the parked nodes' standby draw is charged.
"""

from __future__ import annotations

from typing import Mapping

from gpupool.sim.power import ParkingSpec
from gpupool.sim.scenario import Scenario

#: minutes to wake a node (the issue's bar is read at 10)
WAKE_MINUTES = 10.0
#: the warm buffers of the Slurm-style baseline (idle nodes kept per platform, ``SuspendExcNodes=...:N``)
SLURM_BUFFERS = (2, 4)
#: minutes a node is idle before the Slurm-style rule parks it (``SuspendTime``)
SLURM_IDLE_MINUTES = 30
#: the issue's bars on the held-out groupings: saved at least, unmet added at most
BAR_SAVED, BAR_ADDED = 0.55, 15.0

OFF = "off"
GPUPOOL = "gpupool"


def slurm_name(buffer: int) -> str:
    return f"slurm b{buffer}"


def rules(wake: float = WAKE_MINUTES, gpupool: Mapping | None = None,
          slurm_buffers=SLURM_BUFFERS) -> dict[str, dict | None]:
    """``off``, gpupool's rule (the product defaults, ``gpupool`` merged over them; None: left
    out) and the Slurm-style rule for each buffer: name -> the scenario's ``parking`` mapping."""
    base = {"wake_minutes": wake}
    out: dict[str, dict | None] = {OFF: None}
    if gpupool is not None:
        out[GPUPOOL] = {**base, **gpupool}
    for n in slurm_buffers:
        out[slurm_name(n)] = {**base, "scope": "platform", "buffer": int(n), "idle_minutes": SLURM_IDLE_MINUTES,
                              "cooldown_minutes": 0}
    return out


def with_parking(sc: Scenario, parking: Mapping | None) -> Scenario:
    """``sc`` with its ``parking`` set (None: off)."""
    return sc.model_copy(update={"parking": None if parking is None else ParkingSpec(**parking)})


def buffers(text: str) -> list[int]:
    """``--slurm-buffers`` ("2,4") as integers."""
    return [int(b) for b in text.split(",") if b.strip()]


def figures(off: Mapping, on: Mapping) -> tuple[float, float, int, int]:
    """(saved fraction, unmet GPU-h added, wakes, late wakes) of a run against ``parking: off``."""
    saved = 1 - (on["idle_kwh"] + on["parked_kwh"]) / off["idle_kwh"] if off["idle_kwh"] > 0 else 0.0
    return saved, on["unmet_gpu_hours"] - off["unmet_gpu_hours"], on["wakes"], on["late_wakes"]


def energy_table(totals: Mapping[tuple, Mapping], keys: list[tuple], names: list[str],
                 heads: tuple[str, str] = ("grouping", "pool"), unit: str = "%") -> dict:
    """Print, per regime ``(grouping, pool)`` (or what ``heads`` names, the second shown with
    ``unit``), the idle kWh and unmet with parking off and each rule's saved / +unmet / wakes
    (late), then the means; ``totals[(*key, rule)]`` is a study's totals (rule ``off``
    included). Returns ``{(key, rule): figures}``."""
    print(f"| {heads[0]} | {heads[1]} | idle kWh off | unmet off | " + " | ".join(
        f"{r}: saved / +unmet / wakes (late)" for r in names) + " |")
    print("|---|---:|---:|---:|" + "---:|" * len(names))
    fig = {(k, r): figures(totals[(*k, OFF)], totals[(*k, r)]) for k in keys for r in names}
    for k in keys:
        off = totals[(*k, OFF)]
        print(f"| {k[0]} | {k[1]:g}{unit} | {off['idle_kwh']:.0f} | {off['unmet_gpu_hours']:.0f} | " + " | ".join(
            f"{fig[(k, r)][0]:.0%} / {fig[(k, r)][1]:+.0f} / {fig[(k, r)][2]} ({fig[(k, r)][3]})" for r in names) + " |")

    def mean(r, i):
        return sum(fig[(k, r)][i] for k in keys) / len(keys)

    print("| mean | | | | " + " | ".join(
        f"{mean(r, 0):.0%} / {mean(r, 1):+.1f} / {mean(r, 2):.0f} ({mean(r, 3):.0f})" for r in names) + " |")
    return fig


def energy_bars(fig: Mapping, keys: list[tuple], slurms: list[str]) -> None:
    """Issue 41's bars: gpupool's mean saving and unmet added, against each Slurm-style rule on
    the mean and in every regime."""
    print()
    mean = {r: (sum(fig[(k, r)][0] for k in keys) / len(keys), sum(fig[(k, r)][1] for k in keys) / len(keys))
            for r in [GPUPOOL, *slurms]}
    s, u = mean[GPUPOOL]
    worst = max(keys, key=lambda k: (fig[(k, GPUPOOL)][1], -fig[(k, GPUPOOL)][0]))
    print(f"- mean: gpupool saves {s:.0%} (bar >= {BAR_SAVED:.0%}) with {u:+.1f} GPU-h unmet (bar <= +{BAR_ADDED:g}): "
          + ("MET" if s >= BAR_SAVED and u <= BAR_ADDED else "NOT MET"))
    print(f"- worst regime for unmet: {worst[0]} {worst[1]}%: saved {fig[(worst, GPUPOOL)][0]:.0%}, "
          f"{fig[(worst, GPUPOOL)][1]:+.1f} GPU-h")
    for r in slurms:
        rs, ru = mean[r]
        print(f"- mean against {r} ({rs:.0%}, {ru:+.1f}): better on both counts: "
              + ("MET" if s > rs and u < ru else "NOT MET"))
        bad = [f"{k[0]} {k[1]}%" for k in keys
               if not (fig[(k, GPUPOOL)][0] >= fig[(k, r)][0] and fig[(k, GPUPOOL)][1] < fig[(k, r)][1])]
        print("  every regime at least its saving with less unmet added: "
              + ("MET" if not bad else f"NOT MET in {len(bad)}/{len(keys)}: {', '.join(bad)}"))
