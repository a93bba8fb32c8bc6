"""What an operator does to a run: cancel it, or resolve a step left in doubt.

Both are CAS checkpoints like any other transition, recorded in the flight
recorder under the worker name ``operator``.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from enum import StrEnum

from harness.agents import get_agent
from harness.engine.runner import Runtime, commit, dispatch
from harness.errors import NotResolvable, StaleWriteError
from harness.records import JSON, Run, RunStatus, StepStatus
from harness.store import Checkpoint, EventDraft, RunPatch, StepPatch

OPERATOR = "operator"


class Decision(StrEnum):
    """How an operator settles an in-doubt step."""

    RETRY = "retry"  # call the tool again
    SUCCEEDED = "succeeded"  # it did happen; here is its result
    FAIL = "fail"  # treat the call as failed


def cancel(rt: Runtime, run_id: str, reason: str) -> Run:
    """Mark a run cancelled. A step executing now may finish; its result is not recorded."""
    while True:
        run = rt.store.load(run_id)
        if run.status.terminal:
            return run
        try:
            commit(
                rt,
                Checkpoint(
                    run_id,
                    run.version,
                    OPERATOR,
                    rt.clock.now(),
                    run=RunPatch.ended(RunStatus.CANCELLED, error=reason),
                    events=(EventDraft(RunStatus.CANCELLED, run.status, detail=reason),),
                ),
            )
        except StaleWriteError:
            continue
        return rt.store.load(run_id)


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
    moving = RunPatch(status=RunStatus.RUNNING, error=None, wake_at=now + rt.lease_ttl)
    if decision is Decision.RETRY:
        step_patch = StepPatch(step.index, status=StepStatus.PENDING, error=None)
        run_patch, cursor = moving, step.index
    elif decision is Decision.SUCCEEDED:
        step_patch = StepPatch(
            step.index, status=StepStatus.DONE, result=result, error=None, finished_at=now
        )
        run_patch, cursor = replace(moving, cursor=step.index + 1), step.index + 1
    else:
        error = "the operator marked the in-doubt call as failed"
        step_patch = StepPatch(step.index, status=StepStatus.FAILED, error=error, finished_at=now)
        cursor = step.index + 1
        if get_agent(run.agent).on_tool_error == "fail":
            run_patch = RunPatch.ended(RunStatus.FAILED, error=f"step {step.index} failed: {error}")
        else:
            run_patch = replace(moving, cursor=cursor)
    new_status = run_patch.status if isinstance(run_patch.status, RunStatus) else run.status
    try:
        commit(
            rt,
            Checkpoint(
                run_id,
                run.version,
                OPERATOR,
                now,
                run=run_patch,
                steps=(step_patch,),
                events=(
                    EventDraft(str(step_patch.status), StepStatus.IN_DOUBT, step.index, detail),
                    EventDraft(new_status, RunStatus.WAITING, detail=detail),
                ),
            ),
        )
    except StaleWriteError:
        raise NotResolvable(
            f"run {run_id} changed while it was being resolved; look again"
        ) from None
    if decision is Decision.SUCCEEDED and not found:
        # After the checkpoint, so a lost race leaves no record behind.
        rt.store.put_tool_result(
            step.idempotency_key, run_id, step.index, step.tool or "", result, time.time()
        )
    if new_status is RunStatus.RUNNING:
        dispatch(rt, run_id, cursor)
    return rt.store.load(run_id)
