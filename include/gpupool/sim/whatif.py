"""`gpupool whatif`: a scenario built from a platform's own history and the user's node counts.

A source on the command line is ``FORMAT:PATH[,key=value...]`` — ``sacct:jobs.txt``,
``pods:pods.csv,origin=2023-01-01T00:00:00Z``, ``csv:demand.csv,time_col=ts,value_col=gpus``,
``prometheus:allocated.json,pending=pending.json`` — or a bare path (a Helios CSV). The keys are
those of a scenario's trace mapping (:class:`gpupool.sim.history.HistorySpec`); a live Prometheus
(``url`` and queries, whose commas a command line cannot split) goes in a scenario file.

The ownership keys of a scenario's platform (``owns``, ``lend_limit``, ...; docs/stages/ownership.md)
are options named after them, ``--reclaim-minutes [PLATFORM=]VALUE`` (:func:`parse_ownership`): a
bare value holds for every platform of the study, ``PLATFORM=VALUE`` for that one (over a bare one).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from gpupool import inputfiles
from gpupool.cli_args import echo
from gpupool.config import MAX_DURATION_HOURS
from gpupool.errors import UsageError, one_line
from gpupool.sim.history import HISTORY_FORMATS, HistorySpec, history_span
from gpupool.sim.scenario import Scenario, scenario_from_dict

#: the platforms `gpupool whatif` has options for (their nodes are named as the real ones are)
WHATIF_PLATFORMS = ("slurm", "kubernetes", "openstack")
#: the ownership keys `gpupool whatif` has options for (``--lend-limit`` for ``lend_limit``), each
#: with whether it is a whole count and the least value it takes (reclaim_minutes: more than 0)
OWNERSHIP_OPTIONS = {"owns": (True, 0), "lend_limit": (True, 0), "borrow_limit": (True, 0),
                     "reclaim_minutes": (False, None), "min_runtime_minutes": (False, 0)}


def parse_ownership(given: dict[str, list[str] | None], study: Any) -> dict[str, dict[str, Any]]:
    """Platform -> its ownership keys, from each key's option values (``given``: ``lend_limit`` ->
    the ``--lend-limit`` values, None or [] where not given) for the platforms of the ``study``
    (those with a history). ``VALUE`` holds for every platform of the study, ``PLATFORM=VALUE`` for
    that one, over a bare value. A platform `gpupool whatif` has no option for or that has no history,
    a value that is not a number (a whole one for a count) or out of range, or one said twice, is a
    UsageError naming the option and the value."""
    out: dict[str, dict[str, Any]] = {}
    for key, texts in given.items():
        whole, least = OWNERSHIP_OPTIONS[key]
        option = "--" + key.replace("_", "-")
        every: Any = None
        own: dict[str, Any] = {}
        for text in texts or ():
            name, eq, value = text.rpartition("=")
            name = name.strip()
            where = f"{option} {echo(text)}"
            if eq and name not in WHATIF_PLATFORMS:
                raise UsageError(f"{where}: no platform {echo(name)} (give {', '.join(WHATIF_PLATFORMS)}, or no "
                                 "PLATFORM= for every platform)")
            if eq and name not in study:
                raise UsageError(f"{where}: without --{name}")
            number = _number(value.strip(), whole, least, where)
            if (name in own) if eq else (every is not None):
                raise UsageError(f"{where}: {key} of {name if eq else 'every platform'} is given twice")
            if eq:
                own[name] = number
            else:
                every = number
        for name in study:
            value = own.get(name, every)
            if value is not None:
                out.setdefault(name, {})[key] = value
    return {name: out[name] for name in study if name in out}


def _number(text: str, whole: bool, least: float | None, where: str) -> int | float:
    """``text`` as a count (``whole``) or minutes in range; else a UsageError at ``where``."""
    limit = MAX_DURATION_HOURS * 60
    try:
        value: int | float = int(text) if whole else float(text)
    except ValueError:
        raise UsageError(f"{where}: not a {'whole number' if whole else 'number of minutes'}") from None
    if whole and value < 0:
        raise UsageError(f"{where}: give 0 or more")
    if not whole and not (math.isfinite(value) and (value > 0 if least is None else value >= least) and value <= limit):
        raise UsageError(f"{where}: give minutes {'above 0' if least is None else 'from 0'} up to {limit} (a year)")
    return value


def parse_source(text: str, option: str) -> dict[str, Any] | str:
    """One ``FORMAT:PATH[,key=value...]`` as a scenario trace entry (a bare path: Helios). A key
    that says the format or the file again (``format=``, ``path=``; ``allocated=`` for
    prometheus), or a key given twice, is refused."""
    fmt, sep, rest = text.partition(":")
    if not sep or fmt not in (*HISTORY_FORMATS, "helios"):
        return text
    path, *pairs = rest.split(",")
    if not path:
        raise UsageError(f"{option} {text}: give the file after '{fmt}:'")
    file_key = "allocated" if fmt == "prometheus" else "path"
    entry: dict[str, Any] = {"format": fmt, file_key: path}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        key = key.strip()
        if not eq or not key:
            raise UsageError(f"{option} {text}: {pair!r} is not key=value")
        if key in ("format", file_key):  # FORMAT:PATH said it; a key must not quietly say otherwise
            raise UsageError(f"{option} {text}: {key} is given by {fmt}:{path}; a key may not set it again")
        if key in entry:
            raise UsageError(f"{option} {text}: {key} is given twice")
        entry[key] = value.strip()
    return entry


def whatif_scenario(sources: dict[str, list[str]], nodes: dict[str, int | None], *, start: str | None = None,
                    end: str | None = None, settings: dict[str, Any] | None = None,
                    base_dir: str | Path = ".",
                    ownership: dict[str, dict[str, Any]] | None = None) -> tuple[Scenario, dict[str, Any]]:
    """The scenario of a what-if and its mapping (what ``--scenario-out`` writes, with absolute
    paths). Without ``start``/``end`` the window is the span the history files name, on the step
    grid (a job still running at the log's last instant runs to it). ``ownership``: platform ->
    its ownership keys (``owns``, ``lend_limit``, ``reclaim_minutes``, ...), as a scenario's."""
    base_dir = Path(base_dir)
    if not sources:
        raise UsageError("give at least one platform's history, e.g. --slurm sacct:jobs.txt")
    platforms: dict[str, dict[str, Any]] = {}
    for name, texts in sources.items():
        trace = [parse_source(t, f"--{name}") for t in texts]
        history = [e["format"] for e in trace if isinstance(e, dict) and e["format"] != "helios"]
        if history and nodes.get(name) is None:
            raise UsageError(f"--{name}-nodes: required with a {history[0]} history (it carries no capacity)")
        platforms[name] = {"trace": [_absolute(e, base_dir, f"--{name} {t}") for e, t in zip(trace, texts)]}
        if nodes.get(name) is not None:
            platforms[name]["nodes"] = nodes[name]
        platforms[name].update((ownership or {}).get(name, {}))
    raw: dict[str, Any] = {"start": start, "end": end, **(settings or {}), "platforms": platforms}
    if start is None or end is None:
        lo, hi = _span(raw, sources)
        if lo is not None:
            raw["start"] = start if start is not None else lo.isoformat()
            raw["end"] = end if end is not None else hi.isoformat()
    raw = {k: v for k, v in raw.items() if v is not None}
    scenario = scenario_from_dict(raw, base_dir=base_dir, where="the scenario built")
    return scenario, raw


def scenario_text(raw: dict[str, Any]) -> str:
    """A scenario mapping as the YAML file `gpupool simulate` reads."""
    head = "# written by gpupool whatif; run it again with: gpupool simulate THIS_FILE\n"
    return head + yaml.safe_dump(raw, sort_keys=False, default_flow_style=None)


def _absolute(entry: dict[str, Any] | str, base_dir: Path, option: str) -> dict[str, Any] | str:
    """``entry`` with its files resolved; a UsageError naming the option when one is missing, is
    no regular file or holds more than a trace may (:func:`gpupool.inputfiles.file_problem`)."""
    def resolved(value: str) -> str:
        full = (base_dir / value).resolve()
        problem = inputfiles.file_problem(full, inputfiles.MAX_TRACE_BYTES, "trace")
        if problem == "no such file":
            raise UsageError(f"{option}: no such file {full}")
        if problem is not None:
            raise UsageError(f"{option}: {full} {problem}")
        return str(full)

    if isinstance(entry, str):
        return resolved(entry)
    return {k: resolved(v) if k in ("path", "allocated", "pending") else v for k, v in entry.items()}


def _span(raw: dict[str, Any], sources: dict[str, list[str]]) -> tuple[pd.Timestamp | None, pd.Timestamp | None]:
    """The first and last instant the history entries name, widened to whole steps."""
    from pydantic import ValidationError

    try:
        step = pd.Timedelta(str(raw.get("step", "5min")))
    except ValueError:
        raise UsageError(f"--step {raw.get('step')}: not a duration such as 5min") from None
    firsts, lasts = [], []
    for name, platform in raw["platforms"].items():
        platform = {**platform, "sources": sources[name]}
        for text, entry in zip(platform["sources"], platform["trace"]):
            if not isinstance(entry, dict):
                continue
            try:
                spec = HistorySpec.model_validate(entry)
            except ValidationError as exc:
                first = exc.errors()[0]
                key = one_line(".".join(str(p) for p in first["loc"]), 100)
                msg = one_line(str(first["msg"]).removeprefix("Value error, "))
                raise UsageError(f"--{name} {text}: {key + ': ' if key else ''}{msg}") from None
            span = history_span(spec)
            if span is not None:
                firsts.append(span[0])
                lasts.append(span[1])
    if not firsts:
        return None, None
    lo = min(firsts).floor(step)
    hi = max(lasts).ceil(step)
    return lo, max(hi, lo + step)
