"""Runs on SQL (harness.store.RunStore): create, load, checkpoint, claim,
reads, due runs.

A checkpoint is encoded before its transaction (a value the boundary
refuses raises then, writing nothing; a large result's blob file is written
then). On PostgreSQL it is one autocommit statement, one round trip
(:func:`harness.store.schema.checkpoint_in_one_statement`); on SQLite a
``BEGIN IMMEDIATE`` transaction of a few statements.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, Integer, RowMapping, Select, bindparam, exc

from harness.errors import RunNotFound, StaleWriteError, StoreError
from harness.records import Event, Run, Step
from harness.store import mapping, schema
from harness.store.checkpoint import Checkpoint, ClaimGuard, EventDraft
from harness.store.sql.base import SQLBase, describe
from harness.store.sql.rows import (
    STEP_COLUMNS,
    EncodedCheckpoint,
    changes,
    joined_run,
    kept_once,
    record_row,
    step_row,
    step_values,
)
from harness.store.values import Delivered, RunQuery


def _all_rows(queries: list[Select[Any]], conn: Connection) -> list[RowMapping]:
    return [row for query in queries for row in conn.execute(query).mappings()]


@functools.cache
def _events_after_each() -> Select[Any]:
    return schema.select_events_after_each()


def _load_at() -> Select[Any]:
    return schema.load_run(at=bindparam("at", type_=Integer))


class SQLRuns(SQLBase):
    """The run store's part (harness.store.RunStore): runs, their steps and flight recorder."""

    def create_run(
        self, run: Run, steps: Sequence[Step], wake_at: float, created: EventDraft
    ) -> tuple[Run, bool]:
        row = mapping.run_row(run, wake_at)
        event = mapping.event_row(run.run_id, run.version, None, run.created_at, created)
        batch = self.blobs.batch()
        step_rows = [step_row(s, batch) for s in steps]
        blobs = self.blobs.stage(batch)

        def insert(conn: Connection) -> None:
            conn.execute(schema.insert_run(), [row])
            conn.execute(schema.insert_steps(), step_rows)
            conn.execute(schema.insert_events(), [event])
            self.blobs.insert(conn, self.dialect, blobs)

        try:
            self._write(insert)
        except exc.IntegrityError:
            return self.load(run.run_id), False
        return self.load(run.run_id), True

    def load(self, run_id: str, at: int | None = None) -> Run:
        if at is None:
            # Planned each time: a generic plan of the join on the cursor column,
            # made while the tables were small, reads a long run's steps one by one.
            row = self._fetch_one(
                "load_run", schema.load_run, {"run_id": run_id}, plan_each_time=True
            )
        else:  # the step's index bound: any plan is two primary-key lookups
            row = self._fetch_one("load_run_at", _load_at, {"run_id": run_id, "at": at})
        if row is None:
            raise RunNotFound(run_id)
        if at is not None and row["cursor"] != at:  # the step read is not the cursor's
            row = {k: None if k in STEP_COLUMNS else v for k, v in row.items()}
        if row["step_result_blob"] is not None:  # rare: a large result at the cursor
            found = row
            row = self._read(lambda conn: dict(self.blobs.fill(conn, [found], "step_")[0]))
        return joined_run(row)

    def checkpoint(self, checkpoint: Checkpoint) -> int:
        try:
            rows = self._encode(checkpoint)
            if self.dialect == "postgresql" and not checkpoint.take_signals:
                return self._one_statement(checkpoint, rows)
            return self._write(lambda conn: self._apply(conn, checkpoint, rows))
        except StaleWriteError:
            self._count("stale_writes")
            raise
        except exc.IntegrityError as err:
            raise StoreError(
                f"checkpoint of run {checkpoint.run_id} conflicts with stored rows: {describe(err)}"
            ) from err

    def claim_loaded(self, claim: Checkpoint, guard: ClaimGuard) -> tuple[Run, int] | None:
        guards = {
            "g_cursor": guard.cursor,
            "g_agent": guard.agent,
            "g_tool": guard.tool,
            "g_attempts": guard.attempts,
        }
        rows = self._encode(claim)
        if self.dialect == "postgresql":
            params, shape = self._statement_params(claim, rows)
            build = functools.partial(schema.claim_in_one_statement, shape)
            row = self._fetch_one(("claim", shape), build, params | guards)
            if row is None:
                return None
            version = row.pop("claimed_version")
        else:

            def apply(conn: Connection) -> tuple[dict[str, Any], int] | None:
                load = schema.load_run().where(
                    schema.runs.c.version == claim.expected_version,
                    *schema.claim_guard(claim.run_id),
                )
                found = conn.execute(load, {"run_id": claim.run_id} | guards).mappings().first()
                if found is None:
                    return None
                return dict(found), self._apply(conn, claim, rows)

            done = self._write(apply)
            if done is None:
                return None
            row, version = done
        if row["step_result_blob"] is not None:  # a pending call has no result: never
            raise StoreError(f"run {claim.run_id}: a pending step with a stored result")
        return joined_run(row), version

    def _encode(self, cp: Checkpoint) -> EncodedCheckpoint:
        """The checkpoint's step and record rows, and their blobs staged."""
        batch = self.blobs.batch()
        patches = tuple((p, step_values(p, cp.run_id, batch)) for p in cp.steps if changes(p))
        new_steps = tuple(step_row(s, batch) for s in cp.new_steps)
        record, shared = None, None
        if cp.tool_record is not None:
            row = record_row(cp.run_id, cp.tool_record, cp.now, batch)
            record, shared = kept_once(row, patches)
        return EncodedCheckpoint(patches, new_steps, record, self.blobs.stage(batch), shared)

    def _one_statement(self, cp: Checkpoint, rows: EncodedCheckpoint) -> int:
        """PostgreSQL: the checkpoint as one autocommit statement, one round trip."""
        params, shape = self._statement_params(cp, rows)
        build = functools.partial(schema.checkpoint_in_one_statement, shape)
        row = self._fetch_one(shape, build, params)
        if row is None:
            raise StaleWriteError(cp.run_id, cp.expected_version)
        return int(row["version"])

    def _statement_params(
        self, cp: Checkpoint, rows: EncodedCheckpoint
    ) -> tuple[dict[str, Any], schema.CheckpointShape]:
        """The bound values of a checkpoint's one statement, and its shape."""
        params: dict[str, Any] = {"run_id": cp.run_id, "expected": cp.expected_version}
        run_values = mapping.run_values(cp)
        params |= {f"r_{c}": v for c, v in run_values.items()}
        patches = []
        for n, (patch, values) in enumerate(rows.patches):
            patches.append((tuple(values), patch.bump_attempts))
            params |= {f"s{n}_{c}": v for c, v in values.items()}
            params[f"s{n}_idx"] = patch.index
        for i, new_step in enumerate(rows.new_steps):
            params |= {f"n{i}_{c}": v for c, v in new_step.items()}
        for i, draft in enumerate(cp.events):
            params |= {
                f"e{i}_{c}": v
                for c, v in mapping.event_row(cp.run_id, 0, cp.worker, cp.now, draft).items()
            }
        if rows.record is not None:
            params |= {f"t_{c}": v for c, v in rows.record.items()}
            params["t_shared"] = rows.shared
        for i, blob in enumerate(rows.blobs):
            params |= {f"b{i}_{c}": v for c, v in blob.items()}
        shape = schema.CheckpointShape(
            tuple(run_values),
            tuple(patches),
            len(cp.new_steps),
            len(cp.events),
            cp.tool_record is not None,
            len(rows.blobs),
        )
        return params, shape

    def _apply(self, conn: Connection, cp: Checkpoint, rows: EncodedCheckpoint) -> int:
        values = mapping.run_values(cp)
        matched = conn.execute(schema.cas_run(cp.run_id, cp.expected_version, values)).rowcount
        if matched != 1:
            raise StaleWriteError(cp.run_id, cp.expected_version)
        new_version = cp.expected_version + 1
        for patch, patched in rows.patches:
            conn.execute(schema.patch_step(cp.run_id, patch.index, patched, patch.bump_attempts))
        if rows.new_steps:
            conn.execute(schema.insert_steps(), list(rows.new_steps))
        if cp.events:
            events = [
                mapping.event_row(cp.run_id, new_version, cp.worker, cp.now, e) for e in cp.events
            ]
            conn.execute(schema.insert_events(), events)
        if rows.record is not None:
            conn.execute(schema.insert_record(self.dialect, rows.record, rows.shared))
        said = {row["idx"]: row["args"] for row in rows.new_steps}  # a message kept once
        for signal, index in cp.take_signals:  # rolled back whole if one was taken first
            taken = schema.take_signal(signal, index, cp.now, said.get(index))
            if conn.execute(taken).rowcount != 1:
                raise StaleWriteError(cp.run_id, cp.expected_version)
        self.blobs.insert(conn, self.dialect, rows.blobs)
        return new_version

    def steps(self, run_id: str, start: int = 0, limit: int | None = None) -> list[Step]:
        if limit is None:  # a model turn's read of the steps after its cached transcript
            params = {"run_id": run_id, "start": start}
            found = self._fetch_all("steps_from", schema.select_steps_from, params)
            return [mapping.to_step(r) for r in found]
        query = schema.select_steps(run_id, start, limit)
        rows = self._read(lambda conn: self.blobs.fill(conn, conn.execute(query).mappings().all()))
        return [mapping.to_step(r) for r in rows]

    def events(self, run_id: str) -> list[Event]:
        rows = self._read(lambda conn: conn.execute(schema.select_events(run_id)).mappings().all())
        return [mapping.to_event(r) for r in rows]

    def query_runs(self, query: RunQuery, limit: int | None = None) -> list[Run]:
        statement = schema.query_runs(
            query.limit if limit is None else limit,
            None if query.status is None else query.status.value,
            query.agent,
            query.created_before,
            query.created_after,
            query.keyset(),
            query.forked_from,
            query.replay_of,
            query.replays,
        )

        def page(conn: Connection) -> list[Mapping[Any, Any]]:
            return self.blobs.fill(conn, conn.execute(statement).mappings().all(), "step_")

        try:
            rows = self._read(page)
        except RunNotFound:  # a listed run was pruned while its blob was read
            rows = self._read(page)  # the page again, without it
        return [joined_run(r) for r in rows]

    def events_after(
        self, run_id: str, after_id: int | None = None, limit: int | None = None
    ) -> list[Event]:
        query = schema.select_events_after(run_id, after_id, limit)
        rows = self._read(lambda conn: conn.execute(query).mappings().all())
        return [mapping.to_event(r) for r in rows]

    def events_after_runs(self, after: Mapping[str, int], limit: int) -> dict[str, list[Event]]:
        if not after:
            return {}
        if self.dialect == "postgresql":  # one round trip
            values = {"runs": list(after), "afters": list(after.values()), "limit": limit}
            query = _events_after_each()
            rows = self._read(lambda conn: conn.execute(query, values).mappings().all())
        else:  # no round trips to save: a statement for each run, on one connection
            queries = [schema.select_events_after(r, last, limit) for r, last in after.items()]
            rows = self._read(functools.partial(_all_rows, queries))
        found: dict[str, list[Event]] = {}
        for row in sorted(rows, key=lambda r: r["id"]):
            found.setdefault(row["run_id"], []).append(mapping.to_event(row))
        return found

    def due_runs(
        self, now: float, limit: int = 500, delivered: Delivered | None = None
    ) -> list[Run]:
        query = schema.due_runs(now, limit, delivered)
        rows = self._read(lambda conn: conn.execute(query).mappings().all())
        return [mapping.to_run(r) for r in rows]

    def ping(self) -> None:
        self._read(lambda conn: conn.execute(schema.ping()).scalar_one())

    def reset(self) -> None:
        def delete(conn: Connection) -> None:
            for statement in schema.delete_all():
                conn.execute(statement)

        self._write(delete)
