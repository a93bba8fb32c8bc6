"""What is kept once (issue 26) is fenced from the code before it, on each
SQL store: a store written since holds records naming their step's result
(schema.SAME_AS_STEP) and messages whose text is their step's, which code at
revision 0019 misreads (a blob named ``step``; a message lost), so the store
is at 0020 and that code refuses it; the downgrade puts the second copies
back, so every older revision reads its rows as its own; and a record naming
a step that holds no result (an outside edit) is refused by name, not read
as a record without a value."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from sqlalchemy import Engine, select, update

from harness.errors import StoreError
from harness.records import Step, StepKind
from harness.store import migrate, schema
from harness.store.migrate import current_revision, downgrade, ensure_current, upgrade
from harness.store.sql import make_engine
from tests.contract.test_record_growth import converse, said


def rows(engine: Engine, table: Any) -> list[Any]:
    """The table's rows in primary-key order (a downgrade's updates move rows on disk)."""
    with engine.connect() as conn:
        query = select(table).order_by(*table.primary_key.columns)
        return list(conn.execute(query).mappings().all())


def tool_steps(steps: list[Step]) -> list[Step]:
    return [s for s in steps if s.kind is StepKind.TOOL and s.result is not None]


def test_code_before_0020_refuses_a_store_written_since(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, _, _ = converse(database_url, 1)
    try:
        records = rows(store.engine, schema.tool_results)
        assert schema.SAME_AS_STEP in {r["result_blob"] for r in records}
        assert current_revision(store.engine) == migrate.HEAD == "0020"
        # This code as it was at 0019: its revision check refuses the store,
        # migrated (PostgreSQL) or migrating itself (SQLite).
        monkeypatch.setattr(migrate, "HEAD", "0019")
        for auto in (False, True):
            with pytest.raises(StoreError, match="revision 0020, newer than this code's 0019"):
                ensure_current(store.engine, auto=auto)
    finally:
        store.close()


def test_the_downgrade_puts_both_copies_back(database_url: str) -> None:
    store, run_id, _ = converse(database_url, 2)
    done = [s for s in store.steps(run_id) if s.result is not None]
    store.close()
    engine = make_engine(database_url)
    try:
        before = rows(engine, schema.steps)
        downgrade(engine, "0019")
        result = {r["idx"]: (r["result"], r["result_blob"]) for r in before}
        records = rows(engine, schema.tool_results)
        assert len(records) == len(done)
        for record in records:
            assert (record["result"], record["result_blob"]) == result[record["step_index"]]
        args = {r["idx"]: r["args"] for r in before if r["kind"] == StepKind.USER.value}
        kept = rows(engine, schema.signals)
        assert [s["data"] for s in kept] == [json.dumps({"text": said(t)}) for t in (1, 2)]
        assert [args[s["taken_step"]] for s in kept] == [s["data"] for s in kept]
        # Upgraded again, the copies read as before.
        upgrade(engine)
        store = type(store).from_url(database_url)
        try:
            assert [store.get_tool_result(s.idempotency_key) for s in done] == [
                (True, s.result) for s in done
            ]
            signals = store.run_rows(run_id).signals
            assert [s["data"] for s in signals] == [{"text": said(t)} for t in (1, 2)]
        finally:
            store.close()
        # Every revision before reads them as its own: 0009's downgrade
        # (blobs back into rows) no longer takes 'step' for a blob's name.
        downgrade(engine, "0008")
    finally:
        upgrade(engine)
        engine.dispose()


def test_a_record_naming_a_step_that_holds_no_result_is_refused(database_url: str) -> None:
    store, run_id, _ = converse(database_url, 1)
    try:
        step = tool_steps(store.steps(run_id))[-1]
        with store.engine.begin() as conn:
            conn.execute(
                update(schema.steps)
                .where(schema.steps.c.run_id == run_id, schema.steps.c.idx == step.index)
                .values(result=None)  # a partial restore, a hand edit
            )
        key = step.idempotency_key
        named = re.escape(
            f"run {run_id}: idempotency record '{key}' names the result of step {step.index}, "
        )
        with pytest.raises(StoreError, match=named):
            store.get_tool_result(step.idempotency_key)
        with pytest.raises(StoreError, match=named):
            store.tool_records([step.idempotency_key])
        with pytest.raises(StoreError, match=named):
            store.run_rows(run_id)
        # The downgrade cannot give the record a text: it refuses, changing
        # nothing (the other records still name their steps' results).
        records = rows(store.engine, schema.tool_results)
        assert sum(r["result_blob"] == schema.SAME_AS_STEP for r in records) > 1
        with pytest.raises(RuntimeError, match="1 row"):
            downgrade(store.engine, "0019")
        assert current_revision(store.engine) == migrate.HEAD
        assert rows(store.engine, schema.tool_results) == records
    finally:
        upgrade(store.engine)
        store.close()
