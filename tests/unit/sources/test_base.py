"""Windows, steps, chunks, retries and redaction shared by every source."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupool.sources.base import (
    PermanentError,
    RetryPolicy,
    SourceError,
    Source,
    TransientError,
    aligned_points,
    call_with_retry,
    chunk_range,
    format_window,
    redact_url,
    step_seconds,
)

T0 = datetime(2026, 1, 5, tzinfo=timezone.utc)


@pytest.mark.parametrize("step,seconds", [("5min", 300), ("5m", 300), ("30s", 30), ("1h", 3600), (60, 60),
                                          ("120", 120), (timedelta(minutes=2), 120)])
def test_step_seconds(step, seconds):
    assert step_seconds(step) == seconds


@pytest.mark.parametrize("step", ["0s", "-5min", "1.5s", 0])
def test_bad_steps(step):
    with pytest.raises(ValueError):
        step_seconds(step)


def test_aligned_points_exclude_the_end_and_follow_the_epoch():
    assert aligned_points(T0, T0 + timedelta(hours=1), 300) == (T0, T0 + timedelta(minutes=55))
    first, last = aligned_points(T0 + timedelta(seconds=1), T0 + timedelta(minutes=11), 300)
    assert (first, last) == (T0 + timedelta(minutes=5), T0 + timedelta(minutes=10))
    assert aligned_points(T0 + timedelta(seconds=1), T0 + timedelta(seconds=299), 300) is None
    with pytest.raises(ValueError, match="empty window"):
        aligned_points(T0, T0, 60)
    with pytest.raises(ValueError, match="no time zone"):
        aligned_points(datetime(2026, 1, 5), datetime(2026, 1, 6), 60)


@given(st.integers(0, 20_000), st.integers(1, 11_000), st.sampled_from([15, 60, 300]))
def test_chunks_cover_the_grid_once(n_points, max_points, step_s):
    last = T0 + timedelta(seconds=step_s * n_points)
    chunks = chunk_range(T0, last, step_s, max_points)
    assert chunks[0][0] == T0 and chunks[-1][1] == last
    total = 0
    for (lo, hi), nxt in zip(chunks, chunks[1:] + [None]):
        points = int((hi - lo).total_seconds() // step_s) + 1
        assert 1 <= points <= max_points
        total += points
        if nxt:
            assert nxt[0] == hi + timedelta(seconds=step_s)
    assert total == n_points + 1


def test_retry_is_bounded_and_classified():
    calls, sleeps = [], []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise TransientError("HTTP 503")
        return "ok"

    describe = lambda exc: SourceError("p", "http://h/x", "w", str(exc))  # noqa: E731
    assert call_with_retry(flaky, policy=RetryPolicy(3, 1.0, 1.5), describe=describe, sleep=sleeps.append) == "ok"
    assert len(sleeps) == 2 and 0.5 <= sleeps[0] <= 1.0 and 0.75 <= sleeps[1] <= 1.5

    def always():
        calls.append(1)
        raise TransientError("HTTP 503")

    calls.clear()
    with pytest.raises(SourceError) as err:
        call_with_retry(always, policy=RetryPolicy(4, 0), describe=describe, sleep=lambda s: None)
    assert len(calls) == 4 and err.value.retryable

    def denied():
        calls.append(1)
        raise PermanentError("authentication refused (HTTP 401)")

    calls.clear()
    with pytest.raises(SourceError) as err:
        call_with_retry(denied, policy=RetryPolicy(4, 0), describe=describe, sleep=lambda s: None)
    assert len(calls) == 1 and not err.value.retryable


def test_source_error_names_everything_but_credentials():
    err = SourceError("slurm-hpc", "https://svc:pa55@prom.example/api/v1/query_range?token=abc&x=1",
                      format_window(T0, T0 + timedelta(hours=1)), "HTTP 500")
    text = str(err)
    assert "pa55" not in text and "abc" not in text and "svc" not in text
    assert text == ("slurm-hpc: https://prom.example/api/v1/query_range?token=***&x=1 "
                    "[2026-01-05T00:00:00Z/2026-01-05T01:00:00Z]: HTTP 500")
    assert redact_url("http://h:9090") == "http://h:9090"


def test_every_source_follows_the_protocol():
    from gpupool.sources.kubernetes import KubernetesSource
    from gpupool.sources.nvml import NvmlSource
    from gpupool.sources.openstack import OpenStackSource
    from gpupool.sources.slurm import SlurmSource

    for cls in (KubernetesSource, NvmlSource, OpenStackSource, SlurmSource):
        assert callable(getattr(cls, "inventory")) and callable(getattr(cls, "usage"))
    assert isinstance(SlurmSource("s", live_tolerance=None), Source)


def test_source_class_lookup():
    from gpupool.sources import source_class
    from gpupool.sources.slurm import SlurmSource

    assert source_class("slurm") is SlurmSource
    with pytest.raises(ValueError, match="unknown platform kind 'lsf'"):
        source_class("lsf")


def test_a_read_timeout_wrapped_as_a_connection_error_is_a_timeout_and_a_refusal_is_not():
    """requests wraps urllib3's read timeout raised while a body streams as a ConnectionError; a
    source must still say it had no answer in time, and say "refused" only of a refusal (urllib3's
    NewConnectionError is a ConnectTimeoutError subclass, so the order matters)."""
    import requests
    import urllib3

    from gpupool.sources.base import timed_out

    read = requests.ConnectionError(urllib3.exceptions.ReadTimeoutError(None, "/api/v1/query_range", "Read timed out."))
    refused = urllib3.exceptions.NewConnectionError(None, "Connection refused")
    assert timed_out(read)
    assert not timed_out(requests.ConnectionError(refused))
    assert not timed_out(requests.ConnectionError(urllib3.exceptions.MaxRetryError(None, "/", refused)))
    assert not timed_out(requests.ConnectionError("Connection aborted."))
