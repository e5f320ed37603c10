"""series_profile.model: JSON parameters instead of a pickle

Revision ID: 0002
Revises: 0001
Fitted detector models were stored as pickles, so whoever could write `series_profile`
could run code in every worker that read them back. The column becomes text holding the
model's JSON parameters (`FittedSeriesModel.to_params`). Stored pickles are dropped, not
converted: they are caches, and the next hourly run refits the series.
"""

from alembic import op
import sqlalchemy as sa


revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('series_profile', schema=None) as batch_op:
        batch_op.drop_column('model')
    with op.batch_alter_table('series_profile', schema=None) as batch_op:
        batch_op.add_column(sa.Column('model', sa.Text(), nullable=True))


def downgrade() -> None:
    # the JSON parameters are caches too: dropped, refitted by the next run
    with op.batch_alter_table('series_profile', schema=None) as batch_op:
        batch_op.drop_column('model')
    with op.batch_alter_table('series_profile', schema=None) as batch_op:
        batch_op.add_column(sa.Column('model', sa.LargeBinary(), nullable=True))
