"""Benchmark the detect stage on NAB, scored by NAB's own rules.

    .venv/bin/python bench/detect_nab.py [--groups G ...] [--limit N] [--workers 2]
                                         [--cache DIR] [--cv] [--json OUT]

Every file goes through `stream_detect`, the function `gpupool detect FILE` runs, with
default settings: the router (`auto`) and each detector alone (`--detector sr|svr|prophet`,
and `zscore`, the rolling z-score the router may fall back to). `is_anomaly` is taken as
the detections. A file is scored as the detectors see it: in time order, one point per
timestamp. Eight NAB files repeat timestamps (a DST change, a re-sent hour or minute), which
`gpupool detect` refuses; the bench reads a copy of each keeping the first row of every
timestamp and prints the rows it dropped (NAB's windows and labels are timestamps and apply
to the copy unchanged).

Columns:

- `NAB std`, `lowFP`, `lowFN`: NAB's standard, reward-low-FP and reward-low-FN scores
  (bench/nab_scoring.py: probationary first 15 % of a file, at most 750 rows; scaled
  sigmoid of the first detection's position in a window; later detections in a window
  ignored; false positives weighted by their distance after the preceding window;
  normalised between the null and the perfect detector over the files scored), on all
  files and on `real*` alone;
- `PA-F1` (point-adjusted, delay k = 7), `winF1` (a window found by any detection;
  precision over runs of detections), `labelPA` (point-adjusted from NAB's labelled point
  to its window's end) and `chance` (the PA-F1 of flagging at random at the method's
  own rate): the columns of the earlier bench, on the points after the probationary period;
- `alarm%`, `s/1k` (seconds per 1,000 points, refits included).

Reference lines: the null and perfect detectors (0 and 100 by construction); NAB's
windowed Gaussian detector (6400-point window, 100-point step) with its threshold
optimised over the corpus per profile, as NAB's published scoreboard does (published:
39.6 standard, 20.9 low FP, 47.4 low FN) - a check of this scorer; and random detections
at the best of a few rates (published "random": 16.8 standard, with its threshold
optimised the same way).

`--methods auto zscore` runs the router alone (it needs the z-score's run), the cheap part
of the bench: Prophet, refitted daily on the growing history, is most of the full run's time.

`--cv`: leave-one-NAB-group-out choice of the router's flagging settings (τ scale, false-alarm
budget, alarm merge, detector selection rule) among a small grid, on the cached scores
(no detector is rerun): for each held-out group the setting with the best standard score
on the other groups is scored on the held-out group, and the held-out raw scores are
pooled and normalised. Nothing is chosen per file.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))

import tempfile  # noqa: E402

from detect_nab_collect import collect, dedupe_csv, line_ranges  # noqa: E402
from nab_scoring import PROFILES, FileScorer, normalised, probation_rows, windowed_gaussian_z  # noqa: E402

from gpupool.detect.alarms import TAIL_LEVELS  # noqa: E402
from gpupool.detect.settings import RouterConfig  # noqa: E402

DEFAULT_NAB = Path(__file__).resolve().parents[2] / "shared" / "data" / "nab"
METHODS = ["auto", "sr", "svr", "prophet", "zscore"]
DELAY_K = 7
# --cv grid
CV_SCALE = (1.0, 1.5, 2.0, 3.0)
CV_BUDGET = (None, 0.002, 0.001, 0.0005, 0.0)
CV_MERGE = (12, 48, 144)
CV_RULES = ("features", "fallback", "fallback_all", "zscore")
RANDOM_RATES = (0.0005, 0.001, 0.002, 0.004)


# --- data ---------------------------------------------------------------------------------


def load_files(nab: Path, groups: list[str] | None, limit: int | None) -> list[tuple[Path, str]]:
    out = []
    for d in sorted((nab / "data").iterdir()):
        if not d.is_dir() or (groups and d.name not in groups):
            continue
        paths = sorted(d.glob("*.csv"))
        out += [(p, f"{d.name}/{p.name}") for p in (paths[:limit] if limit else paths)]
    return out


def window_rows(index: pd.DatetimeIndex, windows: list) -> list[tuple[int, int]]:
    """(left, right) rows of each window, as NAB finds them (first row at or after each limit)."""
    rows = []
    for a, b in windows:
        left = int(index.searchsorted(pd.Timestamp(a), side="left"))
        right = min(int(index.searchsorted(pd.Timestamp(b), side="left")), len(index) - 1)
        if left < len(index) and right >= left:
            rows.append((left, right))
    return rows


# --- flags from cached scores ---------------------------------------------------------------


def merge_alarms(flags: np.ndarray, merge: int) -> np.ndarray:
    """The first flag of each event (flags within `merge` points of the previous one join it)."""
    where = np.flatnonzero(flags)
    out = np.zeros(flags.size, dtype=bool)
    if where.size == 0:
        return out
    if merge <= 0:
        out[where] = True
        return out
    gaps = np.diff(np.concatenate([[-(merge + 1)], where]))
    out[where[gaps > merge]] = True
    return out


def model_thresholds(models: list[dict], config: RouterConfig, scale: float, budget: float | None,
                     skip: tuple[float, float] = (0.0, 0.0), points: list[int] | None = None) -> np.ndarray:
    """Each model's alarm threshold had the router used this τ scale and false-alarm budget.

    `budget` is `alarms.history_share`: None none, 0 the history's largest score. `skip` is
    (`alarms.history_skip_per_day`, `alarms.history_skip_per_1000_points`), `points` each
    model's history rows; the skip is applied with budget 0 only (the cache keeps the
    history's largest excursion peaks, not its quantiles without them).
    """
    level = None if budget is None else TAIL_LEVELS.index(round(1.0 - budget, 6))
    per_day, per_1000 = skip
    out = np.empty(len(models))
    for i, m in enumerate(models):
        base = config.tau_multiplier if m["residual"] else config.sr.threshold
        q = m["quantiles"][level] if (level is not None and m["quantiles"] and m["quantiles"][level] is not None) else 0.0
        exc = m.get("excursions")
        if (per_day or per_1000) and budget == 0 and exc is not None and q > 0.0:
            n = points[i] if points is not None else exc.get("points", 0)
            k = int(per_day * exc["days"] + per_1000 * n / 1000.0)
            left = ([exc["rest"]] if exc["rest"] is not None else []) + exc["peaks"][k : k + 1]
            q = max(left) if left else 0.0
        out[i] = max(scale * base, q)
    return out


def history_points(res: dict, config: RouterConfig) -> list[int]:
    """Rows in each model's history (the `history_days` before its anchor), as stream_detect fits it."""
    idx = res["index"]
    span = pd.Timedelta(hours=24.0 * config.history_days)
    out = []
    for m in res["models"]:
        anchor = pd.Timestamp(m["anchor"])
        out.append(int(idx.searchsorted(anchor, side="left") - idx.searchsorted(anchor - span, side="left")))
    return out


