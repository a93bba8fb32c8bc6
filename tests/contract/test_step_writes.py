"""What a step costs PostgreSQL beyond its round trips (issue 13, item 2).

A run of tool steps goes through the real runner on its own database, so
that the table statistics read afterwards count its writes alone.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
from psycopg import _queries
from sqlalchemy import create_engine, text

import harness
from harness.engine import creation
from harness.records import RunStatus
from harness.store.migrate import upgrade
from harness.store.sql import SQLStore, make_engine
from tests.rig import Rig
from tests.services import POSTGRES_ADMIN_URL, require

CALLS = 40


@harness.tool(effect="idempotent")
def nothing(n: int, ctx: harness.ToolContext) -> int:
    return n


harness.register_agent(
    harness.Agent(
        name="step-writes",
        model=harness.ScriptedModel(
            [{"tool_calls": [{"name": "nothing", "args": {"n": n}}]} for n in range(CALLS)]
            + [{"final": "done"}]
        ),
        tools=[nothing],
        max_steps=2 * CALLS + 1,
    )
)


@pytest.fixture
def own_database() -> Iterator[str]:
    """A migrated database of this test's own, dropped afterwards."""
    require("postgres")
    name = f"harness_step_writes_{os.getpid()}"
    admin = create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = POSTGRES_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    engine = make_engine(url)
    upgrade(engine)
    engine.dispose()
    yield url
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def run_to_the_end(url: str) -> None:
    store = SQLStore.from_url(url)
    try:
        rig = Rig(store)
        rt = rig.runtime()
        creation.create_run(rt, "step-writes", "goal", run_id="r1")
        rig.drive(limit=4 * CALLS)
        assert store.load("r1").status is RunStatus.COMPLETED
    finally:
        store.close()  # its sessions end, and send their statistics


def step_row_updates(url: str, at_least: int) -> tuple[int, int]:
    """(updates, heap-only updates) of harness_steps, once the statistics of
    the closed sessions have arrived (a backend sends them as it exits)."""
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    deadline = time.monotonic() + 30
    try:
        with engine.connect() as conn:
            while True:
                conn.execute(text("SELECT pg_stat_clear_snapshot()"))
                row: Any = conn.execute(
                    text(
                        "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables"
                        " WHERE relname = 'harness_steps'"
                    )
                ).one()
                if row.n_tup_upd >= at_least or time.monotonic() > deadline:
                    return int(row.n_tup_upd), int(row.n_tup_hot_upd)
                time.sleep(0.1)
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_step_rows_are_updated_heap_only(own_database: str) -> None:
    """Every step row is written pending, then done (and RUNNING between, for
    a tool that acts on the world): with no index on a column those updates
    change, and room left in each page, they are heap-only (migration 0011),
    as the run row's are (migration 0003). Before: none of them was."""
    run_to_the_end(own_database)
    # Each tool step: RUNNING, then its result; each model step: its result.
    updates, hot = step_row_updates(own_database, at_least=3 * CALLS + 1)
    assert updates >= 3 * CALLS + 1
    assert hot >= 0.9 * updates, (updates, hot)


@pytest.mark.postgres
def test_checkpoint_statements_are_converted_once(
    own_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """psycopg rewrites a statement's placeholders for the server on each
    execution unless it caches the statement, which by default it does only
    up to 4 KB and 50 parameters: a tool step's checkpoints are larger. The
    store raises both limits (harness.store.sql.PSYCOPG_CACHED_STATEMENT),
    so every execution of a checkpoint after its shape's first is served
    from psycopg's cache, as this checks on the uncached conversion."""
    uncached: list[bytes] = []
    convert = _queries._query2pg_nocache

    def counted(query: bytes, encoding: str) -> Any:
        uncached.append(query)
        return convert(query, encoding)

    monkeypatch.setattr(_queries, "_query2pg_nocache", counted)
    run_to_the_end(own_database)
    assert uncached == []
