"""Runs in memory: create, load, checkpoint, claim, reads, due runs, and
the writes made beside the version (harness.store.protocols.RunStore and
RunNotes).

Where the SQL store's semantics live in SQL text (the claim guard of
:func:`harness.store.schema.claim_guard`, the sweeper's query
:func:`harness.store.schema.due_runs`, the guards of a pause request, an
approval given ahead and a late charge), the same predicate is written here
in Python, next to a reference to its SQL twin; the contract suite holds the
two to the same cases.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Self

from harness.errors import StaleWriteError, StoreError
from harness.inputs import json_text
from harness.records import JSON, Event, Run, Step
from harness.store import mapping, schema
from harness.store.checkpoint import (
    BILLED,
    ApprovalNote,
    Checkpoint,
    ClaimGuard,
    EventDraft,
    PauseNote,
    StepPatch,
    note_refused,
)
from harness.store.memory import rows
from harness.store.memory.rows import RUNS, Row
from harness.store.memory.tables import MemoryBase, Tables
from harness.store.values import Delivered, RunQuery


class _Encoded:
    """A checkpoint's rows, encoded before the lock is taken (a value the
    boundary refuses raises here, writing nothing, as SQLStore._encode)."""

    def __init__(self, cp: Checkpoint) -> None:
        self.run = RUNS.typed(mapping.run_values(cp))
        self.patches = [(p, rows.step_values(p)) for p in cp.steps if p.bump_attempts or p.values()]
        self.new_steps = [rows.step_row(s) for s in cp.new_steps]
        self.record = None
        if cp.tool_record is not None:
            self.record = rows.record_row(cp.run_id, cp.tool_record, cp.now)


class MemoryRuns(MemoryBase):
    """The run store's part: runs, their steps and flight recorder."""

    def create_run(
        self, run: Run, steps: Sequence[Step], wake_at: float, created: EventDraft
    ) -> tuple[Run, bool]:
        row = rows.run_row(run, wake_at)
        event = rows.event_row(run.run_id, run.version, None, run.created_at, created)
        step_rows = [rows.step_row(s) for s in steps]
        with self._lock:
            if run.run_id in self._tables.runs:
                return self.load(run.run_id), False
            _check_new_steps(self._tables, run.run_id, step_rows)
            self._insert_run(row, step_rows, [event])
            return self.load(run.run_id), True

    def _insert_run(self, row: Row, step_rows: list[Row], events: list[Row]) -> None:
        t = self._tables
        t.runs[row["run_id"]] = row
        t.steps.setdefault(row["run_id"], {})
        for step in step_rows:
            t.steps.setdefault(step["run_id"], {})[step["idx"]] = step
        t.add_events(row["run_id"], events)

    def load(self, run_id: str, at: int | None = None) -> Run:
        with self._lock:
            row = self._tables.run(run_id)
            here = at is None or row["cursor"] == at
            return rows.to_run(row, self._tables.step_at(row) if here else None)

    def checkpoint(self, checkpoint: Checkpoint) -> int:
        encoded = _Encoded(checkpoint)
        with self._lock:
            try:
                return _apply(self._tables, checkpoint, encoded)
            except StaleWriteError:
                counters = self._tables.counters
                counters["stale_writes"] = counters.get("stale_writes", 0) + 1
                raise

    def claim_loaded(self, claim: Checkpoint, guard: ClaimGuard) -> tuple[Run, int] | None:
        encoded = _Encoded(claim)
        with self._lock:
            t = self._tables
            row = t.runs.get(claim.run_id)
            if row is None:
                return None
            before = rows.to_run(row, t.step_at(row))
            # The guard's one definition (ClaimGuard.holds), which the SQL
            # statement is built from.
            if not guard.holds(before, claim.expected_version):
                return None
            return before, _apply(t, claim, encoded)

    def steps(self, run_id: str, start: int = 0, limit: int | None = None) -> list[Step]:
        with self._lock:
            found = sorted(self._tables.steps.get(run_id, {}).items())
            chosen = [row for index, row in found if index >= start]
            return [mapping.to_step(r) for r in chosen[:limit]]

    def events(self, run_id: str) -> list[Event]:
        return self.events_after(run_id)

    def events_after(
        self, run_id: str, after_id: int | None = None, limit: int | None = None
    ) -> list[Event]:
        with self._lock:
            recorder = self._tables.events.get(run_id, [])
            chosen = [e for e in recorder if after_id is None or e["id"] > after_id]
            return [mapping.to_event(e) for e in chosen[:limit]]

    def events_after_runs(self, after: Mapping[str, int], limit: int) -> dict[str, list[Event]]:
        found = {run_id: self.events_after(run_id, last, limit) for run_id, last in after.items()}
        return {run_id: events for run_id, events in found.items() if events}

    def query_runs(self, query: RunQuery, limit: int | None = None) -> list[Run]:
        keyset = query.keyset()
        count = query.limit if limit is None else limit
        with self._lock:
            t = self._tables
            found = [r for r in t.runs.values() if _listed(r, query, keyset)]
            found.sort(key=lambda r: (r["created_at"], r["run_id"]), reverse=True)
            return [rows.to_run(r, t.step_at(r)) for r in found[:count]]

    def due_runs(
        self, now: float, limit: int = 500, delivered: Delivered | None = None
    ) -> list[Run]:
        with self._lock:
            due = [r for r in self._tables.runs.values() if _due(r, now, delivered)]
            due.sort(key=lambda r: r["wake_at"])
            return [rows.to_run(r) for r in due[:limit]]

    def ping(self) -> None:
        """Always answers: the store is this process's memory."""

    def reset(self) -> None:
        with self._lock:
            old = self._tables
            # Ids keep growing, as a PostgreSQL sequence does after a DELETE.
            self._tables = Tables(last_event_id=old.last_event_id, last_sweep_id=old.last_sweep_id)

    def heartbeat_store(self) -> Self:
        """Itself: there is no connection a renewal could wait for."""
        return self

    def close(self) -> None:
        """Nothing to release; the store keeps working (a test may read it after)."""

    def forget_connections(self) -> None:
        """Nothing to forget: a forked child gets a copy of the tables."""

    # -- writes beside the version (RunNotes) ---------------------------------

    def request_pause(self, note: PauseNote) -> None:
        with self._lock:
            row = self._tables.runs.get(note.run_id)
            # schema.request_pause: while the note's statuses, the ask not already so.
            statuses = {s.value for s in note.while_status}
            if row is None or row["status"] not in statuses:
                raise note_refused(note.run_id, note.event)
            if row["pause_requested"] is note.requested:
                raise note_refused(note.run_id, note.event)
            row["pause_requested"] = note.requested
            self._note(row, note.event, note.worker, note.now)

    def note_approval(self, note: ApprovalNote) -> None:
        values: Row = {"approval": json_text(note.approval.to_json(), "approval")}
        if note.args is not None:
            values["args"] = json_text(note.args, "args")
        with self._lock:
            row = self._tables.runs.get(note.run_id)
            step = None if row is None else self._tables.step_at(row, note.index)
            # schema.note_approval: a call of the note's status with no word yet, once.
            if row is None or step is None or step["status"] != note.while_status.value:
                raise note_refused(note.run_id, note.event)
            if step["approval"] is not None:
                raise note_refused(note.run_id, note.event)
            step.update(values)
            self._note(row, note.event, note.worker, note.now)

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
        values = rows.step_values(StepPatch(index, result=result))
        with self._lock:
            row = self._tables.runs.get(run_id)
            step = None if row is None else self._tables.step_at(row, index)
            # schema.late_result: the run ended, the step a model step with no result.
            if row is None or step is None or row["status"] not in schema.TERMINAL:
                return False
            if step["kind"] != "model" or step["result"] is not None:
                return False
            step.update(values)
            row["input_tokens"] += input_tokens
            row["output_tokens"] += output_tokens
            row["cost_usd"] += cost_usd
            self._note(row, EventDraft(BILLED, step_index=index, detail=detail), worker, now)
            return True

    def _note(self, row: Row, draft: EventDraft, worker: str, now: float) -> None:
        """The event of a write beside the version, at the run's current one."""
        event = rows.event_row(row["run_id"], row["version"], worker, now, draft)
        self._tables.add_events(row["run_id"], [event])


