"""The fault rules: falls towards zero that come back (drops, collapses) and counter resets,
told by a flag or by their shape alone."""

from __future__ import annotations

import numpy as np

#: a collapse starts at a value at most this share of x̂ (bench/detect_cleaning.py)
FAULT_DROP_SHARE = 0.1


def fault_shaped(values: np.ndarray, drop_share: float, max_run: int, spike_factor: float) -> np.ndarray:
    """Points of a history shaped like an exporter's faults, whatever the detector made of them:
    runs of at most `max_run` points at or below `drop_share` x the (positive) values on both sides
    (a drop, a counter reset's fall), and single points more than `spike_factor` x the (positive)
    values on both sides (a spike). A series idling at zero, or rising from it, has no such points:
    its neighbours are not positive.

    Used only to read a history's typical step and peak height (`_calibrate`), never to clean.
    """
    v = np.asarray(values, dtype="float64")
    n = v.size
    out = np.zeros(n, dtype=bool)
    if n < 3:
        return out
    finite = np.isfinite(v)
    with np.errstate(invalid="ignore"):
        if spike_factor > 0:
            left, mid, right = v[:-2], v[1:-1], v[2:]
            out[1:-1] |= (left > 0) & (right > 0) & (mid > spike_factor * np.maximum(left, right))
        if max_run > 0 and drop_share > 0:
            for k in range(1, max_run + 1):
                if n < k + 2:
                    break
                before, after = v[: n - k - 1], v[k + 1 :]
                low = np.ones(n - k - 1, dtype=bool)
                for i in range(k):
                    low &= finite[1 + i : n - k + i] & (v[1 + i : n - k + i] <= drop_share * np.minimum(before, after))
                low &= (before > 0) & (after > 0)
                for s in np.flatnonzero(low):
                    out[s + 1 : s + 1 + k] = True
    return out


