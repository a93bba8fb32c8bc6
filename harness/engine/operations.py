"""What an operator does to a run: cancel it, resolve a step left in doubt,
approve or reject a call, pause and resume it.

Each is a CAS checkpoint like any other transition, recorded in the flight
recorder under the operator's name, except two notes that must not fence a
step in flight, written beside the version: a pause asked of a moving run
(it stops at its next step boundary) and a word on a call the run has not
reached yet (a later call of a parallel batch).

Each answers what it did (:class:`Acted`). Whether an action applies is
decided by what the store holds after its own write landed or lost, never
by a read before it alone: of two operators racing with different
decisions (two sets of arguments, approve against reject, a cancel against
the run's completion) exactly one wins, and the other gets a
:class:`~harness.errors.DecisionConflict` saying what the run has instead.
The same decision again (an approval with the same arguments, a cancel of
a cancelled run, a pause of a paused one) changes nothing and says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.agents import Agent, get_agent
from harness.engine import billing, children, offering, transitions
from harness.engine.runtime import Runtime, commit, dispatch
from harness.engine.transitions import OPERATOR, Decision, Unchanged, conflict
from harness.errors import (
    AgentNotFound,
    NoteRefused,
    NotResolvable,
    OperatorError,
    StaleWriteError,
    UnknownTool,
)
from harness.inputs import render_json
from harness.records import JSON, Approval, Run, RunStatus, Step, StepKind, StepStatus, Verdict
from harness.store import Checkpoint

__all__ = [
    "OPERATOR",
    "Acted",
    "Decision",
    "cancel",
    "decide",
    "pause",
    "resolve",
    "resume",
]


@dataclass(frozen=True)
class Acted:
    """What an operator's action did: ``run`` as the action left it;
    ``changed`` False when the run already had this very decision (a repeat,
    a no-op), and ``said`` says what it did, or what the run already had."""

    run: Run
    changed: bool
    said: str


def _short(text: str, limit: int = 200) -> str:
    """Text for a one-line message: on one line, cut to ``limit`` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def cancel(rt: Runtime, run_id: str, reason: str) -> Acted:
    """Mark a run cancelled. A step executing now may finish; its result is
    not recorded, but a model call's usage is charged to the run
    (harness.engine.billing). A run that ended otherwise first (completed,
    failed) is a conflict; a cancelled one, a no-op."""
    while True:
        run = rt.store.load(run_id)
        if run.status is RunStatus.CANCELLED:
            # A cancel whose own reply was lost lands here too: charge what it
            # owes, and cancel the children it did not reach.
            if billing.bill_recorded(rt, run):
                run = rt.store.load(run_id)
            children.cancel_children(rt, run_id, f"its parent {run_id} was cancelled")
            said = "already cancelled" + (f": {_short(run.error)}" if run.error else "")
            return Acted(run, False, said)
        if run.status.terminal:
            raise conflict(run)
        try:
            commit(rt, transitions.cancel(run, reason, now=rt.clock.now()))
        except StaleWriteError:
            continue  # it moved: look again (it may have ended)
        cancelled = rt.store.load(run_id)
        if billing.bill_recorded(rt, cancelled):  # its call returned before the cancel
            cancelled = rt.store.load(run_id)
        children.ended(rt, run, RunStatus.CANCELLED)  # answers a parent, cancels children
        return Acted(cancelled, True, "cancelled")


