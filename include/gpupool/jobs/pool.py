"""The pool as the planner sees it now: each node, who holds it and how busy, from staging.

What the hourly plan, the power step, the reclaim, the metrics and the pool page read the same way
(:func:`pool_nodes`); :mod:`gpupool.jobs.allocation` re-exports it.
"""

from __future__ import annotations

import math
from datetime import datetime

import pandas as pd
from sqlalchemy.engine import Engine

from gpupool.actuation import handover as ho
from gpupool.actuation.actuators.base import is_gpupool_reason
from gpupool.decisions.layouts import WHOLE_LAYOUTS, layout_from_inventory
from gpupool.decisions.planner import NodeRecord
from gpupool.staging import reads


def pool_nodes(engine: Engine, at: datetime, platforms: list[str], config=None) -> tuple[list[NodeRecord], list[dict]]:
    """The pool as the planner sees it at ``at``, and the nodes left out (with why).

    A node may appear in several platforms' inventories (gpupool keeps it drained where it is
    not owned): its owner is the platform where it is not held by gpupool — or, while a
    handover is open, the handover's target. A node another tool drained at its owner is left
    out of the pool (it serves nobody and gpupool must not touch it). Nodes outside an explicit
    ``pool.nodes`` list are fixed capacity (planned as in a handover: they never move).
    Inventory rows carry each platform's own node name; with ``config`` they are mapped back to
    pool node ids (``pool.nodes[].names``) so one machine is one node. A node gpupool parked (or
    is parking or waking) is its platform's capacity that never moves (planned as in a handover):
    a handover opens only on a node that is on, so the plan leaves it to the power step to wake
    (the what-if moves a parked node and wakes it on the way). A node drained by someone else is
    left out with the ``platform`` that holds it. The records' ``home`` is left None:
    :func:`plan_from_staging` fills it (:func:`~gpupool.jobs.owners.homes_at`).
    """
    from gpupool.staging import power as power_store

    inv = reads.read_inventory(engine, at, platforms)
    if config is not None:  # each platform reports its own name of a machine: plan on pool ids
        inv = inv.assign(node=[config.pool.node_id(p, n) for p, n in zip(inv["platform"], inv["node"])])
    open_h = {h.node: h for h in ho.list_handovers(engine, ho.BLOCKING_STATES) if not h.dry_run}
    last_move = reads.last_moves(engine, ho.DONE)
    members = None
    if config is not None and config.pool.nodes and not config.pool.all_nodes:
        members = {n.node for n in config.pool.nodes}
    rows_by_node: dict[str, list[dict]] = {}
    for r in inv.to_dict("records"):
        rows_by_node.setdefault(str(r["node"]), []).append(r)
    powered_down = {r["node"]: r["platform"] for r in power_store.power_rows(engine) if r["state"] != power_store.ON}
    nodes, excluded = [], []
    for name in sorted(rows_by_node):
        rows = rows_by_node[name]
        h = open_h.get(name)
        own = [r for r in rows if bool(r["schedulable"]) or not is_gpupool_reason(r.get("drain_reason"))]
        if name in powered_down and h is None:  # parked by gpupool: held at its platform, and stays there
            owner = powered_down[name]
            owner_row = next((r for r in rows if r["platform"] == owner), rows[0])
            gpus, capable, layout = layout_from_inventory(owner_row.get("mig_layout"), int(owner_row["gpus"]),
                                                          owner_row.get("gpu_model"))
            nodes.append(NodeRecord(name=name, owner=str(owner), gpus=gpus, busy_gpus=0.0, in_handover=True,
                                    last_moved_at=last_move.get(name), mig_capable=capable, mig_layout=layout))
            continue
        if h is not None:
            owner_row = next((r for r in rows if r["platform"] == h.to_platform), rows[0])
            owner = h.to_platform
        elif len(own) == 1:
            owner_row, owner = own[0], own[0]["platform"]
        elif not own:  # held by gpupool everywhere: between platforms with no handover record
            excluded.append({"node": name, "why": "held by gpupool on every platform, no open handover"})
            continue
        else:
            excluded.append({"node": name, "why": f"open for work on several platforms: {[r['platform'] for r in own]}"})
            continue
        if not bool(owner_row["schedulable"]) and not is_gpupool_reason(owner_row.get("drain_reason")) and h is None:
            excluded.append({"node": name, "platform": str(owner),
                             "why": f"drained on {owner} by someone else: {owner_row.get('drain_reason')}"})
            continue
        gpus, capable, layout = layout_from_inventory(owner_row.get("mig_layout"), int(owner_row["gpus"]),
                                                      owner_row.get("gpu_model"))
        busy = owner_row.get("busy_gpus")
        if layout not in WHOLE_LAYOUTS and busy is not None and not pd.isna(busy) and int(owner_row["gpus"]) > gpus:
            busy = math.ceil(float(busy) * gpus / int(owner_row["gpus"]))  # busy slices (Slurm) -> GPUs with work
        nodes.append(NodeRecord(
            name=name, owner=str(owner), gpus=gpus,
            busy_gpus=0.0 if busy is None or pd.isna(busy) else min(float(busy), float(gpus)),
            in_handover=h is not None or (members is not None and name not in members),
            last_moved_at=last_move.get(name),
            mig_capable=capable,
            mig_layout=layout,
        ))
    return nodes, excluded
