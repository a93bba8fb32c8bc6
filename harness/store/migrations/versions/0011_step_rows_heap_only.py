"""Let a step row's updates be HOT updates on PostgreSQL, as the run row's are (0003).

A step row is written three times: inserted pending, then RUNNING, then done.
The index on (status, started_at), which only the running-step alert read,
changed with each of those updates, so none could be heap-only: every one
added entries to both of the table's indexes (measured: 0 of 4,001 step
updates HOT in a 4,001-step run). The alert now finds a running step through
its run (the moving runs, by the runs' status index, and the step at each
one's cursor), and the table leaves room in each page for the new versions.

Revision ID: 0011
Revises: 0010
"""

from alembic import op

revision = "0011"
down_revision = "0010"


def upgrade() -> None:
    op.drop_index("ix_harness_steps_running", "harness_steps")
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE harness_steps SET (fillfactor = 70)")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE harness_steps RESET (fillfactor)")
    op.create_index("ix_harness_steps_running", "harness_steps", ["status", "started_at"])
