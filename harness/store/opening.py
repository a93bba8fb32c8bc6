"""The run store the settings name, opened as every process opens it.

One function for the composition roots (the library's runtime, a worker's
sweep watch): the blob folder checked, the connection pool sized, and the
embedded SQLite default migrated on first use (PostgreSQL's revision only
checked: it is migrated by ``harness migrate``).
"""

from __future__ import annotations

import logging

from harness.settings import Settings
from harness.store.blobs import BlobStore
from harness.store.migrate import ensure_current
from harness.store.sql import SQLStore

log = logging.getLogger(__name__)


def open_store(settings: Settings, pool_size: int | None = None) -> SQLStore:
    """The configured store, migrated if it is the embedded SQLite default.
    ``pool_size``: connections kept for steps (``HARNESS_DB_POOL_SIZE``
    overrides it; None: the store's default)."""
    blobs = BlobStore(settings.blob_threshold, settings.blob_dir)
    blobs.check()
    store = SQLStore.from_url(settings.database_url, settings.db_pool_size or pool_size, blobs)
    ensure_current(store.engine, auto=store.dialect == "sqlite")
    size = getattr(store.engine.pool, "size", None)
    if callable(size):
        log.info("run store: a pool of %d database connections for steps", size())
    return store
