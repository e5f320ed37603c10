"""`gpupool report`: an HTML report with PNG plots of a staged period and its what-if table.

Plots: demand vs capacity per platform with the detect stage's decisions marked (cleaned as a
telemetry fault, or kept as a real burst), each hour's one-hour-ahead forecast against the demand
that came, with intervals, and moves on a timeline. An energy panel: per platform, the parked
node-hours, wakes, late wakes and the energy parking saved over the period. The what-if table replays the period's staged demand through
`gpupool simulate` under every policy: the staged demand is written as Helios-format traces
next to the report, with a scenario file in the simulator's format, so the study can be
rerun or edited by hand.
"""

from __future__ import annotations

import contextlib
import html
import json
import os
import shutil
import stat
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Iterator

import pandas as pd
import yaml
from sqlalchemy.engine import Engine

from gpupool import energy
from gpupool.decisions.policy import POLICY_KINDS
from gpupool.canonical import DEMAND_METRICS
from gpupool.errors import UsageError, UserError
from gpupool.poolview import decision_label
from gpupool.staging import power as power_store
from gpupool.staging import reads
from gpupool.tsio import unwritable
from gpupool.values import jsonable


class ReportError(UserError, ValueError):
    """Nothing to report for the period asked."""


#: the file gpupool writes into a report directory, listing what it wrote there: a directory that
#: holds it (and nothing else) may be replaced by the next report
MARKER = ".gpupool-report"


def check_report_dir(out: str | Path) -> Path:
    """Refuse, before any work, a report directory gpupool may not write (a
    :class:`gpupool.errors.UsageError` in one line); returns it as a Path.

    Accepted: a new directory in a writable parent, an empty writable directory, and one a
    report wrote before (its :data:`MARKER` lists every entry it holds), which is replaced.
    Refused: a file, a symbolic link, a missing or unwritable parent, and a directory that holds
    anything a report did not write (never overwritten, never followed)."""
    out = Path(out)
    if out.is_symlink():
        raise UsageError(f"--out {out} is a symbolic link to {os.readlink(out)}; give the directory itself")
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file, not a directory; give a directory for the report")
    if out.is_dir():
        owned = _report_entries(out)
        stray = sorted(set(os.listdir(out)) - (owned or set()) - {MARKER})
        if stray and owned is None:
            raise UsageError(f"--out {out} is a directory gpupool did not write (it holds {stray[0]!r}); "
                             "give a new or empty directory")
        if stray:
            raise UsageError(f"--out {out} holds {stray[0]!r}, which no gpupool report wrote; "
                             "move it away or give a new directory")
        why = unwritable(out)
        if why:
            raise UsageError(f"--out {out}: directory is not writable ({why})")
        return out
    if not out.parent.is_dir():
        raise UsageError(f"--out {out}: directory {out.parent} does not exist")
    why = unwritable(out.parent)
    if why:
        raise UsageError(f"--out {out}: directory {out.parent} is not writable ({why})")
    return out


def _report_entries(out: Path) -> set[str] | None:
    """The entries ``out``'s marker says a report wrote, or None where it holds no readable marker."""
    marker = out / MARKER
    try:
        if not stat.S_ISREG(os.lstat(marker).st_mode) or os.lstat(marker).st_size > 1 << 16:
            return None
        entries = json.loads(marker.read_text(encoding="utf-8")).get("entries")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(entries, list) or not all(isinstance(e, str) and e and "/" not in e and e not in (".", "..")
                                                for e in entries):
        return None
    return set(entries)


@contextlib.contextmanager
def _report_dir(out: Path) -> Iterator[Path]:
    """Yield a new, empty directory to build the report in; on success it becomes ``out``, on
    failure it is removed and ``out`` is left as it was: a reader never finds half a report.

    A new ``out`` is built beside it and renamed into place in one step; an existing one (empty,
    or a report's, as :func:`check_report_dir` accepted it) is built inside and its entries
    swapped in, the marker last. Nothing inside ``out`` is ever written through or followed: the
    old report's entries are moved aside and removed (a link as a link)."""
    fresh = not out.exists()
    build = Path(tempfile.mkdtemp(prefix=f".{out.name}." if fresh else ".gpupool-build.", suffix=".tmp",
                                  dir=out.parent if fresh else out))
    try:
        yield build
        entries = sorted(os.listdir(build))
        (build / MARKER).write_text(json.dumps({"written_by": "gpupool report", "entries": entries}) + "\n")
        if fresh:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(build, 0o777 & ~umask)  # as a plain mkdir would have made it
            os.rename(build, out)
            return
        old = Path(tempfile.mkdtemp(prefix=".gpupool-old.", suffix=".tmp", dir=out))
        for name in sorted(_report_entries(out) or ()):
            if os.path.lexists(out / name):
                os.rename(out / name, old / name)
        for name in entries:
            os.rename(build / name, out / name)
        os.replace(build / MARKER, out / MARKER)
        os.rmdir(build)
        shutil.rmtree(old)
    except OSError as exc:
        raise UsageError(f"--out {out}: cannot write the report ({exc.strerror or exc})") from None
    finally:
        if build.exists():
            shutil.rmtree(build, ignore_errors=True)


