"""The KPI bench's scoring (bench/kpi_scoring.py) against small cases worked out by hand."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))

from kpi_scoring import Tally, event_counts, f1, pa_counts, segments  # noqa: E402


def _alarms(n, at):
    a = np.zeros(n, dtype=bool)
    a[list(at)] = True
    return a


def test_segments_are_runs_of_labels():
    lab = np.array([0, 1, 1, 0, 0, 1, 0, 1, 1, 1], dtype=bool)
    assert segments(lab) == [(1, 2), (5, 5), (7, 9)]
    assert segments(np.zeros(4, dtype=bool)) == []


def test_pa_counts_alarm_in_the_first_k_points_detects_the_whole_segment():
    segs = [(5, 14)]  # 10 points
    # row 11 is the segment's 7th point: detected with k = 7, all 10 points true positives
    assert pa_counts(_alarms(20, [11]), segs, k=7) == {"tp": 10, "fp": 0, "fn": 0}
    # row 12 is its 8th point: too late, all 10 points missed, and the late alarm is no false positive
    assert pa_counts(_alarms(20, [12]), segs, k=7) == {"tp": 0, "fp": 0, "fn": 10}
    # with k = 8 the same alarm is in time
    assert pa_counts(_alarms(20, [12]), segs, k=8) == {"tp": 10, "fp": 0, "fn": 0}
    # alarms outside the segment are false-positive points, one each
    assert pa_counts(_alarms(20, [0, 1, 5, 19]), segs, k=7) == {"tp": 10, "fp": 3, "fn": 0}


def test_pa_counts_short_segment_and_k_one():
    segs = [(3, 3), (8, 9)]
    # k = 1: only an alarm at a segment's first point counts
    assert pa_counts(_alarms(12, [3, 9]), segs, k=1) == {"tp": 1, "fp": 0, "fn": 2}
    assert pa_counts(_alarms(12, [3, 8]), segs, k=1) == {"tp": 3, "fp": 0, "fn": 0}
    with pytest.raises(ValueError):
        pa_counts(_alarms(12, []), segs, k=0)


def test_pa_counts_respect_the_scorable_mask():
    segs = [(2, 4), (10, 13)]
    scorable = np.arange(16) >= 6  # the first segment starts in the unscored part: not counted
    c = pa_counts(_alarms(16, [0, 3, 7, 15]), segs, k=7, scorable=scorable)
    # row 0 and row 3 are not scored; row 7 and row 15 are false positives; the second segment is missed
    assert c == {"tp": 0, "fp": 2, "fn": 4}
    sc2 = np.ones(16, dtype=bool)
    sc2[12] = False  # an unscored point inside a segment does not count as a segment point
    # first segment missed (3 points); the second found, 3 of its 4 points scored
    assert pa_counts(_alarms(16, [10]), segs, k=7, scorable=sc2) == {"tp": 3, "fp": 0, "fn": 3}


def test_event_counts_runs_of_false_alarms_count_once():
    segs = [(5, 9), (14, 15)]
    a = _alarms(20, [0, 1, 2, 9, 11, 17, 19])
    # segment 1 found (row 9, however late), segment 2 missed; false runs: 0-2, 11, 17, 19
    assert event_counts(a, segs) == {"found": 1, "missed": 1, "false_events": 4}
    # a false run touching a segment is cut by it: rows 3-4 and 10 are two runs
    assert event_counts(_alarms(20, [3, 4, 5, 10]), segs) == {"found": 1, "missed": 1, "false_events": 2}


def test_tally_pools_counts_before_taking_f1():
    t = Tally(k=7)
    t.add(_alarms(20, [5, 0]), [(5, 14)])  # tp 10, fp 1; found 1, false 1
    t.add(_alarms(10, []), [(2, 3)])  # fn 2; missed 1
    r = t.row()
    assert r["pa_f1"] == pytest.approx(f1(10, 1, 2)) == pytest.approx(20 / 23)
    assert r["pa_p"] == pytest.approx(10 / 11) and r["pa_r"] == pytest.approx(10 / 12)
    assert r["ev_p"] == pytest.approx(0.5) and r["ev_r"] == pytest.approx(0.5) and r["ev_f1"] == pytest.approx(0.5)
    assert (r["found"], r["segments"], r["false_events"]) == (1, 2, 1)
    assert r["alarm_rate"] == pytest.approx(2 / 30)
    assert f1(0, 3, 4) == 0.0


def test_injected_segments_stay_in_the_scored_part_and_change_only_labelled_points():
    from detect_kpi import inject

    rng = np.random.default_rng(3)
    values = 50.0 + rng.normal(0.0, 1.0, 5000)
    excluded = np.zeros(5000, dtype=bool)
    excluded[3000:3500] = True
    x, labels = inject(values, 750, excluded, share=0.03, seed=7)
    assert not labels[:750].any() and not labels[3000:3500].any()
    assert np.array_equal(x != values, labels)  # every labelled point moved, nothing else did
    share = labels.sum() / (~excluded[750:]).sum()
    assert 0.03 <= share < 0.03 + 60 / 3750  # reaches the share, overshooting by at most one segment
    segs = segments(labels)
    assert all(1 <= b - a + 1 <= 60 for a, b in segs)
    # segments are kept apart so that each is judged on a past free of the previous one
    assert all(a2 - b1 > 60 for (_, b1), (a2, _) in zip(segs, segs[1:]))
    # a count (never negative) is never pushed below zero
    counts = rng.poisson(2.0, 5000).astype(float)
    y, lab = inject(counts, 750, np.zeros(5000, dtype=bool), share=0.03, seed=1)
    assert y.min() >= 0.0 and lab.any()
