"""Durable counters, and an index for the stuck-RUNNING-step alert.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"


def upgrade() -> None:
    op.create_table(
        "harness_counters",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("value", sa.Integer, nullable=False),
    )
    op.create_index("ix_harness_steps_running", "harness_steps", ["status", "started_at"])


def downgrade() -> None:
    op.drop_index("ix_harness_steps_running", "harness_steps")
    op.drop_table("harness_counters")
