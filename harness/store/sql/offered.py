"""The tools each run was offered, on SQL (harness.store.protocols.OfferedTools)."""

from __future__ import annotations

import json

from sqlalchemy import Connection

from harness.records import JSON
from harness.store import schema
from harness.store.sql.base import SQLBase


class SQLOfferedTools(SQLBase):
    """One row per run that has toolsets, written once (``harness_run_tools``)."""

    def offered_tools(self, run_id: str) -> JSON | None:
        query = schema.select_run_tools(run_id)
        text = self._read(lambda conn: conn.execute(query).scalar())
        return None if text is None else json.loads(text)

    def offer_tools(self, run_id: str, tools: JSON, now: float) -> JSON:
        values = {"run_id": run_id, "tools": json.dumps(tools), "created_at": now}

        def insert_or_read(conn: Connection) -> JSON:
            conn.execute(schema.insert_run_tools_if_absent(self.dialect, values))
            stored = conn.execute(schema.select_run_tools(run_id)).scalar_one()
            return json.loads(stored)

        # Safe to retry after a lost connection: it never overwrites a record.
        return self._write(insert_or_read)
