"""Operator control: budgets raised per run, pause requests, approvals.

``max_tokens`` and ``max_cost_usd`` on a run override its agent's budgets
(`harness resume --max-tokens`); ``pause_requested`` asks it to stop at its
next step boundary; ``approval`` on a step holds an operator's word on a call
that requires one. A step may now be ``awaiting_approval`` (17 characters),
so step and event statuses widen to 32.

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"


def upgrade() -> None:
    with op.batch_alter_table("harness_runs") as batch:
        batch.add_column(sa.Column("max_tokens", sa.Integer))
        batch.add_column(sa.Column("max_cost_usd", sa.Float))
        batch.add_column(
            sa.Column("pause_requested", sa.Boolean, nullable=False, server_default=sa.false())
        )
    with op.batch_alter_table("harness_steps") as batch:
        batch.add_column(sa.Column("approval", sa.Text))
        batch.alter_column(
            "status", type_=sa.String(32), existing_type=sa.String(16), existing_nullable=False
        )
    with op.batch_alter_table("harness_events") as batch:
        batch.alter_column("from_status", type_=sa.String(32), existing_type=sa.String(16))


def downgrade() -> None:
    with op.batch_alter_table("harness_events") as batch:
        batch.alter_column("from_status", type_=sa.String(16), existing_type=sa.String(32))
    with op.batch_alter_table("harness_steps") as batch:
        batch.alter_column(
            "status", type_=sa.String(16), existing_type=sa.String(32), existing_nullable=False
        )
        batch.drop_column("approval")
    with op.batch_alter_table("harness_runs") as batch:
        batch.drop_column("pause_requested")
        batch.drop_column("max_cost_usd")
        batch.drop_column("max_tokens")
