"""Executing one step: what a model turn or a tool call produces.

Each function returns the :class:`~harness.engine.transitions.StepOutcome`
that the runner records; neither writes anything. An outcome says what
happened (a result, a final answer, a tool's error, a call in doubt, ...);
what that makes of the step and the run is
:func:`harness.engine.transitions.settle`'s to say. A failure of the tool or
the model is an outcome; a store failure is not theirs and propagates, and
so do the control-flow signals (:class:`~harness.errors.StepInterrupted`).
"""

from __future__ import annotations

import functools
import json
import random
from dataclasses import replace
from typing import TYPE_CHECKING

from harness.agents import Agent
from harness.engine import billing, gates
from harness.engine.executor import MODEL_RECORD, StepExecutor
from harness.engine.leases import Lease
from harness.engine.responses import StepRecorder
from harness.engine.transitions import Happened, Reschedule, StepOutcome
from harness.engine.transitions.owners import MARKS
from harness.engine.transitions.waits import describe as describe_waits
from harness.errors import (
    BadInput,
    Diverged,
    InDoubt,
    RecordedToolError,
    RetryableModelError,
    StoreError,
    Throttled,
    ToolError,
    ToolUnavailable,
    interruptions,
)
from harness.inputs import checked_json
from harness.models import AsyncModel, Model, ModelRequest, ModelTurn, Usage, take_turn
from harness.output import INVALID_ANSWERS, InvalidAnswer, as_text, validated
from harness.records import JSON, Run, Step, StepKind, StepStatus
from harness.store import ToolRecord
from harness.streams import Tap
from harness.tools import ToolEffect, WaitHooks
from harness.waiting import wait_of

if TYPE_CHECKING:
    from harness.engine.runtime import Runtime

#: Arguments the model sent that are not a JSON object are kept on the tool
#: step under this name (no tool parameter may start with "_"), and the call
#: is answered with an error instead of being made.
RAW_ARGUMENTS = "_raw_arguments"
#: Transient failures back off exponentially from this, up to the cap, with jitter.
RETRY_BASE = 1.0
RETRY_CAP = 60.0
#: A provider's ``retry-after`` is honoured up to this (a daily quota's hint of
#: hours would otherwise park the run until then; it is retried, and told again).
MAX_RETRY_AFTER = 3600.0
#: A model call may take at most this share of the step's time limit.
CALL_SHARE = 0.9


def _not_the_models_fault() -> tuple[type[BaseException], ...]:
    """Raised out of a model step as they are: the store failed reading the
    history, or the process stops the call (an interruption: nothing recorded)."""
    return (StoreError, *interruptions())


def tool_step(
    tools: StepExecutor,
    agent: Agent,
    step: Step,
    lease: Lease,
    found: StepStatus,
    namespace: str,
    hooks: WaitHooks | None = None,
) -> StepOutcome | Reschedule:
    """Call the step's tool through ``tools``. ``found``: the step's status as
    loaded (RUNNING: a previous attempt was interrupted, and may have acted)."""
    if step.approval is not None and step.approval.rejected:
        # The operator's word, not a tool error: the model is told, the run goes on.
        word = step.approval
        error = f"rejected by {word.by}: {word.reason or 'no reason given'}"
        return StepOutcome(Happened.REJECTED, error=error)
    try:
        spec = agent.tool(step.tool or "")
        if RAW_ARGUMENTS in step.args:
            raw = step.args[RAW_ARGUMENTS]
            raise ToolError(f"arguments for tool {spec.name!r} {_unusable(raw)}: {raw!r}")
        kwargs = spec.validate(step.args)
        called = tools.execute(
            spec,
            step,
            kwargs,
            lease=lease,
            recovered=found is StepStatus.RUNNING,
            namespace=namespace,
            hooks=hooks,
        )
    except InDoubt as doubt:
        return StepOutcome(Happened.IN_DOUBT, error=str(doubt))
    except Diverged as left:  # a replay's call off its recording: never made
        return StepOutcome(Happened.DIVERGED, error=str(left))
    except ToolUnavailable as err:
        return _unreachable(agent, step, err)
    except ToolError as err:  # a store failure is not the tool's: it propagates
        note = err.note if isinstance(err, RecordedToolError) else None
        answered = isinstance(err, RecordedToolError) and err.answered
        return StepOutcome(Happened.TOOL_ERROR, error=str(err), note=note, answered=answered)
    wait = wait_of(called.result, lease.clock.now())
    if wait is not None:  # the answer comes later: the slot is freed now
        note = describe_waits([replace(step, wait=wait)])
        return StepOutcome(
            Happened.DEFERRED, result=called.result, record=called.record, note=note, wait=wait
        )
    return StepOutcome(Happened.DONE, result=called.result, record=called.record, note=called.note)


