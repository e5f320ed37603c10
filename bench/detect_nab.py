"""Benchmark the detect stage on NAB: the router against each detector alone and a baseline.

    .venv/bin/python bench/detect_nab.py [--groups realTweets ...] [--limit N] [--methods auto sr ...]

For every series of the chosen NAB groups (default: all five `real*` groups), each method
flags points streaming (a point is judged on the points before it; the first 15% of a
series, NAB's probationary period, is history only). Counts are pooled over all series:

- point-adjusted F1 with delay k = 7: a labelled window counts as detected in full when a
  flag falls in its first k + 1 points, else it is missed in full; flags outside windows
  are false positives one by one;
- window F1: a window is found when any flag falls in it; precision is the share of flag
  events (runs of consecutive flagged points) that touch a window;
- precision, recall (point-adjusted), flag rate and seconds per 1,000 points.

- label PA-F1: the same point-adjusted F1, but each positive segment starts at NAB's
  labelled anomaly point (combined_labels.json) and runs to its window's end; flags in the
  window before the label are ignored. NAB windows open long before the anomaly they are
  centred on, so the window-based score mostly measures flags that happen to fall early in
  a window; this one measures whether the anomaly itself is flagged within k points.

`chance` is the expected point-adjusted F1 of flagging points independently at random at
the router's flag rate: this metric rewards flagging often, and the line says how much of
a score that alone explains.
The baseline is a rolling median/MAD detector (previous `BASE_WINDOW` points, flag beyond
`BASE_K` robust sigmas) run on the same points in the same process.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from gpupool.detect.clean import detect_and_clean
from gpupool.detect.router import RouterConfig
from gpupool.tsio import read_series_csv

GROUPS = ["realAWSCloudwatch", "realAdExchange", "realKnownCause", "realTraffic", "realTweets"]
DELAY_K = 7
WARMUP_SHARE = 0.15
BASE_WINDOW = 96
BASE_K = 4.0
DEFAULT_NAB = Path(__file__).resolve().parents[2] / "shared" / "data" / "nab"


def load_windows(nab: Path) -> dict[str, list[tuple[pd.Timestamp, pd.Timestamp]]]:
    """NAB's labelled anomaly windows per relative file name."""
    raw = json.loads((nab / "labels" / "combined_windows.json").read_text())
    return {k: [(pd.Timestamp(a), pd.Timestamp(b)) for a, b in v] for k, v in raw.items()}


def load_labels(nab: Path) -> dict[str, list[pd.Timestamp]]:
    """NAB's labelled anomaly points per relative file name."""
    raw = json.loads((nab / "labels" / "combined_labels.json").read_text())
    return {k: [pd.Timestamp(a) for a in v] for k, v in raw.items()}


def label_segments(index: pd.DatetimeIndex, labels, wins: list[np.ndarray]) -> list[np.ndarray]:
    """Rows from each labelled point to the end of the window that holds it."""
    out = []
    for ts in labels:
        p = int(index.searchsorted(ts))
        for rows in wins:
            if rows[0] <= p <= rows[-1]:
                out.append(np.arange(p, rows[-1] + 1))
                break
    return out


def window_rows(index: pd.DatetimeIndex, windows) -> list[np.ndarray]:
    """Row positions (file order) inside each labelled window."""
    out = []
    for a, b in windows:
        rows = np.flatnonzero((index >= a) & (index <= b))
        if rows.size:
            out.append(rows)
    return out


