"""Space out the sweeper's re-sends, and say why a run cannot move.

``resends`` counts the sweeper's re-dispatches since the run last moved, so
the next one waits exponentially longer; ``blocked`` holds, once, the reason
no worker could carry the run (its agent not registered anywhere, no
runnable step). Both are cleared by the run's next step. An index on
(created_at, run_id) serves the read service's keyset pagination; neither
column ever changes, so checkpoints stay heap-only updates.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"


def upgrade() -> None:
    with op.batch_alter_table("harness_runs") as batch:
        batch.add_column(sa.Column("resends", sa.Integer, nullable=False, server_default="0"))
        batch.add_column(sa.Column("blocked", sa.Text))
    op.create_index("ix_harness_runs_created", "harness_runs", ["created_at", "run_id"])


def downgrade() -> None:
    op.drop_index("ix_harness_runs_created", "harness_runs")
    with op.batch_alter_table("harness_runs") as batch:
        batch.drop_column("blocked")
        batch.drop_column("resends")
