"""What every platform source shares: the error it raises, retries, windows and records.

A source reads one platform through its own API and returns either inventory records
(`inventory(at)`) or a canonical long frame (`usage(start, end, step)`). Whatever goes
wrong on the way — the service is down, refuses the credentials, answers 4xx/5xx,
times out or returns something that does not parse — ends in exactly one
`SourceError` that names the platform, the endpoint and the window, and never a
credential.
"""

from __future__ import annotations

import logging
import math
import random
import re
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Iterable, Mapping, Protocol, TypeVar, runtime_checkable

import pandas as pd

from gpupool.errors import UserError

log = logging.getLogger(__name__)

T = TypeVar("T")

#: keys of one inventory record, in order
INVENTORY_KEYS = (
    "node",
    "platform",
    "gpus",
    "gpu_model",
    "mig_layout",
    "schedulable",
    "drain_reason",
    "busy_gpus",
)


class SourceError(UserError, RuntimeError):
    """One failed extraction: which platform, which endpoint, which window, and why.

    The message is built only from these four fields; callers pass an endpoint without
    user info (see `redact_url`) and a reason that never quotes a credential.
    `retryable` tells whether trying the same call again later may succeed
    (timeouts, 5xx, refused connections) or not (auth failure, 4xx, bad payload).
    `unrecoverable` says the data asked for no longer exists anywhere (live-only state
    asked for a past window): the window is recorded as such, never as an empty success.
    """

    def __init__(self, platform: str, endpoint: str, window: str, reason: str, *, retryable: bool = False,
                 unrecoverable: bool = False, connection: str | None = None):
        self.platform = platform
        self.endpoint = redact_url(endpoint)
        self.window = window
        self.reason = reason
        self.retryable = retryable
        self.unrecoverable = unrecoverable
        self.connection = connection
        where = self.endpoint
        if connection is not None:  # the connection by its id; of the endpoint only what follows its address
            where = " ".join(f"connection {connection!r} {_ADDRESS.sub('', self.endpoint)}".split())
            reason = _ADDRESS.sub("<address>", reason)
        super().__init__(f"{platform}: {where} [{window}]: {reason}")

    def naming(self, connection: str) -> "SourceError":
        """This error with its message naming the platform's connection by its id in place of the
        endpoint's address (scheme, host, port): never any part of the connection's URI."""
        return SourceError(self.platform, self.endpoint, self.window, self.reason, retryable=self.retryable,
                           unrecoverable=self.unrecoverable, connection=connection)


@dataclass(frozen=True)
class NodeShard:
    """Which part of a platform's series one extraction reads (a large platform is extracted
    in parts that run side by side, see `gpupool.pipeline.plan_extract`).

    `nodes` given: only the series kept per node (or per GPU of a node), of these nodes.
    `nodes` None: every other series (platform, partition and job level).
    """

    nodes: tuple[str, ...] | None

    @property
    def platform_wide(self) -> bool:
        return self.nodes is None


class TransientError(Exception):
    """A failure worth retrying (timeout, connection refused, 5xx, 429)."""


class PermanentError(Exception):
    """A failure that retrying cannot fix (auth, 4xx, malformed payload)."""


