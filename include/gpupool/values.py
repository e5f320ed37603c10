"""Small conversions every layer needs, defined once: instants in UTC and strict JSON.

A leaf module (it imports nothing from gpupool) so that any stage may use it.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

import numpy as np
import pandas as pd


def utc(ts: Any) -> pd.Timestamp:
    """``ts`` as a tz-aware UTC :class:`pandas.Timestamp`; a naive time is taken to be UTC."""
    t = pd.Timestamp(ts)
    return t.tz_localize("UTC") if t.tzinfo is None else t.tz_convert("UTC")


def utc_datetime(ts: Any) -> datetime:
    """``ts`` as a tz-aware UTC :class:`datetime.datetime` (what the database driver binds)."""
    return utc(ts).to_pydatetime()


def utc_field(value: Any) -> Any:
    """A validator's reading of an instant: None and tz-aware datetimes as they are, anything
    else :func:`utc_datetime` (a naive time is UTC); ValueError naming what is not a timestamp."""
    if value is None or isinstance(value, datetime) and value.tzinfo is not None:
        return value
    try:
        return utc_datetime(value)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"not a timestamp: {value!r}") from exc


def jsonable(value: Any) -> Any:
    """A copy of ``value`` that ``json.dumps`` accepts strictly: mapping keys become strings,
    numpy scalars Python ones, tuples and arrays lists, non-finite floats None and timestamps
    ISO 8601 strings."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [jsonable(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (pd.Timestamp, datetime)):
        return value.isoformat()
    return value


def printable(value: Any) -> str:
    """``value`` as text a terminal shows as it is: control and other unprintable characters
    (terminal escapes, newlines, bidirectional overrides) written as Python escapes (``\\x1b``).
    For listings of what a platform or staging holds: a name is not a command to the terminal."""
    text = "" if value is None else str(value)
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)