def _unreachable(agent: Agent, step: Step, err: ToolUnavailable) -> StepOutcome | Reschedule:
    """A tool whose server could not be started or reached: retried after a
    back-off, at most ``agent.tool_retries`` times, then the step fails with
    the server's message. A call that may have reached the server before the
    connection broke is an interrupted call: in doubt if ``at_most_once``."""
    if err.sent and agent.tool_effect(step.tool) is ToolEffect.AT_MOST_ONCE:
        error = f"{err}; {step.tool} is at_most_once: resolve it with `harness resolve`"
        return StepOutcome(Happened.IN_DOUBT, error=error)
    if step.retries < agent.tool_retries:
        reason = f"retry {step.retries + 1} of {agent.tool_retries}: {err}"
        return Reschedule(retry_delay(step.retries, None), reason, retry=True)
    error = f"tool step {step.index} failed after {step.retries} retries: {err}"
    return StepOutcome(Happened.TOOL_ERROR, error=error)


def _unusable(raw: JSON) -> str:
    """Why arguments kept as text (:data:`RAW_ARGUMENTS`) were not used."""
    try:
        parsed = json.loads(raw) if isinstance(raw, str) else None
    except (ValueError, RecursionError):
        parsed = None
    if not isinstance(parsed, dict):
        return "are not a JSON object"
    try:
        checked_json(parsed, "arguments")
    except BadInput as err:
        return f"are not usable JSON ({err.problem})"
    return "are not a JSON object"


def model_request(rt: Runtime, run: Run, agent: Agent, step: Step) -> ModelRequest:
    """What the agent's model gets for the turn of ``step``. The history is read
    once, when first asked for (a budget's reservation, then the call): through
    the runtime's transcript cache, the steps after those it keeps
    (harness.engine.transcripts), or all of them without one."""
    transcripts = rt.transcripts
    if transcripts is None:
        steps = functools.cache(lambda: rt.store.steps(run.run_id))
        made = None
    else:
        read = functools.cache(lambda: transcripts.read(rt.store, run))
        steps = functools.cache(lambda: read().steps)
        made = functools.cache(lambda: read().exchanges(step.index))
    return ModelRequest(
        run.run_id,
        run.goal,
        int(step.args.get("turn", 0)),
        step.index,
        history=steps,
        exchanges=made,
        tools=agent.tool_specs,
        limiter=rt.limiter,
        # Under the step's limit, so a timeout is recorded as the step's error
        # while its lease still holds.
        timeout=CALL_SHARE * rt.step_time_limit,
        bounded=gates.budgeted(agent, run),
        output_type=agent.output_type,
    )


def _call(
    rt: Runtime,
    run: Run,
    step: Step,
    model: Model | AsyncModel,
    request: ModelRequest,
    lease: Lease,
) -> ModelTurn:
    """The model's turn, its text published as it comes (harness.streams),
    under the call's attempt: the step's attempts and retries together; and
    only while the lease holds, for a call taken over is discarded by the
    next one's first write, which must be the last word on it."""
    if rt.streams is None:
        return take_turn(model, request)
    attempt = step.attempts + step.retries
    # A step run straight through (no RUNNING checkpoint: harness.engine.runner)
    # counts no attempt in the store: a call after its crash has the same number,
    # straight through again, or claimed from the lease its first renewal wrote.
    again = not lease.claimed_before_execution or run.owner not in (None, *MARKS)
    tap = Tap(
        rt.streams,
        run.run_id,
        run.lineage,
        step.index,
        attempt,
        live=lease.seems_valid,
        again=again,
    )
    try:
        return take_turn(model, replace(request, on_text=tap))
    finally:
        tap.close()


