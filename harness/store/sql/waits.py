"""Runs waiting on the world, on SQL (harness.store.Waits)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence

from sqlalchemy import Connection, exc

from harness.records import Run, Wait
from harness.store import mapping, schema
from harness.store.checkpoint import Completion, StepPatch
from harness.store.sql.base import SQLBase
from harness.store.sql.notes import record_event
from harness.store.sql.rows import step_values
from harness.store.values import MESSAGE, KeptSignal, OldestWait, SignalDraft


class _Taken(Exception):
    """The signal an answer was to take was taken first."""


class SQLWaits(SQLBase):
    """Answers to deferred steps, kept signals, children, due waits."""

    def complete_deferred(self, completion: Completion) -> bool:
        c = completion
        batch = self.blobs.batch()
        patch = StepPatch(
            c.index, status=c.status, result=c.result, error=c.error, finished_at=c.now
        )
        values = step_values(patch, c.run_id, batch)
        blobs = self.blobs.stage(batch)

        def apply(conn: Connection) -> bool:
            if conn.execute(schema.answer_deferred(c.run_id, c.index, values)).rowcount != 1:
                return False
            taking = None if c.signal is None else schema.take_signal(c.signal, c.index, c.now)
            if taking is not None and conn.execute(taking).rowcount != 1:
                raise _Taken  # rolls the step's answer back with it
            if c.usage is not None:
                conn.execute(schema.add_usage(c.run_id, *c.usage))
            conn.execute(schema.nudge_waiting(c.run_id, c.now))
            self.blobs.insert(conn, self.dialect, blobs)
            record_event(conn, c.run_id, c.worker, c.now, c.event)
            return True

        # Safe to retry after a lost connection: a second try matches no step.
        try:
            return self._write(apply)
        except _Taken:
            return False

    def keep_signal(self, draft: SignalDraft) -> int | None:
        row = mapping.signal_row(draft)

        def insert(conn: Connection) -> int:
            inserted = conn.execute(schema.insert_signal().returning(schema.signals.c.id), [row])
            conn.execute(schema.nudge_waiting(draft.run_id, draft.now))  # the sweeper looks
            return int(inserted.scalar_one())

        try:
            return self._write(insert)
        except exc.IntegrityError:
            return None  # this sender's id was kept before: its retry

    def keep_message(
        self, run_id: str, text: str, now: float, message_id: str | None = None
    ) -> int | None:
        draft = SignalDraft(run_id, MESSAGE, {"text": text}, None, message_id, now)
        row = mapping.signal_row(draft)

        def insert(conn: Connection) -> int:
            conn.execute(schema.mark_inbox(run_id, now))  # the run's row locked first
            inserted = conn.execute(schema.insert_signal().returning(schema.signals.c.id), [row])
            return int(inserted.scalar_one())

        try:
            return self._write(insert)
        except exc.IntegrityError:
            return None  # this sender's id was kept before: its retry

    def clear_inbox(self, run_id: str) -> None:
        def clear(conn: Connection) -> None:
            if self.dialect == "postgresql":
                # A sender keeping a message holds this lock until it commits; the
                # statement after it then sees the message (a fresh snapshot).
                conn.execute(schema.lock_run(run_id))
            conn.execute(schema.clear_inbox(run_id, MESSAGE))

        self._write(clear)

    def stranded_inboxes(self, before: float, limit: int = 500) -> list[str]:
        query = schema.stranded_inboxes(before, limit)
        return list(self._read(lambda conn: conn.execute(query).scalars().all()))

    def kept_signals(self, run_id: str) -> list[KeptSignal]:
        rows = self._read(
            lambda conn: conn.execute(schema.select_kept_signals(run_id)).mappings().all()
        )
        return [_signal(r) for r in rows]

    def has_signal(self, run_id: str, signal_id: str) -> bool:
        query = schema.select_signal_id(run_id, signal_id)
        return self._read(lambda conn: conn.execute(query).first() is not None)

    def children(self, run_id: str) -> list[Run]:
        rows = self._read(
            lambda conn: conn.execute(schema.select_children(run_id)).mappings().all()
        )
        return [mapping.to_run(r) for r in rows]

    def due_waits(self, now: float, limit: int = 500) -> list[Run]:
        rows = self._read(lambda conn: conn.execute(schema.due_waits(now, limit)).mappings().all())
        return [mapping.to_run(r) for r in rows]

    def wait_counts(self) -> dict[str, int]:
        def read(conn: Connection) -> dict[str, int]:
            waits = conn.execute(schema.deferred_waits()).scalars().all()
            kept = conn.execute(schema.count_kept_signals()).scalar_one()
            return {**_by_kind(waits), "signals_kept": int(kept)}

        return self._read(read)

    def oldest_wait(self) -> OldestWait | None:
        row = self._read(lambda conn: conn.execute(schema.oldest_wait()).first())
        return None if row is None else OldestWait(row[0], int(row[1]), float(row[2]))

    def wait_events(self) -> dict[str, int]:
        row = self._read(lambda conn: conn.execute(schema.count_wait_events()).one())
        return {"timeouts": int(row[0]), "children_started": int(row[1])}


def _by_kind(waits: Sequence[str | None]) -> dict[str, int]:
    kinds: Counter[str] = Counter()
    for text in waits:
        wait = None if text is None else Wait.from_json(json.loads(text))
        if wait is not None:
            kinds[wait.kind.value] += 1
    return dict(kinds)


def _signal(row: object) -> KeptSignal:
    r = dict(row)  # type: ignore[call-overload]
    return KeptSignal(
        r["id"],
        r["run_id"],
        r["name"],
        mapping.loads(r["data"]),
        r["error"],
        r["signal_id"],
        r["created_at"],
    )
