"""Tokens and cost per run, transient model retries per step.

``input_tokens``, ``output_tokens`` and ``cost_usd`` on a run are the sums of
what its model steps' providers reported, added by each model step's result
checkpoint (so a budget check reads one row). ``retries`` on a step counts
the transient provider failures (429, 5xx, timeouts) it has been retried
after; they are not interruptions, so ``attempts`` does not count them.

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"


def upgrade() -> None:
    with op.batch_alter_table("harness_runs") as batch:
        batch.add_column(sa.Column("input_tokens", sa.Integer, nullable=False, server_default="0"))
        batch.add_column(sa.Column("output_tokens", sa.Integer, nullable=False, server_default="0"))
        batch.add_column(sa.Column("cost_usd", sa.Float, nullable=False, server_default="0"))
    with op.batch_alter_table("harness_steps") as batch:
        batch.add_column(sa.Column("retries", sa.Integer, nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("harness_steps") as batch:
        batch.drop_column("retries")
    with op.batch_alter_table("harness_runs") as batch:
        batch.drop_column("cost_usd")
        batch.drop_column("output_tokens")
        batch.drop_column("input_tokens")
