"""The scenario file of the virtual datacenter (YAML).

The format other tools read and write::

    step: 5min            # simulation step
    decision_every: 1h    # how often the allocator runs
    node_gpus: 8
    move_minutes: 30      # a moving node serves nobody for this long
    max_moves_per_decision: 4
    platforms:
      kubernetes: {trace: [path/a.csv, path/b.csv]}   # or {synthetic: {...}}
      slurm: {trace: [path/c.csv]}
      openstack: {trace: [path/d.csv], nodes: 12}     # optional: start with this many nodes

A trace entry is a Helios CSV's path, or a mapping naming its format: a platform's own history
(``{format: sacct, path: jobs.txt}``, ``pods``, ``prometheus``, ``csv``; see
:mod:`gpupool.sim.history`). Such a platform needs ``nodes`` (these formats carry no capacity)
and the scenario ``start`` and ``end`` (a job log defines demand at every instant).

Relative trace paths are relative to the scenario file. Optional keys beyond that format:
``start``/``end`` (the simulated window; required when no platform has a trace, otherwise it
clips the traces), ``seed`` (synthetic platforms), ``policy`` (overrides of
:class:`gpupool.decisions.policy.Policy` fields), ``faults`` (telemetry faults the pipeline sees,
:mod:`gpupool.sim.faults`; absent: clean telemetry), ``fastpath`` (the fast path's cadence between
the hourly plans, e.g. ``5min``, or ``off`` for hourly decisions only; absent: what the shipped
``gpupool_fastpath`` DAG does, :data:`gpupool.decisions.cadence.FASTPATH_EVERY`), ``parking``
(``off``, the default, or a mapping of :class:`gpupool.sim.power.ParkingSpec`: parking idle nodes
and waking them, pool-wide settings) and, per platform, ``gpu_model``, ``slice_profile`` and the
ownership keys of ``platforms[]`` in platforms.yaml (``owns``, ``lend_limit``, ``borrow_limit``,
``reclaim_minutes``, ``min_runtime_minutes``; docs/stages/ownership.md). Where any platform gives
one, every platform owns the first ``owns`` of the nodes it holds at the start (absent: all of
them), the plan and the fast path keep the limits, owners reclaim, and the study reports each
platform's lending, borrowing, reclaims and regret against ``static``; without them, nobody owns
anything, as before.

``slice_profile`` (a MIG profile such as ``1g.10gb``; absent: whole GPUs) is the platform
configuration's key of the same name with its default ``slice_demand: requests``: the platform's
trace demand counts slice requests (one unit of demand is one job that fits a slice), the plan
counts it in slices, and the world serves it per node's MIG layout (:mod:`gpupool.sim.slices`).
"""

from __future__ import annotations

import datetime as dt
import math
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gpupool import inputfiles, mig
from gpupool.values import utc_field
from gpupool.config import (BorrowLimit, LendLimit, MinRuntimeMinutes, Ownership, Owns, PlanLimits, ReclaimMinutes,
                            ownership_of)
from gpupool.decisions.cadence import FASTPATH_EVERY
from gpupool.decisions.layouts import GPU_UNIT
from gpupool.errors import UserError, one_line, shown
from gpupool.sim.faults import FaultSpec
from gpupool.sim.history import HistorySpec
from gpupool.sim.power import ParkingSpec, parking_value
from gpupool.sim.synthetic import SyntheticSpec


#: the operator's limits as shipped: a scenario's move rules default to them (defined once there)
_LIMITS = PlanLimits()


class ScenarioError(UserError, ValueError):
    """A scenario file that cannot be used; the message names the file and the key."""


def _timedelta(value: Any) -> dt.timedelta:
    if isinstance(value, dt.timedelta):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        raise ValueError(f"give a duration with a unit such as '5min' or '1h', not a bare number {shown(value)}")
    if isinstance(value, (list, tuple, dict, set)):
        raise ValueError(f"not a duration: {shown(value)}")
    try:
        out = pd.Timedelta(str(value))
    except (ValueError, TypeError, OverflowError):
        out = pd.NaT
    if out is pd.NaT:
        raise ValueError(f"not a duration: {shown(value)}")
    return out.to_pytimedelta()


