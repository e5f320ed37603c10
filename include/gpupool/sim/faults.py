"""Telemetry faults: what breaks between a platform's true usage and what its exporter reports.

A scenario's optional ``faults:`` key corrupts the demand telemetry the pipeline *sees*
(platform-level ``gpu_allocated`` and ``gpu_pending``) and never the true demand the world
serves, so a study measures what cleaning is worth::

    faults: {seed: 7, drop: 2, spike: 2, gap: 2, reset: 0.5, stuck: 0.5}

Rates are events per series per day (Poisson); absent keys are zero and an absent ``faults:``
key means clean telemetry. Each event:

* ``drop`` — the value reads 0 for 1-3 steps (a scrape that found no exporter);
* ``spike`` — the value reads 3-6 times itself (at least +8) for one step;
* ``gap`` — 1-6 steps are missing (no row at all);
* ``reset`` — a restarted exporter: 0 at the first step, then back to the truth over 3 steps;
* ``stuck`` — the value of the event's first step is repeated for 6-24 steps (30 min to 2 h at
  5-minute steps).

Events are drawn once per series from ``seed`` and the platform and metric names, so every policy
of a study sees the same faults.
"""

from __future__ import annotations

import zlib

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

FAULT_KINDS = ("drop", "spike", "gap", "reset", "stuck")


class FaultSpec(BaseModel):
    """Rates (events per series per day) of each telemetry fault, and the seed that places them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seed: int = 0
    drop: float = Field(0.0, ge=0)
    spike: float = Field(0.0, ge=0)
    gap: float = Field(0.0, ge=0)
    reset: float = Field(0.0, ge=0)
    stuck: float = Field(0.0, ge=0)

    def any(self) -> bool:
        """Whether any fault has a positive rate."""
        return any(getattr(self, k) > 0 for k in FAULT_KINDS)


def fault_plan(spec: FaultSpec, platform: str, metric: str, steps: int, steps_per_day: float) -> dict[str, np.ndarray]:
    """Per step of one series: ``scale`` and ``add`` (seen = scale * true + add), ``hold`` (repeat
    the value of the step given, -1 none) and ``gap`` (no row). Deterministic in its arguments."""
    salt = zlib.crc32(f"{platform}/{metric}".encode())
    rng = np.random.default_rng([spec.seed, salt])
    scale = np.ones(steps)
    add = np.zeros(steps)
    hold = np.full(steps, -1, dtype=np.int64)
    gap = np.zeros(steps, dtype=bool)
    for kind in FAULT_KINDS:  # a fixed order keeps the draws reproducible
        rate = getattr(spec, kind) / steps_per_day
        if rate <= 0:
            continue
        starts = np.flatnonzero(rng.random(steps) < rate)
        for s in starts:
            if kind == "drop":
                scale[s : s + int(rng.integers(1, 4))] = 0.0
            elif kind == "spike":
                scale[s] = float(rng.uniform(3.0, 6.0))
                add[s] = 8.0
            elif kind == "gap":
                gap[s : s + int(rng.integers(1, 7))] = True
            elif kind == "reset":
                ramp = np.array([0.0, 1 / 3, 2 / 3])[: steps - s]
                scale[s : s + len(ramp)] = ramp
            elif kind == "stuck":
                hold[s : s + int(rng.integers(6, 25))] = s
    return {"scale": scale, "add": add, "hold": hold, "gap": gap}


def corrupt(values: np.ndarray, plan: dict[str, np.ndarray], i0: int, i1: int) -> tuple[np.ndarray, np.ndarray]:
    """``(seen values, kept mask)`` at steps ``[i0, i1)`` of the true series ``values`` under ``plan``.

    ``values`` is the whole true series from step 0 (a stuck value repeats a step that may lie
    before ``i0``).
    """
    sl = slice(i0, i1)
    hold = plan["hold"][sl]
    base = np.where(hold >= 0, values[np.clip(hold, 0, None)], values[sl])
    return base * plan["scale"][sl] + plan["add"][sl], ~plan["gap"][sl]