def _read_platform_series(engine: Engine, start: datetime, end: datetime) -> pd.DataFrame:
    frame = reads.platform_series(engine, start, end)
    if frame.empty:
        raise ReportError(f"staging holds no platform samples in [{start.isoformat()}, {end.isoformat()})")
    return frame


def write_report(engine: Engine, start: datetime, end: datetime, out: str | Path, step: str = "5min",
                 whatif: bool = True, progress: Callable[[str], None] | None = None, config: Any = None) -> Path:
    """Write `index.html` (with the energy panel, :func:`energy_panel`; ``config`` gives each
    platform's watts), the PNG plots, `demand_hourly.csv` (the hourly demand plotted),
    `forecast_hourly.csv` (each hour's one-hour-ahead forecast plotted, and whether a pipeline
    run issued it or the report replayed the forecast stage's model), the what-if
    traces/scenario and `whatif.json` to the directory `out`, with the :data:`MARKER` that lets
    the next report replace them. The report covers the part of [start, end) staging holds
    samples for (:func:`data_span`; the page says so where that is less than the window), so its
    time follows the data, not the window.

    Refuses (a :class:`gpupool.errors.UserError`, before anything is written) an ``out``
    :func:`check_report_dir` refuses and a period staging holds no samples for. The report is
    built apart and moved into place whole: a failure leaves ``out`` as it was."""
    out = check_report_dir(out)
    raw = _read_platform_series(engine, start, end)  # nothing to report: refused before out is made
    with _report_dir(out) as build:
        _write_files(engine, raw, start, end, build, step, whatif, progress, config)
    return out / "index.html"


def energy_panel(engine: Engine, start: datetime, end: datetime, platforms: list[str], config: Any = None) -> list[dict]:
    """One row per platform (those given, and any other a node was parked on), then a
    ``total`` row: ``parked_node_hours``, ``wakes`` (started in [start, end)), ``late_wakes``
    and ``saved_kwh`` (:func:`gpupool.energy.summary`)."""
    per = energy.summary(power_store.live_transitions(engine, end), start, end, config, platforms)
    rows = [{"platform": p, **v} for p, v in per.items()]
    total = {k: sum(r[k] for r in rows) for k in ("parked_node_hours", "wakes", "late_wakes", "saved_kwh")}
    return rows + [{"platform": "total", **total}]


def data_span(raw: pd.DataFrame, start: datetime, end: datetime) -> tuple[datetime, datetime]:
    """The part of [start, end) that ``raw``'s samples cover, in whole hours: from the hour of
    the first sample to the end of the hour of the last."""
    ts = pd.to_datetime(raw["ts"], utc=True)
    first, last = ts.min().floor("1h"), ts.max().floor("1h") + pd.Timedelta("1h")
    return max(pd.Timestamp(start), first).to_pydatetime(), min(pd.Timestamp(end), last).to_pydatetime()


