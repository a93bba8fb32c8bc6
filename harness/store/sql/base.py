"""What every part of the SQL store stands on: the engine and its heartbeat
twin, the three ways to run work on a connection (a read, a write
transaction, a read-only snapshot), hot statements through the compiled
cache, and database errors turned into :class:`StoreError`.

The parts (:mod:`~harness.store.sql.runs`, ``notes``, ``upkeep``,
``retention``, ``archives``) are mixins of :class:`SQLBase`, one per part of
:mod:`harness.store.protocols`; :class:`harness.store.sql.SQLStore` composes
them.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Hashable, Mapping
from pathlib import Path
from typing import Any, Self, TypeVar

from sqlalchemy import Connection, Engine, Select, exc

from harness.errors import StoreError
from harness.store import schema
from harness.store.blobs import BlobStore
from harness.store.sql.engine import HEARTBEAT_POOL, UNPREPARED, WRITE, in_memory, make_engine
from harness.store.sql.statements import StatementCache, execute_hot

#: The package's logger, as before the store was split into modules.
log = logging.getLogger("harness.store.sql")
T = TypeVar("T")


class SQLBase:
    """The engine, connections and compiled statements every part of the store uses."""

    def __init__(
        self,
        engine: Engine,
        heartbeat_engine: Callable[[], Engine] | None = None,
        blobs: BlobStore | None = None,
    ) -> None:
        """``heartbeat_engine`` makes the engine of :meth:`heartbeat_store`;
        by default one on the same URL with :data:`HEARTBEAT_POOL`. ``blobs``:
        where large results go (harness.store.blobs); by default the table,
        above 64 KiB."""
        self.engine = engine
        self.dialect = engine.dialect.name
        self.blobs = BlobStore() if blobs is None else blobs
        # PostgreSQL connections autocommit (a read or a one-statement checkpoint
        # is one round trip); multi-statement writes ask for a transaction.
        self._transactional = (
            {"isolation_level": "READ COMMITTED"} if self.dialect == "postgresql" else {}
        )
        self._sql_cache = StatementCache()
        if heartbeat_engine is None and not in_memory(engine.url):
            kept, overflow = HEARTBEAT_POOL
            heartbeat_engine = functools.partial(
                make_engine, engine.url, kept, max_overflow=overflow
            )
        self._heartbeat_engine = heartbeat_engine
        self._heartbeat: Self | None = None
        self._heartbeat_lock = threading.Lock()

    @classmethod
    def from_url(
        cls, url: str, pool_size: int | None = None, blobs: BlobStore | None = None
    ) -> Self:
        """A store whose pool serves ``pool_size`` threads at once (None: a couple)."""
        return cls(make_engine(url, pool_size), blobs=blobs)

    def heartbeat_store(self) -> Self:
        """This store on a small engine of its own, made on first use, for lease
        renewals: they never wait for a connection behind step threads. It
        shares the compiled statements; an in-memory SQLite store is itself."""
        with self._heartbeat_lock:
            if self._heartbeat is None:
                if self._heartbeat_engine is None:
                    self._heartbeat = self
                else:
                    view = type(self)(self._heartbeat_engine(), blobs=self.blobs)
                    view._sql_cache = self._sql_cache
                    view._heartbeat = view
                    self._heartbeat = view
            return self._heartbeat

    def _read(self, work: Callable[[Connection], T]) -> T:
        """Run ``work`` outside a transaction: one round trip per statement."""

        def attempt() -> T:
            with self.engine.connect() as conn:
                return work(conn)

        return guarded(attempt)

    def _write(self, work: Callable[[Connection], T]) -> T:
        """Run ``work`` in one transaction (``BEGIN IMMEDIATE`` on SQLite)."""

        def attempt() -> T:
            with self.engine.connect() as conn:
                conn = conn.execution_options(**{WRITE: True, **self._transactional})
                with conn.begin():
                    return work(conn)

        return guarded(attempt)

    def _snapshot(self, work: Callable[[Connection], T]) -> T:
        """Run read-only ``work`` in one transaction over one snapshot of the
        database: REPEATABLE READ on PostgreSQL; on SQLite a deferred BEGIN (a
        WAL reader sees the database as of its first read)."""

        def attempt() -> T:
            with self.engine.connect() as conn:
                if self.dialect == "postgresql":
                    conn = conn.execution_options(isolation_level="REPEATABLE READ")
                with conn.begin():
                    if self.dialect == "sqlite":
                        conn.exec_driver_sql("BEGIN")
                    return work(conn)

        return guarded(attempt)

    def _fetch_one(
        self,
        key: Hashable,
        build: Callable[[], Select[Any]],
        params: dict[str, Any],
        plan_each_time: bool = False,
    ) -> dict[str, Any] | None:
        """The first row of a hot statement, outside a transaction.

        Building and compiling a Core statement, and reading a result's
        metadata, cost more than the round trip itself; so the statement is
        compiled once for this database and run by
        :func:`~harness.store.sql.statements.execute_hot`.
        ``plan_each_time``: not a prepared statement on PostgreSQL, whose
        generic plan, made while the tables were small, can read a run's
        steps one by one (measured: a load 3.5x slower at step 10,000 than
        at step 100).
        """
        text, order, names = self._sql_cache.compiled(key, build, self.engine.dialect)
        bound = params if order is None else tuple(params[name] for name in order)
        options = UNPREPARED if plan_each_time else None

        def fetch(conn: Connection) -> dict[str, Any] | None:
            row = execute_hot(conn, text, bound, options)
            return None if row is None else dict(zip(names, row, strict=True))

        return self._read(fetch)

    def _fetch_all(
        self, key: Hashable, build: Callable[[], Select[Any]], params: dict[str, Any]
    ) -> list[Mapping[Any, Any]]:
        """Every row of a hot statement (as :meth:`_fetch_one`: compiled once,
        run without a Core statement built), outside a transaction, with the
        texts of their results' blobs filled in on the same connection."""
        text, order, names = self._sql_cache.compiled(key, build, self.engine.dialect)
        bound = params if order is None else tuple(params[name] for name in order)

        def fetch(conn: Connection) -> list[Mapping[Any, Any]]:
            found = execute_hot(conn, text, bound, None, every_row=True)
            return self.blobs.fill(conn, [dict(zip(names, row, strict=True)) for row in found])

        return self._read(fetch)

    def _count(self, name: str) -> None:
        """Bump a durable counter; a metric, so a failure here is only logged."""
        try:
            self._write(lambda conn: conn.execute(schema.bump_counter(self.dialect, name)))
        except StoreError as err:
            log.warning("could not count %s: %s", name, err)

    def orphan_blobs(self) -> list[Path]:
        """Files in the blob directory that no blob row names (see
        :meth:`harness.store.blobs.BlobStore.orphans`)."""
        return self._read(self.blobs.orphans)

    def close(self) -> None:
        for engine in self._engines():
            engine.dispose()

    def forget_connections(self) -> None:
        for engine in self._engines():
            engine.dispose(close=False)

    def _engines(self) -> list[Engine]:
        """This store's engine, and its heartbeat store's if one was made."""
        heartbeat = self._heartbeat
        if heartbeat is None or heartbeat is self:
            return [self.engine]
        return [self.engine, heartbeat.engine]


def guarded(attempt: Callable[[], T]) -> T:
    """Run ``attempt``; once more on a fresh connection if the old one was dead
    (a database restart); database failures become :class:`StoreError`.
    ``IntegrityError`` passes through for the caller to interpret."""
    for retry in (True, False):
        try:
            return attempt()
        except exc.IntegrityError:
            raise
        except exc.DBAPIError as err:
            if retry and err.connection_invalidated:
                log.warning("database connection lost (%s); retrying once", describe(err))
                continue
            raise StoreError(describe(err)) from err
        except exc.TimeoutError as err:
            raise StoreError(f"database connection pool exhausted: {err}") from err
    raise AssertionError("unreachable")


def describe(err: exc.DBAPIError) -> str:
    """One line saying what went wrong with the database, without a traceback."""
    text = str(err.orig).strip().splitlines()[0] if err.orig is not None else str(err)
    if "no such table" in text or ("relation" in text and "does not exist" in text):
        return f"the run store is not migrated ({text}); run `harness migrate`"
    return f"database error: {text}"
