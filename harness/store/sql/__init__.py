"""The run store on SQLAlchemy Core: SQLite (embedded) and PostgreSQL.

Reads run outside a transaction (one round trip); every write is one
transaction. SQLite runs in WAL mode and its writes begin with ``BEGIN
IMMEDIATE``; PostgreSQL runs without pre-ping: after a restart the first
operation on a dead connection fails with :class:`StoreError` and the
caller's retry connects afresh (see :mod:`~harness.store.sql.engine`).

Pools: the store's pool keeps one connection per thread that uses it at once
(``pool_size``: under the threads pool, the worker's concurrency up to
``harness.api.STEP_CONNECTIONS``), and lease renewals go through
:meth:`SQLStore.heartbeat_store`, a view on an engine of their own, so a
renewal never queues behind step threads for a connection.

- :mod:`~harness.store.sql.engine`: engines, pools, dialect set-up.
- :mod:`~harness.store.sql.statements`: hot statements compiled once.
- :mod:`~harness.store.sql.base`: connections, the heartbeat store, errors.
- :mod:`~harness.store.sql.rows`: rows as this store writes them (blobs).
- The store's parts, one mixin per part of :mod:`harness.store.protocols`:
  :mod:`~harness.store.sql.runs` (RunStore), :mod:`~harness.store.sql.notes`
  (RunNotes), :mod:`~harness.store.sql.upkeep` (ToolRecords, Lanes, Sweeps,
  Stats, Catalog), :mod:`~harness.store.sql.retention` (Retention),
  :mod:`~harness.store.sql.archives` (Archives),
  :mod:`~harness.store.sql.streams` (Streams),
  :mod:`~harness.store.sql.offered` (OfferedTools).

The statements themselves are in :mod:`harness.store.schema`.
"""

from __future__ import annotations

from harness.store import Store
from harness.store.sql.archives import SQLArchives
from harness.store.sql.engine import (
    DEFAULT_POOL,
    HEARTBEAT_POOL,
    PSYCOPG_CACHED_STATEMENT,
    make_engine,
    pool_limits,
)
from harness.store.sql.notes import SQLNotes
from harness.store.sql.offered import SQLOfferedTools
from harness.store.sql.retention import SQLRetention
from harness.store.sql.streams import SQLStreams
from harness.store.sql.upkeep import SQLCatalog, SQLLanes, SQLStats, SQLSweeps, SQLToolRecords
from harness.store.sql.waits import SQLWaits

__all__ = [
    "DEFAULT_POOL",
    "HEARTBEAT_POOL",
    "PSYCOPG_CACHED_STATEMENT",
    "SQLStore",
    "make_engine",
    "pool_limits",
]


class SQLStore(
    SQLStreams,
    SQLWaits,
    SQLArchives,
    SQLNotes,
    SQLToolRecords,
    SQLLanes,
    SQLSweeps,
    SQLStats,
    SQLRetention,
    SQLCatalog,
    SQLOfferedTools,
):
    """:class:`harness.store.Store` on a SQLAlchemy engine."""


#: Held by mypy: an SQLStore is a Store, every method of the protocol alike.
STORE: type[Store] = SQLStore
