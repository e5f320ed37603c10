"""The staging schema (SQLAlchemy Core). Alembic migrations create it; this module is
what the code queries. `tests/staging/test_migrations.py` checks the two agree."""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    false,
)

metadata = MetaData()

TS = DateTime(timezone=True)


def _series_columns() -> list[Column]:
    return [
        Column("platform", String(64), nullable=False),
        Column("cluster", String(128), nullable=False, server_default=""),
        Column("entity_kind", String(16), nullable=False),
        Column("entity_id", String(256), nullable=False, server_default=""),
        Column("metric", String(64), nullable=False),
    ]


SERIES_PK = ("platform", "cluster", "entity_kind", "entity_id", "metric")

extract_run = Table(
    "extract_run",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("platform", String(64), nullable=False),
    Column("source", String(32), nullable=False),  # usage | inventory
    Column("window_start", TS, nullable=False),
    Column("window_end", TS, nullable=False),
    Column("status", String(16), nullable=False),  # running | success | failed | unrecoverable
    Column("rows", BigInteger),
    Column("error", Text),
    Column("started_at", TS, nullable=False),
    Column("finished_at", TS),
    # NULL: the run of the whole platform; else one part of a sharded extraction (see
    # `gpupool.pipeline.plan_extract`), e.g. "2/5 node-0833..node-1665 (833 nodes) #1a2b3c4d"
    Column("part", String(160)),
    Index("ix_extract_run_window", "platform", "window_start"),
)

#: the parts of a sharded extraction land here side by side; the platform's window in
#: `sample` is replaced from them in one transaction once every part is in (no key: the
#: sample table's own key checks the parts did not overlap when they are promoted)
part_sample = Table(
    "part_sample",
    metadata,
    Column("part", String(160), nullable=False),
    *_series_columns(),
    Column("ts", TS, nullable=False),
    Column("value", Float, nullable=False),
    Column("unit", String(16), nullable=False, server_default=""),
    Index("ix_part_sample_part", "platform", "part"),
)

#: the plan of a sharded extraction: one row per part of a platform's window, naming the
#: nodes of its range (NULL: the platform-wide part). `plan_extract` writes it and each
#: mapped part reads its own row, so node names stay out of XCom (which carries the window,
#: the part's number and counts)
extract_part = Table(
    "extract_part",
    metadata,
    Column("platform", String(64), nullable=False),
    Column("window_start", TS, nullable=False),
    Column("window_end", TS, nullable=False),
    Column("part", String(160), nullable=False),  # as extract_run.part records it
    Column("position", Integer, nullable=False),  # 0-based, in node-name order; the platform-wide part last
    Column("parts", Integer, nullable=False),  # how many parts the plan has
    Column("nodes", JSON),
    PrimaryKeyConstraint("platform", "window_start", "window_end", "part", name="pk_extract_part"),
)

#: canonical long format; range-partitioned by day on PostgreSQL
sample = Table(
    "sample",
    metadata,
    *_series_columns(),
    Column("ts", TS, nullable=False),
    Column("value", Float, nullable=False),
    Column("unit", String(16), nullable=False, server_default=""),
    PrimaryKeyConstraint(*SERIES_PK, "ts", name="pk_sample"),
    postgresql_partition_by="RANGE (ts)",
)

inventory_node = Table(
    "inventory_node",
    metadata,
    Column("platform", String(64), nullable=False),
    Column("node", String(256), nullable=False),
    Column("snapshot_at", TS, nullable=False),
    Column("gpus", Integer, nullable=False),
    Column("gpu_model", String(128), nullable=False, server_default=""),
    Column("mig_layout", JSON),
    Column("schedulable", Boolean, nullable=False),
    Column("drain_reason", Text),
    Column("busy_gpus", Float),
    PrimaryKeyConstraint("platform", "node", "snapshot_at", name="pk_inventory_node"),
)

