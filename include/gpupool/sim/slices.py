"""MIG layouts in the what-if's world: each node's layout per step and what it serves.

A platform whose scenario entry has a ``slice_profile`` counts its demand in slice requests of
that profile (the platform configuration's ``slice_demand: requests``). Every MIG-capable node
starts ``all-disabled``; a plan's move carries the layout the node gets on arrival, a plan's
re-layout changes it in place. What a node serves its owner at a step is
:func:`gpupool.decisions.layouts.node_capacity` of its layout in the owner's unit, the planner's
own rule: a whole GPU serves one request of either kind, a GPU laid out ``all-<profile>`` serves
``SLICES_PER_GPU[profile]`` slice requests of a profile no bigger and no whole-GPU request; a node
that cannot do MIG serves its GPUs to both.

A re-layout in place takes the node out of service for
:data:`gpupool.decisions.planner.LAYOUT_CHANGE_MINUTES` (the time the planner charges it, shorter
than a move: the node stays on its platform). Only a world with a slice platform serves by
layout; without one every node serves its GPUs whatever its layout, as it always has.
"""

from __future__ import annotations

import numpy as np

from gpupool import mig
from gpupool.decisions.layouts import GPU_UNIT, NodeRecord, node_capacity


class Layouts:
    """The MIG layout of every node per step (codes into ``names``) and the re-layout outages.

    ``nodes`` are the world's nodes (``name``, ``gpus``, ``mig_capable``), ``units`` each
    platform's unit in platform-index order.
    """

    def __init__(self, nodes, units: tuple[str, ...], n_steps: int):
        self.nodes = nodes
        self.units = units
        self.names: list[str | None] = [mig.DISABLED, None]
        self.code_ = np.array([[0 if n.mig_capable else 1] for n in nodes], dtype=np.int16).repeat(n_steps, axis=1) \
            if nodes else np.zeros((0, n_steps), dtype=np.int16)
        self.out_ = np.zeros((len(nodes), n_steps), dtype=bool)  # out of service for a re-layout
        self._table: dict[tuple[int, int, int], float] = {}

    def code(self, layout: str | None) -> int:
        """The code of ``layout`` (a new one is added)."""
        if layout not in self.names:
            self.names.append(layout)
        return self.names.index(layout)

    def at(self, j: int, i: int) -> str | None:
        """Node ``j``'s layout at step ``i`` (the last step's past the end)."""
        return self.names[int(self.code_[j, min(i, self.code_.shape[1] - 1)])]

    def set(self, j: int, i: int, layout: str | None, out_steps: int = 0) -> None:
        """Node ``j`` has ``layout`` from step ``i`` on, out of service for ``out_steps`` of them."""
        self.code_[j, i:] = self.code(layout)
        self.out_[j, i : i + out_steps] = True

    def serves(self, j: int, platform: int, code: int) -> float:
        """Requests of ``platform``'s unit node ``j`` serves in layout ``code``."""
        key = (j, platform, code)
        if key not in self._table:
            n = self.nodes[j]
            record = NodeRecord(n.name, "", n.gpus, mig_capable=n.mig_capable, mig_layout=self.names[code])
            self._table[key] = node_capacity(record, self.units[platform], self.names[code])
        return self._table[key]

    def capacity(self, owner: np.ndarray, cordoned: np.ndarray, i0: int, i1: int) -> np.ndarray:
        """Requests each node (rows) serves its owner of each step in ``[i0, i1)`` in the owner's
        unit: 0 in transit, cordoned or re-laying out."""
        codes = self.code_[:, i0:i1]
        out = np.zeros(owner.shape)
        live = ~cordoned & ~self.out_[:, i0:i1]
        for j in range(len(self.nodes)):
            for p in range(len(self.units)):
                mine = (owner[j] == p) & live[j]
                if not mine.any():
                    continue
                for c in np.unique(codes[j][mine]):
                    out[j] = np.where(mine & (codes[j] == c), self.serves(j, p, int(c)), out[j])
        return out


def units_of(scenario) -> tuple[str, ...]:
    """Each platform's demand unit, in the scenario's platform order."""
    return tuple(spec.slice_profile or GPU_UNIT for spec in scenario.platforms.values())
