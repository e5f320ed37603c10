"""the fast path: its pressure readings and its decisions

Revision ID: 0005
Revises: 0004
`pressure_sample` keeps each platform's instant pressure readings (allocated, pending, open
capacity), the history a new reading is judged against before the fast path acts on it;
`fastpath_decision` records every fast-path decision: the pressure seen, the move started or
none, why, and the handover it opened.
"""

from alembic import op
import sqlalchemy as sa


revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'pressure_sample',
        sa.Column('platform', sa.String(length=64), nullable=False),
        sa.Column('metric', sa.String(length=64), nullable=False),
        sa.Column('at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('value', sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint('platform', 'metric', 'at', name='pk_pressure_sample'),
    )
    op.create_table(
        'fastpath_decision',
        sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
        sa.Column('decided_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('platform', sa.String(length=64), nullable=False),
        sa.Column('pressure', sa.JSON(), nullable=True),
        sa.Column('node', sa.String(length=256), nullable=True),
        sa.Column('source', sa.String(length=64), nullable=True),
        sa.Column('target', sa.String(length=64), nullable=True),
        sa.Column('reason', sa.Text(), nullable=False),
        sa.Column('dry_run', sa.Boolean(), nullable=False),
        sa.Column('handover_id', sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint('id'),
    )
    op.create_index('ix_fastpath_decision_decided', 'fastpath_decision', ['decided_at'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_fastpath_decision_decided', table_name='fastpath_decision')
    op.drop_table('fastpath_decision')
    op.drop_table('pressure_sample')
