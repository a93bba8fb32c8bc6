"""Incarnations: a nonce per run row, made fresh whenever the store inserts
the row (``harness_runs.incarnation``), so that a worker's memory of a run
(harness.engine.transcripts) and a run's Redis stream tell it apart from
another run under the same id: one pruned and imported again, whose
creation time an import keeps. Rows made before stay NULL (one value to
a reader), and are not rewritten: a table of any size migrates at once.

Revision ID: 0018
Revises: 0017
"""

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"


def upgrade() -> None:
    with op.batch_alter_table("harness_runs") as batch:
        batch.add_column(sa.Column("incarnation", sa.String(32)))


def downgrade() -> None:
    with op.batch_alter_table("harness_runs") as batch:
        batch.drop_column("incarnation")
