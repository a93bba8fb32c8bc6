"""Writes beside the version on SQL (harness.store.RunNotes): each is
guarded by its own statement's WHERE clause and records its event at the
run's current version, in one transaction."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection

from harness.inputs import json_text
from harness.records import JSON
from harness.store import mapping, schema
from harness.store.checkpoint import (
    BILLED,
    ApprovalNote,
    EventDraft,
    PauseNote,
    StepPatch,
    note_refused,
)
from harness.store.sql.base import SQLBase
from harness.store.sql.rows import step_values


class SQLNotes(SQLBase):
    """Writes beside the version (harness.store.RunNotes)."""

    def request_pause(self, note: PauseNote) -> None:
        statement = schema.request_pause(note.run_id, note.requested, note.while_status)
        self._side_write(note.run_id, statement, note.event, note.worker, note.now)

    def note_approval(self, note: ApprovalNote) -> None:
        values: dict[str, Any] = {"approval": json_text(note.approval.to_json(), "approval")}
        if note.args is not None:
            values["args"] = json_text(note.args, "args")
        statement = schema.note_approval(note.run_id, note.index, note.while_status, values)
        self._side_write(note.run_id, statement, note.event, note.worker, note.now)

    def _side_write(
        self, run_id: str, statement: Any, draft: EventDraft, worker: str, now: float
    ) -> None:
        """An operator's note that must not fence a step in flight: the change and
        its event, at the run's current version, in one transaction; NoteRefused
        if the change matched no row."""

        def apply(conn: Connection) -> bool:
            if conn.execute(statement).rowcount != 1:
                return False
            record_event(conn, run_id, worker, now, draft)
            return True

        if not self._write(apply):
            raise note_refused(run_id, draft)

    def add_late_usage(
        self,
        run_id: str,
        index: int,
        result: JSON,
        input_tokens: int,
        output_tokens: int,
        cost_usd: float,
        worker: str,
        now: float,
        detail: str,
    ) -> bool:
        batch = self.blobs.batch()
        values = step_values(StepPatch(index, result=result), run_id, batch)
        blobs = self.blobs.stage(batch)
        draft = EventDraft(BILLED, step_index=index, detail=detail)

        def apply(conn: Connection) -> bool:
            # The step first: its guard (no result yet) is what makes this once.
            if conn.execute(schema.late_result(run_id, index, values)).rowcount != 1:
                return False
            conn.execute(schema.add_usage(run_id, input_tokens, output_tokens, cost_usd))
            self.blobs.insert(conn, self.dialect, blobs)
            record_event(conn, run_id, worker, now, draft)
            return True

        # Safe to retry after a lost connection: a second try matches no step.
        return self._write(apply)


def record_event(conn: Connection, run_id: str, worker: str, now: float, draft: EventDraft) -> None:
    """A note's event, at the run's version as it stands (a note does not move it)."""
    version = conn.execute(schema.run_version(run_id)).scalar_one()
    conn.execute(schema.insert_events(), [mapping.event_row(run_id, version, worker, now, draft)])
