"""`gpupool ...` — the same functions the DAG calls, from a shell."""

from __future__ import annotations

import argparse
import json
import math
import numbers
import os
import sys
from typing import Sequence

from gpupool import __version__
from gpupool.cli_args import check_options
from gpupool.cli_args import instant as _at


class _Parser(argparse.ArgumentParser):
    """argparse with its errors on one line (the usage stays behind --help)."""

    def error(self, message: str):  # noqa: D102 - argparse's hook
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="platforms.yaml (default: $GPUPOOL_CONFIG, else the embedded virtual datacenter)")
    p.add_argument("--staging-url", help="SQLAlchemy URL of staging (default: $GPUPOOL_STAGING_URL, the Airflow "
                   "connection gpupool_staging, else a SQLite file in $AIRFLOW_HOME)")


def _add_window(p: argparse.ArgumentParser) -> None:
    p.add_argument("--start", required=True, help="window start, ISO 8601 (naive = UTC)")
    p.add_argument("--end", required=True, help="window end (exclusive), ISO 8601")


def _add_reader(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dayfirst", action=argparse.BooleanOptionalAction, default=None,
                   help="CSV mode: read year-last dates (05.01.2026) day-first, or with --no-dayfirst month-first "
                   "(default: the reading under which they all parse; refused when both do)")
    p.add_argument("--duplicates", default="refuse", choices=["refuse", "first", "last", "mean"],
                   help="CSV mode: a repeated timestamp is refused (default) or keeps its first, last or mean value")


