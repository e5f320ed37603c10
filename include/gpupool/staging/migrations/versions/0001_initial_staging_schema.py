"""initial staging schema

Revision ID: 0001
Revises: (none)
Creates every staging table. `sample` is range-partitioned by day on PostgreSQL
(the loader creates day partitions as windows arrive); a plain table on SQLite.
"""

from alembic import op
import sqlalchemy as sa


revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('action_audit',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('handover_id', sa.Integer(), nullable=True),
    sa.Column('platform', sa.String(length=64), nullable=False),
    sa.Column('node', sa.String(length=256), nullable=False),
    sa.Column('action', sa.String(length=64), nullable=False),
    sa.Column('request', sa.JSON(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('response', sa.Text(), nullable=True),
    sa.Column('dry_run', sa.Boolean(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_table('allocation_plan',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('decided_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('policy', sa.String(length=32), nullable=False),
    sa.Column('solver', sa.String(length=32), nullable=False),
    sa.Column('dry_run', sa.Boolean(), nullable=False),
    sa.Column('summary', sa.JSON(), nullable=False),
    sa.Column('moves', sa.JSON(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('allocation_plan', schema=None) as batch_op:
        batch_op.create_index('ix_allocation_plan_decided', ['decided_at'], unique=False)

    op.create_table('clean_sample',
    sa.Column('platform', sa.String(length=64), nullable=False),
    sa.Column('cluster', sa.String(length=128), server_default='', nullable=False),
    sa.Column('entity_kind', sa.String(length=16), nullable=False),
    sa.Column('entity_id', sa.String(length=256), server_default='', nullable=False),
    sa.Column('metric', sa.String(length=64), nullable=False),
    sa.Column('ts', sa.DateTime(timezone=True), nullable=False),
    sa.Column('value', sa.Float(), nullable=True),
    sa.Column('expected', sa.Float(), nullable=True),
    sa.Column('score', sa.Float(), nullable=True),
    sa.Column('is_anomaly', sa.Boolean(), nullable=False),
    sa.Column('filled', sa.Boolean(), nullable=False),
    sa.Column('detector', sa.String(length=16), nullable=False),
    sa.Column('clean_value', sa.Float(), nullable=True),
    sa.PrimaryKeyConstraint('platform', 'cluster', 'entity_kind', 'entity_id', 'metric', 'ts', name='pk_clean_sample')
    )
    op.create_table('extract_run',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('platform', sa.String(length=64), nullable=False),
    sa.Column('source', sa.String(length=32), nullable=False),
    sa.Column('window_start', sa.DateTime(timezone=True), nullable=False),
    sa.Column('window_end', sa.DateTime(timezone=True), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('rows', sa.BigInteger(), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('extract_run', schema=None) as batch_op:
        batch_op.create_index('ix_extract_run_window', ['platform', 'window_start'], unique=False)

    op.create_table('forecast',
    sa.Column('platform', sa.String(length=64), nullable=False),
    sa.Column('series', sa.String(length=64), nullable=False),
    sa.Column('issued_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('step', sa.Integer(), nullable=False),
    sa.Column('ts', sa.DateTime(timezone=True), nullable=False),
    sa.Column('yhat', sa.Float(), nullable=False),
    sa.Column('yhat_lower', sa.Float(), nullable=False),
    sa.Column('yhat_upper', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('platform', 'series', 'issued_at', 'step', name='pk_forecast')
    )
    op.create_table('forecast_run',
    sa.Column('platform', sa.String(length=64), nullable=False),
    sa.Column('series', sa.String(length=64), nullable=False),
    sa.Column('issued_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('model', sa.String(length=32), nullable=False),
    sa.Column('summary', sa.JSON(), nullable=False),
    sa.Column('level', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('platform', 'series', 'issued_at', name='pk_forecast_run')
    )
    op.create_table('handover',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('node', sa.String(length=256), nullable=False),
    sa.Column('from_platform', sa.String(length=64), nullable=False),
    sa.Column('to_platform', sa.String(length=64), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('plan_id', sa.Integer(), nullable=True),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('dry_run', sa.Boolean(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('deadline', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('handover', schema=None) as batch_op:
        batch_op.create_index('ix_handover_node_state', ['node', 'state'], unique=False)

    op.create_table('inventory_node',
    sa.Column('platform', sa.String(length=64), nullable=False),
    sa.Column('node', sa.String(length=256), nullable=False),
    sa.Column('snapshot_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('gpus', sa.Integer(), nullable=False),
    sa.Column('gpu_model', sa.String(length=128), server_default='', nullable=False),
    sa.Column('mig_layout', sa.JSON(), nullable=True),
    sa.Column('schedulable', sa.Boolean(), nullable=False),
    sa.Column('drain_reason', sa.Text(), nullable=True),
    sa.Column('busy_gpus', sa.Float(), nullable=True),
    sa.PrimaryKeyConstraint('platform', 'node', 'snapshot_at', name='pk_inventory_node')
    )
    op.create_table('sample',
    sa.Column('platform', sa.String(length=64), nullable=False),
    sa.Column('cluster', sa.String(length=128), server_default='', nullable=False),
    sa.Column('entity_kind', sa.String(length=16), nullable=False),
    sa.Column('entity_id', sa.String(length=256), server_default='', nullable=False),
    sa.Column('metric', sa.String(length=64), nullable=False),
    sa.Column('ts', sa.DateTime(timezone=True), nullable=False),
    sa.Column('value', sa.Float(), nullable=False),
    sa.Column('unit', sa.String(length=16), server_default='', nullable=False),
    sa.PrimaryKeyConstraint('platform', 'cluster', 'entity_kind', 'entity_id', 'metric', 'ts', name='pk_sample'),
    postgresql_partition_by='RANGE (ts)'
    )
    op.create_table('series_profile',
    sa.Column('platform', sa.String(length=64), nullable=False),
    sa.Column('cluster', sa.String(length=128), server_default='', nullable=False),
    sa.Column('entity_kind', sa.String(length=16), nullable=False),
    sa.Column('entity_id', sa.String(length=256), server_default='', nullable=False),
    sa.Column('metric', sa.String(length=64), nullable=False),
    sa.Column('computed_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('features', sa.JSON(), nullable=False),
    sa.Column('detector', sa.String(length=16), nullable=False),
    sa.Column('reason', sa.Text(), nullable=False),
    sa.Column('model', sa.LargeBinary(), nullable=True),
    sa.PrimaryKeyConstraint('platform', 'cluster', 'entity_kind', 'entity_id', 'metric', 'computed_at', name='pk_series_profile')
    )


def downgrade() -> None:
    op.drop_table('series_profile')
    op.drop_table('sample')
    op.drop_table('inventory_node')
    with op.batch_alter_table('handover', schema=None) as batch_op:
        batch_op.drop_index('ix_handover_node_state')

    op.drop_table('handover')
    op.drop_table('forecast_run')
    op.drop_table('forecast')
    with op.batch_alter_table('extract_run', schema=None) as batch_op:
        batch_op.drop_index('ix_extract_run_window')

    op.drop_table('extract_run')
    op.drop_table('clean_sample')
    with op.batch_alter_table('allocation_plan', schema=None) as batch_op:
        batch_op.drop_index('ix_allocation_plan_decided')

    op.drop_table('allocation_plan')
    op.drop_table('action_audit')
