"""Blobs: results too large for their rows, stored beside them.

``harness_blobs`` holds a run's large results keyed (run_id, digest), the
text in ``data``, or NULL when it is a file in ``HARNESS_BLOB_DIR``. A step
or an idempotency record whose result is a blob has ``result`` NULL and
``result_blob`` naming it, so ``harness_tool_results.result`` becomes
nullable (harness.store.blobs).

The downgrade puts every blob kept in the table back into its rows; it
refuses while a row names a blob kept as a file, which the old schema could
not read.

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"

_TABLES = ("harness_steps", "harness_tool_results")


def upgrade() -> None:
    op.create_table(
        "harness_blobs",
        sa.Column("run_id", sa.String(128), primary_key=True),
        sa.Column("digest", sa.String(80), primary_key=True),
        sa.Column("size", sa.Integer, nullable=False),
        sa.Column("data", sa.Text),
    )
    with op.batch_alter_table("harness_steps") as batch:
        batch.add_column(sa.Column("result_blob", sa.String(80)))
    with op.batch_alter_table("harness_tool_results") as batch:
        batch.add_column(sa.Column("result_blob", sa.String(80)))
        batch.alter_column("result", existing_type=sa.Text, nullable=True)


def downgrade() -> None:
    conn = op.get_bind()
    for table in _TABLES:
        conn.execute(
            sa.text(
                f"UPDATE {table} SET result = (SELECT b.data FROM harness_blobs b "
                f"WHERE b.run_id = {table}.run_id AND b.digest = {table}.result_blob), "
                "result_blob = NULL WHERE result_blob IS NOT NULL AND EXISTS "
                f"(SELECT 1 FROM harness_blobs b WHERE b.run_id = {table}.run_id "
                f"AND b.digest = {table}.result_blob AND b.data IS NOT NULL)"
            )
        )
        left = conn.execute(
            sa.text(f"SELECT count(*) FROM {table} WHERE result_blob IS NOT NULL")
        ).scalar_one()
        if left:
            raise RuntimeError(
                f"{left} row(s) of {table} name a blob kept as a file in HARNESS_BLOB_DIR "
                "(or a missing one): the schema before 0009 cannot hold them; prune those "
                "runs or export them first"
            )
    with op.batch_alter_table("harness_tool_results") as batch:
        batch.alter_column("result", existing_type=sa.Text, nullable=False)
        batch.drop_column("result_blob")
    with op.batch_alter_table("harness_steps") as batch:
        batch.drop_column("result_blob")
    op.drop_table("harness_blobs")
