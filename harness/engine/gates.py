"""What may stop a step before it executes: its run's limits (steps, deadline,
interruptions), its budgets (tokens, cost, reserved before the model call),
and the two races an operator's note beside the version can lose against a
worker that loaded the run before it (a pause withdrawn, a word given
ahead). Each function decides; the runner writes what it returns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from harness.agents import Agent
from harness.engine import transitions
from harness.errors import RunNotFound, StoreError
from harness.models import ModelRequest, Usage
from harness.records import Run, RunStatus, Step, StepStatus
from harness.store import Checkpoint

if TYPE_CHECKING:
    from harness.engine.runtime import Runtime


def over_steps(agent: Agent, run: Run, step: Step) -> str | None:
    """Why the run may not take this step: it would pass its step limit (the
    run's, raised by `harness resume --max-steps`, or the agent's), counted
    across the whole conversation. None if it may."""
    max_steps = run.max_steps if run.max_steps is not None else agent.max_steps
    if step.index >= max_steps:
        return f"exceeded max_steps={max_steps}"
    return None


def over_limits(agent: Agent, run: Run, step: Step, now: float) -> str | None:
    """Why the run must fail before this step: too many steps, past its
    deadline, or a step interrupted too often. None if it may go on."""
    steps = over_steps(agent, run, step)
    if steps is not None:
        return steps
    if agent.deadline is not None and now > run.created_at + agent.deadline:
        return f"exceeded its deadline of {agent.deadline:g}s"
    if step.status is StepStatus.RUNNING and step.attempts >= agent.max_attempts:
        return (
            f"step {step.index} was interrupted {step.attempts} times "
            f"(max_attempts={agent.max_attempts}); giving up"
        )
    return None


def budgets(agent: Agent, run: Run) -> tuple[int | None, float | None]:
    """The run's token and cost budgets: raised by an operator, or the agent's."""
    max_tokens = run.max_tokens if run.max_tokens is not None else agent.max_tokens
    max_cost = run.max_cost_usd if run.max_cost_usd is not None else agent.max_cost_usd
    return max_tokens, max_cost


def budgeted(agent: Agent, run: Run) -> bool:
    """Does the run have a budget, so that its model calls must carry the
    output limit their reservation counts?"""
    return budgets(agent, run) != (None, None)


@dataclass(frozen=True)
class Overspent:
    """Why the next model call may not be made. ``raisable``: a budget that an
    operator can raise (``on_budget="pause"`` holds the run for it); if not, a
    setting to fix (a cost budget with no price to measure it by), and the run
    fails whatever ``on_budget`` says: a pause would only pause again after
    every resume."""

    reason: str
    raisable: bool = True


def over_spend(
    rt: Runtime, agent: Agent, run: Run, step: Step, request: ModelRequest | None
) -> Overspent | None:
    """Would the model call of ``step`` exceed the run's token or cost budget?
    The call's most (its input, estimated, and its output limit, which the
    request then carries) is reserved before it is made, so a run stops before
    it overspends, not after."""
    max_tokens, max_cost = budgets(agent, run)
    if request is None or (max_tokens is None and max_cost is None):
        return None
    reserve = getattr(agent.model, "reserve", None)
    try:
        wanted = Usage() if reserve is None else reserve(request)
    except StoreError:
        raise  # reading the history failed: retry the step
    except Exception as err:
        reason = f"cannot reserve the next model call's budget: {type(err).__name__}: {err}"
        return Overspent(reason, raisable=False)
    used = run.input_tokens + run.output_tokens
    needed = wanted.input_tokens + wanted.output_tokens
    if max_tokens is not None and used + needed > max_tokens:
        return Overspent(
            f"token budget: {used} used + {needed} reserved for the next model call "
            f"> max_tokens={max_tokens}"
        )
    if max_cost is None:
        return None
    name = getattr(agent.model, "name", "")
    cost = rt.prices.cost(name, wanted)
    if cost is None and wanted != Usage():
        return Overspent(
            f"max_cost_usd is set, but HARNESS_PRICES has no price for {name!r}: the cost "
            "budget cannot be measured (no call was made)",
            raisable=False,
        )
    if run.cost_usd + (cost or 0.0) > max_cost:
        return Overspent(
            f"cost budget: ${run.cost_usd:.6f} spent + ${cost or 0.0:.6f} reserved for the "
            f"next model call > max_cost_usd={max_cost:g}"
        )
    return None


def withdrawn_meanwhile(rt: Runtime, run_id: str) -> Checkpoint | None:
    """After our pause landed: did the operator withdraw it (beside the
    version) between our load and our write? Then the resume to write."""
    run = _reload(rt, run_id)
    if run is None or run.status is not RunStatus.PAUSED or run.pause_requested:
        return None
    return transitions.resume(run, who=rt.worker_id, now=rt.clock.now(), ttl=rt.lease_ttl)


def word_given_meanwhile(rt: Runtime, run_id: str) -> Checkpoint | None:
    """After our wait for approval landed: did an operator decide the call
    ahead (beside the version) between our load and our write? Then nobody
    else is left to act on the word: the decision to write."""
    run = _reload(rt, run_id)
    step = None if run is None else run.current
    if run is None or run.status is not RunStatus.WAITING or step is None:
        return None
    if step.approval is None or step.status is not StepStatus.AWAITING_APPROVAL:
        return None
    return transitions.act_on_word_ahead(
        run, step, who=rt.worker_id, now=rt.clock.now(), ttl=rt.lease_ttl
    )


def _reload(rt: Runtime, run_id: str) -> Run | None:
    try:
        return rt.store.load(run_id)
    except (StoreError, RunNotFound):
        return None  # the operator's next action (approve, resume) settles it
