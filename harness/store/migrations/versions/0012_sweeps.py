"""Sweeps: every sweep recorded, and the lease of a worker that sweeps for beat.

``harness_sweeps`` holds the newest sweeps (and the newest of each kind),
whoever ran them: beat, ``harness sweep``, ``tasks.sweep``, or a worker that
took the sweep over because no beat swept (harness.worker.takeover). Health,
stats and metrics report the last one's age; a run whose lease lapsed with
no sweep since is called out. ``harness_sweep_lease`` is the one row those
workers take by compare-and-set, so that exactly one sweeps at a time.

Revision ID: 0012
Revises: 0011
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"


def upgrade() -> None:
    op.create_table(
        "harness_sweeps",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("worker", sa.String(200), nullable=False),
        sa.Column("started_at", sa.Float, nullable=False),
        sa.Column("finished_at", sa.Float, nullable=False),
        sa.Column("redispatched", sa.Integer, nullable=False),
    )
    op.create_table(
        "harness_sweep_lease",
        sa.Column("name", sa.String(32), primary_key=True),
        sa.Column("holder", sa.String(200)),
        sa.Column("expires_at", sa.Float),
    )


def downgrade() -> None:
    op.drop_table("harness_sweep_lease")
    op.drop_table("harness_sweeps")
