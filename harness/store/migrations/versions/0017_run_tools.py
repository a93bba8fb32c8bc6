"""Run tools: the tools each run was offered by its toolsets (MCP servers),
recorded when a worker first carries it (``harness_run_tools``, harness.toolsets).

Revision ID: 0017
Revises: 0016
"""

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"


def upgrade() -> None:
    op.create_table(
        "harness_run_tools",
        sa.Column("run_id", sa.String(128), primary_key=True),
        sa.Column("tools", sa.Text, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("harness_run_tools")
