"""What the CLI prints of the jobs: fast-path decisions and handovers as lines and tables."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from gpupool.values import utc


def format_decisions(rows: Sequence[Mapping[str, Any]], title: str = "fast path") -> str:
    """Recent fast-path decisions as lines for ``gpupool plan``/``handovers``/``fastpath``."""
    if not rows:
        return f"{title}: no decisions recorded"
    lines = [f"{title}:"]
    for r in rows:
        when = utc(r["decided_at"]).strftime("%Y-%m-%d %H:%M")
        mode = "dry-run" if r["dry_run"] else "live"
        if r.get("node"):
            ho_ = f" handover #{r['handover_id']}" if r.get("handover_id") else ""
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
        lines.append(f"{r['id']:>5}  {r['node']:<20} {r['from_platform']:<12} {r['to_platform']:<12} "
                     f"{r['state']:<12} {age_s:>8}  {'dry-run' if r['dry_run'] else 'live':<7} {r['error'] or ''}")
    return "\n".join(lines)