def _check_new_steps(t: Tables, run_id: str, step_rows: list[Row]) -> None:
    """Refuse step rows whose (run_id, idx) is taken, or repeated among them
    (the steps' primary key), before anything is written."""
    seen: set[tuple[str, int]] = set()
    for step in step_rows:
        key = (step["run_id"], step["idx"])
        if key in seen or step["idx"] in t.steps.get(step["run_id"], {}):
            raise StoreError(
                f"checkpoint of run {run_id} conflicts with stored rows: "
                f"step {step['idx']} of {step['run_id']} exists"
            )
        seen.add(key)


def _apply(t: Tables, cp: Checkpoint, encoded: _Encoded) -> int:
    """Apply a checkpoint whose rows are encoded: compare-and-swap on the
    version (StaleWriteError), then every write, or none."""
    row = t.runs.get(cp.run_id)
    if row is None or row["version"] != cp.expected_version:
        raise StaleWriteError(cp.run_id, cp.expected_version)
    _check_new_steps(t, cp.run_id, encoded.new_steps)
    taken = [t.signals.get(signal) for signal, _ in cp.take_signals]
    if any(s is None or s["taken_step"] is not None for s in taken):  # schema.take_signal
        raise StaleWriteError(cp.run_id, cp.expected_version)
    version = cp.expected_version + 1
    row.update(encoded.run)
    row["version"] = version
    steps = t.steps.setdefault(cp.run_id, {})
    for patch, values in encoded.patches:
        step = steps.get(patch.index)
        if step is None:  # an UPDATE that matches no row
            continue
        attempts = step["attempts"] + 1
        step.update(values)
        if patch.bump_attempts:  # the stored count plus one, whatever the patch set
            step["attempts"] = attempts
    for new in encoded.new_steps:
        t.steps.setdefault(new["run_id"], {})[new["idx"]] = new
    events = [rows.event_row(cp.run_id, version, cp.worker, cp.now, e) for e in cp.events]
    t.add_events(cp.run_id, events)
    if encoded.record is not None:
        t.tool_results.setdefault(encoded.record["key"], encoded.record)
    for signal, (_, index) in zip(taken, cp.take_signals, strict=True):
        assert signal is not None
        signal.update(taken_step=index, taken_at=cp.now)
    return version


