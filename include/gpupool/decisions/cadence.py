"""The fast path's cadence, defined once: the DAG's schedule, the judge's grid and the what-if's ticks.

A leaf with no import beyond the standard library, so a DAG file can read it at parse time
without loading the scientific stack (``tests/dags``: parsing stays light).
"""

from __future__ import annotations

from datetime import timedelta

#: how often the fast path decides (``dags/gpupool_fastpath.py`` runs every this often)
FASTPATH_EVERY = timedelta(minutes=5)
#: the cron of that cadence (whole minutes dividing the hour)
FASTPATH_CRON = f"*/{int(FASTPATH_EVERY.total_seconds() // 60)} * * * *"
