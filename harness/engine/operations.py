"""What an operator does to a run: cancel it, or resolve a step left in doubt.

Both are CAS checkpoints like any other transition, recorded in the flight
recorder under the worker name ``operator``.
"""

from __future__ import annotations

import json
import time

from harness.agents import get_agent
from harness.engine import transitions
from harness.engine.runner import Runtime, commit, dispatch
from harness.engine.transitions import OPERATOR, Decision
from harness.errors import NotResolvable, StaleWriteError
from harness.records import JSON, Run, RunStatus, StepStatus

__all__ = ["OPERATOR", "Decision", "cancel", "resolve"]


def cancel(rt: Runtime, run_id: str, reason: str) -> Run:
    """Mark a run cancelled. A step executing now may finish; its result is not recorded."""
    while True:
        run = rt.store.load(run_id)
        if run.status.terminal:
            return run
        try:
            commit(rt, transitions.cancel(run, reason, now=rt.clock.now()))
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
