"""The harness's exceptions, in one tree.

    HarnessError
     ├── ConfigError           a HARNESS_* variable or database URL is unusable
     ├── StoreError            the run store failed or is not migrated
     │    ├── StaleWriteError  a compare-and-swap matched no row: we are not the owner
     │    └── NoteRefused      a note beside the version matched no row: the run moved first
     ├── RunNotFound           no run with that id
     ├── AgentNotFound         no agent of that name here, nor on a live worker
     ├── ToolError             a tool step could not produce a result
     │    ├── UnknownTool      the model asked for a tool the agent does not have
     │    ├── InvalidToolArgs  arguments failed validation; the tool was not called
     │    ├── ToolResultError  the tool returned something that is not JSON
 │    └── ToolUnavailable  the tool's server could not be started or reached: retried
     ├── ModelError            the model could not produce a turn (permanent)
     │    ├── RetryableModelError  a transient provider failure (429, 5xx, timeout)
     │    └── Throttled        a shared rate limit says wait: rescheduled, not retried
     ├── InDoubt               an at_most_once call may have happened: an operator decides
     ├── NotResolvable         `harness resolve` on a run with nothing in doubt
     ├── OperatorError         an operator action that does not apply to the run as it is
     │    ├── BadForkPoint     `harness fork --at` a step that is not a settled model turn
     │    ├── NotReplayable    `harness replay` of a run that has not ended, or of a replay
     │    ├── RunConflict      a run id taken by a run of another agent or goal: not created
     │    └── DecisionConflict an operator's action the run had already gone against
     │                         (another word on the call, the run ended): nothing changed
     ├── BadCursor             a page cursor the read service did not issue
     ├── BadInput              a value from outside that no column can hold (harness.inputs)
     ├── BadArchive            an export document that is malformed, tampered or too new
     ├── ExportFailed          `harness export -o FILE` could not write FILE
     ├── ImportConflict        an imported run's id is taken by a run with other content
     └── BadRetention          `harness prune` with an unreadable age or a status not terminal

    BaseException
     └── StepInterrupted       control flow: stop working on this step now
          ├── LeaseLost        our lease lapsed or was taken over: do not act on the world
          │    └── StepTimedOut an async call ran past the step's time limit: cancelled
          └── ToolBusy         (harness.engine.executor) another executor holds the key

``StepInterrupted`` derives from ``BaseException`` so that a tool's
``except Exception`` cannot swallow it; the step task catches it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harness.records import Run


class HarnessError(Exception):
    """Root of every error the harness raises on purpose."""


class ConfigError(HarnessError):
    """A setting from the environment cannot be used."""


class StoreError(HarnessError):
    """The run store is unreachable, malformed or not migrated."""


class StaleWriteError(StoreError):
    """A guarded write matched no row: someone else wrote first."""

    def __init__(self, run_id: str, expected_version: int) -> None:
        super().__init__(f"run {run_id}: version {expected_version} is stale")
        self.run_id = run_id
        self.expected_version = expected_version


class NoteRefused(StoreError):
    """A note written beside the version (a pause asked or withdrawn, a word
    on a call not reached yet) matched no row: the run or its call is no
    longer as the note requires. The operator's action looks again."""


class RunNotFound(HarnessError):
    """No run exists with the given id."""

    def __init__(self, run_id: str, message: str | None = None) -> None:
        super().__init__(message or f"no run with id {run_id!r}")
        self.run_id = run_id


class AgentNotFound(HarnessError):
    """No agent is registered under the given name (with ``catalog``: nor
    carried by a live worker, harness.catalog)."""

    def __init__(self, name: str, known: list[str], *, catalog: bool = False) -> None:
        if catalog:
            hint = ", ".join(sorted(known)) or (
                "none: no live worker carries one (is a worker running on this store?) "
                "and HARNESS_IMPORTS registers none here"
            )
            message = f"known agents (registered here or carried by a live worker): {hint}"
        else:
            message = "registered agents: " + (
                ", ".join(sorted(known)) or "none (set HARNESS_IMPORTS)"
            )
        super().__init__(f"no agent named {name!r}; {message}")
        self.name = name


class ToolError(HarnessError):
    """A tool step failed; the message is recorded on the step."""


class UnknownTool(ToolError):
    """The model named a tool the agent does not offer."""


class InvalidToolArgs(ToolError):
    """The arguments did not validate; the tool was not called."""


class ToolResultError(ToolError):
    """The tool's return value cannot be stored as JSON."""


class ToolUnavailable(ToolError):
    """The server behind a tool (an MCP server) could not be started or
    reached, or the connection broke during the call. The step is retried
    after a back-off (``Agent.tool_retries``); ``sent``: the request may have
    reached the server, so an ``at_most_once`` call is in doubt instead."""

    def __init__(self, message: str, *, sent: bool) -> None:
        super().__init__(message)
        self.sent = sent


class RecordedToolError(ToolError):
    """A failure served from a replay's recording: the call was not made.
    ``note`` says so in the flight recorder. ``answered``: the recording's
    failure was a deferred call's error answer, which the run went on after
    (``on_tool_error="fail"`` did not end it), so neither does the replay."""

    def __init__(self, message: str, note: str, *, answered: bool = False) -> None:
        super().__init__(message)
        self.note = note
        self.answered = answered


