"""The export document's shape: one pydantic model per section, every
column of its table named (a test holds them equal to the tables).

Its own module because both sides of an import need it and neither owns it:
harness.runs.archive reads and writes documents, harness.runs.admission
checks one before anything is written, and each calls the other's names
only through these.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from harness.records import RunStatus, StepKind, StepStatus

#: The largest integer a column holds (PostgreSQL's ``integer``).
MAX_INT = 2**31 - 1
#: The latest time a document may name: 2100-01-01T00:00:00Z.
MAX_TIME = 4_102_444_800.0
#: The most a run may have cost, or be allowed to (US dollars).
MAX_USD = 1e12
RunId = Annotated[str, Field(min_length=1, max_length=128)]
Name = Annotated[str, Field(max_length=200)]
#: Every integer column is PostgreSQL's ``integer``; SQLite would take more.
Count = Annotated[int, Field(ge=0, le=MAX_INT)]
#: Unix seconds, 1970 to 2100.
Time = Annotated[float, Field(ge=0, le=MAX_TIME)]
Usd = Annotated[float, Field(ge=0, le=MAX_USD)]


class _Strict(BaseModel):
    """Types checked without coercion, unknown fields refused."""

    # No NaN or infinity in a float column: PostgreSQL would take them, and a
    # run "created at NaN" is never due, never prunable.
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, allow_inf_nan=False)


class Counts(_Strict):
    steps: Count
    events: Count
    tool_records: Count
    signals: Count = 0  # migration 0014: present only beside a ``signals`` section


class Manifest(_Strict):
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    exported_at: Annotated[str, Field(max_length=64)]
    harness_version: Annotated[str, Field(max_length=64)]
    counts: Counts


class RunDoc(_Strict):
    """Every column of ``harness_runs``."""

    run_id: RunId
    agent: Annotated[str, Field(min_length=1, max_length=200)]
    goal: str
    status: Annotated[RunStatus, Field(strict=False)]  # from its JSON string
    cursor: Count
    version: Count
    step_count: Count
    owner: Name | None
    lease_expires_at: Time | None
    wake_at: Time | None
    result: str | None
    error: str | None
    created_at: Time
    updated_at: Time
    resends: Count
    blocked: str | None
    input_tokens: Count
    output_tokens: Count
    cost_usd: Usd
    # As `harness resume` raises them: at least one token, more than nothing.
    max_tokens: Annotated[int, Field(ge=1, le=MAX_INT)] | None
    max_cost_usd: Annotated[float, Field(gt=0, le=MAX_USD)] | None
    pause_requested: bool
    forked_from_run: RunId | None
    forked_from_step: Count | None
    # Added without a new schema version: a document written before replays
    # existed has neither, and is not a replay.
    replay_of_run: RunId | None = None
    replay_live_reads: bool = False
    # Added without a new schema version (migration 0014): a document written
    # before waits existed has none of them.
    parent_run: RunId | None = None
    parent_step: Count | None = None
    deferred_from: Count | None = None
    # Migration 0015, as the others above.
    inbox_at: Time | None = None
    max_steps: Annotated[int, Field(ge=1, le=MAX_INT)] | None = None


class StepDoc(_Strict):
    """Every column of ``harness_steps``."""

    run_id: RunId
    idx: Count
    kind: Annotated[StepKind, Field(strict=False)]
    status: Annotated[StepStatus, Field(strict=False)]
    attempts: Count
    tool: Name | None
    args: dict[str, Any]
    result: Any
    error: str | None
    started_at: Time | None
    finished_at: Time | None
    retries: Count
    approval: dict[str, Any] | None
    wait: dict[str, Any] | None = None  # migration 0014, as parent_run


class EventDoc(_Strict):
    """Every column of ``harness_events`` but ``id``, which the importing store assigns."""

    run_id: RunId
    version: Count
    step_index: Count | None
    from_status: Annotated[str, Field(max_length=32)] | None
    to_status: Annotated[str, Field(max_length=32)]
    worker: Name | None
    at: Time
    detail: str | None


class ToolRecordDoc(_Strict):
    """Every column of ``harness_tool_results``."""

    key: Name
    run_id: RunId
    step_index: Count
    tool: Name
    result: Any
    created_at: Time


class SignalDoc(_Strict):
    """Every column of ``harness_signals`` but ``id``, which the importing
    store assigns: a signal kept for the run, or taken by one of its steps."""

    run_id: RunId
    name: Annotated[str, Field(min_length=1, max_length=200)]
    signal_id: Name | None
    data: Any
    error: str | None
    created_at: Time
    taken_step: Count | None
    taken_at: Time | None


class OfferedToolDoc(_Strict):
    """One tool of a toolset as the run was offered it (harness.toolsets.OfferedTool)."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    remote: Name
    description: str
    schema_: Annotated[dict[str, Any], Field(alias="schema")]
    effect: Literal["read_only", "idempotent", "at_most_once"]
    requires_approval: bool


class Document(_Strict):
    format: Literal["harness-run"]
    schema_version: Literal[1]
    manifest: Manifest
    run: RunDoc
    steps: list[StepDoc]
    events: list[EventDoc]
    tool_records: list[ToolRecordDoc]
    # Migration 0014, without a new schema version: written only for a run
    # that has signals, so any other run's document is what an older harness
    # wrote (and reads).
    signals: list[SignalDoc] = []
    # Migration 0017, as signals: only for a run whose agent has toolsets (MCP
    # servers), the record of the tools it was offered (``harness_run_tools``),
    # by toolset name.
    offered_tools: dict[Name, list[OfferedToolDoc]] | None = None