@dataclass(frozen=True)
class Pressure:
    """One platform's pressure now, from a cheap instant read (`pressure(at)`), for the fast path.

    at:              the instant the reading describes
    gpus_allocated:  GPUs in use on the nodes open to new work
    gpus_pending:    GPUs asked for by work the platform cannot place now (0 where the platform
                     has no notion of pending work; `notes` then says so)
    gpus_capacity:   GPUs of the nodes open to new work (not drained, cordoned, disabled or held)
    idle_nodes:      names (the platform's own) of whole nodes open to work with nothing running
    node_gpus:       GPUs of every GPU node the platform reports (open or not), by its own name
    nodes_open:      how many nodes are open to new work
    provenance:      field -> where it was read (endpoint, query), as the platform gave it
    notes:           what a reader must know about the reading (a series absent, a fallback)
    """

    platform: str
    at: datetime
    gpus_allocated: float
    gpus_pending: float
    gpus_capacity: float
    idle_nodes: tuple[str, ...] = ()
    node_gpus: Mapping[str, int] = field(default_factory=dict)
    nodes_open: int = 0
    provenance: Mapping[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def __post_init__(self):
        for name in ("gpus_allocated", "gpus_pending", "gpus_capacity"):
            value = getattr(self, name)
            if not math.isfinite(float(value)) or float(value) < 0:
                raise ValueError(f"{self.platform} pressure at {format_window(self.at)}: {name} is {value!r}, "
                                 "not a finite count >= 0")
        unknown = [n for n in self.idle_nodes if n not in self.node_gpus]
        if unknown:
            raise ValueError(f"{self.platform} pressure: idle nodes {unknown} have no GPU count in node_gpus")

    @property
    def gpus_free(self) -> float:
        """GPUs open to work and not in use."""
        return max(0.0, float(self.gpus_capacity) - float(self.gpus_allocated))

    @property
    def gpus_short(self) -> float:
        """Pending GPUs beyond the free ones: what the platform cannot place with what it has."""
        return max(0.0, float(self.gpus_pending) - self.gpus_free)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (what staging records as the pressure seen)."""
        return {
            "platform": self.platform, "at": as_utc(self.at).isoformat(),
            "gpus_allocated": float(self.gpus_allocated), "gpus_pending": float(self.gpus_pending),
            "gpus_capacity": float(self.gpus_capacity), "gpus_free": self.gpus_free,
            "idle_nodes": list(self.idle_nodes), "nodes_open": int(self.nodes_open),
            "node_gpus": {k: int(v) for k, v in sorted(self.node_gpus.items())},
            "provenance": dict(self.provenance), "notes": list(self.notes),
        }


def pressure_from_records(platform: str, at: datetime, records: Iterable[Mapping[str, Any]], *,
                          pending: float, provenance: Mapping[str, str], notes: Iterable[str] = (),
                          allocated: float | None = None, capacity: float | None = None) -> Pressure:
    """A :class:`Pressure` from inventory records (`INVENTORY_KEYS`) and a pending count.

    Capacity and allocation count the nodes open to new work (`schedulable`) unless given (e.g.
    read from an exporter); a node is idle when it is open to work and none of its GPUs is busy.
    """
    recs = list(records)
    open_ = [r for r in recs if r["schedulable"]]
    return Pressure(
        platform=platform, at=as_utc(at, "at"),
        gpus_allocated=float(sum(r["busy_gpus"] for r in open_)) if allocated is None else float(allocated),
        gpus_pending=float(pending),
        gpus_capacity=float(sum(r["gpus"] for r in open_)) if capacity is None else float(capacity),
        idle_nodes=tuple(sorted(r["node"] for r in open_ if int(r["busy_gpus"]) == 0 and int(r["gpus"]) > 0)),
        node_gpus={r["node"]: int(r["gpus"]) for r in recs},
        nodes_open=len(open_),
        provenance=dict(provenance), notes=tuple(notes),
    )


@runtime_checkable
class Source(Protocol):
    """The interface every platform source implements."""

    platform: str

    def inventory(self, at: datetime) -> list[dict[str, Any]]:
        """GPU nodes as records with the keys in `INVENTORY_KEYS`, as seen at `at`."""

    def usage(self, start: datetime, end: datetime, step: str = "5min") -> pd.DataFrame:
        """Canonical samples (see `gpupool.canonical`) for the window `[start, end)`.

        A source that can read a platform in parts also takes `shard=NodeShard(...)` and
        has `node_names(start, end, step)`: the nodes whose series exist in the window."""

    def pressure(self, at: datetime) -> Pressure:
        """The platform's pressure now (a cheap instant read, not a window): GPUs allocated,
        pending and open, and its idle whole nodes. Live only, like `inventory`."""


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded retries with exponential backoff and jitter.

    `attempts` counts every try (1 = no retry). The wait before try n+1 is
    `min(max_delay, base_delay * 2**(n-1))` scaled by a random factor in [0.5, 1].
    """

    attempts: int = 3
    base_delay: float = 0.5
    max_delay: float = 8.0

    def delays(self) -> list[float]:
        """The waits between tries, before jitter."""
        return [min(self.max_delay, self.base_delay * 2**i) for i in range(max(0, self.attempts - 1))]


NO_RETRY = RetryPolicy(attempts=1)


def call_with_retry(
    fn: Callable[[], T],
    *,
    policy: RetryPolicy,
    describe: Callable[[BaseException], SourceError],
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Call `fn` until it succeeds, retrying `TransientError` under `policy`.

    `PermanentError` (and anything the caller did not classify) is not retried.
    Every failure ends in the `SourceError` that `describe(last_exception)` builds,
    so the caller decides the wording once. The exception's text is logged only
    through that SourceError, which carries no credential.
    """
    delays = policy.delays()
    for attempt in range(policy.attempts):
        try:
            return fn()
        except TransientError as exc:
            if attempt >= len(delays):
                err = describe(exc)
                err.retryable = True
                raise err from exc
            wait = delays[attempt] * (0.5 + random.random() / 2)
            log.warning("%s; retry %d/%d in %.2fs", describe(exc), attempt + 1, len(delays), wait)
            sleep(wait)
        except PermanentError as exc:
            raise describe(exc) from exc
    raise AssertionError("unreachable")  # pragma: no cover


_USERINFO = re.compile(r"(?<=://)[^/@\s]*@")
#: the scheme and authority of a URL (``https://user@host:port``), what a connection's id replaces
_ADDRESS = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/\s]*|unix:\S*?\.sock")
_SECRET_QUERY = re.compile(r"(?i)([?&](?:token|password|passwd|secret|api_key|apikey|access_token)=)[^&\s]*")


def redact_url(url: str) -> str:
    """`url` without user info (`user:pass@`) or secret-looking query parameters."""
    return _SECRET_QUERY.sub(r"\1***", _USERINFO.sub("", str(url)))


def as_utc(ts: datetime | str | pd.Timestamp, name: str = "timestamp") -> datetime:
    """A tz-aware UTC datetime; naive inputs are refused (their zone is a guess)."""
    t = pd.Timestamp(ts)
    if t.tzinfo is None:
        raise ValueError(f"{name} {ts!r} has no time zone; pass a tz-aware UTC timestamp")
    return t.tz_convert("UTC").to_pydatetime()


def format_window(start: datetime, end: datetime | None = None) -> str:
    """`start/end` in ISO 8601 UTC, the way every SourceError names its window."""
    fmt = "%Y-%m-%dT%H:%M:%SZ"
    s = as_utc(start).strftime(fmt)
    return s if end is None else f"{s}/{as_utc(end).strftime(fmt)}"


def step_seconds(step: str | int | float | timedelta) -> int:
    """A step as whole seconds: accepts "5min", "30s", "1h", 300, timedelta(minutes=5)."""
    if isinstance(step, timedelta):
        seconds = step.total_seconds()
    elif isinstance(step, (int, float)):
        seconds = float(step)
    else:
        text = str(step).strip()
        if re.fullmatch(r"\d+", text):
            seconds = float(text)
        else:
            # Prometheus spells minutes "m"; pandas reads "m" as minutes too but warns.
            text = re.sub(r"(?<=\d)m$", "min", text)
            seconds = pd.Timedelta(text).total_seconds()
    if seconds <= 0 or seconds != int(seconds):
        raise ValueError(f"step {step!r} must be a positive whole number of seconds")
    return int(seconds)


def aligned_points(start: datetime, end: datetime, step_s: int) -> tuple[datetime, datetime] | None:
    """First and last evaluation instants of `[start, end)` on the epoch grid of `step_s`.

    Aligning to the epoch (not to `start`) makes two overlapping windows evaluate at the
    same instants, so a re-run or an adjacent window yields the same timestamps.
    Returns None when no grid point falls inside the window.
    """
    s = as_utc(start, "start").timestamp()
    e = as_utc(end, "end").timestamp()
    if e <= s:
        raise ValueError(f"empty window {format_window(start, end)}")
    first = math.ceil(s / step_s) * step_s
    last = math.ceil(e / step_s) * step_s - step_s  # strictly before end
    if last < first:
        return None
    return (datetime.fromtimestamp(first, timezone.utc), datetime.fromtimestamp(last, timezone.utc))


def chunk_range(first: datetime, last: datetime, step_s: int, max_points: int) -> list[tuple[datetime, datetime]]:
    """Split the grid `first, first+step, ..., last` into inclusive ranges of at most `max_points`."""
    if max_points < 1:
        raise ValueError("max_points must be >= 1")
    out = []
    span = timedelta(seconds=step_s * (max_points - 1))
    cur = first
    while cur <= last:
        stop = min(last, cur + span)
        out.append((cur, stop))
        cur = stop + timedelta(seconds=step_s)
    return out


def inventory_record(
    *,
    node: str,
    platform: str,
    gpus: int,
    gpu_model: str | None,
    mig_layout: dict[str, int] | None,
    schedulable: bool,
    drain_reason: str | None,
    busy_gpus: int,
) -> dict[str, Any]:
    """One inventory record with every key of `INVENTORY_KEYS`, values checked."""
    if gpus < 0 or busy_gpus < 0:
        raise ValueError(f"{platform}/{node}: negative GPU count")
    return {
        "node": str(node),
        "platform": str(platform),
        "gpus": int(gpus),
        "gpu_model": gpu_model or None,
        "mig_layout": dict(mig_layout) if mig_layout else None,
        "schedulable": bool(schedulable),
        "drain_reason": drain_reason or None,
        "busy_gpus": int(busy_gpus),
    }


def records_to_samples(rows: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """A frame with the canonical columns from dict rows (not yet normalized)."""
    from gpupool.canonical import SAMPLE_COLUMNS

    return pd.DataFrame(list(rows), columns=SAMPLE_COLUMNS)


def timed_out(exc: BaseException) -> bool:
    """Whether a requests ConnectionError stands for a timeout (urllib3's read timeout raised while
    the body streamed, which requests wraps as a ConnectionError), not a refused connection."""
    import urllib3

    seen, cause = set(), exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        reason = getattr(cause, "reason", None)
        for e in (cause, reason):
            if isinstance(e, urllib3.exceptions.NewConnectionError):  # a ConnectTimeoutError subclass
                return False
            if isinstance(e, (urllib3.exceptions.TimeoutError, TimeoutError)):
                return True
        nxt = cause.args[0] if cause.args and isinstance(cause.args[0], BaseException) else None
        cause = nxt or cause.__cause__ or cause.__context__
    return False
