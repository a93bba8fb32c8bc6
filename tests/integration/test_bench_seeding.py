"""What ``make bench`` leans on and a change to the harness can break
unseen: its conversation model reads the request the provider builds, and
its seeding copies a run's rows as they stand in PostgreSQL. Both broke
once, found only 18 minutes into a ``make bench`` run."""

from __future__ import annotations

from sqlalchemy import func, select

from bench import conversation
from bench.common import copy_runs
from harness.engine import conversation as talk
from harness.engine.creation import create_run
from harness.records import RunStatus
from harness.store import schema
from harness.store.sql import SQLStore
from tests.rig import Rig


def test_copies_of_a_conversation_carry_on_like_the_run_they_copy(postgres_url: str) -> None:
    store = SQLStore.from_url(postgres_url)
    try:
        rig = Rig(store)
        rt = rig.runtime()
        run_id = create_run(rt, conversation.AGENT, conversation.GOAL)
        rig.drive()
        original = rig.load(run_id)
        assert original.status is RunStatus.COMPLETED, original.error
        assert original.result == conversation.ANSWER

        copies = [f"{run_id}-copy-{n}" for n in range(2)]
        copy_runs(store.engine, run_id, copies)
        for copy in copies:
            run = rig.load(copy)
            assert (run.status, run.step_count, run.version) == (
                original.status,
                original.step_count,
                original.version,
            )
        with store.engine.connect() as conn:
            keys = conn.execute(
                select(func.count()).where(schema.tool_results.c.key.like(f"{copies[0]}:%"))
            ).scalar_one()
        assert keys > 0  # each copy's idempotency keys renamed with it

        talk.send_message(rt, copies[0], conversation.user_message(2))
        rig.drive()
        carried = rig.load(copies[0])
        assert carried.status is RunStatus.COMPLETED, carried.error
        # The message, the turn asking for a lookup, the lookup, the turn answering.
        assert carried.step_count == original.step_count + 4
        assert rig.load(run_id).step_count == original.step_count  # the original untouched
    finally:
        store.close()
