"""The transitions of a run's steps, as the worker makes them: claim,
record what a step's execution produced, back off, reschedule, fail or
pause before executing, wait for approval (the sweeper's re-sends are in
:mod:`~harness.engine.transitions.resends`).

Step code says what happened (a :class:`StepOutcome`, its
:class:`Happened`); :func:`settle` alone says what that makes of the step
and of the run, and :func:`record` writes it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from typing import NamedTuple

from harness.engine.transitions.owners import BACKED_OFF, LAPSED, RESCHEDULED, takeover
from harness.models import Usage
from harness.records import JSON, Run, RunStatus, Step, StepKind, StepStatus, Wait
from harness.store import KEEP, Checkpoint, EventDraft, RunPatch, StepPatch, ToolRecord

#: The event detail of a user's message made a step.
USER_SAID = "the user's message"


class Happened(StrEnum):
    """What executing a step produced, as the step code says it; what each
    makes of the step and the run is :func:`settle`'s to say."""

    #: A tool call's result, or a model turn asking for tool calls.
    DONE = "done"
    #: The model's final answer.
    FINAL = "final"
    #: The tool call failed (or could not be made: an unknown tool, bad arguments).
    TOOL_ERROR = "tool_error"
    #: An operator rejected the call: never made, and the model is told why.
    REJECTED = "rejected"
    #: An ``at_most_once`` call that may have acted: only an operator can say.
    IN_DOUBT = "in_doubt"
    #: A replay's call off its recording: never made.
    DIVERGED = "diverged"
    #: The model could not produce the turn, for good.
    MODEL_FAILED = "model_failed"
    #: A value in the outcome could not be stored (one that no door checked).
    UNSTORABLE = "unstorable"
    #: The call started something that answers later (harness.Deferred, a
    #: Sleep, a child run): the run goes on with the turn's other calls, and
    #: its next model turn waits for the answer.
    DEFERRED = "deferred"


@dataclass(frozen=True)
class StepOutcome:
    """What executing one step produced; :func:`record` writes it."""

    happened: Happened
    result: JSON = None
    error: str | None = None
    new_steps: tuple[Step, ...] = ()
    #: The tool call's result for the durable idempotency record, stored in
    #: the same transaction (first writer wins).
    record: ToolRecord | None = None
    #: The model's final answer (:attr:`Happened.FINAL`): the run's result.
    final: str | None = None
    #: A model step's tokens, as the provider reported them, and their price.
    usage: Usage | None = None
    cost_usd: float | None = None
    #: How the outcome was obtained, for the step's event (a replay's call
    #: served from its recording, or made live).
    note: str | None = None
    #: What a deferred call waits for (:attr:`Happened.DEFERRED`).
    wait: Wait | None = None
    #: A replay's served failure that was a deferred call's error answer:
    #: the model is told, and ``on_tool_error="fail"`` does not end the run.
    answered: bool = False
    #: Kept messages the new steps take (a final answer steered, harness.engine.
    #: transitions.conversation): (signal row id, step index) each.
    takes: tuple[tuple[int, int], ...] = ()

    @property
    def status(self) -> StepStatus:
        """The step's status once this outcome is recorded."""
        return _STEP_STATUS[self.happened]

    @property
    def detail(self) -> str | None:
        """The step event's detail: the error, with the note before it."""
        if self.note is None or self.error is None:
            return self.note or self.error
        return f"{self.note}: {self.error}"

    @property
    def next_cursor_offset(self) -> int:
        """An in-doubt step keeps the cursor; every other outcome moves past it,
        to the first new step still to run (a user's message, made a step as
        it was, is done already)."""
        if self.happened is Happened.IN_DOUBT:
            return 0
        first = self.new_steps[0].index if self.new_steps else 0
        for step in self.new_steps:
            if step.status is StepStatus.PENDING:
                return step.index - first + 1
        return 1


#: The step's status after each outcome.
_STEP_STATUS = {
    Happened.DONE: StepStatus.DONE,
    Happened.FINAL: StepStatus.DONE,
    Happened.TOOL_ERROR: StepStatus.FAILED,
    Happened.REJECTED: StepStatus.FAILED,
    Happened.IN_DOUBT: StepStatus.IN_DOUBT,
    Happened.DIVERGED: StepStatus.FAILED,
    Happened.MODEL_FAILED: StepStatus.FAILED,
    Happened.UNSTORABLE: StepStatus.FAILED,
    Happened.DEFERRED: StepStatus.DEFERRED,
}