def build_parser() -> argparse.ArgumentParser:
    from gpupool.config import PlanLimits
    from gpupool.decisions.policy import PLANNED_KINDS, POLICY_KINDS  # pydantic only: cheap to import

    parser = _Parser(prog="gpupool", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sub.add_parser("version", help="print the version")

    p = sub.add_parser("db", help="staging database")
    dbsub = p.add_subparsers(dest="db_command", required=True, metavar="ACTION")
    up = dbsub.add_parser("upgrade", help="apply Alembic migrations to staging")
    _add_common(up)
    up.add_argument("--revision", default="head")
    cur = dbsub.add_parser("current", help="print the staging schema revision")
    _add_common(cur)

    p = sub.add_parser("run", help="one pipeline pass over a window outside Airflow")
    _add_common(p)
    _add_window(p)
    p.add_argument("--platform", action="append", help="only this platform (repeatable)")
    p.add_argument("--policy", default="predictive", choices=PLANNED_KINDS)
    p.add_argument("--json", help="write the report as JSON here (its directory must exist)")

    p = sub.add_parser("extract", help="extract one platform's window into staging")
    _add_common(p)
    _add_window(p)
    p.add_argument("--platform", required=True)

    p = sub.add_parser("summary", help="what each stage left in staging for a window")
    _add_common(p)
    _add_window(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of text")

    p = sub.add_parser("detect", help="detect and clean point anomalies of one series in a CSV")
    p.add_argument("input")
    p.add_argument("--out", required=True, help="CSV out (not the input; its directory must exist)")
    p.add_argument("--time-col")
    p.add_argument("--value-col")
    p.add_argument("--detector", default="auto", choices=["auto", "sr", "svr", "prophet", "zscore"])
    p.add_argument("--refit-every", default=None, help="refit cadence, e.g. 1d (default, as the pipeline), 6h")
    _add_reader(p)

    p = sub.add_parser("forecast", help="forecast a series in a CSV, or a platform's demand from staging")
    p.add_argument("input", nargs="?", help="CSV with a time column and a value column")
    p.add_argument("--horizon", type=int, default=None,
                   help="steps ahead, 1 to 8784 = 24 x 366 (CSV mode: required; staging mode: default limits.horizon_hours)")
    p.add_argument("--out", help="CSV out: step,timestamp,yhat,yhat_lower,yhat_upper (not the input; its directory must exist)")
    p.add_argument("--level", type=float, default=None,
                   help="prediction-interval level in percent, 1 to 99.9 (default forecast.stage.FORECAST_LEVEL, 90)")
    p.add_argument("--season", type=int, default=None, help="season length hint in steps, >= 2 (default: detected)")
    p.add_argument("--time-col", help="CSV mode: the time column (default: the first that parses as times)")
    p.add_argument("--value-col", help="CSV mode: the value column (default: the first numeric one after it)")
    p.add_argument("--summary-json")
    _add_reader(p)
    p.add_argument("--platform", help="staging mode: forecast this platform's demand")
    p.add_argument("--at", help="staging mode: issue time (ISO 8601)")
    _add_common(p)

    p = sub.add_parser("plan", help="plan from staging at a time and show why (per platform forecast, capacity, moves)")
    _add_common(p)
    p.add_argument("--at", required=True, help="decision time (ISO 8601); forecasts issued then are used")
    p.add_argument("--policy", default="predictive", choices=PLANNED_KINDS)
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("handovers", help="list node handovers with state and age")
    _add_common(p)
    p.add_argument("--open", action="store_true", help="only open ones")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("owners", help="who owns each pool node, where that came from and who holds it now; "
                       "per platform owned, lent and borrowed")
    _add_common(p)
    p.add_argument("--at", help="read the inventory and handovers as of this time (ISO 8601; default now)")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("fastpath", help="one fast-path tick: read each platform's pressure, decide, start moves")
    _add_common(p)
    p.add_argument("--at", help="the tick's time (ISO 8601; default now: pressure is read live)")
    p.add_argument("--dry-run", action=argparse.BooleanOptionalAction, default=True,
                   help="audit what would be sent and send nothing (default); --no-dry-run sends where "
                        "the configuration and both platforms allow")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("power", help="parked nodes: each node's power state, or park / wake one (operator)")
    psub = p.add_subparsers(dest="power_command", required=True)
    pp = psub.add_parser("status", help="each node gpupool parked or woke: state, since when, transition in flight")
    _add_common(pp)
    pp.add_argument("--json", action="store_true")
    for name, what in (("park", "park NODE (power it off through its platform's power: means)"),
                       ("wake", "wake NODE on the platform it was parked on")):
        pp = psub.add_parser(name, help=what)
        _add_common(pp)
        pp.add_argument("node", help="the pool node id")
        pp.add_argument("--at", help="the action's time (ISO 8601; default now)")
        pp.add_argument("--reason", help="why, for the audit (default: the command)")
        pp.add_argument("--dry-run", action=argparse.BooleanOptionalAction, default=True,
                        help="audit what would be sent and send nothing (default); --no-dry-run sends where the "
                             "configuration and the platform allow")

    p = sub.add_parser("rollback", help="roll a handover back (lift gpupool's hold, or send the node back)")
    _add_common(p)
    p.add_argument("handover_id", type=int)
    p.add_argument("--dry-run", action="store_true", help="write the audit rows only, send nothing")

    p = sub.add_parser("report", help="HTML report with plots of a staged period and its what-if table")
    _add_common(p)
    _add_window(p)
    p.add_argument("--out", required=True, help="directory to write index.html and the plots to (made if missing; "
                   "its parent must exist)")
    p.add_argument("--no-whatif", action="store_true", help="skip the what-if replay under every policy")

    p = sub.add_parser("simulate", help="closed-loop what-if study of a scenario")
    p.add_argument("scenario")
    p.add_argument("--policy", default="predictive", choices=POLICY_KINDS)
    p.add_argument("--json", dest="json_out", help="write the result JSON here (not the scenario or a trace; its "
                   "directory must exist)")
    p.add_argument("--no-clean", action="store_true",
                   help="forecast, and let the fast path act, on the raw telemetry (skip detect/clean and the fast path's judge) to measure what cleaning is worth")
    p.add_argument("--no-progress", action="store_true")

    p = sub.add_parser("whatif", help="what-if study of your own history (sacct, a pod list, Prometheus, a CSV) "
                       "with your node counts")
    for name in ("slurm", "kubernetes", "openstack"):
        p.add_argument(f"--{name}", action="append", metavar="FORMAT:PATH[,KEY=VALUE...]",
                       help=f"{name}'s history: sacct:jobs.txt[,timezone=Europe/Berlin,partition=gpu], "
                       "pods:pods.csv[,origin=TIME], csv:FILE,time_col=C,value_col=C[,pending_col=C], "
                       "prometheus:ALLOCATED.json[,pending=PENDING.json], or a Helios CSV (repeatable: summed)")
        p.add_argument(f"--{name}-nodes", type=int, metavar="N", help=f"{name}'s GPU nodes (required with a history)")
    p.add_argument("--start", help="window start, ISO 8601 (naive = UTC; default: the history's first instant)")
    p.add_argument("--end", help="window end, exclusive (default: the history's last instant)")
    p.add_argument("--step", default="5min", help="simulation step (default 5min)")
    p.add_argument("--node-gpus", type=int, default=8, help="GPUs per node (default 8)")
    moving = PlanLimits().move_minutes  # the operator's default, defined once
    p.add_argument("--move-minutes", type=float, default=moving,
                   help=f"minutes a moving node serves nobody (default {moving:g})")
    for key, value, what in (
            ("owns", "N", "owns the first N of the nodes it starts with (default: all, once any of these is given)"),
            ("lend_limit", "N", "lends at most N of its own nodes at once"),
            ("borrow_limit", "N", "borrows at most N nodes of others at once"),
            ("reclaim_minutes", "M", "gets a lent node back within M minutes of needing it"),
            ("min_runtime_minutes", "M", "lets borrowed work on its nodes run M minutes before a reclaim ends it")):
        p.add_argument("--" + key.replace("_", "-"), action="append", metavar=f"[PLATFORM=]{value}",
                       help=f"every platform (PLATFORM=: that one) {what}; docs/stages/ownership.md (repeatable)")
    p.add_argument("--policy", default="predictive", choices=POLICY_KINDS)
    p.add_argument("--json", "--out", dest="json_out", help="write the result JSON here (not an input; its "
                   "directory must exist)")
    p.add_argument("--scenario-out", help="also write the scenario built, for `gpupool simulate` to rerun or edit")
    p.add_argument("--no-clean", action="store_true", help="as for simulate")
    p.add_argument("--no-progress", action="store_true")

    p = sub.add_parser("metrics", help="Prometheus metrics computed from staging")
    msub = p.add_subparsers(dest="metrics_command", required=True, metavar="ACTION")
    mp = msub.add_parser("serve", help="serve /metrics for Prometheus to scrape (read from staging at each scrape)")
    mp.add_argument("--config", help="platforms.yaml (default: $GPUPOOL_CONFIG, else the embedded virtual datacenter)")
    mp.add_argument("--staging-url", "--staging", dest="staging_url",
                    help="SQLAlchemy URL of staging (default: $GPUPOOL_STAGING_URL, the Airflow connection "
                    "gpupool_staging, else a SQLite file in $AIRFLOW_HOME)")
    mp.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    mp.add_argument("--port", type=int, default=9809, help="port to listen on (default 9809; 0: any free one)")
    mp.add_argument("--at", help="serve staging as it stood at this instant (ISO 8601) instead of the wall clock")

    p = sub.add_parser("nvml", help="the NVML agent of one GPU node of a platform: stage or serve its GPUs' readings")
    nsub = p.add_subparsers(dest="nvml_command", required=True, metavar="ACTION")
    np_ = nsub.add_parser("push", help="read this node's GPUs through NVML once and stage the snapshot")
    _add_common(np_)
    for q in (np_, nsub.add_parser("serve", help="serve this node's NVML readings at /metrics for Prometheus")):
        q.add_argument("--platform", required=True, help="the configured platform the node belongs to")
        q.add_argument("--node", required=True, help="the node's name as its platform knows it")
    np_.add_argument("--at", help="stamp the snapshot at this instant (ISO 8601; default: now, floored to the "
                     "configured step, so each run of a timer lands on the pipeline's grid)")
    ns = nsub.choices["serve"]
    ns.add_argument("--config", help="platforms.yaml (default: $GPUPOOL_CONFIG, else the embedded virtual datacenter)")
    ns.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    ns.add_argument("--port", type=int, default=9810, help="port to listen on (default 9810; 0: any free one)")

    p = sub.add_parser("sim", help="the virtual datacenter")
    simsub = p.add_subparsers(dest="sim_command", required=True, metavar="ACTION")
    sp = simsub.add_parser("serve", add_help=False,
                           help="serve a scenario behind Prometheus, Kubernetes, OpenStack and Slurm APIs")
    sp.add_argument("rest", nargs=argparse.REMAINDER, help="SCENARIO.yaml [options]; see `gpupool sim serve --help`")

    return parser


#: the largest id staging's integer id columns hold
MAX_ROW_ID = 2**31 - 1


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:2] == ["sim", "serve"]:  # its own parser, options and --help included
        from gpupool.emulator.serve import main as serve_main

        return serve_main(argv[2:])
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        check_options(args)  # every option before staging, a file or a platform is touched
        code = _dispatch(args)
        sys.stdout.flush()  # a reader that went away (`| head -1`) is found here, not at exit
        return code
    except BrokenPipeError:
        _stdout_to_devnull()
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # one clear line for a user's error; a bug keeps its traceback
        from gpupool.errors import is_user_error

        if is_user_error(exc):
            message = str(exc)
        else:
            message = _staging_failure(exc, args)
            if message is None:
                raise
        print(f"gpupool {args.command}: error: {' '.join(message.split())}", file=sys.stderr)
        return 2


def _stdout_to_devnull() -> None:
    """After a broken pipe, what is still buffered for stdout goes nowhere: Python flushes it
    at exit and would report a second BrokenPipeError (the recipe of Python's signal docs)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a real file (a test's capture)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


def _staging_failure(exc: BaseException, args: argparse.Namespace) -> str | None:
    """One line for a staging database without gpupool's tables (never upgraded) or that fails
    operationally (an unreachable one is already a StagingUnavailable), naming where staging was
    configured and never any part of its URL; None for any other error."""
    try:
        from pandas.errors import DatabaseError as PandasDatabaseError
        from sqlalchemy.exc import OperationalError, ProgrammingError
    except ImportError:  # pragma: no cover
        return None
    if not isinstance(exc, (OperationalError, ProgrammingError, PandasDatabaseError)):
        return None
    from gpupool.staging.db import staging_label

    source = staging_label(getattr(args, "staging_url", None))
    text = str(getattr(exc, "orig", None) or exc).lower()
    if "no such table" in text or ("relation" in text and "does not exist" in text):
        return f"staging database ({source}) has no gpupool tables: run `gpupool db upgrade`"
    if getattr(getattr(exc, "orig", None), "sqlstate", None) == "42501":  # InsufficientPrivilege
        return (f"staging database ({source}) refused the statement: the role lacks a privilege "
                "(InsufficientPrivilege); gpupool's role must own its schema's tables")
    if isinstance(exc, OperationalError):
        kind = type(getattr(exc, "orig", None) or exc).__name__
        return f"staging database ({source}) failed ({kind}); check that it runs, is writable and accepts connections"
    return None


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "version":
        print(__version__)
        return 0
    if args.command == "detect":
        from gpupool.detect.io import detect_csv

        info = detect_csv(
            args.input, args.out, time_col=args.time_col, value_col=args.value_col, detector=args.detector,
            refit_every=args.refit_every, dayfirst=args.dayfirst, duplicates=args.duplicates,
        )
        print(_json(info))
        return 0
    if args.command == "forecast":
        return _forecast(args)
    if args.command == "simulate":
        return _simulate(args)
    if args.command == "whatif":
        return _whatif(args)

    if args.command == "metrics":
        return _metrics_serve(args)
    if args.command == "nvml":
        return _nvml(args)
    from gpupool import pipeline
    from gpupool.staging import db
    from gpupool.summary import format_summary

    ctx = pipeline.Context.load(args.config, args.staging_url)
    if args.command == "db":
        if args.db_command == "upgrade":
            rev = db.upgrade(ctx.engine, args.revision)
            print(f"staging {db.describe(ctx.engine)} at revision {rev}")
        else:
            print(db.current_revision(ctx.engine) or "<empty>")
        return 0
    if args.command == "plan":
        at = _at(args.at)
        window = pipeline.Window(at - pipeline.timedelta(hours=1), at)
        result = pipeline.plan(ctx, window, policy=args.policy, dry_run=True)
        if args.json:
            print(_json(result, indent=2))
        else:
            print(format_summary(pipeline.summary(ctx, window)))
            print(_recent_fastpath(ctx, until=at, moves_only=False))
        return 0
    if args.command == "handovers":
        from gpupool.jobs.allocation import list_handovers
        from gpupool.jobs.text import format_handovers

        rows = list_handovers(ctx.engine, open_only=args.open)
        print(_json(rows, indent=2) if args.json else format_handovers(rows))
        if not args.json:
            print(_recent_fastpath(ctx, moves_only=True))
        return 0
    if args.command == "owners":
        from datetime import datetime, timezone

        from gpupool.jobs.pool import pool_nodes
        from gpupool.jobs.owners import format_owners, owners_view

        db.upgrade(ctx.engine)
        at = _at(args.at) if args.at is not None else pipeline.parse_time(datetime.now(timezone.utc))
        view = owners_view(ctx, at, *pool_nodes(ctx.engine, at, ctx.platforms(), ctx.config))
        print(_json(view, indent=2) if args.json else format_owners(view))
        return 0
    if args.command == "fastpath":
        from datetime import datetime, timezone

        from gpupool.actuation import handover_records as ho_records
        from gpupool.jobs.fastpath import run_fastpath
        from gpupool.jobs.reclaim import format_blocked
        from gpupool.jobs.text import format_decisions, format_power_step

        db.upgrade(ctx.engine)
        at = _at(args.at) if args.at is not None else pipeline.parse_time(datetime.now(timezone.utc))
        out = run_fastpath(ctx, at.replace(microsecond=0), dry_run=args.dry_run, allow_evict=ctx.config.limits.allow_evict)
        late = str(ho_records.ReclaimLate(out["late"])) if out.get("late") else ""  # a dry run's: said, not raised
        print(_json(out, indent=2) if args.json
              else "\n".join(t for t in (format_power_step(out.get("power")),
                                           format_decisions(out["decisions"], title=f"fast path at {out['at']}"),
                                           format_blocked(out.get("blocked") or ()), late) if t))
        return 0
    if args.command == "power":
        from gpupool.jobs import power as power_job
        from gpupool.jobs.text import format_power

        db.upgrade(ctx.engine)
        if args.power_command == "status":
            rows = power_job.power_status(ctx.engine)
            print(_json(rows, indent=2) if args.json else format_power(rows))
            return 0
        from datetime import datetime, timezone

        at = _at(args.at) if args.at is not None else pipeline.parse_time(datetime.now(timezone.utc))
        print(_json(power_job.operator_power(ctx, args.power_command, args.node, at.replace(microsecond=0),
                                             dry_run=args.dry_run, reason=args.reason), indent=2))
        return 0
    if args.command == "rollback":
        from gpupool.jobs.allocation import rollback_handover
        from gpupool.errors import UserError

        if not 1 <= args.handover_id <= MAX_ROW_ID:  # beyond the id column: no such row can exist
            raise UserError(f"no handover #{args.handover_id} (handover ids run from 1 to {MAX_ROW_ID})")
        print(_json(rollback_handover(ctx, args.handover_id, dry_run=args.dry_run), indent=2))
        return 0
    window = pipeline.Window(pipeline.parse_time(args.start), pipeline.parse_time(args.end))
    if args.command == "extract":
        db.upgrade(ctx.engine)
        print(_json(pipeline.extract(ctx, args.platform, window)))
        return 0
    if args.command == "run":
        return _run(args, ctx, window)
    if args.command == "report":
        from gpupool.report import write_report  # refuses a bad --out before it reads staging

        path = write_report(ctx.engine, window.start, window.end, args.out, step=ctx.config.step,
                            whatif=not args.no_whatif, progress=_progress_printer(), config=ctx.config)
        print(f"report: {path}")
        return 0
    if args.command == "summary":
        s = pipeline.summary(ctx, window)
        print(_json(s, indent=2) if args.json else format_summary(s))
        return 0
    raise AssertionError(args.command)


def _run(args: argparse.Namespace, ctx, window) -> int:
    """`gpupool run`: ``--json`` is checked before the run and written in one step after it."""
    from gpupool import pipeline
    from gpupool.staging import db
    from gpupool.summary import format_summary
    from gpupool.tsio import atomic_output, check_output

    json_out = check_output(args.json, {}, option="--json") if args.json else None
    db.upgrade(ctx.engine)
    report = pipeline.run_window(ctx, window, platforms=args.platform, policy=args.policy, dry_run=True,
                                 progress=_progress_printer())
    if json_out is not None:
        with atomic_output(json_out) as tmp:
            tmp.write_text(_json(report, indent=2))
    print(format_summary(pipeline.summary(ctx, window)))
    return 0


def _simulate(args: argparse.Namespace) -> int:
    """`gpupool simulate`: the output is checked against the scenario and its traces before the
    simulation runs, and written in one step after it."""
    from gpupool.sim.scenario import load_scenario
    from gpupool.sim.study import simulate
    from gpupool.tsio import atomic_output, check_output

    json_out = None
    scenario = load_scenario(args.scenario)
    if args.json_out:
        inputs = {"scenario": args.scenario, **{f"trace platforms.{name}.trace.{i}": path for name, spec in
                                                scenario.platforms.items() for i, path in enumerate(spec.trace_files())}}
        json_out = check_output(args.json_out, inputs, option="--json")
    result = simulate(scenario, args.policy, progress=not args.no_progress and sys.stderr.isatty(),
                      clean=not args.no_clean)
    text = _json(result, indent=2)
    if json_out is not None:
        with atomic_output(json_out) as tmp:
            tmp.write_text(text + "\n")
    print(text)
    return 0


def _whatif(args: argparse.Namespace) -> int:
    """`gpupool whatif`: the scenario built from the histories and node counts, run as
    `gpupool simulate` runs one; outputs are checked against every input before it runs."""
    from gpupool.errors import UsageError
    from gpupool.sim.study import simulate
    from gpupool.sim.whatif import (OWNERSHIP_OPTIONS, WHATIF_PLATFORMS, parse_ownership, parse_source, scenario_text,
                                    whatif_scenario)
    from gpupool.tsio import atomic_output, check_output

    sources = {n: getattr(args, n) for n in WHATIF_PLATFORMS if getattr(args, n)}
    nodes = {n: getattr(args, f"{n}_nodes") for n in WHATIF_PLATFORMS}
    for name, count in nodes.items():
        if count is not None and (count < 0 or name not in sources):
            raise UsageError(f"--{name}-nodes {count}: " + ("give 0 or more" if count < 0 else f"without --{name}"))
    ownership = parse_ownership({k: getattr(args, k) for k in OWNERSHIP_OPTIONS}, sources)
    settings = {"step": args.step, "node_gpus": args.node_gpus, "move_minutes": args.move_minutes}
    named: dict[str, str] = {}  # the history files the options name, before any is read
    for name, texts in sources.items():
        for text in texts:
            entry = parse_source(text, f"--{name}")
            for path in [entry] if isinstance(entry, str) else [entry.get(k) for k in ("path", "allocated", "pending")]:
                if path:
                    named[f"--{name} file" + (f" {len(named) + 1}" if f"--{name} file" in named else "")] = path
    for option, target in (("--json", args.json_out), ("--scenario-out", args.scenario_out)):
        if target:  # writable, and nothing it must not replace, before the histories are read
            check_output(target, named, option=option)
    scenario, raw = whatif_scenario(sources, nodes, start=args.start, end=args.end, settings=settings,
                                    ownership=ownership)
    inputs = {f"--{name} file": path for name, spec in scenario.platforms.items() for path in spec.trace_files()}
    json_out = check_output(args.json_out, inputs, option="--json") if args.json_out else None
    scenario_out = check_output(args.scenario_out, inputs, option="--scenario-out") if args.scenario_out else None
    if json_out is not None and scenario_out is not None:
        check_output(json_out, {"--scenario-out file": scenario_out}, option="--json")
    result = simulate(scenario, args.policy, progress=not args.no_progress and sys.stderr.isatty(),
                      clean=not args.no_clean)
    text = _json(result, indent=2)
    if scenario_out is not None:
        with atomic_output(scenario_out) as tmp:
            tmp.write_text(scenario_text(raw))
    if json_out is not None:
        with atomic_output(json_out) as tmp:
            tmp.write_text(text + "\n")
    print(text)
    return 0


def _recent_fastpath(ctx, until=None, moves_only: bool = False) -> str:
    """The newest fast-path decisions (moves only, for `gpupool handovers`) as lines."""
    from gpupool.jobs.text import format_decisions
    from gpupool.staging import fastpath as store

    rows = store.recent_decisions(ctx.engine, limit=10, moves_only=moves_only, until=until)
    return "\n" + format_decisions(rows, title="fast-path moves (newest first)" if moves_only else "fast-path decisions (newest first)")


def _forecast(args: argparse.Namespace) -> int:
    from gpupool.errors import UsageError
    from gpupool.forecast.io import check_horizon_level
    from gpupool.forecast.stage import FORECAST_LEVEL

    if args.level is None:
        args.level = FORECAST_LEVEL
    if args.platform:
        from gpupool import pipeline

        if not args.at:
            raise UsageError("--platform needs --at (the issue time)")
        at = _at(args.at)
        ctx = pipeline.Context.load(args.config, args.staging_url)
        check_horizon_level(args.horizon or ctx.config.limits.horizon_hours, args.level)
        ctx.config.platform(args.platform)  # a platform the config does not name: one line listing those it does
        window = pipeline.Window(at - pipeline.timedelta(hours=1), at)
        print(_json(pipeline.forecast_demand(ctx, args.platform, window, horizon=args.horizon, level=args.level)))
        return 0
    if not args.input or not args.out or args.horizon is None:
        raise UsageError("INPUT.csv needs --horizon and --out (or use --platform NAME --at TIME)")
    check_horizon_level(args.horizon, args.level)
    if args.season is not None and args.season < 2:  # 0 or less would silently mean "no season"
        raise UsageError(f"--season must be a whole number of steps >= 2, got {args.season}; "
                         "leave it out to have the period detected")
    from gpupool.forecast.io import forecast_csv

    info = forecast_csv(args.input, args.horizon, args.out, level=args.level, season=args.season,
                        summary_json=args.summary_json, time_col=args.time_col, value_col=args.value_col,
                        dayfirst=args.dayfirst, duplicates=args.duplicates)
    print(_json(info))
    return 0


def _metrics_serve(args: argparse.Namespace) -> int:
    from gpupool import metrics, pipeline
    from gpupool.errors import UsageError

    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port {args.port}: must be 0 to 65535")
    at = _at(args.at) if args.at is not None else None
    ctx = pipeline.Context.load(args.config, args.staging_url)

    def ready(host: str, port: int) -> None:
        print(f"gpupool metrics: serving http://{host}:{port}/metrics", flush=True)

    try:
        metrics.serve(ctx.engine, ctx.config, host=args.host, port=args.port, at=at, ready=ready)
    except OSError as exc:  # the port is taken or the address is not ours: one line
        raise UsageError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from None
    return 0


def _nvml(args: argparse.Namespace) -> int:
    """`gpupool nvml push|serve`: the platform must be one platforms.yaml names."""
    from gpupool import collector, pipeline
    from gpupool.errors import UsageError

    if args.nvml_command == "serve":
        if not 0 <= args.port <= 65535:
            raise UsageError(f"--port {args.port}: must be 0 to 65535")
        ctx = pipeline.Context.load(args.config, None)
        ctx.config.platform(args.platform)
        collector.check_node(args.node)

        def ready(host: str, port: int) -> None:
            print(f"gpupool nvml: serving http://{host}:{port}/metrics", flush=True)

        try:
            collector.serve(args.platform, args.node, host=args.host, port=args.port, ready=ready)
        except OSError as exc:
            raise UsageError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from None
        return 0
    from datetime import datetime, timezone

    # no migration here: a node's agent writes samples into a staging the pipeline migrated
    ctx = pipeline.Context.load(args.config, args.staging_url)
    ctx.config.platform(args.platform)
    collector.check_node(args.node)  # the input first, before staging is asked anything
    at = _at(args.at) if args.at is not None else collector.step_instant(datetime.now(timezone.utc), ctx.config.step)
    print(_json(collector.push(ctx.engine, args.platform, args.node, at)))
    return 0


def _json(value, indent: int | None = None) -> str:
    """``value`` as strict JSON: a non-finite float becomes null (never the ``NaN``/``Infinity``
    tokens other JSON readers refuse); what JSON has no type for is written as its text."""
    return json.dumps(_finite(value), indent=indent, default=str, allow_nan=False)


def _finite(value):
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral):  # numpy's floats too
        return value if math.isfinite(float(value)) else None
    return value


def _progress_printer():
    if not sys.stderr.isatty():
        return None

    def tick(label: str) -> None:
        print(f"  .. {label}", file=sys.stderr, flush=True)

    return tick


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
