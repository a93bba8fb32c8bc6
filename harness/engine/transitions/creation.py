"""The transitions that make a run: a new one, a fork of another's past, a
replay of an ended one; and the event each is created with.

Each returns what :meth:`~harness.store.Store.create_run` (or
:meth:`~harness.store.Store.create_fork`) inserts, its creation event
included: the store writes it, and never words one itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from harness.records import (
    ForkOrigin,
    ReplayOrigin,
    Run,
    RunStatus,
    Step,
    StepKind,
    StepStatus,
    idempotency_key,
)
from harness.store import EventDraft, ToolRecord


def new_run(run_id: str, agent: str, goal: str, now: float) -> tuple[Run, list[Step]]:
    """A run and its first model step, as :meth:`Store.create_run` inserts them."""
    run = Run(
        run_id,
        agent,
        goal,
        RunStatus.PENDING,
        cursor=0,
        version=1,
        step_count=1,
        created_at=now,
        updated_at=now,
    )
    return run, [Step(run_id, 0, StepKind.MODEL, StepStatus.PENDING, args={"turn": 0})]


def created(run: Run) -> EventDraft:
    """The event a new run (or a replay) is inserted with: its agent, the
    run it replays, and the run that started it, if any."""
    detail = f"agent={run.agent}"
    if run.parent is not None:
        detail += f"; child of {run.parent.run_id} step {run.parent.step}"
    if run.replay_of is not None:
        detail += f"; replay of {run.replay_of.run_id}"
        detail += "; live read_only calls" * run.replay_of.live_read_only
    return EventDraft(RunStatus.PENDING, detail=detail)


@dataclass(frozen=True)
class Fork:
    """A new run made of another's recorded past: what :meth:`Store.create_fork`
    inserts. ``records``: the idempotency records of the copied steps, under
    the new run's keys; ``created``: its creation event, which says what it
    was forked from."""

    run: Run
    steps: tuple[Step, ...]
    records: tuple[ToolRecord, ...]
    created: EventDraft


def fork(
    origin: Run,
    steps: Sequence[Step],
    records: Sequence[ToolRecord],
    at: int,
    *,
    run_id: str,
    agent: str,
    goal: str,
    now: float,
) -> Fork:
    """A fork of ``origin`` at its model step ``at``: its steps before ``at``
    copied as they were recorded (results, failures, approvals, attempts), so
    none is executed again, and step ``at`` a fresh pending model turn with
    the same arguments (its turn number), where the new run starts. The run
    row's usage is the copied model steps' sum, so it agrees with its steps
    (and budgets count what the copied past cost). ``steps``: the origin's
    steps 0..``at`` at least; that ``at`` is a fork point is the caller's check
    (:func:`harness.runs.fork.fork_points`)."""
    turn = steps[at]
    assert turn.index == at and turn.kind is StepKind.MODEL, turn
    copied = tuple(replace(s, run_id=run_id) for s in steps[:at])
    fresh = Step(run_id, at, StepKind.MODEL, StepStatus.PENDING, args=dict(turn.args))
    usage = [s.result for s in copied if s.kind is StepKind.MODEL and isinstance(s.result, dict)]
    tokens = [u.get("usage") or {} for u in usage]
    same_agent = agent == origin.agent
    run = Run(
        run_id,
        agent,
        goal,
        RunStatus.PENDING,
        cursor=at,
        version=1,
        step_count=at + 1,
        created_at=now,
        updated_at=now,
        input_tokens=sum(int(t.get("input_tokens") or 0) for t in tokens),
        output_tokens=sum(int(t.get("output_tokens") or 0) for t in tokens),
        cost_usd=sum(float(u.get("cost_usd") or 0.0) for u in usage),
        # Budgets an operator raised were for this agent's run: they go with it.
        max_tokens=origin.max_tokens if same_agent else None,
        max_cost_usd=origin.max_cost_usd if same_agent else None,
        forked_from=ForkOrigin(origin.run_id, at),
        # A fork of a replay goes on as a replay of the same recording.
        replay_of=origin.replay_of,
    )
    kept = tuple(
        ToolRecord(idempotency_key(run_id, r.step_index), r.step_index, r.tool, r.result)
        for r in records
        if r.step_index < at
    )
    detail = f"forked from {origin.run_id} at step {at}; agent={agent}"
    if goal != origin.goal:
        detail += "; new goal"
    return Fork(run, (*copied, fresh), kept, EventDraft(RunStatus.PENDING, detail=detail))


def replay(
    origin: Run, *, run_id: str, agent: str, live_read_only: bool, now: float
) -> tuple[Run, list[Step]]:
    """A replay of the ended run ``origin`` under ``agent``: a new run on the
    same goal, from its first model turn, whose tool calls are served from
    ``origin``'s steps (harness.engine.cassette); inserted as
    :func:`new_run`'s pair is, with the event of :func:`created`."""
    run, steps = new_run(run_id, agent, origin.goal, now)
    return replace(run, replay_of=ReplayOrigin(origin.run_id, live_read_only)), steps
