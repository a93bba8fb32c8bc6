"""Engines for the run store: SQLite (embedded) and PostgreSQL, and their pools.

SQLite runs in WAL mode with a busy timeout, and write transactions start
with ``BEGIN IMMEDIATE`` so two writers queue instead of deadlocking on a
lock upgrade. PostgreSQL uses psycopg 3 without pre-ping, which would cost a
round trip per operation: after a database restart, the first operation on a
dead connection fails with :class:`StoreError`, SQLAlchemy invalidates the
pool, and the caller's retry (the step task retries on StoreError) connects
afresh.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event, exc
from sqlalchemy.engine import URL, ExecutionContext, make_url

from harness.errors import ConfigError
from harness.urls import shown_url

#: Execution option: a write transaction (``BEGIN IMMEDIATE`` on SQLite).
WRITE = "harness_write"
#: Execution option: run the statement unprepared on PostgreSQL (planned each time).
PLAN_EACH_TIME = "harness_plan_each_time"
UNPREPARED = {PLAN_EACH_TIME: True}


#: (kept, overflow) connections when no pool size is given: the CLI, the API.
DEFAULT_POOL = (2, 4)
#: The heartbeat engine's pool: the process's one heartbeat thread, and a spare.
HEARTBEAT_POOL = (1, 1)


def pool_limits(pool_size: int | None) -> tuple[int, int]:
    """(kept, overflow) for a pool used by ``pool_size`` threads at once: one
    connection each, kept open, and a few more opened only for an occasional
    extra user (the sweeper, an operation run in the worker's process)."""
    if pool_size is None:
        return DEFAULT_POOL
    if pool_size < 1:
        raise ConfigError(f"pool size must be positive, not {pool_size}")
    return pool_size, max(2, pool_size // 4)


def make_engine(
    url: str | URL, pool_size: int | None = None, *, max_overflow: int | None = None
) -> Engine:
    """An engine for ``url`` with the harness's connection settings.

    ``pool_size``: how many threads use the engine at once (see
    :func:`pool_limits`); ``max_overflow`` overrides the derived overflow.
    """
    kept, overflow = pool_limits(pool_size)
    overflow = overflow if max_overflow is None else max_overflow
    try:
        parsed = make_url(url)
    except (exc.ArgumentError, ValueError) as err:
        raise ConfigError(f"malformed database URL {shown_url(str(url))!r}: {err}") from None
    if parsed.get_backend_name() == "postgres":  # Heroku's and libpq's spelling
        raise ConfigError(
            f"unusable database URL {parsed.render_as_string(hide_password=True)!r}: "
            "use postgresql:// (SQLAlchemy does not know postgres://)"
        )
    try:
        if parsed.get_backend_name() == "sqlite":
            pool = {} if pool_size is None or in_memory(parsed) else _pool(kept, overflow)
            return _sqlite_engine(parsed, pool)
        if parsed.get_backend_name() == "postgresql" and parsed.drivername == "postgresql":
            parsed = parsed.set(drivername="postgresql+psycopg")
        engine = create_engine(
            parsed,
            isolation_level="AUTOCOMMIT",
            **_pool(kept, overflow),
            connect_args={
                "connect_timeout": 10,
                # A frozen process holding a row lock must not stall every other
                # worker and the sweeper: give up on the lock, and on an idle
                # transaction, and notice dead peers.
                "options": "-c lock_timeout=5000 -c idle_in_transaction_session_timeout=60000",
                "keepalives": 1,
                "keepalives_idle": 10,
                "keepalives_interval": 5,
                "keepalives_count": 3,
            },
        )
    except (exc.ArgumentError, exc.NoSuchModuleError, ImportError) as err:
        shown = parsed.render_as_string(hide_password=True)
        raise ConfigError(f"unusable database URL {shown!r}: {err}") from None
    if engine.dialect.driver == "psycopg":
        event.listen(engine, "do_execute", _execute_unprepared)
        _cache_checkpoint_statements()
    return engine


def _pool(kept: int, overflow: int) -> dict[str, Any]:
    return {"pool_size": kept, "max_overflow": overflow, "pool_timeout": 10}


def in_memory(url: URL) -> bool:
    """An in-memory SQLite database: one per connection pool, so never a second engine."""
    return url.database in (None, "", ":memory:") or url.query.get("mode") == "memory"


def _execute_unprepared(
    cursor: Any, statement: str, parameters: Any, context: ExecutionContext
) -> bool:
    """psycopg: honour :data:`PLAN_EACH_TIME` (psycopg prepares a statement
    after its fifth run otherwise); False lets the dialect execute as usual."""
    if not context.execution_options.get(PLAN_EACH_TIME):
        return False
    cursor.execute(statement, parameters, prepare=False)
    return True


def _sqlite_engine(url: URL, pool: dict[str, Any]) -> Engine:
    engine = create_engine(url, connect_args={"timeout": 30}, **pool)

    @event.listens_for(engine, "connect")
    def _connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # the harness issues BEGIN itself
        cursor = dbapi_conn.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        if conn.get_execution_options().get(WRITE):
            conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


#: psycopg converts a statement's ``%(name)s`` placeholders on every execution
#: unless the statement is at most 4 KB with at most 50 parameters; above that it
#: assumes a one-off (a generated many-row INSERT) and does not cache it. A
#: checkpoint's one statement is one of a few fixed shapes of about 5 KB and 60
#: parameters, more with several new steps, so it was converted anew each time:
#: 0.3 ms of CPU a checkpoint on the development machine, about a tenth of a
#: step's CPU. These limits (bytes, parameters) keep shapes of up to a dozen new
#: steps in psycopg's own cache of 128 statements: about 30 KB an entry, so a
#: few MB a process. They hold for every psycopg user of the process, whose
#: long statements may then take cache entries too. Private psycopg API: if it
#: changes, nothing breaks and tests/contract/test_step_writes.py fails.
PSYCOPG_CACHED_STATEMENT = (16 * 1024, 200)


def _cache_checkpoint_statements() -> None:
    from psycopg import _queries

    for name, limit in zip(
        ("MAX_CACHED_STATEMENT_LENGTH", "MAX_CACHED_STATEMENT_PARAMS"),
        PSYCOPG_CACHED_STATEMENT,
        strict=True,
    ):
        current = getattr(_queries, name, None)
        if isinstance(current, int) and current < limit:
            setattr(_queries, name, limit)
