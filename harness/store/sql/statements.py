"""Hot statements compiled once per database, and run without SQLAlchemy's
per-execution overhead.

Building and compiling a Core statement, and reading a result's metadata,
cost more than the round trip of a step's load or checkpoint itself; so
:class:`StatementCache` keeps the SQL text of each shape, and
:func:`execute_hot` runs it as SQLAlchemy runs the statements a dialect
issues itself.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from typing import Any

from sqlalchemy import Connection, Dialect, Select
from sqlalchemy.engine import ExecutionContext
from sqlalchemy.sql.compiler import SQLCompiler

#: A statement as compiled: its text, the order of its positional parameters
#: (None: named), and the names of its columns.
Compiled = tuple[str, tuple[str, ...] | None, tuple[str, ...]]


class StatementCache:
    """Compiled statements by key, for one database; shared by a store and
    its heartbeat store, whose engines are on the same database."""

    def __init__(self) -> None:
        self._compiled: dict[Hashable, Compiled] = {}

    def compiled(
        self, key: Hashable, build: Callable[[], Select[Any]], dialect: Dialect
    ) -> Compiled:
        """The statement under ``key``, built and compiled on first use."""
        compiled = self._compiled.get(key)
        if compiled is None:
            statement = build()
            sql = statement.compile(dialect=dialect)
            assert isinstance(sql, SQLCompiler)
            names = tuple(str(c.key) for c in statement.selected_columns)
            positions = None if sql.positiontup is None else tuple(map(str, sql.positiontup))
            compiled = self._compiled[key] = (sql.string, positions, names)
        return compiled


def execute_hot(
    conn: Connection,
    text: str,
    bound: Any,
    options: Mapping[str, Any] | None,
    every_row: bool = False,
) -> Any:
    """The first row of compiled SQL (``every_row``: the list of all its
    rows), run as SQLAlchemy runs the statements a
    dialect issues itself (``Connection._cursor_execute``): a real execution
    context, ``before_cursor_execute``/``after_cursor_execute`` with this
    connection, echo logging, ``do_execute`` hooks, errors wrapped and a dead
    connection invalidated. ``exec_driver_sql`` does the same, and builds a
    result's metadata from the cursor's description besides, which doubled
    the CPU time of a load (measured: 140 us a load, 280 with it). Private
    SQLAlchemy API, pinned in pyproject.toml and held by
    tests/contract/test_instrumentation.py."""
    dialect = conn.dialect
    context: ExecutionContext | None = None
    try:
        context = dialect.execution_ctx_cls._init_statement(
            dialect,
            conn,
            conn.connection,
            conn.get_execution_options().union(options or {}),
            text,
            [bound],
        )
        conn._cursor_execute(context.cursor, text, bound, context)
        return context.cursor.fetchall() if every_row else context.cursor.fetchone()
    except dialect.loaded_dbapi.Error as err:  # opening the cursor, or fetching
        cursor = None if context is None else context.cursor
        conn._handle_dbapi_exception(err, text, bound, cursor, context)
    finally:
        if context is not None:
            context.cursor.close()
