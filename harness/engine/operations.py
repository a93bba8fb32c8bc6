"""What an operator does to a run: cancel it, resolve a step left in doubt,
approve or reject a call, pause and resume it.

Each is a CAS checkpoint like any other transition, recorded in the flight
recorder under the operator's name, except two notes that must not fence a
step in flight, written beside the version: a pause asked of a moving run
(it stops at its next step boundary) and a word on a call the run has not
reached yet (a later call of a parallel batch).
"""

from __future__ import annotations

import json
import math
import time

from harness.agents import get_agent
from harness.engine import billing, transitions
from harness.engine.runner import Runtime, commit, dispatch
from harness.engine.transitions import OPERATOR, Decision
from harness.errors import (
    AgentNotFound,
    NotResolvable,
    OperatorError,
    StaleWriteError,
    UnknownTool,
)
from harness.records import JSON, Run, RunStatus, Step, StepKind, StepStatus

__all__ = ["OPERATOR", "Decision", "cancel", "decide", "pause", "resolve", "resume"]


def cancel(rt: Runtime, run_id: str, reason: str) -> Run:
    """Mark a run cancelled. A step executing now may finish; its result is not
    recorded, but a model call's usage is charged to the run (harness.engine.billing)."""
    while True:
        run = rt.store.load(run_id)
        if run.status.terminal:
            return run
        try:
            commit(rt, transitions.cancel(run, reason, now=rt.clock.now()))
        except StaleWriteError:
            continue
        cancelled = rt.store.load(run_id)
        if billing.bill_recorded(rt, cancelled):  # its call returned before the cancel
            cancelled = rt.store.load(run_id)
        return cancelled


def resolve(
    rt: Runtime, run_id: str, decision: Decision, result: JSON = None, force: bool = False
) -> Run:
    """Settle the in-doubt step of a waiting run, and set the run moving again.

    If the interrupted call's result was stored after all (its executor lived
    on long enough), that result is adopted whatever the decision: it is the
    truth. ``retry`` is refused until the first executor must have stopped
    (the step time limit has passed since the step was found in doubt),
    unless ``force``: a retry before then could make a second call while the
    first is still under way.
    """
    run = rt.store.load(run_id)
    step = run.current
    if run.status is not RunStatus.WAITING or step is None or step.status != StepStatus.IN_DOUBT:
        raise NotResolvable(f"run {run_id} is {run.status}, with no step in doubt to resolve")
    now = rt.clock.now()
    detail = f"operator: {decision.value}"
    found, stored = rt.store.get_tool_result(step.idempotency_key)
    if found:
        decision, result = Decision.SUCCEEDED, stored
        detail += f"; the call's result had been stored and was adopted: {json.dumps(stored)}"
    elif decision is Decision.RETRY and not force:
        safe_at = (step.started_at or now) + rt.step_time_limit
        if now < safe_at:
            raise NotResolvable(
                f"step {step.index} may still be executing until the step time limit "
                f"passes in {safe_at - now:.0f}s; retry then, or --force if you know it stopped"
            )
    fail_run = decision is Decision.FAIL and get_agent(run.agent).on_tool_error == "fail"
    checkpoint = transitions.resolve(
        run, step, decision, result, fail_run=fail_run, now=now, ttl=rt.lease_ttl, detail=detail
    )
    try:
        commit(rt, checkpoint)
    except StaleWriteError:
        raise NotResolvable(
            f"run {run_id} changed while it was being resolved; look again"
        ) from None
    if decision is Decision.SUCCEEDED and not found:
        # After the checkpoint, so a lost race leaves no record behind.
        rt.store.put_tool_result(
            step.idempotency_key, run_id, step.index, step.tool or "", result, time.time()
        )
    cursor = checkpoint.run.cursor
    if checkpoint.run.status is RunStatus.RUNNING and isinstance(cursor, int):
        dispatch(rt, run_id, cursor)
    return rt.store.load(run_id)


def decide(
    rt: Runtime,
    run_id: str,
    *,
    approve: bool,
    who: str,
    step_index: int | None = None,
    args: dict[str, JSON] | None = None,
    reason: str | None = None,
) -> tuple[Run, bool]:
    """Approve (perhaps with edited ``args``) or reject a call that requires
    approval: the one the run waits on, or with ``step_index`` a later call of
    the same batch. Acted on once: a call that already has an operator's word
    keeps it, and (run, False) says nothing changed."""
    while True:
        run = rt.store.load(run_id)
        step = _call_to_decide(rt, run, step_index)
        step_index = step.index  # if we must look again, at this call
        if step.approval is not None:
            if step.status is StepStatus.AWAITING_APPROVAL and run.status is RunStatus.WAITING:
                # A word noted ahead just as the run reached the call: act on it.
                _move_on(rt, run, step, step.approval, by=who)
            return rt.store.load(run_id), False
        if args is not None:
            _check_args(run, step, args)
        now = rt.clock.now()
        approval: dict[str, JSON] = {
            "decision": "approved" if approve else "rejected",
            "by": who,
            "at": now,
        }
        if reason:
            approval["reason"] = reason
        if args is not None:
            approval["proposed_args"] = step.args
        if step.status is StepStatus.PENDING:
            # A later call of the batch: noted beside the version, so the call
            # under way now still records its result.
            if rt.store.note_approval(run_id, step.index, approval, args, who, now):
                return rt.store.load(run_id), True
            continue  # the run reached the call meanwhile, or another word came: look again
        if _move_on(rt, run, step, approval, args):
            return rt.store.load(run_id), True


