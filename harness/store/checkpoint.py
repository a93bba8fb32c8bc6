"""The checkpoint a store applies atomically: everything one transition writes.

A :class:`Checkpoint` is the run row's changes (guarded by compare-and-swap on
``version``), step rows patched and added, flight-recorder events and the
call's idempotency record. A store applies it in one transaction or not at
all; the transitions (harness.engine.transitions) are what build them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any, ClassVar

from harness.errors import NoteRefused
from harness.records import JSON, Approval, Run, RunStatus, Step, StepKind, StepStatus, Wait


class _Keep(Enum):
    KEEP = "keep"


#: Marks a column a patch leaves as it is.
KEEP = _Keep.KEEP

#: The event of a model call charged after its run ended (:meth:`Store.add_late_usage`).
BILLED = "billed"


#: A patch class's column fields, read once: ``dataclasses.fields`` builds its
#: answer anew at every call, three or four times a step.
_COLUMNS: dict[type, tuple[str, ...]] = {}


def _columns(patch: type) -> tuple[str, ...]:
    names = _COLUMNS.get(patch)
    if names is None:
        names = _COLUMNS[patch] = tuple(f.name for f in fields(patch) if f.name != "index")
    return names


def _present(patch: object) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name in _columns(type(patch)):
        value = getattr(patch, name)
        if value is KEEP:
            continue
        values[name] = value.value if isinstance(value, Enum) else value
    return values


@dataclass(frozen=True)
class RunPatch:
    """Columns of the run row to change; everything else is kept."""

    status: RunStatus | _Keep = KEEP
    cursor: int | _Keep = KEEP
    step_count: int | _Keep = KEEP
    owner: str | _Keep | None = KEEP
    lease_expires_at: float | _Keep | None = KEEP
    wake_at: float | _Keep | None = KEEP
    result: str | _Keep | None = KEEP
    error: str | _Keep | None = KEEP
    resends: int | _Keep = KEEP
    blocked: str | _Keep | None = KEEP
    input_tokens: int | _Keep = KEEP
    output_tokens: int | _Keep = KEEP
    cost_usd: float | _Keep = KEEP
    max_tokens: int | _Keep | None = KEEP
    max_cost_usd: float | _Keep | None = KEEP
    pause_requested: bool | _Keep = KEEP
    deferred_from: int | _Keep | None = KEEP
    inbox_at: float | _Keep | None = KEEP
    max_steps: int | _Keep | None = KEEP

    def values(self) -> dict[str, Any]:
        return _present(self)

    @classmethod
    def stopped(
        cls, status: RunStatus, error: str | None = None, result: str | _Keep | None = KEEP
    ) -> RunPatch:
        """A run leaving the movable states, for good (completed, failed,
        cancelled) or until an operator acts (waiting): unleased, and never
        woken by the sweeper."""
        return cls(
            status=status,
            error=error,
            result=result,
            owner=None,
            lease_expires_at=None,
            wake_at=None,
            # A pause asked for is moot once the run has ended (not while it waits).
            pause_requested=False if status.terminal else KEEP,
        )


@dataclass(frozen=True)
class StepPatch:
    """Columns of one step row to change. ``result`` is stored as JSON.
    ``attempts`` sets the count; ``bump_attempts`` adds one to the stored count."""

    index: int
    kind: StepKind | _Keep = KEEP
    status: StepStatus | _Keep = KEEP
    attempts: int | _Keep = KEEP
    result: JSON | _Keep = KEEP
    error: str | _Keep | None = KEEP
    started_at: float | _Keep | None = KEEP
    finished_at: float | _Keep | None = KEEP
    retries: int | _Keep = KEEP
    approval: Approval | _Keep | None = KEEP
    args: dict[str, JSON] | _Keep = KEEP
    wait: Wait | _Keep | None = KEEP
    bump_attempts: bool = False

    def values(self) -> dict[str, Any]:
        values = _present(self)
        values.pop("bump_attempts")
        return values


@dataclass(frozen=True)
class EventDraft:
    """A flight-recorder row; its version is the checkpoint's new version."""

    to_status: str
    from_status: str | None = None
    step_index: int | None = None
    detail: str | None = None


@dataclass(frozen=True)
class ToolRecord:
    """A tool call's result for the durable idempotency record (first writer wins)."""

    key: str
    step_index: int
    tool: str
    result: JSON


