"""Delivery probes: one row per queue lane (harness.engine.probes).

``probe_sent_at``: when the sweeper last sent a probe down the lane;
``delivered_before``: the newest probe a worker took off it, before which
every message sent down the lane has been delivered. The sweeper re-sends
an overdue run only if its message was sent before that.

Revision ID: 0010
Revises: 0009
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"


def upgrade() -> None:
    op.create_table(
        "harness_lanes",
        sa.Column("lane", sa.String(32), primary_key=True),
        sa.Column("probe_sent_at", sa.Float),
        sa.Column("delivered_before", sa.Float),
    )


def downgrade() -> None:
    op.drop_table("harness_lanes")
