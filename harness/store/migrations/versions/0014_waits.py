"""Waiting on the world: deferred steps, signals, child runs.

A step that waits (a deferred call, a sleep, a child run) says what for in
``harness_steps.wait``; a child run names its parent (``parent_run``,
``parent_step``); a run records the first step deferred since its last model
turn (``deferred_from``); signals, and answers that came before their step
deferred, are kept in ``harness_signals`` until a step takes them.

Revision ID: 0014
Revises: 0013
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"


def upgrade() -> None:
    with op.batch_alter_table("harness_runs") as batch:
        batch.add_column(sa.Column("parent_run", sa.String(128)))
        batch.add_column(sa.Column("parent_step", sa.Integer))
        batch.add_column(sa.Column("deferred_from", sa.Integer))
    op.create_index("ix_harness_runs_parent", "harness_runs", ["parent_run"])
    with op.batch_alter_table("harness_steps") as batch:
        batch.add_column(sa.Column("wait", sa.Text))
    op.create_table(
        "harness_signals",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.String(128), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("signal_id", sa.String(200)),
        sa.Column("data", sa.Text),
        sa.Column("error", sa.Text),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("taken_step", sa.Integer),
        sa.Column("taken_at", sa.Float),
    )
    op.create_index("ix_harness_signals_run", "harness_signals", ["run_id", "id"])
    op.create_index(
        "ix_harness_signals_sender_id", "harness_signals", ["run_id", "signal_id"], unique=True
    )


def downgrade() -> None:
    op.drop_table("harness_signals")
    with op.batch_alter_table("harness_steps") as batch:
        batch.drop_column("wait")
    op.drop_index("ix_harness_runs_parent", "harness_runs")
    with op.batch_alter_table("harness_runs") as batch:
        batch.drop_column("deferred_from")
        batch.drop_column("parent_step")
        batch.drop_column("parent_run")