series_profile = Table(
    "series_profile",
    metadata,
    *_series_columns(),
    Column("computed_at", TS, nullable=False),
    Column("features", JSON, nullable=False),
    Column("detector", String(16), nullable=False),
    Column("reason", Text, nullable=False),
    # the fitted model as JSON parameters (FittedSeriesModel.to_params), reused by the hourly
    # runs; text, never a pickle: nothing read back from staging is executed
    Column("model", Text),
    PrimaryKeyConstraint(*SERIES_PK, "computed_at", name="pk_series_profile"),
)

clean_sample = Table(
    "clean_sample",
    metadata,
    *_series_columns(),
    Column("ts", TS, nullable=False),
    Column("value", Float),  # NULL: the point was missing (and maybe filled)
    Column("expected", Float),
    Column("score", Float),
    Column("is_anomaly", Boolean, nullable=False),  # an alarm: the point deviated beyond τ
    Column("cleaned", Boolean, nullable=False, server_default=false()),  # clean_value replaced the value
    Column("filled", Boolean, nullable=False),
    Column("detector", String(16), nullable=False),
    Column("clean_value", Float),
    PrimaryKeyConstraint(*SERIES_PK, "ts", name="pk_clean_sample"),
)

forecast_run = Table(
    "forecast_run",
    metadata,
    Column("platform", String(64), nullable=False),
    Column("series", String(64), nullable=False),  # "demand" or a pool resource class
    Column("issued_at", TS, nullable=False),
    Column("model", String(32), nullable=False),
    Column("summary", JSON, nullable=False),  # orders, criterion values, test p-values, fallback reason
    Column("level", Float, nullable=False),
    PrimaryKeyConstraint("platform", "series", "issued_at", name="pk_forecast_run"),
)

forecast = Table(
    "forecast",
    metadata,
    Column("platform", String(64), nullable=False),
    Column("series", String(64), nullable=False),
    Column("issued_at", TS, nullable=False),
    Column("step", Integer, nullable=False),
    Column("ts", TS, nullable=False),
    Column("yhat", Float, nullable=False),
    Column("yhat_lower", Float, nullable=False),
    Column("yhat_upper", Float, nullable=False),
    PrimaryKeyConstraint("platform", "series", "issued_at", "step", name="pk_forecast"),
)

allocation_plan = Table(
    "allocation_plan",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("decided_at", TS, nullable=False),
    Column("policy", String(32), nullable=False),
    Column("solver", String(32), nullable=False),
    Column("dry_run", Boolean, nullable=False),
    Column("summary", JSON, nullable=False),  # per platform: demand forecast, capacity, target nodes
    Column("moves", JSON, nullable=False),  # [{node, from, to, expected_gain, reason}]
    Index("ix_allocation_plan_decided", "decided_at"),
)

handover = Table(
    "handover",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("node", String(256), nullable=False),
    Column("from_platform", String(64), nullable=False),
    Column("to_platform", String(64), nullable=False),
    Column("state", String(16), nullable=False),
    Column("plan_id", Integer),
    Column("reason", Text),
    Column("error", Text),
    Column("dry_run", Boolean, nullable=False),
    Column("created_at", TS, nullable=False),
    Column("updated_at", TS, nullable=False),
    Column("deadline", TS),
    # "reclaim": an owner takes its lent node back (issue 42); NULL: a move of the plan or fast path
    Column("kind", String(16)),
    # a reclaim that took no slot of the rolling move budget (the budget would have made it late)
    Column("outside_budget", Boolean),
    # a reclaim's: when its owner's need began (its latency runs from here to `done`)
    Column("need_since", TS),
    # the GPUs the node brings, where the opener knew them: what is on its way while it moves
    Column("gpus", Integer),
    Index("ix_handover_node_state", "node", "state"),
)

action_audit = Table(
    "action_audit",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("handover_id", Integer),
    Column("platform", String(64), nullable=False),
    Column("node", String(256), nullable=False),
    Column("action", String(64), nullable=False),
    Column("request", JSON, nullable=False),
    Column("status", String(16), nullable=False),  # pending | ok | failed | dry_run
    Column("response", Text),
    Column("dry_run", Boolean, nullable=False),
    Column("created_at", TS, nullable=False),
    Column("finished_at", TS),
    # the power transition (park or wake) a command belongs to; NULL for a handover's commands
    Column("power_transition_id", Integer),
)