def _write_files(engine: Engine, raw: pd.DataFrame, asked_start: datetime, asked_end: datetime, out: Path,
                 step: str, whatif: bool, progress: Callable[[str], None] | None, config: Any = None) -> None:
    """Every file of the report, into the (new, empty) directory ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    start, end = data_span(raw, asked_start, asked_end)
    tick = progress or (lambda _label: None)
    wide = raw.pivot_table(index="ts", columns=["platform", "metric"], values="value", aggfunc="mean").sort_index()
    platforms = sorted(raw["platform"].unique())
    marks = reads.cleaning_decisions(engine, start, end)  # the detect stage's decisions on demand points
    stored = reads.forecasts_issued_between(engine, start, end, step=1)
    plans = reads.plans_between(engine, start, end)
    hourly = {p: reads.hourly_demand(engine, p, start, end)[0] for p in platforms}
    fc = _one_hour_ahead(engine, platforms, start, end, stored)
    fc[["platform", "ts", "yhat", "yhat_lower", "yhat_upper", "source"]].to_csv(out / "forecast_hourly.csv", index=False)
    _demand_table(hourly).to_csv(out / "demand_hourly.csv", index=False)

    figures: list[tuple[str, str]] = []
    # 1. demand vs capacity
    fig, axes = plt.subplots(len(platforms), 1, figsize=(11, 2.6 * len(platforms)), sharex=True, squeeze=False)
    for ax, p in zip(axes[:, 0], platforms):
        demand = sum(wide[(p, m)] for m in DEMAND_METRICS if (p, m) in wide) if any((p, m) in wide for m in DEMAND_METRICS) else None
        if demand is not None:
            ax.plot(demand.index, demand.to_numpy(), lw=1, color="#0969da", label="demand (allocated + pending)")
        if (p, "gpu_capacity") in wide:
            ax.plot(wide.index, wide[(p, "gpu_capacity")].to_numpy(), lw=1.2, color="#57606a", label="capacity")
        a = marks[marks["platform"] == p]
        if len(a) and demand is not None:
            # marked on the demand line at the point's time (the raw demand, before cleaning),
            # one legend entry per decision the detect stage stored
            for (decision, fault), g in a.groupby(["decision", "fault"], sort=True):
                on_line = demand.reindex(pd.DatetimeIndex(g["ts"].drop_duplicates()))
                style = _MARK_STYLE[decision]
                ax.scatter(on_line.index, on_line.to_numpy(), zorder=3, **style,
                           label=f"{decision_label(decision, fault)} ({len(on_line)})")
        ax.set_title(p, loc="left", fontsize=10)
        ax.set_ylabel("GPUs")
        ax.legend(loc="upper right", fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "demand_capacity.png", dpi=90)
    plt.close(fig)
    figures.append(("demand_capacity.png", "Demand and capacity per platform: points cleaned as telemetry "
                                           "faults and points kept as real bursts marked"))
    tick("demand vs capacity")

    # 2. forecast (one hour ahead) vs actual hourly demand, with the interval
    if len(fc):
        fig, axes = plt.subplots(len(platforms), 1, figsize=(11, 2.6 * len(platforms)), sharex=True, squeeze=False)
        for ax, p in zip(axes[:, 0], platforms):
            f = fc[fc["platform"] == p].sort_values("ts")
            actual = hourly[p]  # the demand the forecast is fitted on
            ax.plot(actual.index, actual.to_numpy(), color="#0969da", lw=1.2, label="actual (hourly mean)")
            if len(f):
                ax.fill_between(f["ts"], f["yhat_lower"], f["yhat_upper"], color="#bf8700", alpha=0.25, label="interval")
                ax.plot(f["ts"], f["yhat"], color="#bf8700", lw=1, label="forecast 1 h ahead, each hour")
                issued = f[f["source"] == "stored"]
                if len(issued):
                    ax.scatter(issued["ts"], issued["yhat"], s=16, color="#953800", zorder=3, label="issued by a pipeline run")
            ax.set_title(p, loc="left", fontsize=10)
            ax.legend(loc="upper right", fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "forecast_actual.png", dpi=90)
        plt.close(fig)
        figures.append(("forecast_actual.png", "Each hour's one-hour-ahead forecast against the demand that came"))
    tick("forecast vs actual")

    # 3. moves on a timeline
    moves = [(pd.Timestamp(r.decided_at), m) for r in plans for m in (r.moves or [])]
    fig, ax = plt.subplots(figsize=(11, 1.8 + 0.25 * len(platforms)))
    ypos = {p: i for i, p in enumerate(platforms)}
    for t, m in moves:
        y0, y1 = ypos.get(m.get("from"), -1), ypos.get(m.get("to"), -1)
        ax.annotate("", xy=(t, y1), xytext=(t, y0), arrowprops={"arrowstyle": "->", "color": "#8250df"})
    ax.set_yticks(range(len(platforms)), platforms)
    ax.set_xlim(pd.Timestamp(start), pd.Timestamp(end))
    ax.set_title(f"Planned moves ({len(moves)})", loc="left", fontsize=10)
    fig.tight_layout()
    fig.savefig(out / "moves.png", dpi=90)
    plt.close(fig)
    figures.append(("moves.png", "Planned node moves (source → target)"))
    tick("moves")

    table, notes = None, []
    if (start, end) != (pd.Timestamp(asked_start), pd.Timestamp(asked_end)):
        notes.append(f"Window asked: {pd.Timestamp(asked_start).isoformat()} – {pd.Timestamp(asked_end).isoformat()}; "
                     f"staging holds samples only for {start.isoformat()} – {end.isoformat()}, which this report covers.")
    if whatif:
        try:
            table = what_if(raw, out, step=step, progress=tick)
        except UserError as exc:  # e.g. a span shorter than one move: the plots still stand
            notes.append(f"The what-if did not run: {' '.join(str(exc).split())}")
        else:
            (out / "whatif.json").write_text(json.dumps(jsonable(table), indent=2, allow_nan=False))  # strict: no NaN
            notes += [f"{p} has no sample for {n} of the replay's {total} steps: the replay carries its nearest "
                      "values over them." for p, (n, total) in missing_steps(raw, step).items() if n]
    power = energy_panel(engine, start, end, platforms, config)
    page = _html(start, end, platforms, figures, table, marks, len(moves), notes, power)
    (out / "index.html").write_text(page)


#: how the demand panel marks each decision of the detect stage
_MARK_STYLE = {"cleaned": {"s": 22, "marker": "x", "color": "#cf222e"},
               "kept": {"s": 18, "marker": "o", "facecolors": "none", "edgecolors": "#8250df"}}


def _one_hour_ahead(engine: Engine, platforms: list[str], start: datetime, end: datetime,
                    stored: pd.DataFrame) -> pd.DataFrame:
    """Per platform and hour of [start, end): the one-hour-ahead forecast of that hour. Where a
    pipeline run issued one (``stored``: the forecasts staging holds) it is that one
    (``source`` ``stored``); the other hours are replayed: the forecast stage's model on the
    staged hourly demand before the hour, as an hourly run would have issued it (``replayed``).
    A run over a longer window issues one forecast at its end, so staging alone holds few."""
    from gpupool.config import default_config
    from gpupool.forecast.stage import FORECAST_HISTORY, one_hour_ahead

    horizon = default_config().limits.horizon_hours
    hours = pd.date_range(pd.Timestamp(start).ceil("1h"), pd.Timestamp(end), freq="1h", inclusive="left")
    frames = []
    for p in platforms:
        have = stored[stored["platform"] == p][["ts", "yhat", "yhat_lower", "yhat_upper"]].copy()
        have = have[have["ts"].isin(hours)].drop_duplicates("ts", keep="last")
        have["source"] = "stored"
        history, _ = reads.hourly_demand(engine, p, (pd.Timestamp(start) - FORECAST_HISTORY).to_pydatetime(), end)
        replay = one_hour_ahead(history, hours[~hours.isin(have["ts"])], horizon)
        replay["source"] = "replayed"
        both = pd.concat([f for f in (have, replay) if len(f)], ignore_index=True) if len(have) or len(replay) else replay
        both["platform"] = p
        frames.append(both)
    out = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        columns=["ts", "yhat", "yhat_lower", "yhat_upper", "source", "platform"])
    return out.sort_values(["platform", "ts"], ignore_index=True)


def _demand_table(hourly: dict[str, pd.Series]) -> pd.DataFrame:
    """platform, ts, demand: the hourly demand the report plots (and the forecast is fitted on)."""
    rows = [pd.DataFrame({"platform": p, "ts": s.index, "demand": s.to_numpy()}) for p, s in hourly.items() if len(s)]
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(columns=["platform", "ts", "demand"])


def what_if(raw: pd.DataFrame, out: Path, step: str = "5min", progress: Callable[[str], None] | None = None) -> list[dict]:
    """Replay the staged demand under every policy; returns one row per policy and fast-path
    setting: as shipped (``fastpath`` its cadence) and hourly only (``fastpath: off``), with the
    moves the fast path started (``fastpath_moves``, of ``moves``)."""
    from gpupool.config import PlanLimits
    from gpupool.sim.scenario import load_scenario
    from gpupool.sim.study import simulate

    traces = out / "traces"
    traces.mkdir(exist_ok=True)
    limits = PlanLimits()  # the move rules as shipped, written out so the scenario file says them
    spec: dict[str, Any] = {"step": step, "decision_every": "1h", "node_gpus": 8, "move_minutes": limits.move_minutes,
                            "max_moves_per_decision": limits.max_moves_per_decision, "platforms": {}}
    grid = _step_grid(raw, step)
    for p, g in raw.groupby("platform"):
        w = g.pivot_table(index="ts", columns="metric", values="value", aggfunc="mean").sort_index()
        # every platform on the one grid the simulator steps through: a step without a sample
        # (an hour a platform missed, at either end too) carries its nearest values
        w = w.resample(step).mean().reindex(grid).interpolate(limit_direction="both")
        if "gpu_capacity" not in w or w["gpu_capacity"].isna().all():
            continue
        trace = pd.DataFrame({
            "time": w.index.tz_convert("UTC").tz_localize(None).strftime("%Y-%m-%d %H:%M:%S"),
            "running_gpu_num": w.get("gpu_allocated", pd.Series(0.0, index=w.index)).fillna(0).round(3).to_numpy(),
            "pending_gpu_num": w.get("gpu_pending", pd.Series(0.0, index=w.index)).fillna(0).round(3).to_numpy(),
            "total_gpu_num": w["gpu_capacity"].ffill().bfill().round().astype(int).to_numpy(),
        })
        trace.to_csv(traces / f"{p}.csv", index=False)
        spec["platforms"][p] = {"trace": [f"traces/{p}.csv"]}
    if not spec["platforms"]:
        return []
    path = out / "scenario.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    scenario = load_scenario(path)
    hourly = scenario.model_copy(update={"fastpath": None})
    rows = []
    # each policy as shipped (the fast path beside the hourly plan) and with the hourly plan alone;
    # static never moves, so once
    for policy in POLICY_KINDS:
        for sc in (scenario,) if policy == "static" else (scenario, hourly):
            res = simulate(sc, policy)
            t = res["total"]
            rows.append({"policy": policy, "fastpath": res.get("fastpath", "off"),
                         **{k: t[k] for k in ("demand_gpu_hours", "served_gpu_hours", "unmet_gpu_hours",
                                              "capacity_gpu_hours", "utilization", "moves")},
                         "fastpath_moves": t.get("fastpath_moves", 0)})
            if progress:
                progress(f"what-if {policy} (fast path {rows[-1]['fastpath']})")
    _explain_worse_than_static(rows)
    return rows


def _step_grid(raw: pd.DataFrame, step: str) -> pd.DatetimeIndex:
    """The steps of ``step`` from the first sample of any platform to the last of any."""
    ts = pd.to_datetime(raw["ts"], utc=True)
    return pd.date_range(ts.min().floor(step), ts.max().floor(step), freq=step, name="ts")


def missing_steps(raw: pd.DataFrame, step: str = "5min") -> dict[str, tuple[int, int]]:
    """Per platform: how many steps of the what-if's grid hold none of its samples, of how many."""
    grid = _step_grid(raw, step)
    have = {p: pd.to_datetime(g["ts"], utc=True).dt.floor(step).unique() for p, g in raw.groupby("platform")}
    return {p: (int((~grid.isin(t)).sum()), len(grid)) for p, t in have.items()}