def resolve(
    rt: Runtime, run_id: str, decision: Decision, result: JSON = None, force: bool = False
) -> Acted:
    """Settle the in-doubt step of a waiting run, and set the run moving again.

    If the interrupted call's result was stored after all (its executor lived
    on long enough), that result is adopted whatever the decision: it is the
    truth. ``retry`` is refused until the first executor must have stopped
    (the step time limit has passed since the step was found in doubt),
    unless ``force``: a retry before then could make a second call while the
    first is still under way. A run whose step was resolved already (by a
    racing operator, or this one a moment ago) answers as :func:`_resolved`
    says.
    """
    while True:
        run = rt.store.load(run_id)
        step = run.current
        waiting = run.status is RunStatus.WAITING
        if not waiting or step is None or step.status is not StepStatus.IN_DOUBT:
            return _resolved(rt, run, decision, result)
        checkpoint, adopted = _resolution(rt, run, step, decision, result, force)
        try:
            commit(rt, checkpoint)
        except StaleWriteError:
            continue  # it moved (another operator, a cancel): look again
        if decision is Decision.SUCCEEDED and not adopted:
            # After the checkpoint, so a lost race leaves no record behind.
            rt.store.put_tool_result(
                step.idempotency_key, run_id, step.index, step.tool or "", result, rt.clock.now()
            )
        cursor = checkpoint.run.cursor
        if checkpoint.run.status is RunStatus.RUNNING and isinstance(cursor, int):
            dispatch(rt, run_id, cursor)
        children.ended(rt, run, checkpoint.run.status)  # a child failed by it answers its parent
        return Acted(rt.store.load(run_id), True, f"step {step.index} resolved: {decision.value}")


def _resolution(
    rt: Runtime, run: Run, step: Step, decision: Decision, result: JSON, force: bool
) -> tuple[Checkpoint, bool]:
    """The checkpoint resolving ``step`` so; True if it adopts the call's
    stored result instead. Raises NotResolvable for a retry too early."""
    found, stored = rt.store.get_tool_result(step.idempotency_key)
    fail_run = (
        decision is Decision.FAIL and not found and get_agent(run.agent).on_tool_error == "fail"
    )
    checkpoint = transitions.resolve(
        run,
        step,
        decision,
        stored if found else result,
        fail_run=fail_run,
        now=rt.clock.now(),
        ttl=rt.lease_ttl,
        adopted=found,
        force=force,
        step_time_limit=rt.step_time_limit,
    )
    return checkpoint, found


def _resolved(rt: Runtime, run: Run, decision: Decision, result: JSON) -> Acted:
    """A resolve of a run with no step in doubt: if an operator resolved one
    and the run has waited on nothing since, a no-op when it was resolved
    this same way (with this result), else a conflict; otherwise NotResolvable."""
    last = None
    for event in reversed(rt.store.events(run.run_id)):
        if event.from_status == StepStatus.IN_DOUBT and event.worker == OPERATOR:
            last = event
            break
        if event.to_status == RunStatus.WAITING:
            break  # it waited on something else since: a resolve now is no repeat
    if last is None or last.step_index is None:
        raise NotResolvable(f"run {run.run_id} is {run.status}, with no step in doubt to resolve")
    ways = {str(status): way for way, status in transitions.RESOLVED_TO.items()}
    way = ways.get(last.to_status)
    said = f"step {last.step_index} was already resolved: {way or last.to_status}"
    same = way is decision
    if same and decision is Decision.SUCCEEDED:
        (step,) = rt.store.steps(run.run_id, last.step_index, 1)
        same = step.result == result
    if not same:
        raise conflict(run, said)
    return Acted(run, False, said)