@dataclass(frozen=True)
class Checkpoint:
    """One atomic transition of a run, guarded by ``expected_version``.

    ``tool_record``: the result of the call the step made, stored in the
    idempotency record in the same transaction as the step's result.
    """

    run_id: str
    expected_version: int
    worker: str | None
    now: float
    run: RunPatch = field(default_factory=RunPatch)
    steps: tuple[StepPatch, ...] = ()
    new_steps: tuple[Step, ...] = ()
    events: tuple[EventDraft, ...] = ()
    tool_record: ToolRecord | None = None
    #: Kept signals (their row ids) this transition takes, each for the step
    #: index beside it: a user's messages made steps. Once: a signal taken
    #: already fails the whole checkpoint (StaleWriteError).
    take_signals: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class ClaimGuard:
    """The state a claim written without a load (:meth:`Store.claim_loaded`)
    must find, besides its version: the run running, unleased, not asked to
    pause and not a replay, of ``agent``, its cursor at ``cursor``, and the
    step there a PENDING call of ``tool`` after ``attempts`` attempts. The
    state in which :func:`harness.engine.transitions.claim_pending` is the
    claim the runner would write after a load.

    :meth:`holds` is the definition; the SQL store's statement
    (``schema.claim_guard``) is built from :data:`RUN_STATUS`,
    :data:`STEP_KIND` and :data:`STEP_STATUS`, and the contract suite checks
    that both agree on every backend (tests/contract/test_claim_guard.py)."""

    cursor: int
    agent: str
    tool: str
    attempts: int

    #: The statuses and kind the guard requires, whatever the hint.
    RUN_STATUS: ClassVar[RunStatus] = RunStatus.RUNNING
    STEP_KIND: ClassVar[StepKind] = StepKind.TOOL
    STEP_STATUS: ClassVar[StepStatus] = StepStatus.PENDING

    def holds(self, run: Run, version: int) -> bool:
        """Does ``run``, loaded with its step at the cursor, let a claim at
        ``version`` guarded so land?"""
        step = run.current
        return (
            run.version == version
            and run.status is self.RUN_STATUS
            and run.owner is None
            and not run.pause_requested
            and run.replay_of is None
            and run.cursor == self.cursor
            and run.agent == self.agent
            and step is not None
            and step.index == self.cursor
            and step.kind is self.STEP_KIND
            and step.status is self.STEP_STATUS
            and step.tool == self.tool
            and step.attempts == self.attempts
        )


@dataclass(frozen=True)
class PauseNote:
    """An operator's ask that a run stop at its next step boundary
    (``requested``), or its withdrawal, with its event: written beside the
    version, so a step in flight still records its result, and only while
    the run's status is one of ``while_status`` and its ask is not already
    so (:meth:`Store.request_pause`)."""

    run_id: str
    requested: bool
    while_status: frozenset[RunStatus]
    event: EventDraft
    worker: str
    now: float


@dataclass(frozen=True)
class ApprovalNote:
    """An operator's word on step ``index``, a call the run has not reached,
    (and the arguments to call it with, if edited), with its event: written
    beside the version, and only while the step is ``while_status`` and has
    no word yet (:meth:`Store.note_approval`)."""

    run_id: str
    index: int
    approval: Approval
    args: dict[str, JSON] | None
    while_status: StepStatus
    event: EventDraft
    worker: str
    now: float


@dataclass(frozen=True)
class Completion:
    """The answer to step ``index``, a deferred call (a callback, a completion,
    a signal, a child run's end, its timeout or a sleep's wake-up), with its
    event: written beside the version, so a step in flight elsewhere in the
    run is not fenced, and only while the step is ``deferred``: the first
    answer wins, and every other matches no row (:meth:`Store.complete_deferred`).

    ``signal``: the kept signal (its row id) this answer takes, once.
    ``usage``: a child run's tokens and cost, added to the run's own.
    A run waiting on its deferred steps gets ``wake_at = now``, so the
    sweeper moves it on if whoever wrote this dies before it does."""

    run_id: str
    index: int
    status: StepStatus
    result: JSON
    error: str | None
    event: EventDraft
    worker: str
    now: float
    signal: int | None = None
    usage: tuple[int, int, float] | None = None


def note_refused(run_id: str, draft: EventDraft) -> NoteRefused:
    """What every store raises for a note that no longer applies (the run or
    step is not as the note requires): nothing was written."""
    return NoteRefused(f"run {run_id}: the note ({draft.to_status}) no longer applies")
