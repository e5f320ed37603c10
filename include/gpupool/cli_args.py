"""The command line's options, checked before a command touches staging, a file or a platform:
a value out of range is one :class:`~gpupool.errors.UsageError` naming the option, and what it
echoes of the value is a short prefix with its control characters escaped.

Cheap to import (the CLI loads it before it knows the command): pandas and the stages are
imported inside the checks that need them.
"""

from __future__ import annotations

import math
import re
from typing import Any

from gpupool.errors import UsageError

#: the issue and decision times `--at` may name: the hour before and a year of horizon after
#: stay inside what datetimes and staging's timestamps hold
EARLIEST_AT, LATEST_AT = "1970-01-01T00:00Z", "2200-01-01T00:00Z"
#: a what-if's move time: a node moving longer than a year serves nobody in any study
MAX_MOVE_MINUTES = 366 * 24 * 60.0
#: a platform's name as platforms.yaml allows it (gpupool.config.PlatformConfig.name)
PLATFORM_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
#: the longest ``--reason`` an operator's park or wake is audited with
MAX_REASON = 200
#: what a message echoes of a bad value, at most
ECHO = 60


def echo(value: Any) -> str:
    """``value`` as a message may show it: its first :data:`ECHO` characters, quoted, with
    control characters (terminal escapes, newlines) escaped, and ``…`` when it was cut."""
    text = str(value)
    return repr(text[:ECHO]) + ("…" if len(text) > ECHO else "")


def instant(value: Any, option: str = "--at"):
    """``value`` as an aware UTC datetime; a time that does not parse, or outside
    EARLIEST_AT..LATEST_AT, is a UsageError naming ``option``."""
    from gpupool.window import WindowError, parse_time

    try:
        at = parse_time(value)
    except WindowError:
        raise UsageError(f"{option} {echo(value)}: not a time (give ISO 8601, e.g. 2026-11-01T00:00Z)") from None
    if not parse_time(EARLIEST_AT) <= at <= parse_time(LATEST_AT):
        raise UsageError(f"{option} {echo(value)}: give a time from {EARLIEST_AT[:10]} to {LATEST_AT[:10]}")
    return at


def duration(value: Any, option: str):
    """``value`` as a positive :class:`pandas.Timedelta` (``5min``, ``1h``); else a UsageError."""
    import pandas as pd

    try:
        step = pd.Timedelta(str(value))
    except (ValueError, TypeError, OverflowError):
        step = None
    if step is None or step is pd.NaT or step <= pd.Timedelta(0):
        raise UsageError(f"{option} {echo(value)}: give a positive duration such as 5min")
    return step


def platform_name(value: Any, option: str = "--platform") -> str:
    """``value`` if it can name a configured platform (lowercase letters, digits, ``_`` and ``-``,
    at most 64 characters), else a UsageError that echoes a short prefix of it."""
    if not isinstance(value, str) or not PLATFORM_NAME.fullmatch(value):
        raise UsageError(f"{option} {echo(value)}: not a platform name (lowercase letters, digits, _ and -, "
                         "at most 64 characters)")
    return value


def check_options(args) -> None:
    """Every option of the parsed ``args`` that can be checked without staging or a file:
    times, the what-if's step and move time, platform and node names, an audit's reason. Raises the first
    UsageError."""
    for option in ("at", "start", "end"):
        value = getattr(args, option, None)
        if value is not None:
            instant(value, f"--{option}")
    platforms = getattr(args, "platform", None)
    for name in platforms if isinstance(platforms, list) else [platforms] if platforms is not None else []:
        platform_name(name)
    if getattr(args, "node", None) is not None:
        from gpupool.collector import check_node

        check_node(args.node)
    if getattr(args, "step", None) is not None:
        duration(args.step, "--step")
    reason = getattr(args, "reason", None)
    if reason is not None and (not reason.strip() or not reason.isprintable() or len(reason) > MAX_REASON):
        raise UsageError(f"--reason {echo(reason)}: give a short printable line (at most {MAX_REASON} characters)")
    minutes = getattr(args, "move_minutes", None)
    if minutes is not None and not (math.isfinite(minutes) and 0 <= minutes <= MAX_MOVE_MINUTES):
        raise UsageError(f"--move-minutes {minutes}: give minutes from 0 to {MAX_MOVE_MINUTES:.0f} (a year)")
