"""Replays: a run that re-runs another run's recording with another agent.

``replay_of_run`` names the recorded run whose tool calls a replay is served
from; ``replay_live_reads`` says whether a call that diverges from the
recording may still be made when its tool is ``read_only`` (``harness replay
--live-read-only``). Both are null / false for a run that is not a replay,
and neither changes after insert, so the index keeps checkpoints heap-only.

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"


def upgrade() -> None:
    with op.batch_alter_table("harness_runs") as batch:
        batch.add_column(sa.Column("replay_of_run", sa.String(128)))
        batch.add_column(
            sa.Column("replay_live_reads", sa.Boolean, nullable=False, server_default=sa.false())
        )
    op.create_index("ix_harness_runs_replay_of", "harness_runs", ["replay_of_run"])


def downgrade() -> None:
    op.drop_index("ix_harness_runs_replay_of", "harness_runs")
    with op.batch_alter_table("harness_runs") as batch:
        batch.drop_column("replay_live_reads")
        batch.drop_column("replay_of_run")