class ModelError(HarnessError):
    """The model failed to produce a usable turn; trying again will not help."""


class RetryableModelError(ModelError):
    """A transient provider failure (rate limit, overload, 5xx, timeout, a dropped
    connection); ``retry_after`` is the provider's hint in seconds, if it gave one."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class Throttled(ModelError):
    """The provider's shared rate limit (HARNESS_RATE_LIMITS) has no room now:
    the step is rescheduled ``wait`` seconds later. Not a failure: it does not
    count as a retry. ``withdraw``: gives up the step's place in the limit's
    queue, for a run that will not come back for it."""

    def __init__(
        self, message: str, wait: float, withdraw: Callable[[], None] | None = None
    ) -> None:
        super().__init__(message)
        self.wait = wait
        self.withdraw = withdraw


def interruptions() -> tuple[type[BaseException], ...]:
    """Exceptions the process raises inside a call to stop it (Celery's soft
    time limit, billiard's ``SoftTimeLimitExceeded``, just before the pool
    kills the child): an interruption of the step, never the tool's or the
    model's failure, so nothing is recorded and the step is resumed like any
    interrupted one (an ``at_most_once`` call in doubt).

    Looked up when an exception is being matched (``except (...,
    *interruptions()):`` evaluates it then), not imported: a process that
    never loaded billiard cannot have raised its exception, and ``import
    harness`` must not load billiard for the sake of a worker."""
    billiard = sys.modules.get("billiard.exceptions")
    if billiard is None:
        return ()
    return (billiard.SoftTimeLimitExceeded,)


class StepInterrupted(BaseException):
    """Stop executing the current step; the run is left for its rightful owner."""


class InDoubt(HarnessError):
    """An ``at_most_once`` call was interrupted and may have happened."""


class NotResolvable(HarnessError):
    """The run has no in-doubt step for an operator to resolve."""


class OperatorError(HarnessError):
    """An operator action that does not apply to the run as it is (approving a
    run with no call awaiting approval, resuming a run that is not paused)."""


class BadForkPoint(OperatorError):
    """A fork asked for at a step where none can start: not a model turn, not
    recorded yet, or after a step that has not settled. ``boundaries``: the
    steps where one can."""

    def __init__(self, message: str, boundaries: list[int]) -> None:
        super().__init__(message)
        self.boundaries = boundaries


class RunConflict(OperatorError):
    """A run asked for under an explicit id (``start_run``, a fork, a replay)
    that another run holds: another agent or goal, or not that fork or
    replay. Nothing was created; ``run`` is the stored run, untouched. The
    same run asked for again is no conflict: a no-op."""

    def __init__(self, message: str, run: Run) -> None:
        super().__init__(message)
        self.run = run


class DecisionConflict(OperatorError):
    """An operator's action that did not take effect because the run had
    already gone another way: its call approved or rejected otherwise (by
    another operator, or with other arguments or reason), or the run ended
    first (a cancel that lost to the run's completion). Nothing changed;
    ``run`` is the run as it is. The same decision again is no conflict: a
    no-op."""

    def __init__(self, message: str, run: Run) -> None:
        super().__init__(message)
        self.run = run


class Diverged(HarnessError):
    """A replay's tool call left its recording (another tool or other
    arguments at that position, or no recorded call there) and may not be
    made live: the replay stops at it, and the run ends ``diverged``."""


class NotReplayable(OperatorError):
    """A replay asked of a run that has not ended: its recording is not whole."""


class BadCursor(HarnessError):
    """A page cursor that the read service did not issue, or a page size out of range."""


class BadInput(HarnessError):
    """A value from outside (an operator's text, a JSON body, a tool's result,
    a model's arguments) that the store cannot hold as it is: a NUL or a lone
    surrogate in text, NaN, nesting deeper than the limit, too long.
    ``field`` names where it was; nothing was written (harness.inputs)."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


class BadArchive(HarnessError):
    """An export document (``harness import``) that cannot be imported: not
    JSON, not a run export, written by a newer harness, or failing its content
    hash or consistency checks. Nothing was written."""


class ExportFailed(HarnessError):
    """An export document could not be written to its file (no such
    directory, a directory in its place, no space, no permission). Nothing
    was left behind: the file is whole or absent."""


class ImportConflict(HarnessError):
    """The store already holds a run with the document's id and different
    content (it moved on since, or it is another run): it is not overwritten."""


class BadRetention(HarnessError):
    """A prune request that cannot be honoured: an age that is not a number
    with a unit (``30d``, ``12h``, ``90m``, ``3600s``), or a status that is not
    terminal (only finished runs are ever pruned). Nothing was deleted."""


class LeaseLost(StepInterrupted):
    """Our lease lapsed or was taken over: we must not call the tool now."""


class StepTimedOut(LeaseLost):
    """An ``async def`` tool ran past the step's time limit: its coroutine was
    cancelled (its ``finally`` blocks ran). Nothing is recorded; like a plain
    tool stopped at the limit, the step's lease, no longer renewed past the
    limit, lapses, and recovery resumes the step (an ``at_most_once`` call
    goes in doubt). A :class:`LeaseLost`: the runner treats it as one."""
