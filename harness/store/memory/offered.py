"""The tools each run was offered, in memory, as :mod:`harness.store.sql.offered`."""

from __future__ import annotations

import json

from harness.records import JSON
from harness.store.memory.tables import MemoryBase


class MemoryOfferedTools(MemoryBase):
    """A run's record of its offered tools: written once, first writer wins."""

    def offered_tools(self, run_id: str) -> JSON | None:
        with self._lock:
            text = self._tables.run_tools.get(run_id)
        return None if text is None else json.loads(text)

    def offer_tools(self, run_id: str, tools: JSON, now: float) -> JSON:
        with self._lock:
            text = self._tables.run_tools.setdefault(run_id, json.dumps(tools))
        return json.loads(text)
