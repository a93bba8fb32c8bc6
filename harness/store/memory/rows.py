"""Rows of the in-memory store, shaped as the SQL tables hold them.

The memory store keeps each table's rows as column-to-value dicts with the
columns, defaults and types that :mod:`harness.store.schema` declares, and
its JSON columns as the text :func:`harness.inputs.json_text` writes. So a
value goes through the same boundary as on SQLite and PostgreSQL (the same
text refused, the same NUL or lone surrogate replaced by
:func:`harness.inputs.storable`), a read decodes a fresh value each time (no
caller ever holds a stored object), and an export of a memory run is the
document an SQL store writes. Blobs are never needed: a row holds any size.

The mappings from rows to records mirror :mod:`harness.store.sql`'s.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from sqlalchemy import Boolean, Float, Table

from harness.errors import StoreError
from harness.inputs import json_text, storable
from harness.records import (
    JSON,
    Approval,
    Event,
    ForkOrigin,
    ReplayOrigin,
    Run,
    RunStatus,
    Step,
    StepKind,
    StepStatus,
)
from harness.store import schema
from harness.store.checkpoint import EventDraft, StepPatch, ToolRecord
from harness.store.values import PublishedAgent, PublishedTool, Sweep, SweepKind

Row = dict[str, Any]


class _Columns:
    """What the memory store needs of one table's declaration."""

    def __init__(self, table: Table) -> None:
        self.name = table.name
        # Ids are the store's to assign; a blob reference is never needed here.
        stored = schema.STORAGE_COLUMNS.get(table.name, ())
        self.names = tuple(
            c.name for c in table.c if c.autoincrement is not True and c.name not in stored
        )
        self.floats = frozenset(c.name for c in table.c if isinstance(c.type, Float))
        self.booleans = frozenset(c.name for c in table.c if isinstance(c.type, Boolean))
        self.defaults: dict[str, Any] = {}
        for column in table.c:
            default = column.server_default
            if default is None:
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


def _loads(text: str | None) -> JSON:
    return None if text is None else json.loads(text)


def run_row(run: Run, wake_at: float) -> Row:
    """The row inserting a new run, unleased, woken at ``wake_at``: built
    from ``run.to_dict()`` as :func:`harness.store.sql._run_row` builds it."""
    row = {**run.to_dict(), "wake_at": wake_at, "owner": None}
    row.pop("lease_expires_at")
    origin = row.pop("forked_from")
    row["forked_from_run"] = None if origin is None else origin["run_id"]
    row["forked_from_step"] = None if origin is None else origin["step"]
    replay = row.pop("replay_of")
    row["replay_of_run"] = None if replay is None else replay["run_id"]
    row["replay_live_reads"] = False if replay is None else replay["live_read_only"]
    return RUNS.row(storable(row))


def step_row(step: Step) -> Row:
    row = {
        "run_id": step.run_id,
        "idx": step.index,
        "kind": step.kind.value,
        "status": step.status.value,
        "attempts": step.attempts,
        "tool": step.tool,
        "args": json_text(step.args, "args"),
        "result": None if step.result is None else json_text(step.result, "result"),
        "error": step.error,
        "started_at": step.started_at,
        "finished_at": step.finished_at,
        "retries": step.retries,
        "approval": None
        if step.approval is None
        else json_text(step.approval.to_json(), "approval"),
    }
    return STEPS.row(storable(row))


def step_values(patch: StepPatch) -> Row:
    """The columns ``patch`` sets, encoded as stored (``bump_attempts`` aside)."""
    values = patch.values()
    for column in ("result", "args"):
        if column in values:
            values[column] = json_text(values[column], column)
    if values.get("approval") is not None:
        values["approval"] = json_text(values["approval"].to_json(), "approval")
    return STEPS.typed(storable(values))


