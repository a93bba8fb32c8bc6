"""Executing one step: what a model turn or a tool call produces.

Each function returns the :class:`~harness.engine.transitions.StepOutcome`
that the runner records; neither writes anything. A failure of the tool or
the model is an outcome (the step failed, perhaps the run with it); a store
failure is not theirs and propagates, and so do the control-flow signals
(:class:`~harness.errors.StepInterrupted`).
"""

from __future__ import annotations

from harness.agents import Agent
from harness.engine.idempotency import ToolExecutor
from harness.engine.leases import Lease
from harness.engine.transitions import StepOutcome
from harness.errors import InDoubt, StoreError, ToolError
from harness.models import ModelRequest
from harness.records import Run, RunStatus, Step, StepKind, StepStatus
from harness.store import Store


def tool_step(
    tools: ToolExecutor,
    agent: Agent,
    step: Step,
    lease: Lease,
    found: StepStatus,
    namespace: str,
) -> StepOutcome:
    """Call the step's tool through ``tools``. ``found``: the step's status as
    loaded (RUNNING: a previous attempt was interrupted, and may have acted)."""
    try:
        spec = agent.tool(step.tool or "")
        kwargs = spec.validate(step.args)
        called = tools.execute(
            spec,
            step,
            kwargs,
            lease=lease,
            recovered=found is StepStatus.RUNNING,
            namespace=namespace,
        )
    except InDoubt as doubt:
        reason = str(doubt)
        return StepOutcome(
            StepStatus.IN_DOUBT, error=reason, run_status=RunStatus.WAITING, run_error=reason
        )
    except ToolError as err:  # a store failure is not the tool's: it propagates
        error = str(err)
    else:
        return StepOutcome(StepStatus.DONE, result=called.result, record=called.record)
    if agent.on_tool_error == "fail":
        return StepOutcome(
            StepStatus.FAILED,
            error=error,
            run_status=RunStatus.FAILED,
            run_error=f"step {step.index} failed: {error}",
        )
    return StepOutcome(StepStatus.FAILED, error=error)


def model_step(store: Store, run: Run, agent: Agent, step: Step) -> StepOutcome:
    """Ask the agent's model for the next turn: a final answer completes the
    run; tool calls become new steps, each followed by the next model turn."""
    turn_number = int(step.args.get("turn", 0))
    request = ModelRequest(
        run.run_id, run.goal, turn_number, step.index, history=lambda: store.steps(run.run_id)
    )
    try:
        turn = agent.model.next_turn(request)
    except StoreError:
        raise  # reading the history failed: not the model's fault, retry the step
    except Exception as err:
        error = f"model step {step.index} failed: {type(err).__name__}: {err}"
        return StepOutcome(
            StepStatus.FAILED, error=error, run_status=RunStatus.FAILED, run_error=error
        )
    if turn.final is not None:
        return StepOutcome(
            StepStatus.DONE,
            result=turn.to_result(),
            run_status=RunStatus.COMPLETED,
            run_result=turn.final,
        )
    new_steps = [
        Step(
            run.run_id,
            step.index + 1 + i,
            StepKind.TOOL,
            StepStatus.PENDING,
            tool=c.name,
            args=c.args,
        )
        for i, c in enumerate(turn.tool_calls)
    ]
    new_steps.append(
        Step(
            run.run_id,
            step.index + 1 + len(new_steps),
            StepKind.MODEL,
            StepStatus.PENDING,
            args={"turn": turn_number + 1},
        )
    )
    return StepOutcome(StepStatus.DONE, result=turn.to_result(), new_steps=tuple(new_steps))
