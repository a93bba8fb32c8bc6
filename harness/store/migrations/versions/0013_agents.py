"""The agent catalog: which agents each worker carries (harness.catalog).

One row per (worker, agent), written when a worker starts and refreshed
while it lives; a clean stop deletes the worker's rows. ``harness start``
and ``POST /api/runs`` accept an agent a live worker carries even where its
code cannot be imported; ``harness agents`` and ``GET /api/agents`` list it.

Revision ID: 0013
Revises: 0012
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"


def upgrade() -> None:
    op.create_table(
        "harness_agents",
        sa.Column("worker", sa.String(200), primary_key=True),
        sa.Column("agent", sa.String(200), primary_key=True),
        sa.Column("definition_hash", sa.String(80), nullable=False),
        sa.Column("tools", sa.Text, nullable=False),
        sa.Column("started_at", sa.Float, nullable=False),
        sa.Column("last_seen", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("harness_agents")
