"""Rows of the in-memory store, shaped as the SQL tables hold them.

The memory store keeps each table's rows as column-to-value dicts with the
columns, defaults and types that :mod:`harness.store.schema` declares, and
its JSON columns as the text :func:`harness.inputs.json_text` writes. So a
value goes through the same boundary as on SQLite and PostgreSQL (the same
text refused, the same NUL or lone surrogate replaced by
:func:`harness.inputs.storable`), a read decodes a fresh value each time (no
caller ever holds a stored object), and an export of a memory run is the
document an SQL store writes. Blobs are never needed: a row holds any size.

Rows and records map to each other as in the SQL store, through the
same module (:mod:`harness.store.mapping`); here each row is also typed as
its table's columns read back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import Boolean, Float, Table

from harness.errors import StoreError
from harness.inputs import json_text, storable
from harness.records import Run, Step
from harness.store import mapping, schema
from harness.store.checkpoint import EventDraft, StepPatch, ToolRecord
from harness.store.values import PublishedAgent, Sweep

Row = mapping.Row


class _Columns:
    """What the memory store needs of one table's declaration."""

    def __init__(self, table: Table) -> None:
        self.name = table.name
        # Ids are the store's to assign; a blob reference is never needed here,
        # nor a column the database computes for its indexes (wake_minute).
        stored = schema.STORAGE_COLUMNS.get(table.name, ())
        self.names = tuple(
            c.name
            for c in table.c
            if c.autoincrement is not True and c.name not in stored and c.computed is None
        )
        self.floats = frozenset(c.name for c in table.c if isinstance(c.type, Float))
        self.booleans = frozenset(c.name for c in table.c if isinstance(c.type, Boolean))
        self.defaults: dict[str, Any] = {}
        for column in table.c:
            default = column.server_default
            if default is None or column.computed is not None:
                continue
            arg = getattr(default, "arg", None)
            if column.name in self.booleans:
                self.defaults[column.name] = False
            elif column.name in self.floats:
                self.defaults[column.name] = float(str(arg))
            else:
                self.defaults[column.name] = int(str(arg))
        self.required = frozenset(
            c.name
            for c in table.c
            if not c.nullable and c.name in self.names and c.name not in self.defaults
        )

    def row(self, values: Mapping[str, Any]) -> Row:
        """A new row from ``values``, as an INSERT makes it: other keys
        ignored, absent columns their default or NULL, a NOT NULL column
        without a value refused (:class:`StoreError`)."""
        row = {c: values.get(c, self.defaults.get(c)) for c in self.names}
        for column in self.required:
            if row[column] is None:
                raise StoreError(f"NOT NULL constraint failed: {self.name}.{column}")
        return self.typed(row)

    def typed(self, values: Row) -> Row:
        """``values`` as the columns' types read them back (a float column
        returns a float, a boolean one a bool)."""
        for column, value in values.items():
            if value is None:
                continue
            if column in self.floats and type(value) is not float:
                values[column] = float(value)
            elif column in self.booleans and type(value) is not bool:
                values[column] = bool(value)
        return values


RUNS = _Columns(schema.runs)
STEPS = _Columns(schema.steps)
EVENTS = _Columns(schema.events)
TOOL_RESULTS = _Columns(schema.tool_results)
SWEEPS = _Columns(schema.sweeps)
AGENTS = _Columns(schema.agents)
SIGNALS = _Columns(schema.signals)


def run_row(run: Run, wake_at: float) -> Row:
    """The row inserting a new run, unleased, woken at ``wake_at``."""
    return RUNS.row(mapping.run_row(run, wake_at))


def step_row(step: Step) -> Row:
    return STEPS.row(mapping.step_row(step))


def step_values(patch: StepPatch) -> Row:
    """The columns ``patch`` sets, encoded as stored (``bump_attempts`` aside)."""
    return STEPS.typed(mapping.step_values(patch))


def record_row(run_id: str, record: ToolRecord, now: float) -> Row:
    return TOOL_RESULTS.row(mapping.record_row(run_id, record, now))


def event_row(run_id: str, version: int, worker: str | None, at: float, draft: EventDraft) -> Row:
    return EVENTS.row(mapping.event_row(run_id, version, worker, at, draft))


def sweep_row(sweep: Sweep) -> Row:
    return SWEEPS.row(mapping.sweep_row(sweep))


def agent_row(agent: PublishedAgent) -> Row:
    return AGENTS.row(mapping.agent_row(agent))


def to_run(row: Mapping[str, Any], step: Mapping[str, Any] | None = None) -> Run:
    """The run of ``row``, with ``step`` (a step row) as its current step."""
    return mapping.to_run(row, None if step is None else mapping.to_step(step))


def encoded(table: str, row: Mapping[str, Any]) -> Row:
    """A row from an import: its JSON columns as text, as the runner writes them."""
    values = dict(row)
    for column in schema.JSON_COLUMNS.get(table, ()):
        value = values.get(column)
        # A step's result or approval is NULL until set; a record of a None
        # result holds "null".
        unset = value is None and table == schema.steps.name
        values[column] = None if unset else json_text(value, f"{table}.{column}")
    return storable(values)
