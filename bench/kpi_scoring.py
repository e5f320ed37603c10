"""Segment-labelled anomaly scoring as the AIOps KPI challenge does it, for binary alarms.

A label is a set of anomaly SEGMENTS (runs of consecutive labelled points). Per file, on the
points marked scorable (points outside it are neither alarms nor labels; a segment whose
first point is not scorable is not counted):

- point-adjusted F1 with delay k (`pa_counts`): a segment counts as wholly detected (all its
  points true positives) when an alarm falls within its first k points; otherwise all its
  points are false negatives, whatever alarms come later in it. An alarm outside every
  segment is a false-positive point. Alarms inside a segment are never false positives.
- event F1 (`event_counts`): a segment is found when any alarm falls in it (recall over
  segments); a run of consecutive false alarms (alarms outside segments at adjacent points)
  is one false event; precision = found / (found + false events).

Counts are pooled over files before the F1 is taken (`f1`), as the challenge pooled its KPIs.
"""

from __future__ import annotations

import numpy as np

#: the challenge's delay: a segment is detected by an alarm within its first k points
DELAY_K = 7


def segments(labels: np.ndarray) -> list[tuple[int, int]]:
    """(first, last) rows, inclusive, of each run of True in `labels`."""
    lab = np.asarray(labels, dtype=bool)
    edges = np.diff(np.concatenate([[0], lab.astype(np.int8), [0]]))
    return [(int(a), int(b) - 1) for a, b in zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1))]


def _mask(n: int, scorable: np.ndarray | None) -> np.ndarray:
    return np.ones(n, dtype=bool) if scorable is None else np.asarray(scorable, dtype=bool)


def _segment_hits(alarms: np.ndarray, segs: list[tuple[int, int]], k: int | None,
                  scorable: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, list[tuple[int, bool]]]:
    """Scorable alarms, the mask of segment points, and per scored segment (scorable points, hit):
    hit = an alarm in its first `k` points (any point when `k` is None). A segment whose first
    point is not scorable is not scored."""
    a = np.asarray(alarms, dtype=bool)
    ok = _mask(a.size, scorable)
    a = a & ok
    in_seg = np.zeros(a.size, dtype=bool)
    hits = []
    for left, right in segs:
        in_seg[left : right + 1] = True
        if ok[left]:
            stop = right + 1 if k is None else min(left + k, right + 1)
            hits.append((int(ok[left : right + 1].sum()), bool(a[left:stop].any())))
    return a, in_seg, hits


def pa_counts(alarms: np.ndarray, segs: list[tuple[int, int]], k: int = DELAY_K,
              scorable: np.ndarray | None = None) -> dict:
    """Point-adjusted counts tp, fp, fn (points) with delay `k` for one file."""
    if k < 1:
        raise ValueError("k must be at least 1 (the segment's first point)")
    a, in_seg, hits = _segment_hits(alarms, segs, k, scorable)
    tp = sum(size for size, hit in hits if hit)
    fn = sum(size for size, hit in hits if not hit)
    return {"tp": tp, "fp": int(np.count_nonzero(a & ~in_seg)), "fn": fn}


def event_counts(alarms: np.ndarray, segs: list[tuple[int, int]], scorable: np.ndarray | None = None) -> dict:
    """Event counts for one file: found and missed segments, false events (runs of false alarms)."""
    a, in_seg, hits = _segment_hits(alarms, segs, None, scorable)
    found = sum(1 for _, hit in hits if hit)
    false = a & ~in_seg
    edges = np.diff(np.concatenate([[0], false.astype(np.int8)]))
    return {"found": found, "missed": len(hits) - found, "false_events": int(np.count_nonzero(edges == 1))}


def f1(tp: float, fp: float, fn: float) -> float:
    """F1 from counts (0 when nothing is right)."""
    return 2.0 * tp / (2.0 * tp + fp + fn) if tp else 0.0


class Tally:
    """PA and event counts pooled over files; `row()` gives precision, recall and F1 of both."""

    def __init__(self, k: int = DELAY_K) -> None:
        self.k = k
        self.c = {"tp": 0, "fp": 0, "fn": 0, "found": 0, "missed": 0, "false_events": 0, "alarms": 0, "points": 0}

    def add(self, alarms: np.ndarray, segs: list[tuple[int, int]], scorable: np.ndarray | None = None) -> None:
        a = np.asarray(alarms, dtype=bool)
        ok = _mask(a.size, scorable)
        for key, val in {**pa_counts(a, segs, self.k, ok), **event_counts(a, segs, ok)}.items():
            self.c[key] += val
        self.c["alarms"] += int(np.count_nonzero(a & ok))
        self.c["points"] += int(ok.sum())

    def row(self) -> dict:
        c = self.c
        pa_p = c["tp"] / (c["tp"] + c["fp"]) if c["tp"] + c["fp"] else 0.0
        pa_r = c["tp"] / (c["tp"] + c["fn"]) if c["tp"] + c["fn"] else 0.0
        ev_p = c["found"] / (c["found"] + c["false_events"]) if c["found"] + c["false_events"] else 0.0
        ev_r = c["found"] / (c["found"] + c["missed"]) if c["found"] + c["missed"] else 0.0
        return {
            "pa_p": pa_p, "pa_r": pa_r, "pa_f1": f1(c["tp"], c["fp"], c["fn"]),
            "ev_p": ev_p, "ev_r": ev_r, "ev_f1": 2 * ev_p * ev_r / (ev_p + ev_r) if ev_p + ev_r else 0.0,
            "found": c["found"], "segments": c["found"] + c["missed"], "false_events": c["false_events"],
            "alarm_rate": c["alarms"] / c["points"] if c["points"] else 0.0,
        }