def decide(
    rt: Runtime,
    run_id: str,
    *,
    approve: bool,
    who: str,
    step_index: int | None = None,
    args: dict[str, JSON] | None = None,
    reason: str | None = None,
) -> Acted:
    """Approve (perhaps with edited ``args``) or reject a call that requires
    approval: the one the run waits on, or with ``step_index`` a later call of
    the same batch. Acted on once: a call that already has an operator's word
    keeps it; the same word again is a no-op, another a DecisionConflict."""
    verdict = Verdict.APPROVED if approve else Verdict.REJECTED
    while True:
        run = rt.store.load(run_id)
        step = _call_to_decide(rt, run, step_index)
        step_index = step.index  # if we must look again, at this call
        if step.approval is not None:
            if step.status is StepStatus.AWAITING_APPROVAL and run.status is RunStatus.WAITING:
                # A word noted ahead just as the run reached the call: act on it.
                ahead = transitions.act_on_word_ahead(
                    run, step, who=who, now=rt.clock.now(), ttl=rt.lease_ttl
                )
                if not _move_on(rt, ahead):
                    continue
                run = rt.store.load(run_id)
            return _compared(run, step, verdict, args, reason)
        if args is not None:
            _check_args(rt, run, step, args)
        now = rt.clock.now()
        approval = Approval(
            verdict,
            who,
            now,
            reason=reason or None,
            proposed_args=None if args is None else step.args,
        )
        said = f"step {step.index} {verdict} by {who}"
        if step.status is StepStatus.PENDING:
            # A later call of the batch: noted beside the version, so the call
            # under way now still records its result.
            try:
                rt.store.note_approval(
                    transitions.note_approval(run, step, approval, args, now=now)
                )
            except NoteRefused:
                continue  # the run reached the call meanwhile, or another word came: look again
            return Acted(rt.store.load(run_id), True, said)
        decided = transitions.decide(run, step, approval, args, now=now, ttl=rt.lease_ttl)
        if _move_on(rt, decided):
            return Acted(rt.store.load(run_id), True, said)


def _compared(
    run: Run, step: Step, verdict: Verdict, args: dict[str, JSON] | None, reason: str | None
) -> Acted:
    """The answer to a word on a call that has one: a no-op if it is the same
    word (the same decision; an approval's call made with the same arguments,
    a rejection's same reason), else DecisionConflict."""
    word = step.approval
    assert word is not None, step
    said = f"step {step.index} was already {word.decision} by {word.by}"
    if word.reason:
        said += f" ({_short(word.reason)})"
    if word.proposed_args is not None:
        said += f" with {_short(render_json(step.args))}"
    same = word.decision is verdict
    if same and verdict is Verdict.REJECTED:
        same = (word.reason or None) == (reason or None)
    elif same:
        proposed = step.args if word.proposed_args is None else word.proposed_args
        same = (proposed if args is None else args) == step.args
    if not same:
        raise conflict(run, said)
    return Acted(run, False, said)


def _move_on(rt: Runtime, decided: Checkpoint) -> bool:
    """Write the word on the call the run waits on, setting the run moving, and
    send the call's message; False if the run moved first (look again)."""
    try:
        commit(rt, decided)
    except StaleWriteError:
        return False  # it moved (another operator, a cancel)
    (patch,) = decided.steps
    dispatch(rt, decided.run_id, patch.index)
    return True


def _call_to_decide(rt: Runtime, run: Run, step_index: int | None) -> Step:
    """The call a word is for: the one named, or the one the run waits on (or
    has just moved on with, so that a repeated word finds it)."""
    if step_index is None:
        step = run.current
        if run.status.terminal:
            raise conflict(run)
        if step is not None and step.kind is StepKind.TOOL and step.approval is not None:
            return step  # decided: a word again is compared with it
        if (
            run.status is not RunStatus.WAITING
            or step is None
            or (step.status is not StepStatus.AWAITING_APPROVAL)
        ):
            raise OperatorError(
                f"run {run.run_id} is {run.status} with no call awaiting approval "
                "(name a later call of its batch with --step)"
            )
        return step
    steps = {s.index: s for s in rt.store.steps(run.run_id)}
    step = steps.get(step_index)
    if step is None or step.kind is not StepKind.TOOL:
        raise OperatorError(f"run {run.run_id} has no tool call at step {step_index}")
    if step.approval is not None:
        return step  # decided already: a word again is compared with it, whenever it comes
    if run.status.terminal:
        raise conflict(run)
    try:
        needed = _agent(rt, run).needs_approval(step.tool)
    except AgentNotFound:
        needed = True  # not registered here: the worker acts on the word if it needs one
    if not needed:
        # Its call goes ahead without a word: one given now could be ignored.
        raise OperatorError(
            f"step {step_index} of run {run.run_id} calls {step.tool}, "
            "which does not require approval"
        )
    if step.status not in (StepStatus.PENDING, StepStatus.AWAITING_APPROVAL):
        raise OperatorError(
            f"step {step_index} of run {run.run_id} is {step.status}: too late to decide"
        )
    return step


