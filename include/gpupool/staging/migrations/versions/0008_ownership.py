"""ownership: node_owner, owner_sight, reclaim_need; a handover's kind, budget slot and need

Revision ID: 0008
Revises: 0007
Issue 42: each pool node's owner is recorded once (config or first sight) so a restart does not
reshuffle it; an owner's need for its lent nodes is kept between ticks; a reclaim is a handover
of kind "reclaim" that says whether it took a slot of the move budget and when its need began; a
handover keeps the GPUs its node brings, so what is on its way is known without an inventory.
"""

from alembic import op
import sqlalchemy as sa


revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('handover') as batch:
        batch.add_column(sa.Column('kind', sa.String(length=16), nullable=True))
        batch.add_column(sa.Column('outside_budget', sa.Boolean(), nullable=True))
        batch.add_column(sa.Column('need_since', sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column('gpus', sa.Integer(), nullable=True))
    op.create_table(
        'node_owner',
        sa.Column('node', sa.String(length=256), primary_key=True),
        sa.Column('owner', sa.String(length=64), nullable=False),
        sa.Column('source', sa.String(length=16), nullable=False),
        sa.Column('recorded_at', sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        'owner_sight',
        sa.Column('platform', sa.String(length=64), primary_key=True),
        sa.Column('owns', sa.Integer(), nullable=True),
        sa.Column('at', sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        'reclaim_need',
        sa.Column('platform', sa.String(length=64), primary_key=True),
        sa.Column('since', sa.DateTime(timezone=True), nullable=False),
        sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table('reclaim_need')
    op.drop_table('owner_sight')
    op.drop_table('node_owner')
    with op.batch_alter_table('handover') as batch:
        batch.drop_column('gpus')
        batch.drop_column('need_since')
        batch.drop_column('outside_budget')
        batch.drop_column('kind')
