"""Reading canonical series from Prometheus with `query_range`, chunked and step-aligned.

Used by the Slurm source (Slurm exporter + DCGM exporter) and by the Kubernetes source
for past windows (kube-state-metrics + DCGM exporter). Each canonical metric maps to
one `MetricQuery`: a PromQL expression plus how to name the entity of each returned
series from its labels.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
import requests
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from urllib3.util.retry import Retry

from gpupool.canonical import (
    CANONICAL_METRICS,
    HEALTH_ENTITY_KIND,
    HEALTH_METRICS,
    CanonicalFrameError,
    empty_samples,
    health_target,
    normalize_samples,
)
from gpupool.sources.base import (
    NodeShard,
    PermanentError,
    RetryPolicy,
    SourceError,
    TransientError,
    aligned_points,
    call_with_retry,
    timed_out,
    chunk_range,
    format_window,
    redact_url,
    step_seconds,
)

log = logging.getLogger(__name__)

#: Prometheus refuses a query_range with more than 11,000 points per series.
PROMETHEUS_MAX_POINTS = 11_000
#: points per chunk we ask for, with a margin under the hard limit
DEFAULT_CHUNK_POINTS = 10_000
#: listing a platform's nodes reads a grid this coarse (Prometheus' default lookback: an
#: instant sees the newest sample of the 5 minutes before it, so none is stepped over)
LISTING_STEP_S = 300
#: the largest magnitude a reading may have: no canonical metric comes near it (a GPU's memory in
#: bytes is far below), so a larger one is a broken exporter, and sums of it overflow downstream
MAX_ABS_VALUE = 1e15
#: a point's time, in seconds since the epoch, lies in 1970-01-01 .. 2200-01-01
MAX_POINT_TIME_S = 7_258_118_400

_LABEL_FIELD = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass(frozen=True)
class TargetHealth:
    """How Prometheus says the readings of one canonical metric were made (each PromQL; "" = not read).

    up:      the scrape targets' `up`, e.g. `up{job="slurm-exporter"}` (0: the scrape failed)
    stamp:   the samples' own times, e.g. `min(timestamp(slurm_gpus_alloc))`: the oldest is
             the one that says whether any of the metric's series stopped advancing
    scraped: `scrape_samples_scraped` of the targets (0: the target answered with nothing)

    Several series answer (targets, or groups): the worst of them at each instant is staged
    (`up` and `scraped` their least, the sample age its greatest), as a health series per
    target (`gpupool.canonical.HEALTH_METRICS`).
    """

    up: str = ""
    stamp: str = ""
    scraped: str = ""

    def mapped(self, fn) -> "TargetHealth":
        """The same health with ``fn`` applied to each PromQL that is read (e.g. added matchers)."""
        return TargetHealth(*(fn(q) if q else q for q in (self.up, self.stamp, self.scraped)))

    def queries(self) -> list[tuple[str, str]]:
        """(health metric, PromQL) of the parts that are read."""
        parts = (("health_up", self.up), ("health_sample_age_seconds", self.stamp),
                 ("health_samples_scraped", self.scraped))
        return [(m, q) for m, q in parts if q]


@dataclass(frozen=True)
class MetricQuery:
    """How one canonical metric is read from Prometheus.

    expr:        PromQL, evaluated with query_range; its result labels name the entity
    entity_kind: canonical entity kind of every returned series ("node", "gpu", ...)
    entity:      template over result labels, e.g. "{Hostname}/gpu{gpu}"; "" for a
                 platform-wide series
    unit:        canonical unit; None takes the unit of the canonical metric
    cluster:     template over result labels for the cluster column ("" = source's cluster)
    node_label:  the label naming the node in every series `expr` selects ("" = none): such
                 a query can be read for a subset of nodes (one shard of a large platform)
                 by adding a matcher on this label to each of its selectors
    health:      how the metric's readings were made (`TargetHealth`), staged beside them
                 as the metric's health series; None: the source gives no such evidence
    """

    expr: str
    entity_kind: str
    entity: str = ""
    unit: str | None = None
    cluster: str = ""
    node_label: str = ""
    health: TargetHealth | None = None

    def labels_needed(self) -> set[str]:
        """The result labels the templates refer to."""
        return set(_LABEL_FIELD.findall(self.entity)) | set(_LABEL_FIELD.findall(self.cluster))


class PrometheusReader:
    """Run `MetricQuery`s over a window and return canonical samples.

    Connection parameters are explicit: `url`, optional `bearer_token` or
    `basic_auth=(user, password)`, `timeout` seconds per HTTP request, `retry` policy,
    `verify` (TLS). Credentials live only in the HTTP session, never in messages.
    """

    def __init__(
        self,
        url: str,
        *,
        platform: str,
        bearer_token: str | None = None,
        basic_auth: tuple[str, str] | None = None,
        timeout: float = 30.0,
        retry: RetryPolicy = RetryPolicy(),
        verify: bool = True,
        chunk_points: int = DEFAULT_CHUNK_POINTS,
    ):
        if not 1 <= chunk_points <= PROMETHEUS_MAX_POINTS:
            raise ValueError(f"chunk_points must be in 1..{PROMETHEUS_MAX_POINTS}")
        self.url = url.rstrip("/")
        self.platform = platform
        self.timeout = timeout
        self.retry = retry
        self.chunk_points = chunk_points
        headers = {"Authorization": f"Bearer {bearer_token}"} if bearer_token else None
        # Retries are ours (bounded, logged, classified); the client's adapter must not add its own.
        self._client = PrometheusConnect(
            url=self.url,
            headers=headers,
            auth=basic_auth,
            disable_ssl=not verify,
            retry=Retry(total=0, raise_on_status=False, redirect=0),
            timeout=timeout,
        )

    @property
    def endpoint(self) -> str:
        """The query_range endpoint, without credentials."""
        return redact_url(f"{self.url}/api/v1/query_range")

    def close(self) -> None:
        """Release the HTTP session."""
        self._client.close()

    def read(
        self,
        queries: Mapping[str, MetricQuery | Sequence[MetricQuery]],
        start: datetime,
        end: datetime,
        step: str | int = "5min",
        cluster: str = "",
        shard: NodeShard | None = None,
    ) -> pd.DataFrame:
        """Canonical samples of every query in `queries` for `[start, end)`.

        `queries` maps a canonical metric to one MetricQuery or several (e.g. the same
        metric per GPU and per job). With `shard`, only the queries kept per node (a
        `node_label`) restricted to the shard's nodes, or (a platform-wide shard) only the
        others: the parts of a sharded platform together read each series exactly once.

        The evaluation grid is aligned to the epoch on `step`, so re-runs and adjacent
        windows see the same instants; long windows are split into chunks of at most
        `chunk_points` points. Any failure raises one SourceError for the window.
        """
        window = format_window(start, end)
        step_s = step_seconds(step)
        grid = aligned_points(start, end, step_s)
        if grid is None:
            return empty_samples()
        chunks = chunk_range(grid[0], grid[1], step_s, self.chunk_points)
        parts = []
        for metric, qs in queries.items():
            found = 0
            for query in shard_queries(as_query_tuple(qs), shard):
                for lo, hi in chunks:
                    part = self._read_one(metric, query, lo, hi, step_s, cluster, window)
                    found += len(part)
                    parts.append(part)
            if not found and shard is None:
                # Not an error (a quiet cluster has no jobs), but a missing exporter looks the same.
                log.warning("%s %s [%s]: no series for %s", self.platform, self.endpoint, window, metric)
            health = next((q.health for q in as_query_tuple(qs) if q.health is not None), None)
            if health is not None and (shard is None or shard.platform_wide):
                # a target's health is platform-wide: read once, by the part that reads the platform
                for lo, hi in chunks:
                    parts.append(self._read_health(metric, health, lo, hi, step_s, cluster, window))
        parts = [p for p in parts if len(p)]
        if not parts:
            return empty_samples()
        frame = pd.concat(parts, ignore_index=True)
        try:
            return normalize_samples(frame, where=f"{self.platform} {self.endpoint} [{window}]")
        except CanonicalFrameError as exc:
            raise SourceError(self.platform, self.endpoint, window, f"result is not canonical: {exc}") from exc

    def node_names(
        self,
        queries: Mapping[str, MetricQuery | Sequence[MetricQuery]],
        start: datetime,
        end: datetime,
        step: str | int = "5min",
    ) -> list[str]:
        """The names of the nodes with series in `[start, end)`, sorted: for each distinct
        `node_label` of the queries, the label's values over the first query that has it.

        Read on a grid of a multiple of `step` no coarser than `LISTING_STEP_S` (Prometheus'
        lookback, so no sample of the window is stepped over) with `count by (label)`, so the answer is one
        series per node, not the queries' data."""
        window = format_window(start, end)
        base = step_seconds(step)
        step_s = base * max(1, LISTING_STEP_S // base)  # a multiple of the step, at most 5 min unless the step is more
        grid = aligned_points(start, end, step_s)
        names: set[str] = set()
        if grid is None:
            return []
        seen: set[str] = set()
        for metric, qs in queries.items():
            for query in as_query_tuple(qs):
                if not query.node_label or query.node_label in seen:
                    continue
                seen.add(query.node_label)
                expr = f"count by ({query.node_label}) ({query.expr})"
                for lo, hi in chunk_range(grid[0], grid[1], step_s, self.chunk_points):
                    def describe(exc: BaseException, metric=metric, lo=lo, hi=hi) -> SourceError:
                        return SourceError(self.platform, self.endpoint, window,
                                           f"listing nodes by {query.node_label} of {metric} "
                                           f"(chunk {format_window(lo, hi)}): {exc}")

                    result = call_with_retry(lambda: self._fetch(expr, lo, hi, step_s), policy=self.retry,
                                             describe=describe)
                    for series in result or []:
                        name = (series.get("metric") or {}).get(query.node_label)
                        if name:
                            names.add(name)
        return sorted(names)

    def instant_sum(self, expr: str, at: datetime, what: str) -> float | None:
        """The sum over the series `expr` answers at the instant `at` (`/api/v1/query`), or None
        when it answers no series at all. `what` names the reading in errors. NaN/Inf points
        (PromQL's "no value") count as absent."""
        endpoint = redact_url(f"{self.url}/api/v1/query")
        window = format_window(at)

        def describe(exc: BaseException) -> SourceError:
            return SourceError(self.platform, endpoint, window, f"{what} ({expr}): {exc}")

        def fetch() -> list[dict[str, Any]]:
            return self._classified(lambda: self._client.custom_query(expr, params={"time": at.timestamp()}))

        result = call_with_retry(fetch, policy=self.retry, describe=describe)
        if not isinstance(result, list):
            raise describe(PermanentError(f"malformed payload: result is {type(result).__name__}, not a vector"))
        values = []
        for series in result:
            try:
                values.append(float(series["value"][1]))
            except (KeyError, IndexError, TypeError, ValueError, OverflowError) as exc:
                raise describe(PermanentError("malformed payload: a sample is not [ts, value]")) from exc
        values = [v for v in values if np.isfinite(v)]
        if any(abs(v) > MAX_ABS_VALUE for v in values):
            raise describe(PermanentError(f"malformed payload: a value beyond ±{MAX_ABS_VALUE:g}"))
        return float(sum(values)) if values else None

    def _fetch(self, expr: str, lo: datetime, hi: datetime, step_s: int) -> list[dict[str, Any]]:
        return self._classified(
            lambda: self._client.custom_query_range(expr, start_time=lo, end_time=hi, step=str(step_s)))

    def _classified(self, call) -> Any:
        """Run one client call, classifying its failures as transient or permanent."""
        try:
            return call()
        except requests.Timeout as exc:  # ConnectTimeout is a ConnectionError too: this first
            raise TransientError(f"{type(exc).__name__}: no answer within {self.timeout}s") from exc
        except requests.ConnectionError as exc:
            if timed_out(exc):  # a read that timed out inside the body comes wrapped as a ConnectionError
                raise TransientError(f"ReadTimeout: no answer within {self.timeout}s") from exc
            raise TransientError(f"connection refused or unreachable ({type(exc).__name__})") from exc
        except PrometheusApiClientException as exc:
            status, detail = _status_of(str(exc))
            if status in (408, 429) or status >= 500:
                raise TransientError(f"HTTP {status}{detail}") from exc
            if status in (401, 403):
                raise PermanentError(f"authentication refused (HTTP {status})") from exc
            raise PermanentError(f"HTTP {status}{detail}") from exc
        except (ValueError, KeyError, TypeError, OverflowError) as exc:
            raise PermanentError(f"malformed payload ({type(exc).__name__})") from exc
        except RecursionError as exc:  # JSON nested deeper than the parser recurses
            raise PermanentError("malformed payload (nested too deeply)") from exc

    def _read_health(
        self, metric: str, health: TargetHealth, lo: datetime, hi: datetime, step_s: int, cluster: str, window: str
    ) -> pd.DataFrame:
        """The health rows of `metric` over one chunk: per instant, the worst of the series each
        of `health`'s queries answers."""
        chunk = format_window(lo, hi)
        parts = []
        for name, expr in health.queries():
            def describe(exc: BaseException, name=name) -> SourceError:
                return SourceError(self.platform, self.endpoint, window, f"{name} of {metric} (chunk {chunk}): {exc}")

            result = call_with_retry(lambda expr=expr: self._fetch(expr, lo, hi, step_s), policy=self.retry,
                                     describe=describe)
            try:
                rows = _result_to_frame(result, self.platform, cluster, name, MetricQuery(expr, HEALTH_ENTITY_KIND))
            except PermanentError as exc:
                raise describe(exc) from exc
            if rows.empty:
                continue
            if name == "health_sample_age_seconds":
                rows["value"] = (rows["ts"] - pd.Timestamp(0, tz="UTC")).dt.total_seconds() - rows["value"]
                worst = rows.groupby("ts", sort=True)["value"].max()
            else:
                worst = rows.groupby("ts", sort=True)["value"].min()
            parts.append(pd.DataFrame({
                "platform": self.platform, "cluster": cluster, "entity_kind": HEALTH_ENTITY_KIND,
                "entity_id": health_target(metric), "metric": name, "ts": worst.index,
                "value": worst.to_numpy(float), "unit": HEALTH_METRICS[name],
            }))
        return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()

    def _read_one(
        self,
        metric: str,
        query: MetricQuery,
        lo: datetime,
        hi: datetime,
        step_s: int,
        cluster: str,
        window: str,
    ) -> pd.DataFrame:
        chunk = format_window(lo, hi)

        def describe(exc: BaseException) -> SourceError:
            return SourceError(self.platform, self.endpoint, window, f"{metric} (chunk {chunk}): {exc}")

        result = call_with_retry(lambda: self._fetch(query.expr, lo, hi, step_s), policy=self.retry, describe=describe)
        try:
            return _result_to_frame(result, self.platform, cluster, metric, query)
        except PermanentError as exc:
            raise describe(exc) from exc


#: PromQL words that are never a metric name (aggregations, keywords, set operators)
_GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
_KEYWORDS = _GROUPING | {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
                         "bottomk", "topk", "quantile", "limitk", "limit_ratio", "bool", "and", "or",
                         "unless", "offset", "atan2", "inf", "nan", "start", "end"}
_STRING = r""""(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`"""
_TOKEN = re.compile(
    rf"(?P<string>{_STRING})"
    r"|(?P<range>\[[^\]]*\])"
    rf"|(?P<braces>\{{(?:[^}}\"'`]|{_STRING})*\}})"
    r"|(?P<number>(?:0x[0-9a-fA-F]+|\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|\.\d+)[a-z]*)"
    r"|(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)"
)
_LABEL_LIST = re.compile(r"\s*\([^)]*\)")


def with_label_matcher(expr: str, label: str, op: str, value: str) -> str:
    """`expr` with the matcher `label op "value"` added to every vector selector.

    A selector is a metric name (not a function, aggregation or keyword, nor a label of a
    `by (...)`/`on (...)` list) with or without `{...}`, or a bare `{...}`. Strings, ranges,
    numbers and durations are left alone. `value` is written as a PromQL double-quoted string.
    """
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", label) or op not in ("=", "!=", "=~", "!~"):
        raise ValueError(f"not a label matcher: {label!r} {op!r}")
    quoted = '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    matcher = f"{label}{op}{quoted}"
    out: list[str] = []
    pos = 0
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if m is None:  # an operator, a parenthesis, white space
            out.append(expr[pos])
            pos += 1
            continue
        text, kind = m.group(0), m.lastgroup
        pos = m.end()
        if kind == "braces":
            inner = text[1:-1].strip().rstrip(",").strip()
            out.append("{" + (inner + ", " if inner else "") + matcher + "}")
        elif kind == "name":
            rest = expr[pos:].lstrip()
            word = text.lower()
            if word in _GROUPING:
                out.append(text)
                lst = _LABEL_LIST.match(expr, pos)  # its label list names labels, not series
                if lst:
                    out.append(lst.group(0))
                    pos = lst.end()
            elif word in _KEYWORDS or rest.startswith("(") or rest.startswith("{"):
                out.append(text)  # a function or keyword; or a name whose braces come next
            else:
                out.append(text + "{" + matcher + "}")
        else:
            out.append(text)
    return "".join(out)


def node_regex(names) -> str:
    """A regular expression (RE2 and Python alike) matching exactly the given node names."""
    return "|".join(re.sub(r"([.^$*+?()\[\]{}|\\])", r"\\\1", n) for n in names)


def shard_queries(queries: Sequence[MetricQuery], shard: NodeShard | None) -> list[MetricQuery]:
    """The queries one shard runs: all (no shard); those kept per node, restricted to the
    shard's nodes; or (a platform-wide shard) those not kept per node."""
    if shard is None:
        return list(queries)
    if shard.platform_wide:
        return [q for q in queries if not q.node_label]
    if not shard.nodes:
        return []
    regex = node_regex(shard.nodes)
    return [replace(q, expr=with_label_matcher(q.expr, q.node_label, "=~", regex))
            for q in queries if q.node_label]


def as_query_tuple(q: MetricQuery | Sequence[MetricQuery]) -> tuple[MetricQuery, ...]:
    """One query or several, as a tuple."""
    return (q,) if isinstance(q, MetricQuery) else tuple(q)


def _status_of(message: str) -> tuple[int, str]:
    """Status code and a short detail from a prometheus-api-client error message."""
    m = re.search(r"HTTP Status Code (\d+)", message)
    status = int(m.group(1)) if m else 0
    detail = ""
    e = re.search(r'"error"\s*:\s*"((?:[^"\\]|\\.){0,300})', message)
    if e:
        detail = ": " + re.sub(r"\\+(.)", r"\1", e.group(1))
    return status, detail


def _result_to_frame(
    result: Any, platform: str, cluster: str, metric: str, query: MetricQuery
) -> pd.DataFrame:
    """Canonical rows (not yet normalized) from a query_range `result` list.

    Raises PermanentError on a payload that is not a matrix of [ts, "value"] pairs, whose
    times are not instants of 1970..2200, whose values exceed ±MAX_ABS_VALUE, or whose series
    lack a label the entity template needs. NaN/Inf values (PromQL's "no value", e.g. 0/0)
    are dropped: a missing point is an absent row.
    """
    if not isinstance(result, list):
        raise PermanentError(f"malformed payload: result is {type(result).__name__}, not a matrix")
    unit = query.unit or CANONICAL_METRICS.get(metric, "")
    need = query.labels_needed()
    ts_all: list[Any] = []
    val_all: list[Any] = []
    ent_all: list[str] = []
    clu_all: list[str] = []
    for series in result:
        try:
            labels = series["metric"]
            values = series["values"]
            if not isinstance(labels, dict) or not isinstance(values, list):
                raise TypeError
        except (KeyError, TypeError) as exc:
            raise PermanentError("malformed payload: a series without metric/values") from exc
        missing = need - labels.keys()
        if missing:
            raise PermanentError(f"series {labels} lacks label(s) {sorted(missing)} for entity {query.entity!r}")
        entity = query.entity.format_map(labels)
        clu = query.cluster.format_map(labels) if query.cluster else cluster
        n = len(values)
        try:
            ts_all.extend(v[0] for v in values)
            val_all.extend(v[1] for v in values)
        except (IndexError, KeyError, TypeError) as exc:  # KeyError: a point given as an object
            raise PermanentError("malformed payload: a point is not [ts, value]") from exc
        ent_all.extend([entity] * n)
        clu_all.extend([clu] * n)
    if not ts_all:
        return pd.DataFrame()
    try:
        ts = np.asarray(ts_all, dtype="float64")
        vals = np.asarray(val_all).astype("float64")
    except (TypeError, ValueError, OverflowError) as exc:
        raise PermanentError("malformed payload: non-numeric timestamp or value") from exc
    if vals.ndim != 1 or ts.ndim != 1:
        raise PermanentError("malformed payload: a point is not [ts, value]")
    with np.errstate(invalid="ignore"):
        bad_ts = ~((ts >= 0) & (ts <= MAX_POINT_TIME_S))
        big = np.isfinite(vals) & (np.abs(vals) > MAX_ABS_VALUE)
    if bad_ts.any():
        raise PermanentError(f"malformed payload: a point's time {ts[bad_ts][0]:g} is not an instant of 1970..2200")
    if big.any():
        raise PermanentError(f"malformed payload: value {vals[big][0]:g} is beyond ±{MAX_ABS_VALUE:g}")
    keep = np.isfinite(vals)
    dropped = int((~keep).sum())
    if dropped:
        log.info("%s %s: dropped %d non-finite points", platform, metric, dropped)
    n = int(keep.sum())
    return pd.DataFrame(
        {
            "platform": platform,
            "cluster": np.asarray(clu_all, dtype=object)[keep],
            "entity_kind": query.entity_kind,
            "entity_id": np.asarray(ent_all, dtype=object)[keep],
            "metric": metric,
            "ts": pd.to_datetime((ts[keep] * 1_000_000).round().astype("int64"), unit="us", utc=True),
            "value": vals[keep],
            "unit": unit,
        },
        index=pd.RangeIndex(n),
    )