class Settled(NamedTuple):
    """What an outcome makes of its run: its next status, and why it stopped."""

    status: RunStatus
    error: str | None = None


def settle(step: Step, outcome: StepOutcome, *, fail_on_tool_error: bool) -> Settled:
    """The run's next status after ``outcome`` of ``step``: a final answer
    completes it; a call in doubt makes it wait for an operator; a replay's
    call off its recording ends it diverged; a model failure fails it, and so
    does a tool's failure when the agent says so (``on_tool_error="fail"``),
    or a value that cannot be stored where either would. A rejected call, or
    a tool's failure the model is told of, moves it on."""
    happened, error = outcome.happened, outcome.error
    if happened is Happened.FINAL:
        return Settled(RunStatus.COMPLETED)
    if happened is Happened.IN_DOUBT:
        return Settled(RunStatus.WAITING, error)
    if happened is Happened.DIVERGED:
        return Settled(RunStatus.DIVERGED, error)
    if happened is Happened.MODEL_FAILED:
        return Settled(RunStatus.FAILED, error)
    if happened is Happened.TOOL_ERROR and fail_on_tool_error and not outcome.answered:
        return Settled(RunStatus.FAILED, f"step {step.index} failed: {error}")
    if happened is Happened.UNSTORABLE and (step.kind is StepKind.MODEL or fail_on_tool_error):
        return Settled(RunStatus.FAILED, error)
    return Settled(RunStatus.RUNNING)


@dataclass(frozen=True)
class Reschedule:
    """What executing a step produced instead of an outcome: come back in
    ``delay`` seconds. ``retry``: a transient failure, counted in the step's
    ``retries``; otherwise a wait for a shared rate limit, counted nowhere."""

    delay: float
    reason: str
    retry: bool


def claim(run: Run, step: Step, *, worker: str, now: float, ttl: float) -> Checkpoint:
    """Take the lease and mark the step RUNNING ("about to execute"), an attempt.

    A step found RUNNING was interrupted (its executor died or lost the run),
    and is counted as recovered, unless a back-off left it so.
    """
    events = list(takeover(run))
    if step.status is StepStatus.RUNNING and run.owner != BACKED_OFF:
        detail = f"attempt {step.attempts} was interrupted"
        events.append(EventDraft("recovered_running", step_index=step.index, detail=detail))
    if run.status is RunStatus.PENDING:
        events.append(EventDraft(RunStatus.RUNNING, RunStatus.PENDING))
    events.append(
        EventDraft(StepStatus.RUNNING, step.status, step.index, f"attempt {step.attempts + 1}")
    )
    return _claimed(run.run_id, run.version, step.index, events, worker=worker, now=now, ttl=ttl)


def claim_pending(
    run_id: str, version: int, index: int, attempts: int, *, worker: str, now: float, ttl: float
) -> Checkpoint:
    """:func:`claim` of a running, unleased run at ``version`` whose step
    ``index`` is PENDING after ``attempts`` attempts: the checkpoint a worker
    can write without loading the run, when the message says that is the
    run's state (:class:`harness.store.ClaimGuard` makes the write hold only
    if it is)."""
    event = EventDraft(StepStatus.RUNNING, StepStatus.PENDING, index, f"attempt {attempts + 1}")
    return _claimed(run_id, version, index, [event], worker=worker, now=now, ttl=ttl)


def _claimed(
    run_id: str,
    version: int,
    index: int,
    events: list[EventDraft],
    *,
    worker: str,
    now: float,
    ttl: float,
) -> Checkpoint:
    return Checkpoint(
        run_id,
        version,
        worker,
        now,
        run=RunPatch(
            status=RunStatus.RUNNING,
            owner=worker,
            lease_expires_at=now + ttl,
            # Not a re-send's far-off wake-up: if this worker dies, the sweeper
            # must find the run one TTL from now.
            wake_at=now + ttl,
            resends=0,
            blocked=None,
        ),
        steps=(StepPatch(index, status=StepStatus.RUNNING, started_at=now, bump_attempts=True),),
        events=tuple(events),
    )