#: the fast path's instant pressure readings (`Source.pressure`), one row per platform, metric
#: (gpu_allocated_now, gpu_pending_now, gpu_capacity_now) and reading time: the history each new
#: reading is judged against before the fast path acts on it
pressure_sample = Table(
    "pressure_sample",
    metadata,
    Column("platform", String(64), nullable=False),
    Column("metric", String(64), nullable=False),
    Column("at", TS, nullable=False),
    Column("value", Float, nullable=False),
    PrimaryKeyConstraint("platform", "metric", "at", name="pk_pressure_sample"),
)

#: every fast-path decision: the pressure it saw, the move it started (node, source, target) or
#: none, why, and the handover it opened. `platform` is the platform the decision is about
#: (the target of a move; "*" for one about the whole tick, e.g. a backfill)
fastpath_decision = Table(
    "fastpath_decision",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("decided_at", TS, nullable=False),
    Column("platform", String(64), nullable=False),
    Column("pressure", JSON),
    Column("node", String(256)),
    Column("source", String(64)),
    Column("target", String(64)),
    Column("reason", Text, nullable=False),
    Column("dry_run", Boolean, nullable=False),
    Column("handover_id", Integer),
    Index("ix_fastpath_decision_decided", "decided_at"),
)

#: the power state of each pool node gpupool parked or woke: on | parking | parked | waking (a
#: node without a row is on). `platform` is where the node wakes; `deadline`, while parking or
#: waking, is when the change is late. Written only by `gpupool.staging.power`
node_power = Table(
    "node_power",
    metadata,
    Column("node", String(256), primary_key=True),
    Column("platform", String(64), nullable=False),
    Column("state", String(16), nullable=False),
    Column("reason", Text),
    Column("error", Text),
    Column("since", TS, nullable=False),  # when it entered `state`
    Column("updated_at", TS, nullable=False),
    Column("deadline", TS),
    Column("transition_id", Integer),  # the power_transition that put it in `state`
    # a wake asked while the node was powering off (which cannot be taken back): it is woken as
    # soon as it is parked, due by this time
    Column("wake_deadline", TS),
)

#: every power transition of a node, in order: the audit of `node_power` (a dry run's, which
#: leaves `node_power` as it was, included). `by`: plan | fastpath | operator | observed (the
#: platform changed it itself, e.g. Slurm woke a parked node for a job)
power_transition = Table(
    "power_transition",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("node", String(256), nullable=False),
    Column("platform", String(64), nullable=False),
    Column("from_state", String(16), nullable=False),
    Column("to_state", String(16), nullable=False),
    Column("at", TS, nullable=False),
    Column("by", String(32), nullable=False),
    Column("reason", Text),
    Column("error", Text),
    Column("dry_run", Boolean, nullable=False),
    Column("deadline", TS),  # the deadline the park or wake was given (the metrics' late wakes)
    Index("ix_power_transition_node", "node", "id"),
)

#: who owns each pool node (issue 42): `pool.nodes[].owner` (source "config") or a platform's
#: first `owns` of what it held when gpupool first saw it (source "first_sight"). A row is written
#: once and never reshuffled: a restart reads it back. Written only by `gpupool.staging.owners`
node_owner = Table(
    "node_owner",
    metadata,
    Column("node", String(256), primary_key=True),
    Column("owner", String(64), nullable=False),
    Column("source", String(16), nullable=False),
    Column("recorded_at", TS, nullable=False),
)

#: the platforms gpupool has seen and recorded owners for (their first sight), so a platform
#: whose `owns` took fewer nodes than it holds does not take more on a later tick
owner_sight = Table(
    "owner_sight",
    metadata,
    Column("platform", String(64), primary_key=True),
    Column("owns", Integer),
    Column("at", TS, nullable=False),
)

#: each owner's open need for its lent nodes: since when its work queues with a node of its own
#: lent out (`gpupool.decisions.ownership.need_since`), kept between ticks
reclaim_need = Table(
    "reclaim_need",
    metadata,
    Column("platform", String(64), primary_key=True),
    Column("since", TS, nullable=False),
    Column("updated_at", TS, nullable=False),
)
