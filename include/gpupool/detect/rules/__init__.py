"""The cleaning rules, one module each: what looks like an exporter fault is replaced, everything
else the series does is kept.

- `spikes`: a short excursion that towers over the series' own and jumps back;
- `faults`: falls towards zero that come back (drops, collapses) and counter resets;
- `stuck`: one exact value repeated for longer than the history makes plausible;
- `outages`: on a series that hardly idles, a long fall to zero is the exporter's;
- `gaps`: the line that bridges a cleaned run or a short gap.

`gpupool.detect.clean` applies them in order to each flagged point.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class CleaningRules(BaseModel):
    """The cleaning rules' settings that tests and benches vary (`RouterConfig.cleaning`); the
    rest are constants beside each rule.

    Chosen with bench/detect_cleaning.py (injected exporter faults on synthetic and Helios demand,
    scored by the day-ahead forecast they spoil); the allocation study (bench/allocate_helios.py)
    weighs the two that are off by default.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_anomaly_run: int = Field(
        3,
        ge=0,
        description="a flagged excursion (a spike, or a fall to zero) is cleaned only if the series comes back in at "
        "most this many points; otherwise it is a level shift, a burst of real demand or an idle spell: kept, "
        "marked `sustained` (0: no limit, every flagged point is cleaned)",
    )
    spike_height_factor: float = Field(
        3.0,
        ge=0.0,
        description="a flagged excursion that comes back within `max_anomaly_run` points is cleaned only when it "
        "stands more than this x the history's ordinary local-peak height (`spikes.SPIKE_HEIGHT_QUANTILE`) above "
        "(or below) the values on both sides of it; a smaller one is the series' own noise or a short surge of "
        "real demand and is kept (0: no such test)",
    )
    spike_max_shoulder: float = Field(
        0.25,
        ge=0.0,
        le=1.0,
        description="a cleaned excursion rises from the level and falls back at once: the values just before "
        "and after it carry at most this share of its deviation from x̂ (a surge of real demand climbs and "
        "ebbs over a few points; 1: no such test)",
    )
    max_fault_run: int = Field(
        36,
        ge=0,
        description="a counter reset of the exporter (a fall to zero, then a climb at every step back to the "
        "demand) within this many points is cleaned as one fault (0: no fall to zero is cleaned)",
    )
    min_stuck_run: int = Field(
        6,
        ge=0,
        description="a run of one exact value longer than this many points (and than `stuck.STUCK_RUN_FACTOR` x "
        "the history's typical run) on a series whose history varies is a stuck exporter: its repeats are "
        "replaced (0: no such rule)",
    )
    max_stuck_run: int = Field(
        72, ge=0, description="a run of one value longer than this many points is kept as real (0: no limit)"
    )
    stuck_max_repeat_share: float = Field(
        0.1,
        ge=0.0,
        le=1.0,
        description="a series can be stuck only if at most this share of its history's steps repeat the value "
        "before: a count that repeats more often stands still in plateaus at every level, which a stuck exporter "
        "cannot be told from by values alone (docs/decisions/0018-stuck-from-values.md; 1: every series is "
        "judged on its runs at the run's level). A series judged with a co-moving series "
        "(`stream_detect(moving=)`, docs/decisions/0020-stuck-co-moving.md) is judged whatever its repeat share",
    )
    outage_max_idle_share: float | None = Field(
        0.01,
        ge=0.0,
        le=1.0,
        description="a fall to zero that comes back within `max_fault_run` points is an exporter outage, however "
        "long, on a series whose history hardly idles: at most this share of its points lie in runs of more than "
        "`max_anomaly_run` points at or below `faults.FAULT_DROP_SHARE` x its median (a series that never idles "
        "does not idle for an hour and come back to where it was; one that does keeps its idle spells). None "
        "switches it off. The price: real demand does fall idle for the first time in a week now and then, and "
        "such an hour is replaced (bench/detect_cleaning.py weighs it)",
    )
    scales_without_fault_shapes: bool = Field(
        False,
        description="read a history's typical step (the floor of its residual spread, so τ) and its peak height "
        "(the spike bar) without the points shaped like an exporter's faults (`faults.fault_shaped`): at faults "
        "on a few % of the steps of a flat count, the quantile of its peak heights is otherwise a fault's own "
        "size and the next faults pass. Off by default: it cleans more of the faults, but the allocation study "
        "(bench/allocate_helios.py) did not follow",
    )
    open_move_factor: float = Field(
        0.0,
        ge=0.0,
        description="a flagged move still open at the end of the data (the newest points: it cannot be told "
        "from a step of the demand yet) is cleaned only when it moved more than this x the history's "
        "`spikes.SPIKE_HEIGHT_QUANTILE` one-step change from the point before it; a smaller one is kept as the "
        "demand stepping (a fall to zero is the collapse rule's). 0: off, every such move is cleaned as a point "
        "anomaly",
    )
