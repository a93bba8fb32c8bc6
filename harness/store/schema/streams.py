"""The stream table's statements (harness.store.protocols.Streams)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Delete, Insert, Select, delete, insert, select

from harness.store.schema.tables import stream


def insert_stream() -> Insert:
    """Append entries: executed with a list of rows (run_id, entry, at)."""
    return insert(stream)


def select_stream_after(run_id: str, after: int, limit: int) -> Select[Any]:
    """The run's entries with an id above ``after``, oldest first (by the
    index on (run_id, id))."""
    return (
        select(stream.c.id, stream.c.entry)
        .where(stream.c.run_id == run_id, stream.c.id > after)
        .order_by(stream.c.id)
        .limit(limit)
    )


def trim_stream(before: float) -> Delete:
    """Forget the entries written before ``before`` (by the index on ``at``)."""
    return delete(stream).where(stream.c.at < before)


def delete_run_stream(run_ids: list[str]) -> Delete:
    """Forget the entries of these (deleted) runs."""
    return delete(stream).where(stream.c.run_id.in_(run_ids))