def deviations(res: dict, config: RouterConfig, scale: float, budget: float,
               skip: tuple[float, float] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per point: deviates beyond its model's threshold; and the detectable size θσ of its model.

    The size (what `fallback` compares) is read under the whole history's budget; `skip`
    (default: the config's `alarms.history_skip_per_day` and `alarms.history_skip_per_1000_points`)
    moves the threshold only.
    """
    if skip is None:
        skip = (config.alarms.history_skip_per_day, config.alarms.history_skip_per_1000_points)
    points = history_points(res, config) if any(skip) else None
    thr = model_thresholds(res["models"], config, scale, budget, skip, points)
    thr_whole = model_thresholds(res["models"], config, scale, budget)
    mid = res["model_id"]
    ok = mid >= 0
    row_thr = np.where(ok, thr[np.where(ok, mid, 0)], np.inf)
    with np.errstate(invalid="ignore"):
        dev = ok & np.isfinite(res["score"]) & (res["score"] > row_thr)
        sr = np.array([not m["residual"] for m in res["models"]] or [False])
        scale_r = np.array([m["residual_scale"] for m in res["models"]] or [np.nan])
        is_sr = ok & sr[np.where(ok, mid, 0)]
        resid = np.abs(res["value"] - res["expected"])
        dev &= ~is_sr | (resid > config.sr.min_residual * scale_r[np.where(ok, mid, 0)])
    if config.alarms.run_points > 0:
        dev |= run_alarms(res, config, scale, budget, skip)
    size = np.array([t * m["residual_scale"] if m["residual"] else np.inf for t, m in zip(thr_whole, res["models"])]
                    or [np.inf])
    return dev, size


def run_thresholds(res: dict, config: RouterConfig, scale: float, budget: float | None,
                   skip: tuple[float, float]) -> np.ndarray:
    """Each model's run-alarm threshold (`alarms.run_points`, `alarms.run_share`) from the history's
    run excursions the cache keeps (budget 0 or none; NaN: no run alarms for that model)."""
    key = f"{config.alarms.run_points}:{config.alarms.run_share:g}"
    points = history_points(res, config)
    out = np.full(len(res["models"]), np.nan)
    for i, m in enumerate(res["models"]):
        kept = m.get("run_excursions")
        if not m["residual"] or not kept or key not in kept or not np.isfinite(m.get("run_threshold", np.nan)):
            continue
        level = config.alarms.run_share * scale * config.tau_multiplier
        peaks = [p for p in kept[key] if p > level]
        exc = m.get("excursions") or {"days": 0.0}
        k = int(skip[0] * exc["days"] + skip[1] * points[i] / 1000.0) if budget == 0 else 0
        out[i] = level if budget is None else max([level] + peaks[k : k + 1])
    return out


def run_alarms(res: dict, config: RouterConfig, scale: float, budget: float | None,
               skip: tuple[float, float]) -> np.ndarray:
    """Per point: a run of `alarms.run_points` deviations on one side beyond its model's run threshold.

    As stream_detect judges them: a run lies within one model's rows (a refitted model has no
    expected value before its first point), in units of that model's residual spread.
    """
    from gpupool.detect.alarms import run_scores

    thr = run_thresholds(res, config, scale, budget, skip)
    mid = res["model_id"]
    out = np.zeros(mid.size, dtype=bool)
    if not np.isfinite(thr).any():
        return out
    bounds = np.flatnonzero(np.diff(np.concatenate([[-2], mid, [-2]])) != 0)
    for a, b in zip(bounds[:-1], bounds[1:]):
        k = mid[a]
        if k < 0 or not np.isfinite(thr[k]):
            continue
        m = res["models"][k]
        signed = (res["value"][a:b] - res["expected"][a:b]) / m["residual_scale"]
        out[a:b] = run_scores(signed, config.alarms.run_points) > thr[k]
    return out


def routed_flags(per: dict, rule: str, config: RouterConfig, scale: float, budget: float, merge: int,
                 skip: tuple[float, float] | None = None) -> np.ndarray:
    """Alarms of the router variant `rule` for one file from the cached single-detector runs.

    features: the profile router's choice at each refit (the cached `auto` run);
    fallback: that choice, replaced by the rolling z-score when the z-score would flag a
    smaller deviation at the same false-alarm budget on the series' own history;
    fallback_all: the same, and the z-score also where the router chose SR (whose score is
    not a deviation in the series' units, so it cannot be compared);
    sensitive: among SVR, Prophet and the z-score, the detector that flags the smallest
    deviation (θσ, in the series' units) at that budget (SR where the router chose SR);
    zscore: the z-score alone.
    """
    auto = per["auto"]
    if rule == "features":
        dev, _ = deviations(auto, config, scale, budget, skip)
        return merge_alarms(dev, merge)
    if rule == "zscore":
        dev, _ = deviations(per["zscore"], config, scale, budget, skip)
        return merge_alarms(dev, merge)
    names = ["auto", "zscore"] if rule in ("fallback", "fallback_all") else ["auto", "svr", "prophet", "zscore"]
    devs, sizes = {}, {}
    for name in names:
        devs[name], sizes[name] = deviations(per[name], config, scale, budget, skip)
    n = auto["value"].size
    mid = auto["model_id"]
    chosen = np.zeros(n, dtype=bool)
    routes = [m["detector"] for m in auto["models"]]
    for k in range(len(auto["models"])):
        rows = mid == k
        if routes[k] == "sr":
            pick = "zscore" if rule == "fallback_all" else "auto"
        else:
            cands = {nm: sizes[nm][k] for nm in names if nm != "auto" or True}
            if rule == "sensitive":
                cands.pop("auto")  # the routed detector is one of svr/prophet/zscore already
            pick = min(cands, key=lambda nm: (cands[nm], nm != "auto"))
        chosen[rows] = devs[pick][rows]
    return merge_alarms(chosen, merge)


# --- the earlier bench's columns ------------------------------------------------------------


def pa_counts(flags: np.ndarray, wins: list[tuple[int, int]], scorable: np.ndarray) -> dict:
    """Point-adjusted and window counts for one file (points after the probationary period)."""
    f = flags & scorable
    in_win = np.zeros(f.size, dtype=bool)
    c = {"tp": 0, "fp": 0, "fn": 0, "wf": 0, "wt": 0, "ev": 0, "ev_in": 0}
    for left, right in wins:
        in_win[left : right + 1] = True
        if not scorable[left]:
            continue
        size = right - left + 1
        hit = bool(f[left : left + DELAY_K + 1].any())
        c["tp" if hit else "fn"] += size
        c["wt"] += 1
        c["wf"] += int(f[left : right + 1].any())
    c["fp"] = int(np.count_nonzero(f & ~in_win))
    edges = np.diff(np.concatenate([[0], f.astype(np.int8), [0]]))
    for a, b in zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)):
        c["ev"] += 1
        c["ev_in"] += int(in_win[a:b].any())
    return c


def f1(tp: float, fp: float, fn: float) -> float:
    return 2 * tp / (2 * tp + fp + fn) if tp else 0.0


def chance_counts(rate: float, wins: list[tuple[int, int]], scorable: np.ndarray) -> tuple[float, float, float]:
    in_win = np.zeros(scorable.size, dtype=bool)
    tp = fn = 0.0
    for left, right in wins:
        in_win[left : right + 1] = True
        if not scorable[left]:
            continue
        k = int(scorable[left : left + DELAY_K + 1].sum())
        p = 1.0 - (1.0 - rate) ** k
        tp += p * (right - left + 1)
        fn += (1.0 - p) * (right - left + 1)
    return tp, rate * float(np.count_nonzero(scorable & ~in_win)), fn


class Table:
    """NAB scores and the earlier columns of one method over a set of files."""

    def __init__(self) -> None:
        self.raw = {p: 0.0 for p in PROFILES}
        self.null = {p: 0.0 for p in PROFILES}
        self.perfect = {p: 0.0 for p in PROFILES}
        self.c = {"tp": 0, "fp": 0, "fn": 0, "wf": 0, "wt": 0, "ev": 0, "ev_in": 0}
        self.lab = {"tp": 0, "fp": 0, "fn": 0}
        self.flags = self.points = 0
        self.seconds = 0.0
        self.parts: list[tuple] = []
        self.det = {"tp": 0, "fp": 0, "fn": 0}

    def add(self, f: dict, flags: np.ndarray, seconds: float = 0.0) -> None:
        for p in PROFILES:
            s = f["scorers"][p].score(flags)
            self.raw[p] += s["raw"]
            self.null[p] += f["null"][p]
            self.perfect[p] += f["perfect"][p]
            if p == "standard":
                for k in ("tp", "fp", "fn"):
                    self.det[k] += s[k]
        c = pa_counts(flags, f["wins"], f["scorable"])
        for k in self.c:
            self.c[k] += c[k]
        lab = pa_counts(label_flags(flags, f["wins"], f["segs"]), f["segs"], f["scorable"])
        for k in self.lab:
            self.lab[k] += lab[k]
        self.flags += int((flags & f["scorable"]).sum())
        self.points += int(f["scorable"].sum())
        self.seconds += seconds
        self.parts.append((f["wins"], f["scorable"]))

    def row(self) -> dict:
        rate = self.flags / self.points if self.points else 0.0
        ctp = cfp = cfn = 0.0
        for wins, scorable in self.parts:
            a, b, c = chance_counts(rate, wins, scorable)
            ctp, cfp, cfn = ctp + a, cfp + b, cfn + c
        wr = self.c["wf"] / self.c["wt"] if self.c["wt"] else 0.0
        wp = self.c["ev_in"] / self.c["ev"] if self.c["ev"] else 0.0
        out = {p: normalised(self.raw[p], self.null[p], self.perfect[p]) for p in PROFILES}
        out.update(
            pa_f1=f1(self.c["tp"], self.c["fp"], self.c["fn"]),
            window_f1=2 * wp * wr / (wp + wr) if wp + wr else 0.0,
            label_pa_f1=f1(self.lab["tp"], self.lab["fp"], self.lab["fn"]),
            chance_pa_f1=f1(ctp, cfp, cfn),
            alarm_rate=rate,
            s_per_1k=1000.0 * self.seconds / self.points if self.points else 0.0,
            windows_found=self.det["tp"],
            windows=self.det["tp"] + self.det["fn"],
            false_alarms=self.det["fp"],
        )
        return out


def label_segments(index: pd.DatetimeIndex, labels: list, wins: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out = []
    for ts in labels:
        p = int(index.searchsorted(pd.Timestamp(ts)))
        for left, right in wins:
            if left <= p <= right:
                out.append((p, right))
                break
    return out


def label_flags(flags: np.ndarray, wins: list[tuple[int, int]], segs: list[tuple[int, int]]) -> np.ndarray:
    out = flags.copy()
    for left, right in wins:
        out[left : right + 1] = False
    for left, right in segs:
        out[left : right + 1] = flags[left : right + 1]
    return out


def print_table(title: str, rows: dict[str, dict]) -> None:
    print(title)
    print(
        f"  {'method':<30}{'NAB std':>8}{'lowFP':>7}{'lowFN':>7}{'found':>8}{'FPs':>6}{'PA-F1':>7}{'winF1':>7}"
        f"{'labelPA':>8}{'chance':>7}{'alarm%':>7}{'s/1k':>7}"
    )
    for name, r in rows.items():
        print(
            f"  {name:<30}{r['standard']:>8.1f}{r['reward_low_FP_rate']:>7.1f}{r['reward_low_FN_rate']:>7.1f}"
            f"{str(r['windows_found']) + '/' + str(r['windows']):>8}{r['false_alarms']:>6}{r['pa_f1']:>7.3f}"
            f"{r['window_f1']:>7.3f}{r['label_pa_f1']:>8.3f}{r['chance_pa_f1']:>7.3f}{100 * r['alarm_rate']:>7.2f}"
            f"{r['s_per_1k']:>7.2f}"
        )


def _collect_job(args):
    path, rel, method, config, cache = args
    return collect(path, rel, method, config, cache)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nab", type=Path, default=DEFAULT_NAB, help="NAB root (data/, labels/)")
    ap.add_argument("--groups", nargs="+", default=None, help="NAB groups (default: all seven, 58 files)")
    ap.add_argument("--limit", type=int, default=None, help="at most N files per group")
    ap.add_argument("--methods", nargs="+", default=METHODS)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--cache", type=Path, default=None, help="reuse detector runs cached here")
    ap.add_argument("--cv", action="store_true", help="leave-one-group-out choice of the flagging settings")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    ap.add_argument("--verify", type=int, default=0, help="rerun the default router on the N smallest files")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    config = RouterConfig()
    methods = list(args.methods)

    windows = json.loads((args.nab / "labels" / "combined_windows.json").read_text())
    labels = json.loads((args.nab / "labels" / "combined_labels.json").read_text())
    files = load_files(args.nab, args.groups, args.limit)
    workdir = tempfile.TemporaryDirectory(prefix="nab-dedup-")
    read_from: dict[str, Path] = {}
    for path, rel in files:
        read_from[rel], dropped = dedupe_csv(path, Path(workdir.name))
        if dropped:
            print(f"{rel}: {len(dropped)} rows repeat an earlier timestamp, dropped (file lines "
                  f"{line_ranges(dropped)}); the first row of each timestamp is kept")
    # the router's alarms are assembled from the features router's run (SR for spiky series,
    # no fallback) and the z-score's: a fresh run of the default router gives the same alarms
    # (--verify reruns files to show it), and --cv can then compare routing rules for free
    features_cfg = config.model_copy(update={"spiky_detector": "sr", "fallback": False})
    needed = sorted(set(methods) | {"auto", "zscore"})
    jobs = [(read_from[rel], rel, m, features_cfg if m == "auto" else config, args.cache)
            for m in needed for _, rel in files]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max(1, args.workers)) as ex:
        results = list(ex.map(_collect_job, jobs))
    by_file: dict[str, dict] = {}
    for r in results:
        by_file.setdefault(r["rel"], {})[r["method"]] = r
    print(f"detectors ran (or came from the cache) in {time.perf_counter() - t0:.0f} s")

    prepared = []
    for path, rel in files:
        per = by_file[rel]
        any_res = next(iter(per.values()))
        index = any_res["index"]
        n = index.size
        wins = window_rows(index, windows.get(rel, []))
        scorers = {p: FileScorer(n, wins, p) for p in PROFILES}
        scorable = np.arange(n) >= probation_rows(n)
        prepared.append(
            {
                "rel": rel,
                "group": rel.split("/")[0],
                "per": per,
                "wins": wins,
                "segs": label_segments(index, labels.get(rel, []), wins),
                "scorable": scorable,
                "scorers": scorers,
                "null": {p: s.null() for p, s in scorers.items()},
                "perfect": {p: s.perfect() for p, s in scorers.items()},
                "value": any_res["value"],
            }
        )

    def alarms_of(f: dict, m: str) -> np.ndarray:
        if m == "auto":
            return routed_flags(f["per"], "fallback_all", config, config.alarms.tau_scale, config.alarms.history_share,
                                config.alarms.merge_points)
        dev, _ = deviations(f["per"][m], config, config.alarms.tau_scale, config.alarms.history_share)
        return merge_alarms(dev, config.alarms.merge_points)

    if args.verify:
        from gpupool.detect.clean import stream_detect
        from gpupool.detect._robust import as_sorted_unique
        from gpupool.tsio import read_series_csv

        by_size = sorted(zip(files, prepared), key=lambda t: t[0][0].stat().st_size)[: args.verify]
        for (path, rel), f in by_size:
            fresh = stream_detect(as_sorted_unique(read_series_csv(read_from[rel])), config)["is_anomaly"].to_numpy()
            same = np.array_equal(fresh, alarms_of(f, "auto"))
            print(f"verify {rel}: a fresh default run raises {int(fresh.sum())} alarms, "
                  f"{'identical to' if same else 'DIFFERENT from'} the assembled ones")

    out: dict = {"settings": config.model_dump(), "tables": {}}
    for subset, keep in (("all files", lambda f: True), ("real* only", lambda f: f["group"].startswith("real"))):
        chosen = [f for f in prepared if keep(f)]
        if not chosen:
            continue
        rows: dict[str, dict] = {}
        for m in methods:
            t = Table()
            for f in chosen:
                t.add(f, alarms_of(f, m), f["per"][m]["seconds"])
            label = {"auto": "router (auto, default)", "zscore": "rolling z-score"}.get(m, f"{m} alone")
            rows[label] = t.row()
        # references: null, perfect, windowed Gaussian and random
        t = Table()
        for f in chosen:
            t.add(f, np.zeros(f["value"].size, dtype=bool))
        rows["null detector"] = t.row()
        t = Table()
        for f in chosen:
            flags = np.zeros(f["value"].size, dtype=bool)
            for left, _ in f["wins"]:
                flags[left] = True
            t.add(f, flags)
        rows["perfect detector"] = t.row()
        zs = [windowed_gaussian_z(f["value"]) for f in chosen]
        for p in PROFILES:
            best = None
            for thr in np.arange(3.0, 12.01, 0.1):
                t = Table()
                for f, z in zip(chosen, zs):
                    t.add(f, z >= thr)
                r = t.row()
                if best is None or r[p] > best[0][p]:
                    best = (r, thr)
            rows[f"windowed Gaussian, opt. {p[:13]} (|z|>={best[1]:.1f})"] = best[0]
        best = None
        for rate in RANDOM_RATES:
            t = Table()
            for i, f in enumerate(chosen):
                t.add(f, np.random.default_rng(i).random(f["value"].size) < rate)
            r = t.row()
            if best is None or r["standard"] > best[0]["standard"]:
                best = (r, rate)
        rows[f"random, best rate ({best[1]})"] = best[0]
        print_table(f"NAB, {subset}: {len(chosen)} files", rows)
        out["tables"][subset] = rows

    if args.cv:
        out["cv"] = leave_one_group_out(prepared, config)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, default=str))
    workdir.cleanup()
    return 0


def leave_one_group_out(prepared: list[dict], config: RouterConfig) -> dict:
    """Choose (rule, τ scale, budget, merge) on the other groups; score each held-out group."""
    grid = list(itertools.product(CV_RULES, CV_SCALE, CV_BUDGET, CV_MERGE))
    # raw standard scores per file and setting, computed once
    raw = np.zeros((len(prepared), len(grid)))
    null = np.array([f["null"]["standard"] for f in prepared])
    perfect = np.array([f["perfect"]["standard"] for f in prepared])
    flags_cache: dict = {}
    for j, (rule, scale, budget, merge) in enumerate(grid):
        for i, f in enumerate(prepared):
            flags = routed_flags(f["per"], rule, config, scale, budget, merge)
            flags_cache[(i, j)] = flags
            raw[i, j] = f["scorers"]["standard"].score(flags)["raw"]
    groups = sorted({f["group"] for f in prepared})
    gid = np.array([groups.index(f["group"]) for f in prepared])
    held = Table()
    chosen = {}
    for g in range(len(groups)):
        train = gid != g
        scores = 100 * (raw[train].sum(0) - null[train].sum()) / (perfect[train].sum() - null[train].sum())
        j = int(np.argmax(scores))
        chosen[groups[g]] = {"setting": grid[j], "train_score": round(float(scores[j]), 1)}
        for i in np.flatnonzero(~train):
            held.add(prepared[i], flags_cache[(i, j)])
    whole = 100 * (raw.sum(0) - null.sum()) / (perfect.sum() - null.sum())
    best = int(np.argmax(whole))
    print("leave-one-NAB-group-out (choose on six groups, score the seventh; held-out scores pooled):")
    for g, c in chosen.items():
        print(f"  held out {g:<22} chose rule/τ scale/budget/merge = {c['setting']} (train {c['train_score']})")
    print_table("  held-out, pooled", {"router, settings chosen without the group": held.row()})
    print(f"  chosen on all groups: {grid[best]} (in-sample {whole[best]:.1f}); "
          f"by rule, best in-sample: " + ", ".join(
              f"{r} {max(whole[j] for j, s in enumerate(grid) if s[0] == r):.1f}" for r in CV_RULES))
    return {"chosen": chosen, "held_out": held.row(), "in_sample_best": {"setting": grid[best], "score": float(whole[best])}}


if __name__ == "__main__":
    from _tables import record_run  # bench/ is sys.path[0] when a bench is run

    sys.exit(record_run(lambda a: "detect_nab" if "--cv" in a else "detect_nab-no-cv", main))
