"""Conversations: a user's message waiting for the run's next model turn
(``harness_runs.inbox_at``; the messages are kept in ``harness_signals``
under the name ``@message``), and a run's own step limit
(``harness_runs.max_steps``, raised by `harness resume --max-steps`).

Revision ID: 0015
Revises: 0014
"""

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"


def upgrade() -> None:
    with op.batch_alter_table("harness_runs") as batch:
        batch.add_column(sa.Column("inbox_at", sa.Float))
        batch.add_column(sa.Column("max_steps", sa.Integer))
    waiting = sa.text("inbox_at IS NOT NULL")
    op.create_index(
        "ix_harness_runs_inbox",
        "harness_runs",
        ["inbox_at"],
        postgresql_where=waiting,
        sqlite_where=waiting,
    )


def downgrade() -> None:
    op.drop_index("ix_harness_runs_inbox", "harness_runs")
    with op.batch_alter_table("harness_runs") as batch:
        batch.drop_column("max_steps")
        batch.drop_column("inbox_at")
