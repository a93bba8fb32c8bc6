"""Runs, steps, the event log and durable tool results.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None


def upgrade() -> None:
    op.create_table(
        "harness_runs",
        sa.Column("run_id", sa.String(128), primary_key=True),
        sa.Column("agent", sa.String(200), nullable=False),
        sa.Column("goal", sa.Text, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("cursor", sa.Integer, nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("step_count", sa.Integer, nullable=False),
        sa.Column("owner", sa.String(200)),
        sa.Column("lease_expires_at", sa.Float),
        sa.Column("wake_at", sa.Float),
        sa.Column("result", sa.Text),
        sa.Column("error", sa.Text),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )
    op.create_index("ix_harness_runs_due", "harness_runs", ["status", "wake_at"])
    op.create_table(
        "harness_steps",
        sa.Column("run_id", sa.String(128), primary_key=True),
        sa.Column("idx", sa.Integer, primary_key=True),
        sa.Column("kind", sa.String(8), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("tool", sa.String(200)),
        sa.Column("args", sa.Text, nullable=False),
        sa.Column("result", sa.Text),
        sa.Column("error", sa.Text),
        sa.Column("started_at", sa.Float),
        sa.Column("finished_at", sa.Float),
    )
    op.create_table(
        "harness_events",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.String(128), nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("step_index", sa.Integer),
        sa.Column("from_status", sa.String(16)),
        sa.Column("to_status", sa.String(32), nullable=False),
        sa.Column("worker", sa.String(200)),
        sa.Column("at", sa.Float, nullable=False),
        sa.Column("detail", sa.Text),
    )
    op.create_index("ix_harness_events_run", "harness_events", ["run_id", "id"])
    op.create_table(
        "harness_tool_results",
        sa.Column("key", sa.String(200), primary_key=True),
        sa.Column("run_id", sa.String(128), nullable=False),
        sa.Column("step_index", sa.Integer, nullable=False),
        sa.Column("tool", sa.String(200), nullable=False),
        sa.Column("result", sa.Text, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    for table in ("harness_tool_results", "harness_events", "harness_steps", "harness_runs"):
        op.drop_table(table)