def renew(run_id: str, version: int, *, worker: str, now: float, ttl: float) -> Checkpoint:
    """Extend a lease (or write it, for a step that went straight through).
    Not a transition: no event, but the version moves, fencing off the past."""
    return Checkpoint(
        run_id, version, worker, now, run=RunPatch(owner=worker, lease_expires_at=now + ttl)
    )


def fail(run: Run, reason: str, *, worker: str, now: float) -> Checkpoint:
    """End the run as failed before its step executes (a budget is exhausted)."""
    return Checkpoint(
        run.run_id,
        run.version,
        worker,
        now,
        run=RunPatch.stopped(RunStatus.FAILED, error=reason),
        events=(*takeover(run), EventDraft(RunStatus.FAILED, run.status, detail=reason)),
    )


def unstorable(outcome: StepOutcome, step: Step, problem: str) -> StepOutcome:
    """What ``outcome`` becomes when a value in it cannot be stored (one that no
    door checked): the step's failure, saying why, so it is recorded once
    instead of retried (:func:`settle` says whether the run fails with it).
    What the turn cost is kept."""
    error = f"the outcome of step {step.index} could not be stored: {problem}"
    return StepOutcome(
        Happened.UNSTORABLE, error=error, usage=outcome.usage, cost_usd=outcome.cost_usd
    )


def record(
    run: Run,
    step: Step,
    outcome: StepOutcome,
    *,
    version: int,
    worker: str,
    now: float,
    ttl: float,
    claimed: bool,
    started_at: float,
    fail_on_tool_error: bool,
) -> Checkpoint:
    """The result checkpoint: the step's outcome, the steps the model asked for,
    the cursor moved on, the tool's idempotency record, the lease released,
    and the run's next status as :func:`settle` says.

    ``claimed``: the step was checkpointed RUNNING before it executed; if not
    (it went straight through), this one write also counts its attempt.
    """
    deferred = outcome.happened is Happened.DEFERRED
    patch = StepPatch(
        step.index,
        status=outcome.status,
        result=None if deferred else outcome.result,
        error=outcome.error,
        finished_at=None if deferred else now,
        wait=outcome.wait if deferred else KEEP,
    )
    events = []
    if claimed:
        events.append(EventDraft(outcome.status, StepStatus.RUNNING, step.index, outcome.detail))
    else:
        if run.status is RunStatus.PENDING:
            events.append(EventDraft(RunStatus.RUNNING, RunStatus.PENDING))
        events.append(EventDraft(outcome.status, StepStatus.PENDING, step.index, outcome.detail))
        patch = replace(patch, started_at=started_at, bump_attempts=True)
    events.extend(  # a user's messages made steps (a final answer steered on)
        EventDraft(StepStatus.DONE, None, s.index, USER_SAID)
        for s in outcome.new_steps
        if s.kind is StepKind.USER
    )
    settled = settle(step, outcome, fail_on_tool_error=fail_on_tool_error)
    if settled.status is not RunStatus.RUNNING:
        events.append(EventDraft(settled.status, RunStatus.RUNNING, detail=settled.error))
    return Checkpoint(
        run.run_id,
        version,
        worker,
        now,
        run=_moved_on(run, step, outcome, settled, now=now, ttl=ttl),
        steps=(patch,),
        new_steps=outcome.new_steps,
        events=tuple(events),
        tool_record=outcome.record,
        take_signals=outcome.takes,
    )


def _moved_on(
    run: Run, step: Step, outcome: StepOutcome, settled: Settled, *, now: float, ttl: float
) -> RunPatch:
    """The run row after a step's outcome: the cursor moved on, the lease
    released (the next step's message may reach any worker), stopped if the
    outcome stops it, and what the step cost added."""
    if settled.status is RunStatus.RUNNING:
        patch = RunPatch(
            status=RunStatus.RUNNING, owner=None, lease_expires_at=None, wake_at=now + ttl
        )
    else:
        patch = RunPatch.stopped(settled.status, error=settled.error, result=outcome.final)
    patch = replace(
        patch,
        cursor=step.index + outcome.next_cursor_offset,
        step_count=run.step_count + len(outcome.new_steps),
        resends=0,
        blocked=None,
    )
    if outcome.happened is Happened.DEFERRED and run.deferred_from is None:
        patch = replace(patch, deferred_from=step.index)
    elif step.kind is StepKind.MODEL and run.deferred_from is not None:
        patch = replace(patch, deferred_from=None)  # its gate found every answer in
    if outcome.usage is None:
        return patch
    # Summed here, in the step's own checkpoint: the run row always agrees
    # with its steps, and a budget check reads one row.
    return replace(
        patch,
        input_tokens=run.input_tokens + outcome.usage.input_tokens,
        output_tokens=run.output_tokens + outcome.usage.output_tokens,
        cost_usd=run.cost_usd + (outcome.cost_usd or 0.0),
    )


