"""power_transition.deadline: the deadline each park or wake was given

Revision ID: 0007
Revises: 0006
`node_power.deadline` holds the deadline of a node's current park or wake only; the metrics and
the report count, over the whole history, the wakes that reached `on` after theirs, so each
transition keeps the deadline it set (null where it set none).
"""

from alembic import op
import sqlalchemy as sa


revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('power_transition') as batch:
        batch.add_column(sa.Column('deadline', sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('power_transition') as batch:
        batch.drop_column('deadline')