def record_row(run_id: str, record: ToolRecord, now: float) -> Row:
    row = {
        "key": record.key,
        "run_id": run_id,
        "step_index": record.step_index,
        "tool": record.tool,
        "result": json_text(record.result, "result"),
        "created_at": now,
    }
    return TOOL_RESULTS.row(storable(row))


def event_row(run_id: str, version: int, worker: str | None, at: float, draft: EventDraft) -> Row:
    row = {
        "run_id": run_id,
        "version": version,
        "step_index": draft.step_index,
        "from_status": draft.from_status,
        "to_status": draft.to_status,
        "worker": worker,
        "at": at,
        "detail": draft.detail,
    }
    return EVENTS.row(storable(row))


def agent_row(agent: PublishedAgent) -> Row:
    row = {
        "worker": agent.worker,
        "agent": agent.agent,
        "definition_hash": agent.definition_hash,
        "tools": json_text([tool.to_dict() for tool in agent.tools], "tools"),
        "started_at": agent.started_at,
        "last_seen": agent.last_seen,
    }
    return AGENTS.row(storable(row))


def to_step(row: Mapping[str, Any]) -> Step:
    return Step(
        run_id=row["run_id"],
        index=row["idx"],
        kind=StepKind(row["kind"]),
        status=StepStatus(row["status"]),
        attempts=row["attempts"],
        tool=row["tool"],
        args=json.loads(row["args"]),
        result=_loads(row["result"]),
        error=row["error"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        retries=row["retries"],
        approval=None if row["approval"] is None else Approval.from_json(_loads(row["approval"])),
    )


def to_run(row: Mapping[str, Any], step: Mapping[str, Any] | None = None) -> Run:
    """The run of ``row``, with ``step`` (a step row) as its current step."""
    forked = row["forked_from_run"]
    replayed = row["replay_of_run"]
    return Run(
        run_id=row["run_id"],
        agent=row["agent"],
        goal=row["goal"],
        status=RunStatus(row["status"]),
        cursor=row["cursor"],
        version=row["version"],
        step_count=row["step_count"],
        owner=row["owner"],
        lease_expires_at=row["lease_expires_at"],
        wake_at=row["wake_at"],
        result=row["result"],
        error=row["error"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        resends=row["resends"],
        blocked=row["blocked"],
        input_tokens=row["input_tokens"],
        output_tokens=row["output_tokens"],
        cost_usd=row["cost_usd"],
        max_tokens=row["max_tokens"],
        max_cost_usd=row["max_cost_usd"],
        pause_requested=row["pause_requested"],
        forked_from=None if forked is None else ForkOrigin(forked, row["forked_from_step"]),
        replay_of=None if replayed is None else ReplayOrigin(replayed, row["replay_live_reads"]),
        current=None if step is None else to_step(step),
    )


def to_event(row: Mapping[str, Any]) -> Event:
    return Event(
        id=row["id"],
        run_id=row["run_id"],
        version=row["version"],
        step_index=row["step_index"],
        from_status=row["from_status"],
        to_status=row["to_status"],
        worker=row["worker"],
        at=row["at"],
        detail=row["detail"],
    )


def to_sweep(row: Mapping[str, Any]) -> Sweep:
    return Sweep(
        kind=SweepKind(row["kind"]),
        worker=row["worker"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        redispatched=row["redispatched"],
    )


def to_published(row: Mapping[str, Any]) -> PublishedAgent:
    tools = tuple(
        PublishedTool(t["name"], t["effect"], bool(t["requires_approval"]))
        for t in json.loads(row["tools"])
    )
    return PublishedAgent(
        row["worker"],
        row["agent"],
        row["definition_hash"],
        tools,
        row["started_at"],
        row["last_seen"],
    )


def decoded(table: str, row: Mapping[str, Any]) -> Row:
    """A row for an export: its JSON columns as values (as SQLStore.run_rows)."""
    values = dict(row)
    for column in schema.JSON_COLUMNS.get(table, ()):
        values[column] = _loads(values[column])
    return values


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