def _check_args(rt: Runtime, run: Run, step: Step, args: dict[str, JSON]) -> None:
    """Edited arguments that the tool would refuse are refused now, to the
    operator, rather than to the model later (InvalidToolArgs). Where the agent
    is not registered (a CLI without HARNESS_IMPORTS), the call checks them."""
    try:
        spec = _agent(rt, run).tool(step.tool or "")
    except (AgentNotFound, UnknownTool):
        return
    spec.validate_edit(args)


def _agent(rt: Runtime, run: Run) -> Agent:
    """The run's agent with the tools the run was offered, as recorded
    (harness.engine.offering): an operator's command never starts a server."""
    return offering.for_run(rt.store, get_agent(run.agent), run, rt.clock.now(), live=False)


def pause(rt: Runtime, run_id: str, who: str) -> Acted:
    """Hold the run at its next step boundary: a step in flight finishes and
    records its result, and no further step starts until :func:`resume`.
    A run paused, or asked to, already: a no-op; one that has ended: a conflict."""
    while True:
        run = rt.store.load(run_id)
        note = transitions.request_pause(run, who=who, now=rt.clock.now())
        if isinstance(note, Unchanged):
            return Acted(run, False, note.said)
        try:
            rt.store.request_pause(note)
        except NoteRefused:
            continue  # the run ended, paused or was asked to meanwhile: look again
        if run.owner == transitions.RESCHEDULED:
            # Its step waits for the provider, nothing in flight: a message stops
            # it now rather than when the wait is over.
            dispatch(rt, run_id, run.cursor)
        return Acted(rt.store.load(run_id), True, "pauses at its next step boundary")


def resume(
    rt: Runtime,
    run_id: str,
    who: str,
    max_tokens: int | None = None,
    max_cost_usd: float | None = None,
    max_steps: int | None = None,
) -> Acted:
    """Set a paused run moving, with its budgets raised if given; or withdraw a
    pause asked for that the run has not reached yet. A run not paused is a
    no-op, unless budgets it does not have are asked for (a conflict: they
    are raised on a paused run)."""
    withdrawn = False
    while True:
        run = rt.store.load(run_id)
        if run.status.terminal:
            raise conflict(run)
        if run.status is RunStatus.PAUSED:
            checkpoint = transitions.resume(
                run,
                who=who,
                now=rt.clock.now(),
                ttl=rt.lease_ttl,
                max_tokens=max_tokens,
                max_cost_usd=max_cost_usd,
                max_steps=max_steps,
            )
            try:
                commit(rt, checkpoint)
            except StaleWriteError:
                continue
            dispatch(rt, run_id, run.cursor)
            return Acted(rt.store.load(run_id), True, "resumed")
        if withdrawn:
            return Acted(run, True, "pause withdrawn")
        budgets = max_tokens is not None or max_cost_usd is not None or max_steps is not None
        if run.pause_requested and not budgets:
            # Withdrawn beside the version; then look again, in case the run
            # reached its boundary and paused meanwhile.
            try:
                rt.store.request_pause(transitions.withdraw_pause(run, who=who, now=rt.clock.now()))
            except NoteRefused:
                continue  # paused meanwhile, or ended: look again
            withdrawn = True
            continue
        if not budgets or (
            max_tokens in (None, run.max_tokens)
            and max_cost_usd in (None, run.max_cost_usd)
            and max_steps in (None, run.max_steps)
        ):
            return Acted(run, False, "not paused: nothing to resume")
        raise conflict(run, "not paused, and budgets are raised on a paused run")
