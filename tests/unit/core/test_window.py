"""Window resolution: Params first, then the data interval, else a loud failure."""

from datetime import datetime, timezone

import pytest

from gpupool.pipeline import Window, WindowError, resolve_window

T1 = datetime(2026, 5, 1, 10, tzinfo=timezone.utc)
T2 = datetime(2026, 5, 1, 11, tzinfo=timezone.utc)


def test_params_win_over_the_data_interval():
    w = resolve_window({"window_start": "2026-04-01T00:00:00Z", "window_end": "2026-04-02T00:00:00Z"}, T1, T2)
    assert w == Window(datetime(2026, 4, 1, tzinfo=timezone.utc), datetime(2026, 4, 2, tzinfo=timezone.utc))


def test_data_interval_when_no_params():
    assert resolve_window({"window_start": None, "window_end": None}, T1, T2) == Window(T1, T2)


def test_naive_params_are_utc():
    w = resolve_window({"window_start": "2026-04-01 00:00", "window_end": "2026-04-01 01:00"})
    assert w.start.tzinfo is not None and w.start.hour == 0


@pytest.mark.parametrize(
    "params, di, match",
    [
        ({}, (None, None), "no window"),
        ({}, (T1, T1), "no window"),  # an empty data interval (CronTriggerTimetable) is not a window
        ({"window_start": "2026-04-01T00:00:00Z"}, (T1, T2), "both window_start and window_end"),
        ({"window_start": "2026-04-02T00:00:00Z", "window_end": "2026-04-01T00:00:00Z"}, (None, None), "not after"),
    ],
)
def test_no_usable_window_fails_loudly(params, di, match):
    with pytest.raises(WindowError, match=match):
        resolve_window(params, *di)
