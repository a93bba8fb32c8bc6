"""``harness fork``: a new run made of another run's recorded past.

Rewinding a durable run usually means executing again whatever came after
the rewind point: Temporal's reset re-runs activities, LangGraph's time
travel re-executes nodes, side effects included. A fork here never does.
The steps before the fork point are copied into the new run as they were
recorded (results, failures, approvals), and so are their idempotency
records, under the new run's keys ``"{fork}:{index}"``: a copied step is
settled, so no worker takes it up, and even a tool asked for under its key
would get the recorded result back. The new run starts live at the fork
point, with the original agent or another (``--agent``), with the original
goal or another (``--goal``); the original run is only read.

A fork point is a model step (a turn boundary: the model sees the copied
steps as the conversation so far and decides what comes next) whose earlier
steps have all settled (done or failed). The model step itself may be in
any state, so a run still moving can be forked at its current turn; a step
not recorded yet cannot be a fork point.

Waits (issue 23): a deferred call has not settled, so no turn after a call
still out is a fork point, and every copied step has its answer. A fork is
a run of its own: it is no child (a fork of a child run answers no parent)
and marks no calls out (``deferred_from``). A fork before a child's step
starts, when its turn calls the agent again, a child of its own under the
fork's id (``{fork}:{step}``); one after it copies the child's answer.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from harness import observability
from harness.agents import get_agent
from harness.engine import creation, transitions
from harness.engine.runtime import Runtime, dispatch
from harness.errors import BadForkPoint, OperatorError
from harness.records import Run, Step, StepKind


def fork_points(steps: Sequence[Step]) -> list[int]:
    """The indexes where a fork of a run with these ``steps`` (in order) can
    start: its model steps up to the first step that has not settled."""
    points = []
    for step in steps:
        if step.kind is StepKind.MODEL:
            points.append(step.index)
        if not step.status.settled:
            break
    return points


def check_fork_point(run: Run, steps: Sequence[Step], at: int) -> None:
    """Raise :class:`BadForkPoint`, saying which fork points exist, unless a
    fork of ``run`` (whose ``steps`` these are) can start at step ``at``."""
    points = fork_points(steps)
    if at in points:
        return
    where = f"a fork starts at a model turn: {', '.join(map(str, points)) or 'none yet'}"
    if not 0 <= at < len(steps):
        recorded = f"steps 0 to {len(steps) - 1}" if steps else "no steps"
        problem = f"run {run.run_id} has no step {at} recorded ({recorded})"
    elif steps[at].kind is StepKind.TOOL:
        problem = f"step {at} is a tool step"
    elif steps[at].kind is StepKind.USER:
        problem = f"step {at} is the user's message"
    else:
        unsettled = next((s for s in steps[:at] if not s.status.settled), steps[at])
        problem = (
            f"step {unsettled.index} before it is {unsettled.status.value}, "
            "and a fork copies only settled steps"
        )
    raise BadForkPoint(f"{problem}: {where}", points)


def fork_run(
    rt: Runtime,
    run_id: str,
    at: int,
    *,
    goal: str | None = None,
    agent: str | None = None,
    new_run_id: str | None = None,
) -> str:
    """Create the fork of ``run_id`` at model step ``at`` and dispatch its first
    step; return its id. Idempotent on an explicit ``new_run_id``: if that run
    exists and is this same fork (of ``run_id`` at ``at``, with this agent and
    goal) it is left as it is; any other run there is a RunConflict. Raises
    RunNotFound (also when the origin is pruned meanwhile), BadForkPoint,
    AgentNotFound, OperatorError (an empty goal), RunConflict."""
    if goal is not None and not goal.strip():
        raise OperatorError("the goal must not be empty: leave --goal out to keep the original")
    origin = rt.store.load(run_id)
    steps = rt.store.steps(run_id)
    check_fork_point(origin, steps, at)
    name = agent or origin.agent
    get_agent(name)  # the rest runs under it: it must exist
    records = rt.store.tool_records([s.idempotency_key for s in steps[:at]])
    now = rt.clock.now()
    made = transitions.fork(
        origin,
        steps,
        records,
        at,
        run_id=new_run_id or uuid.uuid4().hex,
        agent=name,
        goal=origin.goal if goal is None else goal,
        now=now,
    )
    stored, created = rt.store.create_fork(
        made.run, made.steps, made.records, wake_at=now + rt.lease_ttl, created=made.created
    )
    if not created:
        creation.refuse_other(stored, made.run)
    else:
        observability.created(stored.run_id, name, stored.version, rt.worker_id)
        dispatch(rt, stored.run_id, at)
    return stored.run_id