def back_off(
    run: Run,
    step: Step,
    *,
    version: int,
    worker: str,
    now: float,
    retry_after: float,
    reason: str,
    claimed: bool,
) -> Checkpoint:
    """Give the run back for ``retry_after`` seconds (another executor holds the
    step's idempotency key). ``step`` is as loaded, before the claim: it gets
    back that status and attempt count, since waiting is neither an attempt
    nor an interruption. Only the lease holder may write this."""
    restored = StepPatch(
        step.index, status=step.status, attempts=step.attempts, started_at=step.started_at
    )
    from_status = StepStatus.RUNNING if claimed else step.status
    return Checkpoint(
        run.run_id,
        version,
        worker,
        now,
        run=RunPatch(owner=BACKED_OFF, lease_expires_at=LAPSED, wake_at=now + retry_after),
        steps=(restored,) if claimed else (),
        events=(
            EventDraft(
                "backed_off", from_status, step.index, f"{reason}; retry in {retry_after:.1f}s"
            ),
        ),
    )


def reschedule(
    run: Run,
    step: Step,
    wait: Reschedule,
    *,
    version: int,
    worker: str,
    now: float,
    claimed: bool,
) -> Checkpoint:
    """Put the step back to sleep until ``now + wait.delay``: the provider
    failed transiently, or its shared rate limit has no room. The worker slot
    is free meanwhile, and a crash loses nothing: the wake-up is ``wake_at``,
    which the sweeper honours if the delayed message is lost. ``step`` is as
    loaded: it gets back that attempt count (a wait is not an interruption)
    and goes PENDING; a retry adds one to ``retries`` and records why on the
    step, so ``show`` says what it is waiting for."""
    patch = StepPatch(
        step.index,
        status=StepStatus.PENDING,
        attempts=step.attempts,
        started_at=step.started_at,
        error=wait.reason if wait.retry else KEEP,
        retries=step.retries + 1 if wait.retry else KEEP,
    )
    from_status = StepStatus.RUNNING if claimed else step.status
    kind = "retry_scheduled" if wait.retry else "rate_limited"
    return Checkpoint(
        run.run_id,
        version,
        worker,
        now,
        run=RunPatch(
            status=RunStatus.RUNNING,
            owner=RESCHEDULED,
            lease_expires_at=LAPSED,
            wake_at=now + wait.delay,
            resends=0,
            blocked=None,
        ),
        steps=(patch,),
        events=(EventDraft(kind, from_status, step.index, f"{wait.reason}; in {wait.delay:.1f}s"),),
    )


def await_approval(run: Run, step: Step, *, worker: str, now: float) -> Checkpoint:
    """The run reached a call that needs an operator's word first: the step
    waits, the run is held (never woken by the sweeper) until ``decide``."""
    detail = f"{step.tool} awaits approval"
    return Checkpoint(
        run.run_id,
        run.version,
        worker,
        now,
        run=replace(RunPatch.stopped(RunStatus.WAITING), resends=0, blocked=None),
        steps=(StepPatch(step.index, status=StepStatus.AWAITING_APPROVAL),),
        events=(
            EventDraft(StepStatus.AWAITING_APPROVAL, step.status, step.index, detail),
            EventDraft(RunStatus.WAITING, run.status, detail=detail),
        ),
    )


def pause(run: Run, reason: str, *, worker: str, now: float) -> Checkpoint:
    """Hold the run at a step boundary (asked for by an operator, or its budget
    is spent with ``on_budget="pause"``) until ``resume``."""
    return Checkpoint(
        run.run_id,
        run.version,
        worker,
        now,
        # The request stays set while paused: an operator's withdrawal that
        # raced this write is then visible to the worker that made it.
        run=replace(RunPatch.stopped(RunStatus.PAUSED, error=reason), resends=0),
        events=(*takeover(run), EventDraft(RunStatus.PAUSED, run.status, run.cursor, reason)),
    )