def baseline_flags(y: pd.Series, score_from: int) -> np.ndarray:
    """Rolling median/MAD on the previous BASE_WINDOW points; flag beyond BASE_K robust sigmas."""
    s = pd.Series(y.to_numpy(dtype="float64"))
    past = s.shift(1).rolling(BASE_WINDOW, min_periods=BASE_WINDOW // 2)
    med = past.median()
    mad = (s.shift(1) - med).abs().rolling(BASE_WINDOW, min_periods=BASE_WINDOW // 2).median() * 1.4826
    flags = ((s - med).abs() > BASE_K * mad.where(mad > 0)).to_numpy().copy()
    flags[:score_from] = False
    return flags


class Counts:
    """Pooled confusion counts for one method."""

    def __init__(self) -> None:
        self.tp = self.fp = self.fn = 0
        self.win_found = self.win_total = 0
        self.events = self.events_in = 0
        self.flags = self.points = 0
        self.seconds = 0.0
        self.chance_tp = self.chance_fp = self.chance_fn = 0.0

    def add(self, flags: np.ndarray, wins: list[np.ndarray], judged: np.ndarray) -> None:
        """Add one series' flags (file order) against its windows."""
        in_win = np.zeros(flags.size, dtype=bool)
        for rows in wins:
            in_win[rows] = True
            first = rows[: DELAY_K + 1]
            hit = bool(flags[first].any())
            self.tp += rows.size if hit else 0
            self.fn += 0 if hit else rows.size
            self.win_total += 1
            self.win_found += int(flags[rows].any())
        self.fp += int(np.count_nonzero(flags & ~in_win))
        edges = np.diff(np.concatenate([[0], flags.astype(np.int8), [0]]))
        for a, b in zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)):
            self.events += 1
            self.events_in += int(in_win[a:b].any())
        self.flags += int(flags.sum())
        self.points += int(judged.sum())

    def add_chance(self, rate: float, wins: list[np.ndarray], judged: np.ndarray, n: int) -> None:
        """Expected counts of flagging each judged point independently with probability `rate`."""
        in_win = np.zeros(n, dtype=bool)
        for rows in wins:
            in_win[rows] = True
            first = rows[: DELAY_K + 1]
            k = int(judged[first].sum())
            p_hit = 1.0 - (1.0 - rate) ** k
            self.chance_tp += p_hit * rows.size
            self.chance_fn += (1.0 - p_hit) * rows.size
        self.chance_fp += rate * float(np.count_nonzero(judged & ~in_win))

    def metrics(self) -> dict:
        p = self.tp / (self.tp + self.fp) if self.tp + self.fp else 0.0
        r = self.tp / (self.tp + self.fn) if self.tp + self.fn else 0.0
        f1 = 2 * p * r / (p + r) if p + r else 0.0
        wr = self.win_found / self.win_total if self.win_total else 0.0
        wp = self.events_in / self.events if self.events else 0.0
        wf1 = 2 * wp * wr / (wp + wr) if wp + wr else 0.0
        return {
            "pa_f1": f1,
            "precision": p,
            "recall": r,
            "window_f1": wf1,
            "window_precision": wp,
            "window_recall": wr,
            "flag_rate": self.flags / self.points if self.points else 0.0,
            "s_per_1k": 1000.0 * self.seconds / self.points if self.points else 0.0,
        }

    def chance_f1(self) -> float:
        tp, fp, fn = self.chance_tp, self.chance_fp, self.chance_fn
        return 2 * tp / (2 * tp + fp + fn) if tp else 0.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nab", type=Path, default=DEFAULT_NAB, help="NAB root (data/, labels/)")
    ap.add_argument("--groups", nargs="+", default=GROUPS)
    ap.add_argument("--limit", type=int, default=None, help="at most N series per group")
    ap.add_argument("--methods", nargs="+", default=["auto", "sr", "svr", "prophet", "baseline"])
    ap.add_argument("--per-series", action="store_true", help="print each series' route and PA-F1")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")

    windows = load_windows(args.nab)
    config = RouterConfig(warmup_share=WARMUP_SHARE)
    labels = load_labels(args.nab)
    counts = {m: Counts() for m in args.methods}
    label_counts = {m: Counts() for m in args.methods}
    per_series = []
    files = []
    for group in args.groups:
        paths = sorted((args.nab / "data" / group).glob("*.csv"))
        files += paths[: args.limit] if args.limit else paths
    for path in files:
        rel = f"{path.parent.name}/{path.name}"
        y = read_series_csv(path)
        wins = window_rows(pd.DatetimeIndex(y.index), windows.get(rel, []))
        segs = label_segments(pd.DatetimeIndex(y.index), labels.get(rel, []), wins)
        n = len(y)
        score_from = min(n - 1, max(int(round(WARMUP_SHARE * n)), config.min_warmup_points))
        judged = np.zeros(n, dtype=bool)
        judged[score_from:] = True
        row = {"series": rel, "n": n}
        for method in args.methods:
            t0 = time.perf_counter()
            if method == "baseline":
                flags = baseline_flags(y, score_from)
            else:
                frame = detect_and_clean(y, detector=method, config=config, score_from=y.index[score_from])
                flags = frame["is_anomaly"].to_numpy(dtype=bool)
                if method == "auto":
                    row["route"] = str(frame["detector"].iloc[0])
                    row["reason"] = frame.attrs.get("reason", "")
            counts[method].seconds += time.perf_counter() - t0
            one = Counts()
            one.add(flags, wins, judged)
            counts[method].add(flags, wins, judged)
            # for the label score, flags in a window before its labelled point do not count
            lflags = flags.copy()
            for rows in wins:
                lflags[rows] = False
            for seg in segs:
                lflags[seg] = flags[seg]
            label_counts[method].add(lflags, segs, judged)
            row[method] = round(one.metrics()["pa_f1"], 3)
            row[f"{method}_rate"] = round(one.metrics()["flag_rate"], 4)
        per_series.append(row)
        if args.per_series:
            print(json.dumps(row), flush=True)

    results = {m: c.metrics() for m, c in counts.items()}
    for m, c in label_counts.items():
        results[m]["label_pa_f1"] = c.metrics()["pa_f1"]
    if "auto" in counts:
        rate = results["auto"]["flag_rate"]
        chance = Counts()
        for path, row in zip(files, per_series):
            rel = row["series"]
            y_index = pd.DatetimeIndex(read_series_csv(path).index)
            n = len(y_index)
            score_from = min(n - 1, max(int(round(WARMUP_SHARE * n)), config.min_warmup_points))
            judged = np.zeros(n, dtype=bool)
            judged[score_from:] = True
            chance.add_chance(rate, window_rows(y_index, windows.get(rel, [])), judged, n)
        results["chance_at_router_rate"] = {"pa_f1": chance.chance_f1(), "flag_rate": rate}
    points = next(iter(counts.values())).points if counts else 0
    print(f"NAB groups {', '.join(args.groups)}: {len(files)} series, {points} judged points, k={DELAY_K}")
    print(
        f"{'method':<24}{'PA-F1':>7}{'prec':>7}{'recall':>7}{'winF1':>7}{'winP':>7}{'winR':>7}"
        f"{'flag%':>7}{'s/1k':>8}{'labelPA':>9}"
    )
    for m, r in results.items():
        if m == "chance_at_router_rate":
            print(f"{'chance @ router rate':<24}{r['pa_f1']:>7.3f}{'':>35}{100 * r['flag_rate']:>7.2f}")
            continue
        label = "router (auto)" if m == "auto" else m
        print(
            f"{label:<24}{r['pa_f1']:>7.3f}{r['precision']:>7.3f}{r['recall']:>7.3f}{r['window_f1']:>7.3f}"
            f"{r['window_precision']:>7.3f}{r['window_recall']:>7.3f}{100 * r['flag_rate']:>7.2f}{r['s_per_1k']:>8.3f}"
            f"{r['label_pa_f1']:>9.3f}"
        )
    if "auto" in results and "baseline" in results and results["baseline"]["pa_f1"] > 0:
        print(f"ratio router/baseline PA-F1: {results['auto']['pa_f1'] / results['baseline']['pa_f1']:.2f}")
    if "auto" in results:
        routes = pd.Series([r.get("route") for r in per_series]).value_counts().to_dict()
        print(f"routes: {routes}")
    if args.json:
        args.json.write_text(json.dumps({"results": results, "series": per_series}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
