"""clean_sample.cleaned: alarms and cleaning are two decisions

Revision ID: 0003
Revises: 0002
`is_anomaly` is the alarm (the point deviated beyond τ); the new `cleaned` says whether
`clean_value` replaced the value. Rows written before this revision get `cleaned` =
`is_anomaly` (until now a flag was raised only on the points that were replaced).
"""

from alembic import op
import sqlalchemy as sa


revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('clean_sample') as batch:
        batch.add_column(sa.Column('cleaned', sa.Boolean(), server_default=sa.false(), nullable=False))
    op.execute(sa.text('UPDATE clean_sample SET cleaned = is_anomaly'))


def downgrade() -> None:
    with op.batch_alter_table('clean_sample') as batch:
        batch.drop_column('cleaned')