def _listed(row: Row, query: RunQuery, keyset: tuple[float, str] | None) -> bool:
    """Whether ``query`` selects the run ``row`` (:func:`harness.store.schema.query_runs`)."""
    checks = (
        query.status is None or row["status"] == query.status.value,
        query.agent is None or row["agent"] == query.agent,
        query.created_after is None or row["created_at"] >= query.created_after,
        query.created_before is None or row["created_at"] < query.created_before,
        keyset is None or (row["created_at"], row["run_id"]) < keyset,
        query.forked_from is None or row["forked_from_run"] == query.forked_from,
        query.replay_of is None or row["replay_of_run"] == query.replay_of,
        query.replays is None or (row["replay_of_run"] is not None) is query.replays,
    )
    return all(checks)


def _due(row: Row, now: float, delivered: Delivered | None) -> bool:
    """:func:`harness.store.schema.due_runs` in Python: movable, past its
    wake-up, unleased or its lease expired, and, given ``delivered``, not a
    run whose message may still be queued."""
    wake_at = row["wake_at"]
    if row["status"] not in schema.MOVABLE or wake_at is None or not wake_at < now:
        return False
    owner, expires = row["owner"], row["lease_expires_at"]
    if owner is not None and not (expires is not None and expires < now):
        return False
    if delivered is None:
        return True
    queued = False
    if delivered.normal is not None:
        queued |= owner is None and row["updated_at"] >= delivered.normal
    if delivered.recovery is not None:
        resent = (owner or "") == delivered.recovery_owner
        queued |= resent and row["updated_at"] >= delivered.recovery
    return not (queued and wake_at >= delivered.oldest)