def _explain_worse_than_static(rows: list[dict]) -> None:
    """Give a policy that left more unmet than static a ``note`` saying, in measured terms, why."""
    static = next((r for r in rows if r["policy"] == "static"), None)
    if static is None:
        return
    for r in rows:
        extra = r["unmet_gpu_hours"] - static["unmet_gpu_hours"]
        if r["policy"] == "static" or extra <= 1e-6:
            continue
        transit = static["capacity_gpu_hours"] - r["capacity_gpu_hours"]
        r["note"] = (f"{extra:.1f} GPU-h more unmet than static: its {r['moves']} moves took {transit:.1f} GPU-h "
                     f"of capacity out of service in transit, and the demand they moved for did not come "
                     f"(decisions made on the hours seen so far, as production would)")


def _energy_html(rows: list[dict]) -> str:
    """The energy panel: what parking did over the period, per platform and in total."""
    e = html.escape
    parts = ["<h2 id='energy'>Energy: parked nodes</h2>"]
    total = rows[-1] if rows else {"parked_node_hours": 0.0, "wakes": 0}
    if total["parked_node_hours"] <= 0 and total["wakes"] == 0:
        parts.append("<p class='energy-none'>No node was parked in this period: parking saved nothing.</p>")
        return "".join(parts)
    parts.append("<p>Saved: parked node-hours times each platform's idle watts minus parked watts "
                 "(<code>power.idle_watts</code>, <code>power.parked_watts</code>), an estimate. A wake is late when "
                 "its node came on after its deadline, or was not on at the period's end past it.</p>"
                 "<table class='energy'><tr><th>platform</th><th>parked node-h</th><th>wakes</th><th>late wakes</th>"
                 "<th>kWh saved</th></tr>")
    for r in rows:
        parts.append(f"<tr data-platform='{e(r['platform'])}'><td>{e(r['platform'])}</td><td>{r['parked_node_hours']:.1f}</td>"
                     f"<td>{r['wakes']}</td><td>{r['late_wakes']}</td><td>{r['saved_kwh']:.1f}</td></tr>")
    parts.append("</table>")
    return "".join(parts)


