"""The hot statements keep SQLAlchemy's execution contract, on every backend.

``load()`` and PostgreSQL's one-statement ``checkpoint()`` skip Core's
statement compilation; they must still look like any other execution to
instrumentation: cursor events with a real connection and execution context
(as OpenTelemetry's SQLAlchemy instrumentation needs), and echo logging.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import Connection, event
from sqlalchemy.engine import ExecutionContext

from harness.records import Run
from harness.store import Checkpoint, RunPatch
from harness.store.sql import SQLStore
from tests.rig import insert_run


def renewal(run: Run, version: int) -> Checkpoint:
    now = time.time()
    return Checkpoint(
        run.run_id, version, "w1", now, run=RunPatch(owner="w1", lease_expires_at=now + 15)
    )


@contextmanager
def cursor_events(store: SQLStore) -> Iterator[list[tuple[str, Any, Any, str]]]:
    """(event, connection, context, statement) of each cursor event, in order.
    The listeners use the context as OpenTelemetry does: a span set before
    the statement, read after it."""
    seen: list[tuple[str, Any, Any, str]] = []

    def before(conn: Any, _cursor: Any, statement: str, _p: Any, context: Any, _m: bool) -> None:
        seen.append(("before", conn, context, statement))
        context._test_span = statement

    def after(conn: Any, _cursor: Any, statement: str, _p: Any, context: Any, _m: bool) -> None:
        seen.append(("after", conn, context, statement))
        assert context._test_span == statement

    event.listen(store.engine, "before_cursor_execute", before)
    event.listen(store.engine, "after_cursor_execute", after)
    try:
        yield seen
    finally:
        event.remove(store.engine, "before_cursor_execute", before)
        event.remove(store.engine, "after_cursor_execute", after)


def assert_paired_with_a_real_connection(seen: list[tuple[str, Any, Any, str]]) -> None:
    assert seen, "no cursor event fired"
    befores = [(conn, ctx, sql) for kind, conn, ctx, sql in seen if kind == "before"]
    afters = [(conn, ctx, sql) for kind, conn, ctx, sql in seen if kind == "after"]
    assert befores == afters
    for conn, context, _sql in befores:
        assert isinstance(conn, Connection)
        assert isinstance(context, ExecutionContext)
        assert context.root_connection is conn


def test_load_fires_both_cursor_events_with_a_real_connection(sql_store: SQLStore) -> None:
    run = insert_run(sql_store, "r1")
    with cursor_events(sql_store) as seen:
        assert sql_store.load("r1") == run
    assert_paired_with_a_real_connection(seen)
    assert [kind for kind, *_ in seen] == ["before", "after"]  # one round trip


def test_checkpoint_fires_both_cursor_events_with_a_real_connection(sql_store: SQLStore) -> None:
    run = insert_run(sql_store, "r1")
    with cursor_events(sql_store) as seen:
        assert sql_store.checkpoint(renewal(run, 0)) == 1
    assert_paired_with_a_real_connection(seen)
    assert sql_store.load("r1").owner == "w1"


def test_heartbeat_store_statements_reach_its_own_engine_listeners(sql_store: SQLStore) -> None:
    run = insert_run(sql_store, "r1")
    heartbeat = sql_store.heartbeat_store()
    with cursor_events(heartbeat) as seen:
        heartbeat.checkpoint(renewal(run, 0))
    assert_paired_with_a_real_connection(seen)


def test_echo_logging_sees_the_hot_statements(
    sql_store: SQLStore, caplog: pytest.LogCaptureFixture
) -> None:
    run = insert_run(sql_store, "r1")
    with cursor_events(sql_store) as seen:
        sql_store.load("r1")
        sql_store.checkpoint(renewal(run, 0))
    statements = {sql for kind, _conn, _ctx, sql in seen if kind == "before"}

    caplog.set_level(logging.INFO, logger="sqlalchemy.engine")
    sql_store.load("r1")
    sql_store.checkpoint(renewal(run, 1))
    logged = {r.getMessage() for r in caplog.records if r.name.startswith("sqlalchemy.engine")}
    assert statements <= logged


def test_load_is_never_a_prepared_statement_on_postgresql(postgres_url: str) -> None:
    """psycopg prepares a statement on its fifth run; the load must stay
    unprepared (its generic plan goes bad as a run grows), the checkpoint not."""
    store = SQLStore.from_url(postgres_url)
    try:
        run = insert_run(store, "r1")
        with cursor_events(store) as seen:
            for version in range(8):
                store.load("r1")
                store.checkpoint(renewal(run, version))
        load_sql = seen[0][3]
        checkpoint_sql = seen[2][3]
        assert store.engine.pool.checkedin() == 1  # one connection served them all
        with store.engine.connect() as conn:
            prepared = list(
                conn.exec_driver_sql("SELECT statement FROM pg_prepared_statements").scalars()
            )
    finally:
        store.close()
    assert not any(_same(p, load_sql) for p in prepared)
    assert any(_same(p, checkpoint_sql) for p in prepared)


def test_a_load_at_a_known_cursor_is_prepared_and_its_generic_plan_uses_both_keys(
    postgres_url: str,
) -> None:
    """A step message's load binds the step's index, so its plan, generic or
    not, finds the step by the whole primary key: nothing for the plan to
    get wrong as a run grows, and so it may be prepared."""
    store = SQLStore.from_url(postgres_url)
    try:
        insert_run(store, "r1")
        with cursor_events(store) as seen:
            for _ in range(8):
                store.load("r1", at=0)
        load_sql = seen[0][3]
        with store.engine.connect() as conn:
            rows = conn.exec_driver_sql("SELECT statement FROM pg_prepared_statements").scalars()
            (prepared,) = [p for p in rows if _same(p, load_sql)]
            conn.exec_driver_sql("SET plan_cache_mode = force_generic_plan")
            conn.exec_driver_sql(f"PREPARE load_at AS {prepared}")
            arguments = "0, 'r1'" if "idx = $1" in prepared else "'r1', 0"
            plan = "\n".join(
                conn.exec_driver_sql(f"EXPLAIN EXECUTE load_at({arguments})").scalars()
            )
            conn.exec_driver_sql("DEALLOCATE load_at")
            conn.exec_driver_sql("RESET plan_cache_mode")
    finally:
        store.close()
    steps_scan = plan.split("harness_steps_pkey on harness_steps", 1)[1].split("->", 1)[0]
    assert re.search(r"run_id\)::text = .* AND \(idx = \(?\$\d", steps_scan), plan


def _same(prepared: str, sql: str) -> bool:
    """psycopg sends ``%(name)s`` placeholders as ``$n``: compare the rest."""
    return prepared.split("$", 1)[0] == sql.split("%(", 1)[0]