def collapses(
    flag: np.ndarray,
    raw: np.ndarray,
    expected: np.ndarray,
    tau: float,
    max_run: int,
    drop_share: float,
    max_drop_run: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Exporter collapses: runs that fall towards zero and come back (drops, counter resets).

    A run starts at a flagged point t0 whose value is at most `drop_share` of x̂_t0 (and
    more than τ below it) and lasts while the values stay more than τ below x̂_t0 (missing
    points included). When the series is back within τ of x̂_t0 after at most `max_run`
    points, the run is a fault of the exporter, not of the demand. So is a counter reset's
    ramp (`ramp_end`: the values climb at every step from the collapse back to the demand,
    which may lie anywhere by then): its points after t0 are scaled back by the share of the
    ramp they stand at (the exporter's window filling again reads demand x that share). The
    other faults' points are replaced
    by a straight line from x̂_t0 to the first value after it (flat at x̂_t0 when that value
    is itself flagged: a spike must not pull the line up). A run still open at the end
    of the data, shorter than `max_run`, cannot be told yet and is replaced by x̂_t0; a
    run longer than `max_run` is kept (demand really fell). The decision waits for at
    most `max_run` later points; judging each point stays causal. `max_run` 0 disables it.
    Returns the mask of replaced points and their values.
    """
    n = raw.size
    mask = np.zeros(n, dtype=bool)
    values = np.full(n, np.nan)
    if max_run <= 0 or not flag.any():
        return mask, values
    t = 0
    starts = np.flatnonzero(flag)
    for t0 in starts:
        if t0 < t:
            continue
        level = expected[t0]
        with np.errstate(invalid="ignore"):
            if not (np.isfinite(level) and raw[t0] < level - tau and raw[t0] <= drop_share * level):
                continue
            if t0 > 0 and raw[t0 - 1] <= drop_share * level:
                continue  # not where the fall began: the fall as a whole was judged at its first point
        j = ramp_end(raw, t0, level, tau, max_run)
        ramp = j >= 0
        if not ramp:
            # the run ends where the series is back near x̂_t0, or nearer where it fell from than
            # to the collapse (x̂ may lag a real move just before it)
            before = raw[t0 - 1] if t0 > 0 and np.isfinite(raw[t0 - 1]) else level
            j = t0
            while j < n and j - t0 <= max_run and (
                not np.isfinite(raw[j]) or (raw[j] < level - tau and raw[j] - raw[t0] <= before - raw[j])
            ):
                j += 1
        length = j - t0
        # a ramp is a reset's signature at any length up to max_run; a flat fall is a fault only
        # while it is as short as a spike (`max_drop_run`, 0: up to max_run): an exporter reading
        # zero is a moment, demand that went away for a while is idle
        longest = max_run + 1 if ramp else (min(max_run, max_drop_run) if max_drop_run > 0 else max_run)
        if j >= n and length <= longest:
            mask[t0:n] = True
            values[t0:n] = level
            t = n
        elif j < n and length <= longest:
            # the value that ends the run is the line's end, unless it is itself flagged (a
            # spike right after a drop): then the line stays at x̂_t0 (x̂ at j is shaped by the
            # run). A ramp ends where it met the demand: x̂ there is the ramp's, so its flag says nothing
            end = level if flag[j] and (not ramp or raw[j] > level + tau) else raw[j]
            # and it starts at the value before the fall (the demand's own reading, which x̂ only
            # estimates), unless that is itself flagged
            start = raw[t0 - 1] if t0 > 0 and np.isfinite(raw[t0 - 1]) and not flag[t0 - 1] else level
            mask[t0:j] = True
            values[t0:j] = start + (end - start) * np.arange(1, length + 1) / (length + 1)
            if ramp:
                # a restarted exporter's window fills again: it reads the demand times the share
                # of the window since the restart, so the ramp scaled back tells the demand as it
                # moved meanwhile (bounded by the levels on both sides and τ)
                i = np.arange(length)
                scaled = raw[t0:j] * length / np.maximum(i, 1)
                scaled = np.clip(scaled, min(level, end) - tau, max(level, end) + tau)
                values[t0 + 1 : j] = scaled[1:]
            t = j
    return mask, values


def resets_by_shape(
    raw: np.ndarray, free: np.ndarray, tau: float, max_run: int, drop_share: float
) -> tuple[np.ndarray, np.ndarray]:
    """Counter resets told by their shape alone, where no flag started them (`collapses` does
    where one did): a series whose x̂ is poor (a rolling mean over steps) has a τ so wide that
    a fall to zero passes unflagged.

    A reset starts at a point t0 that falls to at most `drop_share` of the value before it, and
    climbs back at every step (`ramp_end`, with that value as the level and a tolerance of
    the smaller of τ and `drop_share` x it) to at least half of it within `max_run` + 1 points;
    all the points of the ramp are in `free` (judged, and not taken by another rule). A ramp
    still open at the end of the data is left: without a flag it cannot be told yet. The
    ramp's points are scaled back as `collapses` does, between the values on both sides.
    Returns the mask of replaced points and their values.
    """
    n = raw.size
    mask = np.zeros(n, dtype=bool)
    values = np.full(n, np.nan)
    if max_run <= 0 or n < 3:
        return mask, values
    with np.errstate(invalid="ignore"):
        fall = np.zeros(n, dtype=bool)
        fall[1:] = free[1:] & (raw[1:] <= drop_share * raw[:-1]) & (raw[:-1] - raw[1:] > 0)
    t = 0
    for t0 in np.flatnonzero(fall):
        if t0 < t:
            continue
        level = raw[t0 - 1]
        tol = min(tau, drop_share * level)
        j = ramp_end(raw, t0, level, tol, max_run)
        if j < 0 or j >= n or not free[t0:j].all():
            continue
        length = j - t0
        end = raw[j]
        i = np.arange(length)
        line = level + (end - level) * np.arange(1, length + 1) / (length + 1)
        scaled = np.clip(raw[t0:j] * length / np.maximum(i, 1), min(level, end) - tol, max(level, end) + tol)
        mask[t0:j] = True
        values[t0:j] = np.concatenate([line[:1], scaled[1:]])
        t = j
    return mask, values


def ramp_end(raw: np.ndarray, t0: int, level: float, tau: float, max_run: int) -> int:
    """The end of a counter reset's ramp that starts at the collapse t0, or -1 when there is none.

    A restarted exporter counts up again from zero: after t0 the values climb at every step,
    the second one still more than τ below x̂_t0 (a drop that jumps straight back is no ramp).
    The ramp ends at the first point that does not climb, is missing or overshoots x̂_t0 by
    more than τ (a spike is no part of it); it is a reset when
    it ends within `max_run` + 1 points of t0 at a value of at least half of x̂_t0 (the demand
    met again, wherever it went meanwhile; a ramp still open at the end of the data counts
    too). The ramp's points from t0 on are the fault; the returned index is the first after it.
    """
    n = raw.size
    if t0 + 1 >= n or not (np.isfinite(raw[t0 + 1]) and raw[t0] < raw[t0 + 1] < level - tau):
        return -1
    # the first value back at the demand climbs from the ramp's last too: a ramp of `max_run`
    # points ends at most `max_run` + 1 points after t0
    j = t0 + 2
    while j < n and j - t0 <= max_run + 1 and np.isfinite(raw[j]) and raw[j - 1] < raw[j] <= level + tau:
        j += 1
    if j - t0 > max_run + 1:
        return -1
    if j < n and j - 1 > t0 + 1 and np.isfinite(raw[j]) and raw[j - 1] >= raw[j]:
        # the last climb already reached the value the ramp ends at: that point is the demand
        j -= 1
    if j < n and not (np.isfinite(raw[j]) and raw[j] >= 0.5 * level):
        return -1
    return j