def _move_on(
    rt: Runtime,
    run: Run,
    step: Step,
    approval: dict[str, JSON],
    args: dict[str, JSON] | None = None,
    by: str | None = None,
) -> bool:
    """Put the word on the call the run waits on and set the run moving; False
    if the run moved first (look again). ``by``: acting on a word given ahead."""
    detail = _word(approval, args)
    who = str(approval["by"])
    if by is not None:
        detail, who = f"acting on the word of {who}, given ahead", by
    checkpoint = transitions.decide(
        run, step, approval, args, who=who, now=rt.clock.now(), ttl=rt.lease_ttl, detail=detail
    )
    try:
        commit(rt, checkpoint)
    except StaleWriteError:
        return False  # it moved (another operator, a cancel)
    dispatch(rt, run.run_id, step.index)
    return True


def _call_to_decide(rt: Runtime, run: Run, step_index: int | None) -> Step:
    if run.status.terminal and step_index is None:
        raise OperatorError(f"run {run.run_id} has ended ({run.status})")
    if step_index is None:
        step = run.current
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
        return step  # decided already: a second word is a no-op, whenever it comes
    if run.status.terminal:
        raise OperatorError(f"run {run.run_id} has ended ({run.status})")
    try:
        needed = get_agent(run.agent).needs_approval(step.tool)
    except AgentNotFound:
        needed = True  # not registered here: the worker acts on the word if it needs one
    if not needed:
        # Its call goes ahead without a word: one given now could be ignored.
        raise OperatorError(
            f"step {step_index} of run {run.run_id} calls {step.tool}, "
            "which does not require approval"
        )
    if step.approval is None and step.status not in (
        StepStatus.PENDING,
        StepStatus.AWAITING_APPROVAL,
    ):
        raise OperatorError(
            f"step {step_index} of run {run.run_id} is {step.status}: too late to decide"
        )
    return step


def _check_args(run: Run, step: Step, args: dict[str, JSON]) -> None:
    """Edited arguments that the tool would refuse are refused now, to the
    operator, rather than to the model later (InvalidToolArgs). Where the agent
    is not registered (a CLI without HARNESS_IMPORTS), the call checks them."""
    try:
        spec = get_agent(run.agent).tool(step.tool or "")
    except (AgentNotFound, UnknownTool):
        return
    spec.validate(args)


def _word(approval: dict[str, JSON], args: dict[str, JSON] | None) -> str:
    detail = f"by {approval['by']}"
    if approval.get("reason"):
        detail += f"; reason: {approval['reason']}"
    if args is not None:
        detail += f"; arguments edited to {json.dumps(args)}"
    return detail


def pause(rt: Runtime, run_id: str, who: str) -> tuple[Run, bool]:
    """Hold the run at its next step boundary: a step in flight finishes and
    records its result, and no further step starts until :func:`resume`."""
    run = rt.store.load(run_id)
    if run.status.terminal:
        raise OperatorError(f"run {run_id} has ended ({run.status})")
    if run.status is RunStatus.PAUSED or run.pause_requested:
        return run, False  # already paused, or asked to
    noted = rt.store.request_pause(run_id, True, who, rt.clock.now(), f"by {who}")
    if noted and run.owner == transitions.RESCHEDULED:
        # Its step waits for the provider, nothing in flight: a message stops it now
        # rather than when the wait is over.
        dispatch(rt, run_id, run.cursor)
    return rt.store.load(run_id), noted


def resume(
    rt: Runtime,
    run_id: str,
    who: str,
    max_tokens: int | None = None,
    max_cost_usd: float | None = None,
) -> tuple[Run, bool]:
    """Set a paused run moving, with its budgets raised if given; or withdraw a
    pause asked for that the run has not reached yet."""
    if max_tokens is not None and max_tokens < 1:
        raise OperatorError(f"max_tokens must be at least 1, not {max_tokens}")
    if max_cost_usd is not None and not (math.isfinite(max_cost_usd) and max_cost_usd > 0):
        raise OperatorError(f"max_cost_usd must be a positive number, not {max_cost_usd}")
    withdrawn = False
    while True:
        run = rt.store.load(run_id)
        if run.status.terminal:
            raise OperatorError(f"run {run_id} has ended ({run.status})")
        if run.status is not RunStatus.PAUSED:
            if withdrawn:
                return run, True
            if run.pause_requested and max_tokens is None and max_cost_usd is None:
                # Withdrawn beside the version; then look again, in case the run
                # reached its boundary and paused meanwhile.
                withdrawn = rt.store.request_pause(run_id, False, who, rt.clock.now(), f"by {who}")
                continue
            raise OperatorError(
                f"run {run_id} is {run.status}, not paused; budgets are raised on a paused run"
            )
        checkpoint = transitions.resume(
            run,
            who=who,
            now=rt.clock.now(),
            ttl=rt.lease_ttl,
            max_tokens=max_tokens,
            max_cost_usd=max_cost_usd,
        )
        try:
            commit(rt, checkpoint)
        except StaleWriteError:
            continue
        dispatch(rt, run_id, run.cursor)
        return rt.store.load(run_id), True
