"""Rows as the SQL store writes and reads them: the shared mapping
(:mod:`harness.store.mapping`) with a result too large for its row moved to
a blob (:mod:`harness.store.blobs`), a checkpoint's rows encoded before its
transaction, and a run read joined to the step at its cursor.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from harness.errors import StoreError
from harness.inputs import json_text, storable
from harness.records import Run, RunStatus, Step, StepStatus
from harness.store import mapping, schema
from harness.store.blobs import REF, BlobBatch
from harness.store.checkpoint import StepPatch, ToolRecord

#: A step's status as stored once it is done.
DONE = StepStatus.DONE.value
#: The step's columns in a load's row (schema.load_run).
STEP_COLUMNS = frozenset(f"step_{c.name}" for c in schema.steps.c)


def joined_run(row: Mapping[Any, Any]) -> Run:
    """The run of a row joined to the step at its cursor (schema.load_run,
    schema.query_runs), the step's columns named ``step_<column>``."""
    here = row["step_idx"] is not None
    return mapping.to_run(row, mapping.to_step(row, "step_") if here else None)


def step_row(step: Step, blobs: BlobBatch) -> dict[str, Any]:
    """A step's row; a result too large for it goes to a blob in ``blobs``."""
    return blobs.offload(step.run_id, mapping.step_row(step))


def changes(patch: StepPatch) -> bool:
    return patch.bump_attempts or bool(patch.values())


def step_values(patch: StepPatch, run_id: str, blobs: BlobBatch) -> dict[str, Any]:
    return blobs.offload(run_id, mapping.step_values(patch))


def record_row(run_id: str, record: ToolRecord, now: float, blobs: BlobBatch) -> dict[str, Any]:
    return blobs.offload(run_id, mapping.record_row(run_id, record, now))


def kept_once(
    record: dict[str, Any], patches: tuple[tuple[StepPatch, dict[str, Any]], ...]
) -> tuple[dict[str, Any], str | None]:
    """A checkpoint's record row, its result kept once, and the text it
    shares with its step (None: none). When the same checkpoint makes the
    record's step done with the very same text (a step's result checkpoint),
    the record names the step's result (:data:`schema.SAME_AS_STEP`) instead
    of holding a second copy; a record written before with that very text (a
    model's response, recorded the moment it came) is made to name it too
    (schema.insert_record). Not for a result in a blob: both rows already
    name the one blob. A done step's result never changes, so the record
    reads back the same (schema.upkeep.record_result); forks, exports and
    the executor read records that way."""
    text = record["result"]
    if text is None:
        return record, None
    for patch, values in patches:
        same = values.get("result") == text and values.get(REF) is None
        if patch.index == record["step_index"] and values.get("status") == DONE and same:
            return {**record, "result": None, REF: schema.SAME_AS_STEP}, text
    return record, None


def whole_records(rows: Sequence[Mapping[Any, Any]]) -> Sequence[Mapping[Any, Any]]:
    """Idempotency records as read (schema.upkeep.record_result), each with
    its value or a blob's name; :class:`StoreError` naming the record, its
    run and its step for one that names its step's result when the step
    holds none (an outside edit: a partial restore, a hand-edited row). The
    record cannot be read then, and a reader must not take it for a record
    without a value (or its marker for the name of a blob)."""
    for row in rows:
        if row[REF] == schema.SAME_AS_STEP:
            raise StoreError(
                f"run {row['run_id']}: idempotency record {row['key']!r} names the result "
                f"of step {row['step_index']}, and that step holds none (its row was "
                "edited or restored apart from the record)"
            )
    return rows


@dataclass(frozen=True)
class EncodedCheckpoint:
    """A checkpoint's step and record rows, encoded before its transaction,
    with the rows of the blobs they name (a blob file is written by then)."""

    patches: tuple[tuple[StepPatch, dict[str, Any]], ...]
    new_steps: tuple[dict[str, Any], ...]
    record: dict[str, Any] | None
    blobs: tuple[dict[str, Any], ...]
    #: The text the record shares with its step (:func:`kept_once`), or None.
    shared: str | None = None


def encoded(table: str, row: Mapping[str, Any]) -> dict[str, Any]:
    """A row from an import: its JSON columns as text, as the runner writes them."""
    values = dict(row)
    for column in schema.JSON_COLUMNS.get(table, ()):
        value = values[column]
        # A step's result or approval is NULL until set; a record of a None
        # result holds "null" (its column is NULL only for a blob).
        unset = value is None and table == schema.steps.name
        values[column] = None if unset else json_text(value, f"{table}.{column}")
    return storable(values)


def status_values(statuses: tuple[RunStatus, ...]) -> tuple[str, ...]:
    return tuple(s.value for s in statuses)
