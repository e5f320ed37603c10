"""The stuck rule told by a co-moving series (a platform's job count beside its GPU count), kept
for bench/detect_stuck.py: docs/decisions/0020-stuck-co-moving.md measured it and did not merge
it, so the product judges a series from its own values only (`gpupool.detect.rules.stuck`).

What the product had while the feature was measured lives here whole:

- `Moving`: the seven knobs of the co-moving check, one frozen setting a bench arm passes in;
- `stuck_runs`: the stuck rule with an optional co-moving series;
- `stream_detect`: `gpupool.detect.clean.stream_detect` (the whole series, no window) with that
  rule, the co-moving series read on the series' timestamps.

The stream is a copy of the product's judging with the stuck rule swapped; `check_same_as_product`
fails loudly when the copy, given no co-moving series, no longer judges as the product does, so
the bench never compares a drifted copy with the product.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd

from gpupool.detect._robust import ffill_array
from gpupool.detect.alarms import alarm_flags, run_scores
from gpupool.detect.base import prepare
from gpupool.detect.clean import OUTPUT_COLUMNS, _onto_rows, _row_columns, _unjudged, refit_anchors
from gpupool.detect.clean import stream_detect as product_stream
from gpupool.detect.model import RESIDUAL_DETECTORS, FittedSeriesModel
from gpupool.detect.rules.faults import FAULT_DROP_SHARE, collapses, resets_by_shape
from gpupool.detect.rules.gaps import MAX_FILL_GAP_POINTS, bridge, short_gaps
from gpupool.detect.rules.outages import longest_drop
from gpupool.detect.rules.spikes import transients
from gpupool.detect.rules.stuck import STUCK_RUN_FACTOR, typical_run
from gpupool.detect.settings import CleaningRules, RouterConfig


@dataclass(frozen=True)
class Moving:
    """The co-moving check's setting (decision 0020's defaults: chosen on Helios traces with their
    GPU-job counts as the co-moving series)."""

    #: the run bar's factor in place of `STUCK_RUN_FACTOR` (0: only `cleaning.min_stuck_run`; the
    #: co-moving series, not the run's length against the history's, tells a stuck exporter)
    run_factor: float = 0.0
    #: a run is stuck only when the co-moving series moved at no less than this share of its points
    min_share: float = 0.0
    #: ... and at this many of its points or more
    min_moves: int = 3
    #: a run entered by a step of more than τ is judged too (the co-moving series, not the entry,
    #: tells a stuck exporter from a new level)
    judges_entry: bool = False
    #: only the repeats from the co-moving series' first move in the run on are replaced: until
    #: then it stood still too, and so, most likely, did the demand
    from_first_move: bool = True
    #: the co-moving series counts as moved at a point of the run when it stands at least this far
    #: (its own units: a whole job) from its value at the run's start, so a blip that comes back is
    #: no move; 0: at each step where it changes at all
    min_shift: float = 1.0
    #: the line across the repeats is shaped by the co-moving series: it moves as that series does,
    #: scaled by this series' value per unit of it at the run's start (GPUs per job), the line
    #: closing what is left to the value after the run
    shaped: bool = True


def stuck_runs(raw: np.ndarray, expected: np.ndarray, model: FittedSeriesModel, rules: CleaningRules,
               known: np.ndarray | None = None, moving: np.ndarray | None = None,
               setting: Moving = Moving()) -> tuple[np.ndarray, np.ndarray]:
    """`gpupool.detect.rules.stuck.stuck_runs`, and with `moving` (a series of another exporter on
    the same timestamps that moves when this one really does) judged by it: the repeat-share gate
    is open and the factor is `setting.run_factor`; a run is stuck only when `moving` moved
    (stood `setting.min_shift` or more from its value at the run's start) at `setting.min_moves`
    of the run's points or more (and at `setting.min_share` of them). Only the repeats from its
    first move on are replaced (`setting.from_first_move`), and the line across them follows
    `moving` (`setting.shaped`). Returns the mask of replaced points and their values."""
    stats = model.repeats
    out = np.zeros(raw.size, dtype=bool)
    values = np.full(raw.size, np.nan)
    share = stats.share
    if rules.min_stuck_run <= 0 or not (np.isfinite(share) and np.isfinite(stats.run)):
        return out, values
    # a co-moving series that moves is stronger evidence than the history's repeat share
    if (moving is None and share > rules.stuck_max_repeat_share) or raw.size < 2:
        return out, values
    factor = STUCK_RUN_FACTOR if moving is None else setting.run_factor
    if moving is not None and np.shape(moving) != raw.shape:
        raise ValueError(f"stuck_runs: the co-moving series has {np.size(moving)} points, the series {raw.size}")
    co_all = None if moving is None else np.asarray(moving, dtype="float64")
    with np.errstate(invalid="ignore"):
        same = np.isfinite(raw[1:]) & (raw[1:] == raw[:-1])
    edges = np.diff(np.concatenate([[0], same.astype(np.int8), [0]]))
    for a, b in zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)):
        # same[a:b] true: raw[a] .. raw[b] hold one value, b - a + 1 points
        n_points = b - a + 1
        if n_points <= max(rules.min_stuck_run, factor * typical_run(stats, raw[a])):
            continue
        if rules.max_stuck_run > 0 and n_points > rules.max_stuck_run:
            continue
        if model.nonnegative_ and raw[a] == 0.0:
            continue
        entered = a > 0 and np.isfinite(raw[a - 1]) and abs(raw[a] - raw[a - 1]) > model.tau_
        if entered and not (moving is not None and setting.judges_entry):
            continue
        read = a  # the last reading: its value and the co-series' then agree
        if moving is not None:
            co = co_all[a : b + 1]
            with np.errstate(invalid="ignore"):
                if setting.min_shift > 0:
                    moved = np.isfinite(co[1:]) & (np.abs(co[1:] - co[0]) >= setting.min_shift)
                else:
                    moved = np.isfinite(co[1:]) & np.isfinite(co[:-1]) & (co[1:] != co[:-1])
            m = int(moved.sum())
            if moved.mean() < setting.min_share or m < setting.min_moves:
                continue
            if setting.from_first_move:
                a += int(np.argmax(moved))  # raw[a + 1] is the first repeat the co-series moved at
        out[a + 1 : b + 1] = True
        after = (raw if known is None else known)[b + 1] if b + 1 < raw.size else np.nan
        shape = np.zeros(b - a + 2)  # at raw[a] .. raw[b + 1]
        if moving is not None and setting.shaped and b + 1 < raw.size and np.isfinite(co_all[read]) and co_all[read] != 0:
            co = co_all[a : b + 2]
            if np.isfinite(co).all():
                shape = (co - co_all[read]) * (raw[read] / co_all[read])
        if np.isfinite(after):
            k = b - a  # repeats
            # the run's value moved as the co-series did since the last reading, and what that
            # leaves short of `after` closed along a line
            line = (after - raw[a] - shape[-1]) * np.arange(1, k + 1) / (k + 1)
            values[a + 1 : b + 1] = raw[a] + shape[1:-1] + line
        else:
            values[a + 1 : b + 1] = expected[a + 1 : b + 1]
    return out, values


def _judge_timestamps(model: FittedSeriesModel, work: pd.Series, start: pd.Timestamp, cfg: RouterConfig,
                      moving: np.ndarray | None, setting: Moving) -> dict[str, np.ndarray]:
    """`gpupool.detect.clean._judge_timestamps` with this module's stuck rule."""
    raw = work.to_numpy(dtype="float64")
    if len(work) and start <= work.index[-1]:
        det = model.detector.score(work, start=start)
        expected = det["expected"].to_numpy()
        raw_score = det["score"].to_numpy()
    else:
        expected = np.full(len(work), np.nan)
        raw_score = np.full(len(work), np.nan)
    if model.nonnegative_:
        expected = np.where(np.isfinite(expected), np.maximum(expected, 0.0), expected)
    norm = (raw_score - model.score_center_) / model.score_scale_
    resid = np.abs(raw - expected)
    with np.errstate(invalid="ignore"):
        judged = np.isfinite(norm) & np.isfinite(expected) & np.isfinite(raw)
        if model.detector_name not in RESIDUAL_DETECTORS:
            judged &= resid > model.tau_
        flag = judged & (norm > model.threshold_)
        alarm = judged & (norm > model.alarm_threshold_)
    if cfg.alarms.run_points > 0 and np.isfinite(model.run_threshold_) and model.detector_name in RESIDUAL_DETECTORS:
        signed = np.where(judged, (raw - expected) / model.residual_scale_, np.nan)
        alarm = alarm | (judged & (run_scores(signed, cfg.alarms.run_points) > model.run_threshold_))
    rules = cfg.cleaning
    min_height = rules.spike_height_factor * model.excursion_scale_ if np.isfinite(model.excursion_scale_) else 0.0
    min_open = rules.open_move_factor * model.step_scale_ if np.isfinite(model.step_scale_) else 0.0
    transient = transients(flag, raw, expected, model.tau_, rules.max_anomaly_run, min_height, rules.spike_max_shoulder,
                           min_open)
    sustained = flag & ~transient
    fault, fault_value = collapses(flag, raw, expected, model.tau_, rules.max_fault_run, FAULT_DROP_SHARE,
                                   longest_drop(model.idle_share_, rules))
    sustained &= ~fault
    reset, reset_value = resets_by_shape(raw, np.isfinite(expected) & ~(flag & transient) & ~fault, model.tau_,
                                         rules.max_fault_run, FAULT_DROP_SHARE)
    if reset.any():
        sustained &= ~reset
        fault = fault | reset
        fault_value = np.where(reset, reset_value, fault_value)
    known = np.where(fault, fault_value, np.where(flag & transient, expected, raw))
    stuck, stuck_value = stuck_runs(raw, expected, model, rules, known, moving, setting)
    stuck &= np.isfinite(expected) & ~fault
    if stuck.any():
        alarm = alarm | stuck
        flag = flag | stuck
        sustained &= ~stuck
        fault = fault | stuck
        fault_value = np.where(stuck, stuck_value, fault_value)
    cleaned = (flag & transient) | fault
    spikes = flag & transient & ~fault
    kept = np.where(fault, fault_value, raw)
    clean = np.where(fault, fault_value, np.where(spikes, bridge(kept, spikes, expected), raw))
    filled = np.zeros(len(work), dtype=bool)
    gaps = short_gaps(raw, MAX_FILL_GAP_POINTS)
    if gaps.any():
        carried = ffill_array(np.where(np.isfinite(clean), clean, np.nan))
        has_past = np.maximum.accumulate(np.isfinite(raw))
        fill_value = np.where(np.isfinite(expected), expected, np.where(has_past, carried, np.nan))
        fill_value = np.where(gaps, bridge(clean, gaps, fill_value), fill_value)
        fill_at = gaps & np.isfinite(fill_value)
        clean = np.where(fill_at, fill_value, clean)
        filled = fill_at
    return {"expected": expected, "score": norm, "is_anomaly": alarm, "cleaned": cleaned, "clean_value": clean,
            "filled": filled, "sustained": sustained & flag}


def stream_detect(y: pd.Series, config: RouterConfig, model_for: Callable[[pd.Timestamp, pd.Series], FittedSeriesModel],
                  moving: pd.Series | None = None, setting: Moving = Moving()) -> pd.DataFrame:
    """`gpupool.detect.clean.stream_detect(y, config, model_for=model_for)` (the whole series) with
    this module's stuck rule; `moving` is read on `y`'s timestamps (a timestamp it lacks is missing)."""
    cfg = config
    work = prepare(y)
    span = pd.Timedelta(hours=24.0 * cfg.history_days)
    fits: dict[pd.Timestamp, FittedSeriesModel] = {}

    def fitted(anchor: pd.Timestamp) -> FittedSeriesModel:
        if anchor not in fits:
            fits[anchor] = model_for(anchor, work[(work.index >= anchor - span) & (work.index < anchor)])
        return fits[anchor]

    co = None if moving is None else prepare(moving).reindex(work.index).to_numpy(dtype="float64")
    anchors = refit_anchors(work.index, np.isfinite(work.to_numpy()), cfg)
    parts: list[dict[str, np.ndarray]] = []
    pos, n = 0, len(work)
    a_i8 = anchors.asi8
    work_values = work.to_numpy(dtype="float64")
    ahead = max(cfg.cleaning.max_anomaly_run, cfg.cleaning.max_fault_run + 2)
    carry = np.array([])
    while pos < n:
        stop = pos + 1
        while stop < n and a_i8[stop] == a_i8[pos]:
            stop += 1
        if pd.isna(anchors[pos]):
            parts.append(_unjudged(work_values[pos:stop]))
            carry = np.array([])
            pos = stop
            continue
        model = fitted(anchors[pos])
        lo = int(work.index.searchsorted(anchors[pos] - span, side="left"))
        hi = min(n, stop + ahead)
        ts_cols = _judge_timestamps(model, work.iloc[lo:hi], work.index[pos], cfg,
                                    None if co is None else co[lo:hi], setting)
        full = _row_columns(ts_cols, np.arange(hi - lo), work_values[lo:hi], model)
        part = {c: v[pos - lo : stop - lo].copy() for c, v in full.items()}
        part["detector"] = np.full(stop - pos, model.detector_name, dtype=object)
        if carry.size:
            k = min(carry.size, stop - pos)
            part["cleaned"][:k] = True
            part["clean_value"][:k] = carry[:k]
            part["sustained"][:k] = False
        carry = np.array([])
        if stop > pos and part["cleaned"][-1] and hi > stop:
            cleaned_ahead = full["cleaned"][stop - lo :].astype(bool)
            k = len(cleaned_ahead) if cleaned_ahead.all() else int(np.argmin(cleaned_ahead))
            carry = full["clean_value"][stop - lo :].astype("float64")[:k]
        parts.append(part)
        pos = stop
    judged = {c: np.concatenate([pt[c] for pt in parts]) for c in OUTPUT_COLUMNS} if parts else {}
    if parts:
        judged["is_anomaly"] = alarm_flags(judged["is_anomaly"].astype(bool), work.index, cfg.alarms.merge_points)
    return _onto_rows(judged, work.index if parts else work.index[:0], y)[OUTPUT_COLUMNS]


def check_same_as_product(y: pd.Series, config: RouterConfig, model_for) -> pd.DataFrame:
    """The product's `stream_detect` of `y`, after checking that this module's stream without a
    co-moving series judges it the same (else the copy drifted from the product: RuntimeError)."""
    product = product_stream(y, config, model_for=model_for)
    copy = stream_detect(y, config, model_for)
    try:
        pd.testing.assert_frame_equal(copy, product, check_freq=False)
    except AssertionError as exc:
        raise RuntimeError("bench/_stuck_moving.py no longer judges as gpupool.detect.clean.stream_detect: "
                           f"bring its copy up to date ({str(exc).splitlines()[0][:200]})") from None
    return product
