"""Forks: a run created from another run's recorded steps.

``forked_from_run`` and ``forked_from_step`` name the run a fork copied and
the model step it continued from (both null for a run that is not a fork).
Neither ever changes after the run is inserted, so the index on
``forked_from_run`` (``harness list --forked-from``, and prune keeping a
fork's ancestors) does not rule out heap-only updates of checkpoints.

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"


def upgrade() -> None:
    with op.batch_alter_table("harness_runs") as batch:
        batch.add_column(sa.Column("forked_from_run", sa.String(128)))
        batch.add_column(sa.Column("forked_from_step", sa.Integer))
    op.create_index("ix_harness_runs_forked_from", "harness_runs", ["forked_from_run"])


def downgrade() -> None:
    op.drop_index("ix_harness_runs_forked_from", "harness_runs")
    with op.batch_alter_table("harness_runs") as batch:
        batch.drop_column("forked_from_step")
        batch.drop_column("forked_from_run")
