"""Statements of :mod:`harness.store.blobs`: results too large for their
rows, kept in a table of their own (or as files it names)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql import Delete, Insert, Select

from harness.store.schema.tables import blobs


def select_blobs(run_id: str, digests: list[str]) -> Select[Any]:
    """Some of a run's blobs, (digest, data), on the primary key; data NULL: a file."""
    return select(blobs.c.digest, blobs.c.data).where(
        blobs.c.run_id == run_id, blobs.c.digest.in_(digests)
    )


def insert_blobs_if_absent(dialect: str) -> Insert:
    """A run's blobs; one it has already (the same text: a blob is named by its
    hash) is kept."""
    dialect_insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    return dialect_insert(blobs).on_conflict_do_nothing()


def delete_run_blobs(run_ids: list[str]) -> Delete:
    """The blobs of these (deleted) runs, on the primary key's prefix."""
    return blobs.delete().where(blobs.c.run_id.in_(run_ids))


def select_blob_files() -> Select[Any]:
    """(run_id, digest) of every blob kept as a file."""
    return select(blobs.c.run_id, blobs.c.digest).where(blobs.c.data.is_(None))
