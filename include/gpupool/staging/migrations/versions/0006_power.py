"""power as a node state: node_power, power_transition, action_audit.power_transition_id

Revision ID: 0006
Revises: 0005
`node_power` holds the power state of each pool node gpupool parked or woke (on, parking,
parked, waking; a node without a row is on) and the platform it wakes on; `power_transition`
records every transition, dry runs included; an `action_audit` row of a park or wake command
names its transition in the new `power_transition_id`.
"""

from alembic import op
import sqlalchemy as sa


revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'node_power',
        sa.Column('node', sa.String(length=256), nullable=False),
        sa.Column('platform', sa.String(length=64), nullable=False),
        sa.Column('state', sa.String(length=16), nullable=False),
        sa.Column('reason', sa.Text(), nullable=True),
        sa.Column('error', sa.Text(), nullable=True),
        sa.Column('since', sa.DateTime(timezone=True), nullable=False),
        sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('deadline', sa.DateTime(timezone=True), nullable=True),
        sa.Column('transition_id', sa.Integer(), nullable=True),
        sa.Column('wake_deadline', sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint('node'),
    )
    op.create_table(
        'power_transition',
        sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
        sa.Column('node', sa.String(length=256), nullable=False),
        sa.Column('platform', sa.String(length=64), nullable=False),
        sa.Column('from_state', sa.String(length=16), nullable=False),
        sa.Column('to_state', sa.String(length=16), nullable=False),
        sa.Column('at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('by', sa.String(length=32), nullable=False),
        sa.Column('reason', sa.Text(), nullable=True),
        sa.Column('error', sa.Text(), nullable=True),
        sa.Column('dry_run', sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint('id'),
    )
    op.create_index('ix_power_transition_node', 'power_transition', ['node', 'id'], unique=False)
    with op.batch_alter_table('action_audit') as batch:
        batch.add_column(sa.Column('power_transition_id', sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('action_audit') as batch:
        batch.drop_column('power_transition_id')
    op.drop_index('ix_power_transition_node', table_name='power_transition')
    op.drop_table('power_transition')
    op.drop_table('node_power')
