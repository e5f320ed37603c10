"""The account of one window that `gpupool run`, `gpupool plan` and `gpupool summary` show:
what each stage left in staging for it (:func:`window_summary`, from the record
``gpupool.staging.reads.window_record`` read back) and its few lines of text
(:func:`format_summary`). Pure: it reads nothing itself."""

from __future__ import annotations


def window_summary(record: dict, window: dict) -> dict:
    """The account of the window (``window``: its ``start`` and ``end``) from its staged
    ``record``: per platform the newest extraction run (and how many earlier ones were
    interrupted), the cleaned points and anomalies, the forecast issued at its end and the plan
    decided then."""
    ex, an, fc, pl = record["extract_runs"], record["clean"], record["forecast"], record["plan"]
    last: dict[str, dict] = {}
    for r in ex:  # the newest run per platform, and how many earlier runs were interrupted
        interrupted = last.get(r.platform, {}).get("interrupted", 0) + int(r.status == "interrupted")
        last[r.platform] = {"status": r.status, "rows": r.rows}
        if interrupted:
            last[r.platform]["interrupted"] = interrupted
    issued: dict[str, list] = {}
    for r in fc:
        issued.setdefault(r.platform, []).append([round(r.yhat_lower, 1), round(r.yhat, 1), round(r.yhat_upper, 1)])
    return {
        "window": window,
        "extract": last,
        "clean": {r[0]: {"points": int(r[1]), "anomalies": int(r[2] or 0)} for r in an},
        "forecast": issued,
        "plan": None
        if pl is None
        else {"id": pl.id, "policy": pl.policy, "solver": pl.solver, "dry_run": pl.dry_run, "moves": pl.moves, "summary": pl.summary},
    }


def format_summary(s: dict) -> str:
    """A short human-readable account of one window."""
    lines = [f"gpupool window {s['window']['start']} .. {s['window']['end']}"]
    lines.append("  extract:")
    for p, e in s["extract"].items():
        note = f" ({e['interrupted']} earlier run(s) interrupted)" if e.get("interrupted") else ""
        lines.append(f"    {p:<12} {e['status']:<8} {e['rows'] or 0:>7} rows{note}")
    lines.append("  detect/clean:")
    for p, c in s["clean"].items():
        lines.append(f"    {p:<12} {c['points']:>7} points, {c['anomalies']} anomalies cleaned")
    lines.append("  forecast (GPU demand, next hours: [low, mean, high]):")
    for p, rows in s["forecast"].items():
        lines.append(f"    {p:<12} " + " ".join(f"{r[1]:.0f}[{r[0]:.0f},{r[2]:.0f}]" for r in rows[:6]))
    plan_ = s["plan"]
    if plan_:
        lines.append(f"  plan #{plan_['id']} ({plan_['policy']}, solver {plan_['solver']}, {'dry run' if plan_['dry_run'] else 'LIVE'}):")
        for p, info in (plan_["summary"].get("platforms") or {}).items():
            lines.append(f"    {p:<12} " + _plan_line(info))
        for reason in plan_["summary"].get("reasons") or []:
            if str(reason).startswith("infeasible bounds"):
                lines.append(f"    warning: {reason}")
        if not plan_["moves"]:
            lines.append("    no moves")
        for m in plan_["moves"]:
            lines.append(f"    move {m.get('node')}: {m.get('from')} -> {m.get('to')} ({m.get('reason', '')})")
    return "\n".join(lines)


def _plan_line(info: dict) -> str:
    def first(v):
        return v[0] if isinstance(v, list) and v else v

    parts = []
    if "nodes" in info:
        parts.append(f"{info['nodes']} nodes -> {info.get('nodes_after', info['nodes'])}")
    if "gpus" in info:
        parts.append(f"{info['gpus']} GPUs, {info.get('busy_gpus', 0):.0f} busy")
    if "demand_mean" in info:
        parts.append(f"demand next hour {first(info['demand_mean']):.0f} (upper {first(info.get('demand_upper')) or 0:.0f})")
    if "expected_unmet_after" in info:
        parts.append(f"expected unmet {info.get('expected_unmet_before', 0):.1f} -> {info['expected_unmet_after']:.1f} GPU-h")
    return ", ".join(parts) if parts else ", ".join(f"{k}={v}" for k, v in info.items())
