"""A run's stream on SQL (harness.store.protocols.Streams): the embedded
default's, where no Redis carries it (harness.streams)."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Connection

from harness.store import schema
from harness.store.sql.base import SQLBase
from harness.store.values import StreamEntry


class SQLStreams(SQLBase):
    """The pieces of model answers as they are written, one row each."""

    def append_stream(self, run_id: str, entries: Sequence[StreamEntry], now: float) -> None:
        if not entries:
            return
        rows = [{"run_id": run_id, "entry": e.encode(), "at": now} for e in entries]

        def insert(conn: Connection) -> None:
            conn.execute(schema.insert_stream(), rows)

        self._write(insert)

    def stream_after(
        self, run_id: str, after: int, limit: int = 1000
    ) -> list[tuple[int, StreamEntry]]:
        query = schema.select_stream_after(run_id, after, limit)
        rows = self._read(lambda conn: conn.execute(query).all())
        return [(int(i), StreamEntry.decode(e)) for i, e in rows]

    def trim_streams(self, before: float) -> int:
        return int(self._write(lambda conn: conn.execute(schema.trim_stream(before)).rowcount))
