"""Rows to records and back, as both backends store them.

The SQL store (:mod:`harness.store.sql`) and the memory store
(:mod:`harness.store.memory`) hold the same rows: the columns of
:mod:`harness.store.schema`, JSON columns as the text
:func:`harness.inputs.json_text` writes, every value through
:func:`harness.inputs.storable`. So one mapping serves both; each backend
adds only what is its own (the SQL store moves large results to blobs, the
memory store types a row as its table's columns read back).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from typing import Any

from harness.inputs import json_text, storable
from harness.records import (
    JSON,
    Approval,
    Event,
    ForkOrigin,
    ParentRef,
    ReplayOrigin,
    Run,
    RunStatus,
    Step,
    StepKind,
    StepStatus,
    Wait,
)
from harness.store.checkpoint import Checkpoint, EventDraft, StepPatch, ToolRecord
from harness.store.schema import tables
from harness.store.values import PublishedAgent, PublishedTool, SignalDraft, Sweep, SweepKind

Row = dict[str, Any]


def loads(text: str | None) -> JSON:
    """A JSON column's value; NULL is None."""
    return None if text is None else json.loads(text)


# -- records to rows ---------------------------------------------------------


def run_values(cp: Checkpoint) -> Row:
    """The run row's new values in ``cp``, as stored."""
    return storable({**cp.run.values(), "updated_at": cp.now})


def new_incarnation() -> str:
    """A fresh nonce for a run row this store inserts (``Run.incarnation``):
    64 random bits, so two rows under one id never share one."""
    return secrets.token_hex(8)


def run_row(run: Run, wake_at: float) -> Row:
    """The row inserting a new run: unleased, woken at ``wake_at``, of a
    new incarnation (whatever ``run`` says)."""
    row = {**run.to_dict(), "wake_at": wake_at, "owner": None}
    row["incarnation"] = new_incarnation()
    row.pop("lease_expires_at")
    origin = row.pop("forked_from")
    row["forked_from_run"] = None if origin is None else origin["run_id"]
    row["forked_from_step"] = None if origin is None else origin["step"]
    replay = row.pop("replay_of")
    row["replay_of_run"] = None if replay is None else replay["run_id"]
    row["replay_live_reads"] = False if replay is None else replay["live_read_only"]
    parent = row.pop("parent")
    row["parent_run"] = None if parent is None else parent["run_id"]
    row["parent_step"] = None if parent is None else parent["step"]
    return storable(row)


def step_row(step: Step) -> Row:
    """A step's row, its result whole (the SQL store may move it to a blob)."""
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
        "wait": None if step.wait is None else json_text(step.wait.to_json(), "wait"),
    }
    return storable(row)


def step_values(patch: StepPatch) -> Row:
    """The columns ``patch`` sets, encoded as stored (``bump_attempts`` aside)."""
    values = patch.values()
    for column in ("result", "args"):
        if column in values:
            values[column] = json_text(values[column], column)
    if values.get("approval") is not None:
        values["approval"] = json_text(values["approval"].to_json(), "approval")
    if values.get("wait") is not None:
        values["wait"] = json_text(values["wait"].to_json(), "wait")
    return storable(values)


def record_row(run_id: str, record: ToolRecord, now: float) -> Row:
    """A durable idempotency record's row, written by run ``run_id`` at ``now``."""
    row = {
        "key": record.key,
        "run_id": run_id,
        "step_index": record.step_index,
        "tool": record.tool,
        "result": json_text(record.result, "result"),
        "created_at": now,
    }
    return storable(row)


def event_row(run_id: str, version: int, worker: str | None, at: float, draft: EventDraft) -> Row:
    """The flight recorder's row of ``draft``, at the run's ``version``."""
    row = {
        "run_id": run_id,
        "version": version,
        "step_index": draft.step_index,
        # Plain text, as a column gives it back (a draft may carry a status enum).
        "from_status": None if draft.from_status is None else str(draft.from_status),
        "to_status": str(draft.to_status),
        "worker": worker,
        "at": at,
        "detail": draft.detail,
    }
    return storable(row)


def signal_row(draft: SignalDraft) -> Row:
    """A kept signal's new row (its id is the store's to give), not taken yet."""
    row = {
        "run_id": draft.run_id,
        "name": draft.name,
        "signal_id": draft.signal_id,
        "data": json_text(draft.data, "data"),
        "error": draft.error,
        "created_at": draft.now,
        "taken_step": None,
        "taken_at": None,
    }
    return storable(row)