def retry_delay(retries: int, retry_after: float | None) -> float:
    """Seconds before retry number ``retries + 1``: the provider's
    ``retry-after`` when it gave one (plus up to 10%, so that workers told the
    same do not return together), else exponential from :data:`RETRY_BASE`,
    capped at :data:`RETRY_CAP`, with full jitter in its upper half."""
    if retry_after is not None and retry_after > 0:
        return float(min(retry_after, MAX_RETRY_AFTER) * random.uniform(1.0, 1.1))
    return min(RETRY_CAP, RETRY_BASE * 2.0 ** min(retries, 16)) * random.uniform(0.5, 1.0)


def model_step(
    rt: Runtime,
    run: Run,
    agent: Agent,
    step: Step,
    lease: Lease,
    namespace: str,
    request: ModelRequest,
) -> StepOutcome | Reschedule:
    """Ask the agent's model for the next turn: a final answer completes the
    run; tool calls become new steps, each followed by the next model turn.

    A provider's response is recorded under the step's idempotency key the
    moment it arrives, before the result checkpoint: a step re-executed
    after a crash reads it back instead of calling (and paying) again. A
    transient failure or a full rate limit reschedules the step instead."""
    model = agent.model
    assert not isinstance(model, str)  # Agent resolves a shorthand to its model
    name = getattr(model, "name", "")
    cost = None
    recorder = None
    record = None
    try:
        if getattr(model, "records_early", False):
            # The model records its response itself, before its own code runs on it.
            recorder = StepRecorder(rt, step, namespace, lease, name)
            turn = _call(rt, run, step, model, replace(request, recorder=recorder), lease)
        elif getattr(model, "records_responses", True):
            # Recorded with its price: a call paid for is charged from its record
            # too, should its run end before this step's checkpoint (harness.engine.billing).
            called = rt.executor.respond(
                step,
                namespace,
                lease,
                lambda: _priced(rt, name, _call(rt, run, step, model, request, lease)),
            )
            turn = ModelTurn.from_result(called)
            cost = billing.recorded_cost(called)
            record = ToolRecord(step.idempotency_key, step.index, MODEL_RECORD, called)
        else:
            turn = _call(rt, run, step, model, request, lease)
    except _not_the_models_fault():
        raise  # reading the history failed, or the process stops the call: retry the step
    except Throttled as wait:
        # Spread out the runs that were turned away together.
        delay = wait.wait * random.uniform(1.0, 1.2)
        late = _past_deadline(rt, run, agent, delay, str(wait))
        if late is None:
            return Reschedule(delay, str(wait), retry=False)
        if wait.withdraw is not None:
            wait.withdraw()
        return _model_failed(late)
    except RetryableModelError as err:
        if step.retries < agent.model_retries:
            delay = retry_delay(step.retries, err.retry_after)
            late = _past_deadline(rt, run, agent, delay, str(err))
            if late is not None:
                return _failed(late, recorder)
            reason = f"retry {step.retries + 1} of {agent.model_retries}: {err}"
            return Reschedule(delay, reason, retry=True)
        error = f"model step {step.index} failed after {step.retries} retries: {err}"
        return _failed(error, recorder)
    except Exception as err:
        return _failed(f"model step {step.index} failed: {type(err).__name__}: {err}", recorder)
    if cost is None and turn.usage is not None:  # also a response recorded unpriced
        cost = rt.prices.cost(name, turn.usage)
    outcome = _turn_taken(run, agent, step, turn, request.turn, cost)
    # The response's record, named again by the result checkpoint: the store
    # keeps it once, with the step's result, when both are the same text
    # (harness.store.sql.rows.kept_once); otherwise the record stays as it is.
    return outcome if record is None else replace(outcome, record=record)


def _turn_taken(
    run: Run, agent: Agent, step: Step, turn: ModelTurn, turn_number: int, cost: float | None
) -> StepOutcome:
    """What the model's turn produced: a final answer, or the tool calls it
    asked for as new steps, each followed by the next model turn."""
    result = turn.to_result()
    if cost is not None:
        result["cost_usd"] = cost
    if turn.final is not None:
        if agent.output_type is None and isinstance(turn.final, str):
            return StepOutcome(
                Happened.FINAL, result=result, final=turn.final, usage=turn.usage, cost_usd=cost
            )
        return _structured(run, agent, step, turn, turn_number, result, cost)
    invalid = _invalid_answers(step)
    new_steps = [
        Step(
            run.run_id,
            step.index + 1 + i,
            StepKind.TOOL,
            StepStatus.PENDING,
            tool=c.name,
            args=c.args if c.raw_arguments is None else {RAW_ARGUMENTS: c.raw_arguments},
        )
        for i, c in enumerate(turn.tool_calls)
    ]
    new_steps.append(
        Step(
            run.run_id,
            step.index + 1 + len(new_steps),
            StepKind.MODEL,
            StepStatus.PENDING,
            args=_next_turn(turn_number, invalid),
        )
    )
    return StepOutcome(
        Happened.DONE,
        result=result,
        new_steps=tuple(new_steps),
        usage=turn.usage,
        cost_usd=cost,
    )