class PlatformSpec(BaseModel):
    """Where one platform's demand comes from and how many nodes it starts with."""

    model_config = ConfigDict(extra="forbid")

    trace: list[HistorySpec | Path] | None = None
    synthetic: SyntheticSpec | None = None
    nodes: int | None = Field(None, ge=0)
    gpu_model: str = "NVIDIA A100-SXM4-80GB"
    slice_profile: str | None = Field(None, description="the MIG profile its jobs ask for; None: whole GPUs")
    owns: Owns
    lend_limit: LendLimit
    borrow_limit: BorrowLimit
    reclaim_minutes: ReclaimMinutes
    min_runtime_minutes: MinRuntimeMinutes

    @field_validator("slice_profile")
    @classmethod
    def _known_profile(cls, value: str | None) -> str | None:
        return mig.check_profile(value)

    @field_validator("trace", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        if isinstance(value, (str, Path)):
            return [value]
        if isinstance(value, list) and not value:
            raise ValueError("at least one trace file")
        if isinstance(value, list):  # a mapping names its format: its own message, not a union's
            out = []
            for i, entry in enumerate(value):
                if isinstance(entry, dict):
                    try:
                        entry = HistorySpec.model_validate(entry)
                    except ValidationError as exc:
                        first = exc.errors()[0]
                        key = ".".join(str(p) for p in first["loc"])
                        msg = one_line(str(first["msg"]).removeprefix("Value error, "))
                        raise ValueError(f"entry {i}: {one_line(key, 100) + ': ' if key else ''}{msg}") from None
                    if entry.format == "helios":
                        entry = entry.path
                out.append(entry)
            return out
        return value

    @model_validator(mode="after")
    def _one_source(self) -> "PlatformSpec":
        if (self.trace is None) == (self.synthetic is None):
            raise ValueError("give exactly one of 'trace' or 'synthetic'")
        history = [t.format for t in self.trace or () if isinstance(t, HistorySpec)]
        if history and self.nodes is None:
            raise ValueError(f"nodes: required with a {history[0]} trace (it carries no capacity)")
        return self

    def history(self) -> list[HistorySpec]:
        """The trace entries that name a format other than Helios."""
        return [t for t in self.trace or () if isinstance(t, HistorySpec)]

    def trace_files(self) -> list[Path]:
        """Every file the platform's traces read."""
        return [f for t in self.trace or () for f in (t.files() if isinstance(t, HistorySpec) else [t])]


class Scenario(BaseModel):
    """A parsed scenario: timing, node size, move rules and the platforms' demand sources."""

    model_config = ConfigDict(extra="forbid")

    step: dt.timedelta = dt.timedelta(minutes=5)
    decision_every: dt.timedelta = dt.timedelta(hours=1)
    node_gpus: int = Field(8, gt=0)
    move_minutes: float = Field(_LIMITS.move_minutes, ge=0, le=366 * 24 * 60, allow_inf_nan=False)  # at most a year
    max_moves_per_decision: int = Field(_LIMITS.max_moves_per_decision, ge=0)
    platforms: dict[str, PlatformSpec]
    start: dt.datetime | None = None
    end: dt.datetime | None = None
    seed: int = 0
    policy: dict[str, Any] = Field(default_factory=dict)
    faults: FaultSpec | None = Field(None, description="telemetry faults the pipeline sees (gpupool.sim.faults)")
    fastpath: dt.timedelta | None = Field(FASTPATH_EVERY, description="the fast path's cadence; None: off (hourly only)")
    parking: ParkingSpec | None = Field(None, description="parking idle nodes (gpupool.sim.power); None: off")
    name: str = ""
    source: Path | None = Field(None, exclude=True, description="the file this scenario was read from")

    @field_validator("step", "decision_every", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> dt.timedelta:
        return _timedelta(value)

    @field_validator("fastpath", mode="before")
    @classmethod
    def _fastpath(cls, value: Any) -> dt.timedelta | None:
        # YAML reads a bare `off` as False and `on` as True
        if value is False or (isinstance(value, str) and value.strip().lower() == "off"):
            return None
        if value is True or (isinstance(value, str) and value.strip().lower() == "on"):
            return FASTPATH_EVERY
        if value is None:
            raise ValueError("give the fast path's cadence as a duration such as '5min', or 'off'")
        return _timedelta(value)

    @field_validator("parking", mode="before")
    @classmethod
    def _parking(cls, value: Any) -> Any:
        return parking_value(value)

    @field_validator("policy")
    @classmethod
    def _policy(cls, value: dict[str, Any]) -> dict[str, Any]:
        from gpupool.decisions.policy import Policy

        from gpupool.config import check_section

        return check_section(Policy, value)

    @field_validator("start", "end", mode="before")
    @classmethod
    def _instant(cls, value: Any) -> Any:
        return utc_field(value)

    @model_validator(mode="after")
    def _consistent(self) -> "Scenario":
        if not self.platforms:
            raise ValueError("platforms: at least one platform")
        if self.step <= dt.timedelta(0):
            raise ValueError("step must be positive")
        ratio = self.decision_every / self.step
        if self.decision_every < self.step or abs(ratio - round(ratio)) > 1e-9:
            raise ValueError(f"decision_every ({self.decision_every}) must be a whole multiple of step ({self.step})")
        if self.fastpath is not None and "fastpath" not in self.model_fields_set and self.fastpath % self.step:
            # the product's cadence on a coarser grid: the world changes only at its steps
            self.fastpath = self.step * math.ceil(self.fastpath / self.step)
        if self.fastpath is not None:
            fast = self.fastpath / self.step
            if self.fastpath < self.step or abs(fast - round(fast)) > 1e-9:
                raise ValueError(f"fastpath ({self.fastpath}) must be 'off' or a whole multiple of step ({self.step})")
        if self.start is not None and self.end is not None and self.end <= self.start:
            raise ValueError(f"end ({self.end}) must be after start ({self.start})")
        if all(p.trace is None for p in self.platforms.values()) and (self.start is None or self.end is None):
            raise ValueError("start and end are required when no platform replays a trace")
        history = [(n, p.history()[0].format) for n, p in self.platforms.items() if p.history()]
        if history and (self.start is None or self.end is None):
            name, fmt = history[0]
            raise ValueError(f"start and end are required with a {fmt} trace (platforms.{name}): a job log "
                             "defines demand at every instant, zero between jobs")
        return self

    def demand_units(self) -> dict[str, tuple[str, int]]:
        """Each platform's demand unit and the factor from its demand to it, as
        :func:`gpupool.jobs.allocation.demand_units` gives them (``slice_demand: requests``:
        one unit of demand is one request, so the factor is 1)."""
        return {name: (spec.slice_profile or GPU_UNIT, 1) for name, spec in self.platforms.items()}

    def ownership(self) -> dict[str, Ownership]:
        """Each platform's ownership promises where some platform gives an ownership key; ``{}``
        where none does (nobody owns anything: the study runs as before)."""
        keys = set(Ownership.model_fields)
        if not any(keys & spec.model_fields_set for spec in self.platforms.values()):
            return {}
        return {name: ownership_of(spec) for name, spec in self.platforms.items()}

    @property
    def step_td(self) -> pd.Timedelta:
        """The step as a pandas Timedelta."""
        return pd.Timedelta(self.step)

    def label(self) -> str:
        """A short name for reports: ``name`` or the file's stem."""
        if self.name:
            return self.name
        return self.source.stem if self.source is not None else "scenario"


def load_scenario(path: str | Path) -> Scenario:
    """Read and check a scenario YAML file.

    Relative trace paths are resolved against the file's directory and must exist.

    Raises
    ------
    ScenarioError
        With the file and the offending key in the message (``scenario.yaml: platforms.slurm.trace: ...``).
    """
    path = Path(path)
    raw = inputfiles.load_yaml(path, "scenario", inputfiles.MAX_SCENARIO_BYTES, ScenarioError)
    if not isinstance(raw, dict):
        raise ScenarioError(f"{path}: a scenario is a mapping with at least 'platforms', got {type(raw).__name__}")
    return scenario_from_dict(raw, base_dir=path.parent, where=str(path))


def scenario_from_dict(raw: dict, base_dir: str | Path = ".", where: str = "scenario") -> Scenario:
    """Build a :class:`Scenario` from an already-parsed mapping (same rules as :func:`load_scenario`)."""
    base_dir = Path(base_dir)
    if "platforms" not in raw:
        raise ScenarioError(f"{where}: platforms: missing key (a mapping of platform name -> demand source)")
    if not isinstance(raw["platforms"], dict):
        raise ScenarioError(f"{where}: platforms: must be a mapping of platform name -> demand source")
    try:
        scenario = Scenario.model_validate({**raw})
    except ValidationError as exc:
        first = exc.errors()[0]
        key = one_line(".".join(str(p) for p in first["loc"]), 120) or "(top level)"
        more = f" (and {exc.error_count() - 1} more problems)" if exc.error_count() > 1 else ""
        msg = one_line(str(first["msg"]).removeprefix("Value error, "))
        raise ScenarioError(f"{where}: {key}: {msg}{more}") from exc
    platforms = {}
    for name, spec in scenario.platforms.items():
        if spec.trace is not None:
            paths = []
            for i, p in enumerate(spec.trace):
                if isinstance(p, HistorySpec):
                    files = {k: _existing(getattr(p, k), base_dir, f"{where}: platforms.{name}.trace.{i}.{k}")
                             for k in ("path", "allocated", "pending") if getattr(p, k) is not None}
                    paths.append(p.model_copy(update=files))
                    continue
                paths.append(_existing(p, base_dir, f"{where}: platforms.{name}.trace.{i}"))
            spec = spec.model_copy(update={"trace": paths})
        platforms[name] = spec
    source = Path(where) if where != "scenario" else None
    return scenario.model_copy(update={"platforms": platforms, "source": source})


def _existing(path: Path, base_dir: Path, where: str) -> Path:
    """``path`` against ``base_dir`` when relative, resolved; a ScenarioError when it is no
    regular file or holds more than a trace may (:func:`gpupool.inputfiles.file_problem`)."""
    full = path if path.is_absolute() else (base_dir / path)
    problem = inputfiles.file_problem(full, inputfiles.MAX_TRACE_BYTES, "trace")
    if problem == "no such file":
        raise ScenarioError(f"{where}: no such file {full}")
    if problem is not None:
        raise ScenarioError(f"{where}: {full} {problem}")
    return full.resolve()