def _html(start, end, platforms, figures, table, marks, n_moves, notes=(), power=()) -> str:
    e = html.escape
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>gpupool report</title>",
        "<style>body{font-family:system-ui,sans-serif;margin:1.5rem;max-width:1100px}"
        "table{border-collapse:collapse}td,th{border-bottom:1px solid #ddd;padding:.3rem .6rem;text-align:right}"
        "th:first-child,td:first-child{text-align:left}img{max-width:100%}</style></head><body>",
        f"<h1>gpupool report</h1><p>{e(start.isoformat())} – {e(end.isoformat())} · platforms: {e(', '.join(platforms))} · "
        f"{int((marks['decision'] == 'cleaned').sum())} demand points cleaned as telemetry faults, "
        f"{int((marks['decision'] == 'kept').sum())} flagged and kept as real bursts · {n_moves} planned moves</p>",
    ]
    parts += [f"<p class='note'>{e(n)}</p>" for n in notes]
    for name, caption in figures:
        parts.append(f"<h2>{e(caption)}</h2><img src='{e(name)}' alt='{e(caption)}'>")
        if name == "demand_capacity.png" and len(marks):
            parts.append("<details><summary>The marked points: the detect stage's decision on each</summary><table>"
                         "<tr><th>at</th><th>platform</th><th>metric</th><th>reported</th><th>cleaned to</th>"
                         "<th>decision</th></tr>")
            for r in marks.itertuples():
                to = f"{r.clean_value:.1f}" if r.decision == "cleaned" and pd.notna(r.clean_value) else "–"
                reported = f"{r.value:.1f}" if pd.notna(r.value) else "–"
                parts.append(f"<tr><td>{e(pd.Timestamp(r.ts).strftime('%Y-%m-%d %H:%M'))}</td><td>{e(r.platform)}</td>"
                             f"<td>{e(r.metric)}</td><td>{reported}</td><td>{to}</td>"
                             f"<td>{e(decision_label(r.decision, r.fault))}</td></tr>")
            parts.append("</table></details>")
    parts.append(_energy_html(list(power)))
    if table:
        parts.append("<h2>What if: the period's demand under each policy</h2>")
        parts.append("<p>Replayed by <code>gpupool simulate scenario.yaml --policy …</code> on the staged demand "
                     "(traces in <code>traces/</code>), each policy with the fast path beside the hourly plan (as shipped) "
                     "and with the hourly plan alone (<code>fastpath: off</code>).</p><table><tr><th>policy</th>"
                     "<th>fast path</th><th>demand GPU-h</th><th>served GPU-h</th>"
                     "<th>unmet GPU-h</th><th>capacity GPU-h</th><th>utilization</th><th>moves</th>"
                     "<th>of which fast path</th></tr>")
        for r in table:
            parts.append(
                f"<tr><td>{e(r['policy'])}</td><td>{e(str(r.get('fastpath', 'off')))}</td>"
                f"<td>{r['demand_gpu_hours']:.1f}</td><td>{r['served_gpu_hours']:.1f}</td>"
                f"<td>{r['unmet_gpu_hours']:.1f}</td><td>{r['capacity_gpu_hours']:.1f}</td><td>{r['utilization']:.3f}</td>"
                f"<td>{r['moves']}</td><td>{r.get('fastpath_moves', 0)}</td></tr>"
            )
        parts.append("</table>")
        parts += [f"<p>{e(r['policy'])} (fast path {e(str(r.get('fastpath', 'off')))}): {e(r['note'])}</p>" for r in table
                  if r.get("note")]
    parts.append("</body></html>")
    return "".join(parts)


