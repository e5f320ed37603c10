"""What the CLI prints of the jobs: fast-path decisions and handovers as lines and tables."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from gpupool.values import printable, utc


def format_decisions(rows: Sequence[Mapping[str, Any]], title: str = "fast path") -> str:
    """Recent fast-path decisions as lines for ``gpupool plan``/``handovers``/``fastpath``."""
    if not rows:
        return f"{title}: no decisions recorded"
    lines = [f"{title}:"]
    for row in rows:
        when = utc(row["decided_at"]).strftime("%Y-%m-%d %H:%M")
        mode = "dry-run" if row["dry_run"] else "live"
        # names come from the platforms' APIs: their control characters are shown, not sent
        r = {k: printable(row.get(k)) for k in ("node", "source", "target", "reason", "platform")}
        if row.get("node"):
            ho_ = f" handover #{row['handover_id']}" if row.get("handover_id") else ""
            lines.append(f"  {when}  MOVE {r['node']} {r['source']} -> {r['target']} ({mode}{ho_}): {r['reason']}")
        else:
            lines.append(f"  {when}  {r['platform']:<12} no move: {r['reason']}")
    return "\n".join(lines)


def format_handovers(rows: list[dict[str, Any]]) -> str:
    """A table for ``gpupool handovers``."""
    if not rows:
        return "no handovers"
    lines = [f"{'ID':>5}  {'NODE':<20} {'FROM':<12} {'TO':<12} {'STATE':<12} {'AGE':>8}  {'MODE':<7} NOTE"]
    for r in rows:
        age = r["age_minutes"]
        age_s = f"{age / 60:.1f}h" if age >= 90 else f"{age:.0f}m"
        # a node's name comes from a platform's API: its control characters are shown, not sent
        node, source, target, state, note = (printable(r[k]) for k in ("node", "from_platform", "to_platform",
                                                                        "state", "error"))
        lines.append(f"{r['id']:>5}  {node:<20} {source:<12} {target:<12} "
                     f"{state:<12} {age_s:>8}  {'dry-run' if r['dry_run'] else 'live':<7} {note}")
    return "\n".join(lines)


def format_power_step(step: Mapping[str, Any] | None) -> str:
    """What a power step (the fast path's or the plan's) parked and woke, as lines; nothing where
    no platform parks (a fresh install's output is as before)."""
    if not step or not step.get("platforms", True):
        return ""
    if step.get("note") and not (step.get("wakes") or step.get("parks") or step.get("refused")):
        return f"power: {step['note']}"
    lines = [f"power ({'live' if step.get('live') else 'dry-run'}):"]
    for kind in ("wakes", "parks"):
        for r in step.get(kind) or []:
            what = "WAKE" if kind == "wakes" else "PARK"
            r_ = {k: printable(r.get(k)) for k in ("node", "platform", "state", "action", "reason")}
            lines.append(f"  {what} {r_['node']} on {r_['platform']} ({r_['action']}; now {r_['state']}): {r_['reason']}")
    for r in step.get("refused") or []:
        lines.append(f"  {r['action'].upper()} {printable(r['node'])} on {printable(r['platform'])} refused: "
                     f"{printable(r['why'])}")
    if len(lines) == 1:
        need = ", ".join(f"{p} {n}" for p, n in sorted((step.get("need") or {}).items()))
        lines[0] += " nothing to park or wake" + (f" (powered nodes needed: {need})" if need else "")
    return "\n".join(lines)


def format_power(rows: Sequence[Mapping[str, Any]]) -> str:
    """A table for ``gpupool power status``."""
    if not rows:
        return "no node parked or woken by gpupool: every node is on"
    lines = [f"{'NODE':<20} {'PLATFORM':<12} {'STATE':<8} {'SINCE':<17} PENDING / ERROR"]
    for r in rows:
        pend = r.get("pending")
        note = f"-> {pend['to']} by {utc(pend['deadline']).strftime('%Y-%m-%d %H:%M')}" if pend and pend.get("deadline") else (
            f"-> {pend['to']}" if pend else "")
        if r.get("error"):
            note = f"{note}  {printable(r['error'])}".strip()
        lines.append(f"{printable(r['node']):<20} {printable(r['platform']):<12} {r['state']:<8} "
                     f"{utc(r['since']).strftime('%Y-%m-%d %H:%M'):<17} {note}")
    return "\n".join(lines)
