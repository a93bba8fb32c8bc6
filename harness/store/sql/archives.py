"""Export, import and fork on SQL (harness.store.Archives): whole runs
read in one snapshot, or written in one transaction with their blobs."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, exc

from harness.errors import RunNotFound, StoreError
from harness.inputs import storable
from harness.records import Run, Step
from harness.store import mapping, schema
from harness.store.checkpoint import EventDraft, ToolRecord
from harness.store.sql.base import describe
from harness.store.sql.rows import encoded, record_row, step_row, whole_records
from harness.store.sql.runs import SQLRuns
from harness.store.values import RunRows


class SQLArchives(SQLRuns):
    """Export, import and fork (harness.store.Archives)."""

    def run_rows(self, run_id: str) -> RunRows:
        def read(conn: Connection) -> RunRows:
            run = conn.execute(schema.select_run_row(run_id)).mappings().first()
            if run is None:
                raise RunNotFound(run_id)
            step_rows = conn.execute(schema.select_steps(run_id)).mappings().all()
            events = conn.execute(schema.select_events(run_id)).mappings().all()
            record_rows = conn.execute(schema.select_run_tool_records(run_id)).mappings().all()
            kept = conn.execute(schema.select_run_signals(run_id)).mappings().all()
            offered = conn.execute(schema.select_run_tools(run_id)).scalar()
            steps = self.blobs.fill(conn, step_rows)
            records = self.blobs.fill(conn, whole_records(record_rows))
            return RunRows(
                mapping.decoded(schema.runs.name, run),
                tuple(mapping.decoded(schema.steps.name, row) for row in steps),
                tuple({c: v for c, v in row.items() if c != "id"} for row in events),
                tuple(mapping.decoded(schema.tool_results.name, row) for row in records),
                tuple(_signal_row(row) for row in kept),
                None if offered is None else json.loads(offered),
            )

        return self._snapshot(read)

    def import_run(self, rows: RunRows) -> bool:
        run_id = rows.run["run_id"]
        # Encoded as the runner writes them: large results become blobs of this store's.
        batch = self.blobs.batch()
        steps = [batch.offload(run_id, encoded(schema.steps.name, r)) for r in rows.steps]
        events = [encoded(schema.events.name, r) for r in rows.events]
        records = [
            batch.offload(run_id, encoded(schema.tool_results.name, r)) for r in rows.tool_records
        ]
        kept = [encoded(schema.signals.name, r) for r in rows.signals]
        offered = [] if rows.offered_tools is None else [_offered_row(run_id, rows)]
        blobs = self.blobs.stage(batch)

        def insert(conn: Connection) -> bool:
            if conn.execute(schema.run_version(run_id)).first() is not None:
                return False
            conn.execute(schema.insert_run(), [storable(mapping.imported_run(rows.run))])
            tables = (
                (schema.insert_steps(), steps),
                (schema.insert_events(), events),
                (schema.insert_tool_records(), records),
                (schema.insert_signals(), kept),
                (schema.insert_run_tools(), offered),
            )
            for statement, table_rows in tables:
                if table_rows:  # events in order: their new ids keep it
                    conn.execute(statement, table_rows)
            self.blobs.insert(conn, self.dialect, blobs)
            return True

        try:
            return self._write(insert)
        except exc.IntegrityError as err:
            if self._read(lambda conn: conn.execute(schema.run_version(run_id)).first()):
                return False  # imported at the same time by someone else
            raise StoreError(f"run {run_id} not imported: {describe(err)}") from err

    def create_fork(
        self,
        run: Run,
        steps: Sequence[Step],
        records: Sequence[ToolRecord],
        wake_at: float,
        created: EventDraft,
    ) -> tuple[Run, bool]:
        row = mapping.run_row(run, wake_at)
        event = mapping.event_row(run.run_id, run.version, None, run.created_at, created)
        # The copied values are written as any others: large ones become the
        # fork's own blobs (a file before the transaction that names it).
        batch = self.blobs.batch()
        step_rows = [step_row(s, batch) for s in steps]
        record_rows = [record_row(run.run_id, r, run.created_at, batch) for r in records]
        blobs = self.blobs.stage(batch)

        def insert(conn: Connection) -> None:
            # The origin, locked against a prune's DELETE until this commits
            # (see schema.lock_fork_origin): gone means pruned since it was read.
            origin = run.forked_from
            locked = origin and conn.execute(schema.lock_fork_origin(origin.run_id)).first()
            if origin is not None and locked is None:
                raise RunNotFound(
                    origin.run_id,
                    f"run {origin.run_id!r} was deleted (pruned) while the fork was "
                    "made: no fork created",
                )
            conn.execute(schema.insert_run(), [row])
            conn.execute(schema.insert_steps(), step_rows)
            conn.execute(schema.insert_events(), [event])
            if record_rows:
                conn.execute(schema.insert_tool_records(), record_rows)
            self.blobs.insert(conn, self.dialect, blobs)

        try:
            self._write(insert)
        except exc.IntegrityError as err:
            try:
                return self.load(run.run_id), False
            except RunNotFound:  # no such run: a record with a new key clashed
                raise StoreError(f"fork {run.run_id} not created: {describe(err)}") from err
        return self.load(run.run_id), True


def _signal_row(row: Any) -> dict[str, Any]:
    """A signal as an export carries it: its columns but the id, its data decoded."""
    return mapping.decoded(schema.signals.name, {c: v for c, v in dict(row).items() if c != "id"})


def _offered_row(run_id: str, rows: RunRows) -> dict[str, Any]:
    """The run's record of its offered tools, as ``harness_run_tools`` holds it."""
    return {
        "run_id": run_id,
        "tools": json.dumps(rows.offered_tools),
        "created_at": rows.run["created_at"],
    }
