"""Streams: the pieces of model answers as they are written, for the API's
event stream where there is no Redis (``harness_stream``, harness.streams).

Revision ID: 0016
Revises: 0015
"""

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"


def upgrade() -> None:
    op.create_table(
        "harness_stream",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True),
        sa.Column("run_id", sa.String(128), nullable=False),
        sa.Column("entry", sa.Text, nullable=False),
        sa.Column("at", sa.Float, nullable=False),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_harness_stream_run", "harness_stream", ["run_id", "id"])
    op.create_index("ix_harness_stream_at", "harness_stream", ["at"])


def downgrade() -> None:
    op.drop_index("ix_harness_stream_at", "harness_stream")
    op.drop_index("ix_harness_stream_run", "harness_stream")
    op.drop_table("harness_stream")
