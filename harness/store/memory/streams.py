"""A run's stream in memory (harness.store.Streams), as
:mod:`harness.store.schema.streams` keeps it."""

from __future__ import annotations

from collections.abc import Sequence

from harness.store.memory.tables import MemoryBase
from harness.store.values import StreamEntry


class MemoryStreams(MemoryBase):
    """The pieces of model answers as they are written."""

    def append_stream(self, run_id: str, entries: Sequence[StreamEntry], now: float) -> None:
        with self._lock:
            t = self._tables
            kept = t.stream.setdefault(run_id, [])
            for entry in entries:
                t.last_stream_id += 1
                kept.append((t.last_stream_id, entry.encode(), now))

    def stream_after(
        self, run_id: str, after: int, limit: int = 1000
    ) -> list[tuple[int, StreamEntry]]:
        with self._lock:
            kept = [(i, e) for i, e, _ in self._tables.stream.get(run_id, []) if i > after]
        return [(i, StreamEntry.decode(e)) for i, e in kept[:limit]]

    def trim_streams(self, before: float) -> int:
        with self._lock:
            t = self._tables
            trimmed = 0
            for run_id, kept in list(t.stream.items()):
                left = [row for row in kept if row[2] >= before]
                trimmed += len(kept) - len(left)
                if left:
                    t.stream[run_id] = left
                else:
                    del t.stream[run_id]
            return trimmed