def sweep_row(sweep: Sweep) -> Row:
    row = {
        "kind": sweep.kind.value,
        "worker": sweep.worker,
        "started_at": sweep.started_at,
        "finished_at": sweep.finished_at,
        "redispatched": sweep.redispatched,
    }
    return storable(row)


def agent_row(agent: PublishedAgent) -> Row:
    row = {
        "worker": agent.worker,
        "agent": agent.agent,
        "definition_hash": agent.definition_hash,
        "tools": json_text([tool.to_dict() for tool in agent.tools], "tools"),
        "started_at": agent.started_at,
        "last_seen": agent.last_seen,
    }
    return storable(row)


# -- rows to records ---------------------------------------------------------


def to_step(row: Mapping[Any, Any], prefix: str = "") -> Step:
    """The step in ``row``, its columns named ``prefix`` + column (a join
    names the step at a run's cursor ``step_<column>``)."""
    return Step(
        run_id=row[f"{prefix}run_id"],
        index=row[f"{prefix}idx"],
        kind=StepKind(row[f"{prefix}kind"]),
        status=StepStatus(row[f"{prefix}status"]),
        attempts=row[f"{prefix}attempts"],
        tool=row[f"{prefix}tool"],
        args=json.loads(row[f"{prefix}args"]),
        result=loads(row[f"{prefix}result"]),
        error=row[f"{prefix}error"],
        started_at=row[f"{prefix}started_at"],
        finished_at=row[f"{prefix}finished_at"],
        retries=row[f"{prefix}retries"],
        approval=_approval(row[f"{prefix}approval"]),
        wait=_wait(row[f"{prefix}wait"]),
    )


def _wait(text: str | None) -> Wait | None:
    return None if text is None else Wait.from_json(json.loads(text))


def _approval(text: str | None) -> Approval | None:
    return None if text is None else Approval.from_json(json.loads(text))


def to_run(row: Mapping[Any, Any], current: Step | None = None) -> Run:
    """The run of ``row``, with ``current`` as its step at the cursor."""
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
        pause_requested=bool(row["pause_requested"]),
        forked_from=_fork_origin(row),
        replay_of=_replay_origin(row),
        parent=None
        if row["parent_run"] is None
        else ParentRef(row["parent_run"], row["parent_step"]),
        deferred_from=row["deferred_from"],
        inbox_at=row["inbox_at"],
        max_steps=row["max_steps"],
        incarnation=row["incarnation"],
        current=current,
    )


def _fork_origin(row: Mapping[Any, Any]) -> ForkOrigin | None:
    if row["forked_from_run"] is None:
        return None
    return ForkOrigin(row["forked_from_run"], row["forked_from_step"])


def _replay_origin(row: Mapping[Any, Any]) -> ReplayOrigin | None:
    if row["replay_of_run"] is None:
        return None
    return ReplayOrigin(row["replay_of_run"], bool(row["replay_live_reads"]))


def to_event(row: Mapping[Any, Any]) -> Event:
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


def to_sweep(row: Mapping[Any, Any]) -> Sweep:
    return Sweep(
        kind=SweepKind(row["kind"]),
        worker=row["worker"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        redispatched=row["redispatched"],
    )


def to_published(row: Mapping[Any, Any]) -> PublishedAgent:
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


def to_record(row: Mapping[Any, Any]) -> ToolRecord:
    return ToolRecord(row["key"], row["step_index"], row["tool"], json.loads(row["result"]))


# -- export and import (harness.runs.archive) ------------------------------


def decoded(table: str, row: Mapping[Any, Any]) -> Row:
    """A row for an export: its JSON columns as values (a blob's resolved by
    then), without the columns that say where they are stored or that are
    this store's own (:data:`~harness.store.schema.LOCAL_COLUMNS`)."""
    stored = (*tables.STORAGE_COLUMNS.get(table, ()), *tables.LOCAL_COLUMNS.get(table, ()))
    values = {c: v for c, v in row.items() if c not in stored}
    for column in tables.JSON_COLUMNS.get(table, ()):
        values[column] = loads(values[column])
    return values


def imported_run(row: Mapping[str, Any]) -> Row:
    """An imported run's row: the document's columns, and this store's own
    made fresh (an incarnation is never carried over: the run imported is
    another than any this store, or a worker, held under its id before)."""
    local = tables.LOCAL_COLUMNS[tables.runs.name]
    return {**{c: v for c, v in row.items() if c not in local}, "incarnation": new_incarnation()}