def _structured(
    run: Run,
    agent: Agent,
    step: Step,
    turn: ModelTurn,
    turn_number: int,
    result: dict[str, JSON],
    cost: float | None,
) -> StepOutcome:
    """A final answer wanted as a JSON object (``Agent(output_type=...)``, or
    one given as an object): valid, it completes the run, stored as the
    object; invalid, it is recorded with its error (``"invalid"``) and the
    model is asked again in a new model step that counts it, until
    ``output_retries`` are spent: then the run fails with the error. Either
    way the turn is billed once, on this step."""
    assert turn.final is not None
    try:
        answer = validated(agent.output_type, turn.final)
    except InvalidAnswer as err:
        invalid = _invalid_answers(step)
        result["invalid"] = str(err)
        if invalid >= agent.output_retries:
            error = f"model step {step.index}: the final answer is invalid"
            if invalid:
                error += f" after {invalid} {'retry' if invalid == 1 else 'retries'}"
            return _model_failed(f"{error}: {err}", result, turn.usage, cost)
        again = Step(
            run.run_id,
            step.index + 1,
            StepKind.MODEL,
            StepStatus.PENDING,
            args=_next_turn(turn_number, invalid + 1),
        )
        note = f"invalid final answer, asked again ({invalid + 1} of {agent.output_retries})"
        return StepOutcome(
            Happened.DONE,
            result=result,
            new_steps=(again,),
            usage=turn.usage,
            cost_usd=cost,
            note=note,
        )
    result["final"] = answer
    return StepOutcome(
        Happened.FINAL, result=result, final=as_text(answer), usage=turn.usage, cost_usd=cost
    )


def _invalid_answers(step: Step) -> int:
    """Invalid final answers before this model step (since the last valid one)."""
    count = step.args.get(INVALID_ANSWERS, 0)
    return count if isinstance(count, int) else 0


def _next_turn(turn_number: int, invalid: int) -> dict[str, JSON]:
    """The next model step's arguments: its turn, and the invalid answers so
    far, which its own turn's calls do not reset."""
    args: dict[str, JSON] = {"turn": turn_number + 1}
    if invalid:
        args[INVALID_ANSWERS] = invalid
    return args


def _priced(rt: Runtime, model: str, turn: ModelTurn) -> dict[str, JSON]:
    """The turn as its step stores it, with its price (when the model has one)."""
    result = turn.to_result()
    if turn.usage is not None:
        cost = rt.prices.cost(model, turn.usage)
        if cost is not None:
            result["cost_usd"] = cost
    return result


def _past_deadline(rt: Runtime, run: Run, agent: Agent, delay: float, why: str) -> str | None:
    """Why the run must end now rather than wait ``delay`` seconds for its
    provider: the wait would outlast its deadline. None if it may wait."""
    if agent.deadline is None:
        return None
    left = run.created_at + agent.deadline - rt.clock.now()
    if delay <= left:
        return None
    return (
        f"would pass its deadline of {agent.deadline:g}s waiting: {why} "
        f"(next try in {delay:.1f}s, {max(left, 0.0):.1f}s left)"
    )


def _failed(error: str, recorder: StepRecorder | None) -> StepOutcome:
    """The run fails with ``error``; a response the model recorded itself
    (paid for, then failed on by the model's own code) is kept on the step,
    and billed."""
    kept = None if recorder is None else recorder.kept
    if recorder is None or not isinstance(kept, dict):
        return _model_failed(error)
    return _model_failed(error, kept, recorder.usage(), billing.recorded_cost(kept))


def _model_failed(
    error: str,
    result: dict[str, JSON] | None = None,
    usage: Usage | None = None,
    cost: float | None = None,
) -> StepOutcome:
    """The run fails with ``error``; a turn the model did take is kept on its
    step, and billed."""
    return StepOutcome(
        Happened.MODEL_FAILED, result=result, error=error, usage=usage, cost_usd=cost
    )
