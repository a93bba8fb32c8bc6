"""A fence for what is kept once (issue 26): no change to the tables, a new
revision so that code from before refuses the store.

Since this revision a tool step's idempotency record written by the step's
result checkpoint may hold no text of its own (``result_blob`` is
``'step'``, schema.SAME_AS_STEP: the step's result is the value), and a
user's message taken by its ``user`` step may have NULL ``data`` (the text
is the step's arguments). Code at 0019 reads the first as a blob named
``step`` (StoreError "blob step is missing") and exports the second as null
(the user's text lost). Its revision check (harness.store.migrate) makes
every worker and CLI at 0019 refuse a store at 0020: "revision 0020, not
0019; run `harness migrate`". A worker already running checks only as it
starts: stop the old ones before migrating (docs/RELIABILITY.md).

The downgrade writes the second copies back, so that 0019 (and every
revision before it, 0009's downgrade included) reads the rows as its own:
each record naming its step gets the step's ``result`` and ``result_blob``,
each message without data its step's arguments. A record whose step holds
no result (an outside edit: a partial restore, a hand-edited row) cannot
be given one; the downgrade refuses while one is left, naming how many,
before it changes anything. Stop the workers before downgrading: a record
written meanwhile could name its step again.

Revision ID: 0020
Revises: 0019
"""

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"

#: schema.SAME_AS_STEP, spelled here: a migration does not change with the code.
SAME_AS_STEP = "step"

_STEP_OF_RECORD = (
    "FROM harness_steps s WHERE s.run_id = harness_tool_results.run_id "
    "AND s.idx = harness_tool_results.step_index"
)
_USER_STEP_OF_SIGNAL = (
    "FROM harness_steps s WHERE s.run_id = harness_signals.run_id "
    "AND s.idx = harness_signals.taken_step AND s.kind = 'user'"
)


def upgrade() -> None:
    """Nothing to change: the revision itself is the fence."""


def downgrade() -> None:
    # Checked first: the harness's engines autocommit each statement, so a
    # refusal after an UPDATE would leave it done. Each UPDATE is one
    # statement; a downgrade cut off between them can be run again.
    conn = op.get_bind()
    marker = {"marker": SAME_AS_STEP}
    left = conn.execute(
        sa.text(
            "SELECT count(*) FROM harness_tool_results WHERE result_blob = :marker "
            f"AND NOT EXISTS (SELECT 1 {_STEP_OF_RECORD} "
            "AND (s.result IS NOT NULL OR s.result_blob IS NOT NULL))"
        ),
        marker,
    ).scalar_one()
    if left:
        raise RuntimeError(
            f"{left} row(s) of harness_tool_results name their step's result, and the step "
            "holds none (its row was edited or restored apart from the record): the schema "
            "before 0020 cannot read them; restore those steps' rows, or prune those runs"
        )
    conn.execute(
        sa.text(
            f"UPDATE harness_tool_results SET result = (SELECT s.result {_STEP_OF_RECORD}), "
            f"result_blob = (SELECT s.result_blob {_STEP_OF_RECORD}) "
            "WHERE result_blob = :marker"
        ),
        marker,
    )
    conn.execute(
        sa.text(
            f"UPDATE harness_signals SET data = (SELECT s.args {_USER_STEP_OF_SIGNAL}) "
            "WHERE data IS NULL AND taken_step IS NOT NULL "
            f"AND EXISTS (SELECT 1 {_USER_STEP_OF_SIGNAL})"
        )
    )
