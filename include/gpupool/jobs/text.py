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
