"""The planner's answer: the moves, the in-place MIG re-layouts and the plan that holds them.

Records only (:func:`gpupool.decisions.planner.plan` makes them; the jobs store them as
``allocation_plan`` rows and the what-if carries them out in its world).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import pandas as pd


@dataclass(frozen=True)
class Move:
    """One node to hand over from ``source`` to ``target``."""

    node: str
    source: str
    target: str
    gpus: int
    expected_gain: float  # GPU-hours of objective the move saves, other moves held fixed
    mig_layout: str | None  # the layout the node should have on arrival
    reason: str


@dataclass(frozen=True)
class LayoutChange:
    """A MIG re-layout of a node that stays on its platform."""

    node: str
    platform: str
    from_layout: str | None
    to_layout: str
    expected_gain: float
    reason: str


@dataclass(frozen=True)
class Plan:
    """The planner's answer: target owner of every node, the moves, and why."""

    at: pd.Timestamp | None
    policy: str
    solver: str  # "milp", "greedy" (fallback or forced) or "none" (nothing to decide)
    status: str
    moves: tuple[Move, ...]
    layout_changes: tuple[LayoutChange, ...]
    targets: dict[str, str]
    expected_unmet_before: dict[str, float]  # per platform, over the horizon, platform units x hours
    expected_unmet_after: dict[str, float]
    objective_before: float
    objective_after: float
    reasons: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict:
        """A JSON-ready dict."""
        out = asdict(self)
        out["at"] = None if self.at is None else self.at.isoformat()
        out["moves"] = [asdict(m) for m in self.moves]
        out["layout_changes"] = [asdict(c) for c in self.layout_changes]
        out["reasons"] = list(self.reasons)
        return out
