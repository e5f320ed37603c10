"""In-place MIG re-layouts of a stored plan: the plan's ``layout_changes``, applied through the
platforms' actuators to idle nodes that stay where they are.

A node is re-laid out only when all of these hold: the plan is not stale, the inventory says its
GPUs can do MIG, it has no open or failed handover, and — read from the platform right before —
it is in service, empty and not already in the layout. How a platform changes a node's layout:

* **Kubernetes**: the ``nvidia.com/mig.config`` label; the GPU operator's mig-manager cordons the
  node, applies the layout and reports ``nvidia.com/mig.config.state`` (``relayout_holds_itself``);
* **Slurm**: gpupool drains the node (reason ``gpupool: MIG re-layout to ...``), and once it is
  empty runs the node-side ``mig_command`` and sets the node's GRES, then resumes it. Any step
  that fails resumes the node as it was found: the node is never left held;
* **OpenStack**: not built (mdev types are nova-compute configuration on the node).

Every command is audited in ``action_audit`` before it is sent (:func:`~gpupool.actuation.handover.send_audited`,
no handover id); a dry run audits what it would send and sends nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpupool.actuation.actuators.base import ActuationError, Actuator, Command, REASON_PREFIX
from gpupool.actuation import handover as ho
from gpupool.staging import handovers as store


class LayoutChangeFailed(RuntimeError):
    """MIG re-layouts failed in this run (every node they held back in service); raised after the
    plan's handovers were processed, so the task fails and Airflow alerts."""

    def __init__(self, failed: list[dict[str, Any]]):
        self.failed = failed
        super().__init__(f"{len(failed)} MIG re-layout(s) failed: "
                         + "; ".join(f"{f['node']} on {f['platform']} -> {f['to']}: {f['why']}" for f in failed))


def relayout_reason(layout: str) -> str:
    """The hold reason gpupool writes on a node it drains to re-lay it out."""
    return f"{REASON_PREFIX} MIG re-layout to {layout}"


def apply_layout_changes(engine, changes: list[dict], actuators: Mapping[str, Actuator], live: set[str],
                         capable: Mapping[str, bool], stale_why: str | None = None) -> dict[str, list]:
    """Apply a plan's ``layout_changes``; ``live`` names the platforms this pass may send to and
    ``capable`` what the inventory says of each node's MIG. Returns ``{"applied", "skipped", "failed"}``."""
    out: dict[str, list] = {"applied": [], "skipped": [], "failed": []}
    for c in changes:
        node, platform, layout = c["node"], c["platform"], c["to"]
        item = {"node": node, "platform": platform, "to": layout}
        why = stale_why
        if why is None and not capable.get(node, False):
            why = "the inventory says its GPUs cannot do MIG"
        if why is not None:
            out["skipped"].append({**item, "why": why})
            continue
        # under the node's writer lock, as a handover's steps are: no handover opened or advanced
        # by the fast path, the handover DAG or the CLI acts on the node while it is re-laid out
        with store.node_lock(engine, node) as held:
            if not held:
                out["skipped"].append({**item, "why": "another writer (a handover step) holds the node now"})
                continue
            if ho.list_handovers(engine, ho.BLOCKING_STATES, node=node):
                out["skipped"].append({**item, "why": "the node has an open or failed handover"})
                continue
            act = actuators.get(platform)
            if platform not in live or act is None:
                _on_paper(engine, act, platform, node, layout)
                out["applied"].append({**item, "dry_run": True})
                continue
            try:
                result = _apply(engine, act, node, layout)
            except ActuationError as exc:
                out["failed"].append({**item, "why": str(exc)})
                continue
        key = "applied" if result is None else "skipped"
        out[key].append({**item, "dry_run": False} if result is None else {**item, "why": result})
    return out


def _on_paper(engine, act: Actuator | None, platform: str, node: str, layout: str) -> None:
    cmds: list[Command]
    try:
        cmds = act.prepare_commands(node, layout) if act is not None else []
    except Exception as exc:  # a read failed or the platform cannot: a dry run still says what it would do
        cmds = [Command(platform, node, "mig_layout", {"layout": layout, "refused": str(exc)})]
    if act is None:
        cmds = [Command(platform, node, "mig_layout", {"layout": layout,
                                                      "note": "no actuator for this platform: described, not built"})]
    for cmd in cmds:
        ho.send_audited(engine, None, None, cmd, dry_run=True)


def _apply(engine, act: Actuator, node: str, layout: str) -> str | None:
    """Re-lay ``node`` out now; ``None`` when sent, else why nothing was (ActuationError on failure)."""
    if not act.can_relayout:
        return f"the {act.platform} actuator cannot change MIG layouts"
    st = act.owner_state(node)
    if not st.present:
        return f"{act.platform} does not know the node"
    if act.is_prepared(node, layout):
        return f"already laid out as {layout}"
    if not st.schedulable:
        return f"not in service on {act.platform} ({st.hold_reason})"
    if st.busy:
        return f"{st.busy} unit(s) of work run on it now"
    if act.relayout_holds_itself:
        cmds = act.prepare_commands(node, layout)
        for cmd in cmds:
            ho.send_audited(engine, None, act, cmd, dry_run=False)
        return None if cmds else "a change to it is in progress"
    for cmd in act.release_commands(node, relayout_reason(layout)):
        ho.send_audited(engine, None, act, cmd, dry_run=False)
    try:
        if not act.is_released(node):
            raise _Back("work arrived on it before it was held; back in service")
        for cmd in act.prepare_commands(node, layout):
            ho.send_audited(engine, None, act, cmd, dry_run=False)
        if not act.is_prepared(node, layout):
            raise ActuationError(act.platform, node, "mig_layout",
                                 f"the commands ran but the node does not report {layout}; back in service")
    except _Back as back:
        _resume(engine, act, node)
        return str(back)
    except ActuationError:
        _resume(engine, act, node)
        raise
    _resume(engine, act, node)
    return None


class _Back(Exception):
    pass


def _resume(engine, act: Actuator, node: str) -> None:
    for cmd in act.attach_commands(node):
        ho.send_audited(engine, None, act, cmd, dry_run=False)


__all__ = ["apply_layout_changes", "relayout_reason", "LayoutChangeFailed"]
