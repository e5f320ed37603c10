"""The plan stage's output: one `allocation_plan` row per decision.

This module knows its table and no stage. Plans are appended, never replaced: each decision
(a rerun of a window too) gets a row of its own, which the handovers it leads to refer to.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.engine import Engine

from gpupool.staging.schema import allocation_plan
from gpupool.values import jsonable


def insert_plan(engine: Engine, decided_at: datetime, *, policy: str, solver: str, dry_run: bool,
                summary: dict, moves: list) -> int:
    """Insert a plan decided at `decided_at` (its `summary` and `moves` stored as JSON) and
    return its id."""
    with engine.begin() as conn:
        res = conn.execute(
            allocation_plan.insert().values(
                decided_at=decided_at, policy=policy, solver=solver, dry_run=dry_run,
                summary=jsonable(summary), moves=jsonable(moves),
            )
        )
        return res.inserted_primary_key[0]
