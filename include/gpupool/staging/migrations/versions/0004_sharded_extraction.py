"""sharded extraction: extract_run.part, the part_sample landing table and the extract_part plan

Revision ID: 0004
Revises: 0003
A large platform is extracted in parts (node ranges plus its platform-wide series) that run
side by side; each part records its own `extract_run` row (`part` names it) and lands in
`part_sample`, from which the platform's window in `sample` is replaced in one transaction.
The plan (each part's node range) is kept in `extract_part`, not passed through XCom.
"""

from alembic import op
import sqlalchemy as sa


revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('extract_run') as batch:
        batch.add_column(sa.Column('part', sa.String(length=160), nullable=True))
    op.create_table(
        'part_sample',
        sa.Column('part', sa.String(length=160), nullable=False),
        sa.Column('platform', sa.String(length=64), nullable=False),
        sa.Column('cluster', sa.String(length=128), server_default='', nullable=False),
        sa.Column('entity_kind', sa.String(length=16), nullable=False),
        sa.Column('entity_id', sa.String(length=256), server_default='', nullable=False),
        sa.Column('metric', sa.String(length=64), nullable=False),
        sa.Column('ts', sa.DateTime(timezone=True), nullable=False),
        sa.Column('value', sa.Float(), nullable=False),
        sa.Column('unit', sa.String(length=16), server_default='', nullable=False),
    )
    op.create_index('ix_part_sample_part', 'part_sample', ['platform', 'part'], unique=False)
    op.create_table(
        'extract_part',
        sa.Column('platform', sa.String(length=64), nullable=False),
        sa.Column('window_start', sa.DateTime(timezone=True), nullable=False),
        sa.Column('window_end', sa.DateTime(timezone=True), nullable=False),
        sa.Column('part', sa.String(length=160), nullable=False),
        sa.Column('position', sa.Integer(), nullable=False),
        sa.Column('parts', sa.Integer(), nullable=False),
        sa.Column('nodes', sa.JSON(), nullable=True),
        sa.PrimaryKeyConstraint('platform', 'window_start', 'window_end', 'part', name='pk_extract_part'),
    )


def downgrade() -> None:
    op.drop_table('extract_part')
    op.drop_index('ix_part_sample_part', table_name='part_sample')
    op.drop_table('part_sample')
    with op.batch_alter_table('extract_run') as batch:
        batch.drop_column('part')
