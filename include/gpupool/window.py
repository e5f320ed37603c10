"""The window every task is keyed on: a half-open interval ``[start, end)`` in UTC, resolved from
a run's Params first (UI triggers), then its data interval, never from ``now()``.

A leaf beside ``errors`` and ``values``: the pipeline, the CLI, the Airflow glue and the plugin
all resolve windows here.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pandas as pd

from gpupool.errors import UserError


class WindowError(UserError, ValueError):
    """No usable window: neither Params nor a data interval gave one."""


@dataclass(frozen=True)
class Window:
    """A half-open interval [start, end) in UTC."""

    start: datetime
    end: datetime

    def __post_init__(self) -> None:
        if self.start.tzinfo is None or self.end.tzinfo is None:
            raise WindowError(f"window bounds must be timezone-aware: {self.start} .. {self.end}")
        if self.end <= self.start:
            raise WindowError(f"window end {self.end.isoformat()} is not after start {self.start.isoformat()}")

    def __str__(self) -> str:
        return f"[{self.start.isoformat()}, {self.end.isoformat()})"

    def as_dict(self) -> dict[str, str]:
        return {"start": self.start.isoformat(), "end": self.end.isoformat()}

    @classmethod
    def from_dict(cls, d: dict[str, str]) -> "Window":
        return cls(parse_time(d["start"]), parse_time(d["end"]))


def parse_time(value: Any) -> datetime:
    """Parse an ISO time (or datetime); naive times are UTC. Anything else is a WindowError."""
    try:
        ts = pd.Timestamp(value)
        if ts is pd.NaT:
            raise ValueError
        if ts.tzinfo is None:
            ts = ts.tz_localize("UTC")
        # a year pandas holds but datetime does not (e.g. "-1", year -1) fails here
        return ts.tz_convert("UTC").to_pydatetime()
    except (ValueError, TypeError, OverflowError):
        raise WindowError(f"not a time: {str(value)[:80]!r} (give ISO 8601, e.g. 2026-11-01T00:00Z)") from None


def resolve_window(params: dict | None, data_interval_start: Any = None, data_interval_end: Any = None) -> Window:
    """Params first (UI triggers), then the data interval; fail loudly if neither exists."""
    params = params or {}
    ps, pe = params.get("window_start"), params.get("window_end")
    if ps or pe:
        if not (ps and pe):
            raise WindowError(f"give both window_start and window_end, got start={ps!r} end={pe!r}")
        return Window(parse_time(ps), parse_time(pe))
    if data_interval_start is not None and data_interval_end is not None:
        start, end = parse_time(data_interval_start), parse_time(data_interval_end)
        if end > start:
            return Window(start, end)
    raise WindowError(
        "no window: trigger with Params window_start/window_end, or run on a schedule whose "
        "runs have a data interval"
    )
