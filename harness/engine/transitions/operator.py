"""The transitions an operator makes: cancel, resolve a call in doubt, approve
or reject a call, pause and resume; and their refusals.

Most are CAS checkpoints like any other. Two are notes written beside the
version, so that a step in flight still records its result: a pause asked
of a moving run (or withdrawn) and a word on a call the run has not reached
yet. Each note carries the state it applies in (:class:`PauseNote`,
:class:`ApprovalNote`); the store writes it only while the run is still so,
atomically, and raises :class:`~harness.errors.NoteRefused` otherwise.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from enum import StrEnum

from harness.engine.transitions.owners import OPERATOR
from harness.errors import DecisionConflict, NotResolvable, OperatorError
from harness.records import JSON, Approval, Run, RunStatus, Step, StepStatus
from harness.store import KEEP, ApprovalNote, Checkpoint, EventDraft, PauseNote, RunPatch, StepPatch

#: The run statuses in which a pause may be asked for, or withdrawn: not ended,
#: not paused (a paused run is resumed, a checkpoint of its own).
PAUSABLE = frozenset({RunStatus.PENDING, RunStatus.RUNNING, RunStatus.WAITING})


class Decision(StrEnum):
    """How an operator settles an in-doubt step."""

    RETRY = "retry"  # call the tool again
    SUCCEEDED = "succeeded"  # it did happen; here is its result
    FAIL = "fail"  # treat the call as failed


#: The step status each way of resolving leaves, as its event records it.
RESOLVED_TO = {
    Decision.RETRY: StepStatus.PENDING,
    Decision.SUCCEEDED: StepStatus.DONE,
    Decision.FAIL: StepStatus.FAILED,
}


@dataclass(frozen=True)
class Unchanged:
    """An operator's action that finds the run already as it asks: nothing to
    write, and ``said`` says so."""

    said: str


def conflict(run: Run, why: str | None = None) -> DecisionConflict:
    """The refusal of an action the run has gone against: the run as it is, and ``why``."""
    if run.status is RunStatus.CANCELLED:
        where = f"run {run.run_id} has been cancelled"
    elif run.status.terminal:
        where = f"run {run.run_id} has {run.status.value}"
    else:
        where = f"run {run.run_id} is {run.status.value}"
    return DecisionConflict(f"{where}{f': {why}' if why else ''}; nothing changed", run)


def cancel(run: Run, reason: str, *, now: float) -> Checkpoint:
    """Stop the run for good. A step executing now may finish; its result
    checkpoint then fails, fenced off by the version this bumps."""
    return Checkpoint(
        run.run_id,
        run.version,
        OPERATOR,
        now,
        run=RunPatch.stopped(RunStatus.CANCELLED, error=reason),
        events=(EventDraft(RunStatus.CANCELLED, run.status, detail=reason),),
    )


def resolve(
    run: Run,
    step: Step,
    decision: Decision,
    result: JSON,
    *,
    fail_run: bool,
    now: float,
    ttl: float,
    adopted: bool = False,
    force: bool = False,
    step_time_limit: float = 0.0,
) -> Checkpoint:
    """Settle the in-doubt ``step`` of a waiting run. ``fail_run``: a call
    marked failed ends the run (the agent's ``on_tool_error="fail"``).
    ``adopted``: the call's result was stored after all (``result``), and is
    the truth whatever the operator decided. A retry is refused until the
    first executor must have stopped (``step_time_limit`` after it started),
    unless ``force``: it could make a second call while the first is under way."""
    detail = f"operator: {decision.value}"
    if adopted:
        detail += f"; the call's result had been stored and was adopted: {json.dumps(result)}"
        decision = Decision.SUCCEEDED
    elif decision is Decision.RETRY and not force:
        safe_at = (step.started_at or now) + step_time_limit
        if now < safe_at:
            raise NotResolvable(
                f"step {step.index} may still be executing until the step time limit "
                f"passes in {safe_at - now:.0f}s; retry then, or --force if you know it stopped"
            )
    step_patch, run_patch = _resolution(run, step, decision, result, fail_run, now=now, ttl=ttl)
    new_status = run_patch.status if isinstance(run_patch.status, RunStatus) else run.status
    return Checkpoint(
        run.run_id,
        run.version,
        OPERATOR,
        now,
        run=run_patch,
        steps=(step_patch,),
        events=(
            EventDraft(str(step_patch.status), StepStatus.IN_DOUBT, step.index, detail),
            EventDraft(new_status, RunStatus.WAITING, detail=detail),
        ),
    )


def _resolution(
    run: Run,
    step: Step,
    decision: Decision,
    result: JSON,
    fail_run: bool,
    *,
    now: float,
    ttl: float,
) -> tuple[StepPatch, RunPatch]:
    """The step and the run after ``decision`` on the in-doubt ``step``."""
    moving = RunPatch(status=RunStatus.RUNNING, error=None, wake_at=now + ttl)
    if decision is Decision.RETRY:
        return StepPatch(step.index, status=StepStatus.PENDING, error=None), replace(
            moving, cursor=step.index
        )
    if decision is Decision.SUCCEEDED:
        done = StepPatch(
            step.index, status=StepStatus.DONE, result=result, error=None, finished_at=now
        )
        return done, replace(moving, cursor=step.index + 1)
    error = "the operator marked the in-doubt call as failed"
    failed = StepPatch(step.index, status=StepStatus.FAILED, error=error, finished_at=now)
    if fail_run:
        return failed, RunPatch.stopped(
            RunStatus.FAILED, error=f"step {step.index} failed: {error}"
        )
    return failed, replace(moving, cursor=step.index + 1)


def approval_detail(approval: Approval, args: dict[str, JSON] | None) -> str:
    """How the flight recorder says an operator's word on a call: by whom, why
    (a rejection's reason), and the arguments the call is made with instead,
    when the operator edited them."""
    detail = f"by {approval.by}"
    if approval.reason:
        detail += f"; reason: {approval.reason}"
    if args is not None:
        detail += f"; arguments edited to {json.dumps(args)}"
    return detail


def decide(
    run: Run,
    step: Step,
    approval: Approval,
    args: dict[str, JSON] | None,
    *,
    now: float,
    ttl: float,
) -> Checkpoint:
    """An operator approved or rejected the call the run waits on: the step is
    pending again with that word on it (and the edited arguments), and the
    run moves; the step task acts on the word, once."""
    return _decided(
        run, step, approval, args, approval.by, approval_detail(approval, args), now, ttl
    )


def act_on_word_ahead(run: Run, step: Step, *, who: str, now: float, ttl: float) -> Checkpoint:
    """The run reached a call whose word was noted ahead (:func:`note_approval`)
    and waits on it: ``who`` (a worker, or another operator) sets it moving
    with that word, as :func:`decide` would have."""
    word = step.approval
    assert word is not None, step
    detail = f"acting on the word of {word.by}, given ahead"
    return _decided(run, step, word, None, who, detail, now, ttl)


def _decided(
    run: Run,
    step: Step,
    approval: Approval,
    args: dict[str, JSON] | None,
    who: str | None,
    detail: str,
    now: float,
    ttl: float,
) -> Checkpoint:
    patch = StepPatch(step.index, status=StepStatus.PENDING, approval=approval)
    if args is not None:
        patch = replace(patch, args=args)
    return Checkpoint(
        run.run_id,
        run.version,
        who,
        now,
        run=RunPatch(status=RunStatus.RUNNING, error=None, wake_at=now + ttl),
        steps=(patch,),
        events=(
            EventDraft(str(approval.decision), StepStatus.AWAITING_APPROVAL, step.index, detail),
            EventDraft(RunStatus.RUNNING, RunStatus.WAITING),
        ),
    )


def note_approval(
    run: Run, step: Step, approval: Approval, args: dict[str, JSON] | None, *, now: float
) -> ApprovalNote:
    """An operator's word on ``step``, a later call of the batch under way that
    the run has not reached: noted beside the version (the call under way now
    still records its result), once. Refused if the run has ended, if the
    call has a word already, or if it is no longer pending."""
    if run.status.terminal:
        raise conflict(run)
    if step.approval is not None:
        raise conflict(run, f"step {step.index} was already {step.approval.decision}")
    if step.status is not StepStatus.PENDING:
        raise OperatorError(
            f"step {step.index} of run {run.run_id} is {step.status}: "
            "not a call ahead to note a word on"
        )
    event = EventDraft(
        str(approval.decision), StepStatus.PENDING, step.index, approval_detail(approval, args)
    )
    return ApprovalNote(
        run.run_id, step.index, approval, args, StepStatus.PENDING, event, str(approval.by), now
    )


def request_pause(run: Run, *, who: str, now: float) -> PauseNote | Unchanged:
    """Ask ``run`` to stop at its next step boundary: a step in flight finishes
    and records its result first. A run paused, or asked to, already: a
    no-op; one that has ended: refused."""
    if run.status.terminal:
        raise conflict(run)
    if run.status is RunStatus.PAUSED:
        return Unchanged("already paused")
    if run.pause_requested:
        return Unchanged("a pause was already asked for")
    event = EventDraft("pause_requested", detail=f"by {who}")
    return PauseNote(run.run_id, True, PAUSABLE, event, who, now)


def withdraw_pause(run: Run, *, who: str, now: float) -> PauseNote:
    """Withdraw a pause asked of ``run`` that it has not reached yet."""
    assert run.pause_requested, run
    event = EventDraft("pause_withdrawn", detail=f"by {who}")
    return PauseNote(run.run_id, False, PAUSABLE, event, who, now)


def resume(
    run: Run,
    *,
    who: str,
    now: float,
    ttl: float,
    max_tokens: int | None = None,
    max_cost_usd: float | None = None,
    max_steps: int | None = None,
) -> Checkpoint:
    """Set a paused run moving again, with its budgets (and step limit) raised if given."""
    budgets = [] if max_steps is None else [f"max_steps={max_steps}"]
    if max_tokens is not None:
        budgets.append(f"max_tokens={max_tokens}")
    if max_cost_usd is not None:
        budgets.append(f"max_cost_usd={max_cost_usd:g}")
    return Checkpoint(
        run.run_id,
        run.version,
        who,
        now,
        run=RunPatch(
            status=RunStatus.RUNNING,
            error=None,
            wake_at=now + ttl,
            pause_requested=False,
            max_tokens=KEEP if max_tokens is None else max_tokens,
            max_cost_usd=KEEP if max_cost_usd is None else max_cost_usd,
            max_steps=KEEP if max_steps is None else max_steps,
        ),
        events=(
            EventDraft(
                RunStatus.RUNNING,
                RunStatus.PAUSED,
                run.cursor,
                f"resumed by {who}" + (f"; budget set: {', '.join(budgets)}" if budgets else ""),
            ),
        ),
    )
