"""The step runner: one step of one run, checkpointed on both sides.

``run_step`` is what the Celery task calls. Its lifecycle (DESIGN.md):

1. load the run with the step at its cursor (one round trip);
2. drop the message if the run is not movable, the cursor is stale, or any
   live lease holds the run;
3. claim the lease and checkpoint the step RUNNING, in one CAS transaction
   (a step found RUNNING here was interrupted: it is counted, then re-run
   through its idempotency key; an ``at_most_once`` tool is not re-invoked
   while in doubt);
4. execute, renewing the lease;
5. checkpoint the result, new steps, cursor, events and the tool's result
   record in one transaction, releasing the lease;
6. dispatch the next step. If that dispatch is lost, the sweeper re-sends it.

Checkpoint placement (``Agent.running_checkpoint``): by default the RUNNING
write of step 3 is made only before a tool that acts on the world
(``idempotent`` or ``at_most_once``). A model step or a ``read_only`` tool is
safe to run twice, so when its message arrives on time it goes straight to
execution and its result checkpoint is its only write; the lease is claimed
by the heartbeat only if it runs longer than a third of the TTL. A step
reached late, after a crash or a lost message, always takes the careful path.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import NamedTuple

from harness import faults
from harness.agents import Agent, get_agent
from harness.engine.idempotency import Cache, Called, ToolBusy, ToolCaller
from harness.engine.leases import Clock, Heartbeat, Lease
from harness.errors import (
    AgentNotFound,
    InDoubt,
    LeaseLost,
    RunNotFound,
    StaleWriteError,
    StoreError,
    ToolError,
)
from harness.models import ModelRequest
from harness.records import JSON, Run, RunStatus, Step, StepKind, StepStatus
from harness.store import KEEP, Checkpoint, EventDraft, RunPatch, StepPatch, Store
from harness.tools import ToolEffect

log = logging.getLogger(__name__)

#: The owner the sweeper writes, with a lease already lapsed, on a run it
#: re-sends: its next step is then taken with the careful path.
SWEEPER = "sweeper"


class Outcome(StrEnum):
    """What one step task did; the Celery task returns it for Flower to show."""

    ADVANCED = "advanced"
    COMPLETED = "completed"
    FAILED = "failed"
    WAITING = "waiting"
    NO_RUN = "no_run"
    NO_AGENT = "no_agent"
    NOT_MOVABLE = "not_movable"
    STALE = "stale"
    LEASED = "leased"
    RACED = "raced"
    LEASE_LOST = "lease_lost"
    BUSY = "busy"
    HOP = "hop"  # throughput mode: the next step needs a task of its own


class _Stepped(NamedTuple):
    outcome: Outcome
    agent: Agent | None = None
    next_cursor: int = -1  # set when ADVANCED


@dataclass(frozen=True)
class Runtime:
    """Everything the runner depends on, injected."""

    store: Store
    cache: Cache
    clock: Clock
    worker_id: str
    lease_ttl: float
    dispatch: Callable[[str, int], None]
    #: A step running longer than this stops renewing its lease, so another
    #: worker can take the run over even where Celery cannot kill the step.
    step_time_limit: float = 900.0
    crash: faults.CrashPoints = faults.NEVER


@dataclass(frozen=True)
class _Executed:
    status: StepStatus
    result: JSON = None
    error: str | None = None
    new_steps: tuple[Step, ...] = ()
    called: Called | None = None  # a tool step's call, and a result still to store
    run_status: RunStatus = RunStatus.RUNNING
    run_result: str | None = None
    run_error: str | None = None


#: Transitions every step makes; logged at DEBUG (the flight recorder has them all).
ROUTINE = frozenset({StepStatus.RUNNING.value, StepStatus.DONE.value})


def commit(rt: Runtime, checkpoint: Checkpoint) -> int:
    """Apply a checkpoint and log each of its transitions with run, step and
    version: at INFO, but for the routine ones (RUNNING, DONE) at DEBUG."""
    version = rt.store.checkpoint(checkpoint)
    for e in checkpoint.events:
        level = logging.DEBUG if e.to_status in ROUTINE else logging.INFO
        if not log.isEnabledFor(level):
            continue
        log.log(
            level,
            "run=%s step=%s v=%d %s -> %s%s",
            checkpoint.run_id,
            "-" if e.step_index is None else e.step_index,
            version,
            e.from_status or "-",
            e.to_status,
            f" ({e.detail})" if e.detail else "",
        )
    return version


def dispatch(rt: Runtime, run_id: str, cursor: int) -> None:
    """Send the step message. If it is lost, the sweeper re-sends it after ``wake_at``."""
    try:
        rt.dispatch(run_id, cursor)
    except Exception as err:
        log.warning(
            "run=%s step=%d dispatch failed (%s); the sweeper will resume it", run_id, cursor, err
        )


def create_run(rt: Runtime, agent_name: str, goal: str, run_id: str | None = None) -> str:
    """Create a run with its first model step, then dispatch it.

    Idempotent on an explicit ``run_id``: an existing run is left as it is.
    """
    get_agent(agent_name)
    now = rt.clock.now()
    run_id = run_id or uuid.uuid4().hex
    run = Run(
        run_id,
        agent_name,
        goal,
        RunStatus.PENDING,
        cursor=0,
        version=1,
        step_count=1,
        created_at=now,
        updated_at=now,
    )
    first = Step(run_id, 0, StepKind.MODEL, StepStatus.PENDING, args={"turn": 0})
    stored, created = rt.store.create_run(run, first, wake_at=now + rt.lease_ttl)
    if created:
        log.info("run=%s step=0 v=%d created for agent %s", run_id, stored.version, agent_name)
        dispatch(rt, run_id, 0)
    return run_id


def run_step(rt: Runtime, run_id: str, cursor: int | None = None) -> Outcome:
    """Carry ``run_id`` forward by one step, if this worker should; then send the
    next step's message. In throughput mode (``Agent.steps_per_task`` above 1)
    the following steps that are safe to rerun are executed here first, each
    with its own checkpoints, before the message is sent."""
    stepped = _one_step(rt, run_id, cursor)
    executed = 1
    while stepped.outcome is Outcome.ADVANCED and stepped.agent is not None:
        if executed >= stepped.agent.steps_per_task:
            break
        chained = _one_step(rt, run_id, stepped.next_cursor, chaining=True)
        if chained.outcome is Outcome.HOP:  # the next step needs a task of its own
            break
        stepped = chained
        executed += 1
    if stepped.outcome is Outcome.ADVANCED:
        dispatch(rt, run_id, stepped.next_cursor)
    return stepped.outcome


def _one_step(rt: Runtime, run_id: str, cursor: int | None, chaining: bool = False) -> _Stepped:
    try:
        run = rt.store.load(run_id)
    except RunNotFound:
        log.warning("run=%s does not exist: dropping its message", run_id)
        return _Stepped(Outcome.NO_RUN)
    if not run.status.movable:
        return _Stepped(Outcome.NOT_MOVABLE)
    if cursor is not None and cursor != run.cursor:
        log.info(
            "run=%s stale message for step %d (cursor is %d): dropped", run_id, cursor, run.cursor
        )
        return _Stepped(Outcome.STALE)
    now = rt.clock.now()
    if run.lease_live(now):  # even our own: another thread of this process may hold it
        return _Stepped(Outcome.LEASED)
    try:
        agent = get_agent(run.agent)
    except AgentNotFound as err:
        log.error("run=%s cannot run here: %s", run_id, err)
        return _Stepped(Outcome.NO_AGENT)
    step = run.current
    if step is None or step.status not in (StepStatus.PENDING, StepStatus.RUNNING):
        log.error("run=%s v=%d has no runnable step at cursor %d", run_id, run.version, run.cursor)
        return _Stepped(Outcome.NOT_MOVABLE)
    if chaining and not _safe_to_chain(agent, step):
        return _Stepped(Outcome.HOP, agent)
    try:
        claimed = _claim(
            rt, run, agent, step, now, write_running=not _straight_through(agent, run, step, now)
        )
    except StaleWriteError:
        return _Stepped(Outcome.RACED, agent)
    if isinstance(claimed, Outcome):
        return _Stepped(claimed, agent)
    rt.crash("after_running_checkpoint", step.kind)
    recovered = step.status is StepStatus.RUNNING
    return _execute_and_record(rt, run, agent, claimed, recovered)


def _safe_to_chain(agent: Agent, step: Step) -> bool:
    """Throughput mode runs on through a step only if it is pending and safe to rerun."""
    if step.status is not StepStatus.PENDING:
        return False
    return step.kind is StepKind.MODEL or agent.tool_effect(step.tool) in (
        ToolEffect.READ_ONLY,
        ToolEffect.IDEMPOTENT,
    )


def _straight_through(agent: Agent, run: Run, step: Step, now: float) -> bool:
    """May this step skip its RUNNING checkpoint? Only a step that is safe to
    run twice, in a run on its normal path: the message came before the run's
    wake-up time, and no previous owner's lease had to expire."""
    if agent.running_checkpoint == "always" or step.status is not StepStatus.PENDING:
        return False
    if run.owner is not None or run.wake_at is None or now >= run.wake_at:
        return False
    return step.kind is StepKind.MODEL or agent.tool_effect(step.tool) is ToolEffect.READ_ONLY


def _over_budget(agent: Agent, run: Run, step: Step, now: float) -> str | None:
    if step.index >= agent.max_steps:
        return f"exceeded max_steps={agent.max_steps}"
    if agent.deadline is not None and now > run.created_at + agent.deadline:
        return f"exceeded its deadline of {agent.deadline:g}s"
    if step.status is StepStatus.RUNNING and step.attempts >= agent.max_attempts:
        return (
            f"step {step.index} was interrupted {step.attempts} times "
            f"(max_attempts={agent.max_attempts}); giving up"
        )
    return None


def _claim(
    rt: Runtime, run: Run, agent: Agent, step: Step, now: float, write_running: bool = True
) -> Lease | Outcome:
    """The lease on ``run`` for this step, checkpointed RUNNING, or, without
    ``write_running``, a lease not yet written (its first renewal claims it)."""
    events: list[EventDraft] = []
    if run.owner not in (None, SWEEPER):  # leases are released after each step: it expired
        events.append(EventDraft("lease_takeover", detail=f"from {run.owner}"))
    reason = _over_budget(agent, run, step, now)
    if reason is not None:
        commit(
            rt,
            Checkpoint(
                run.run_id,
                run.version,
                rt.worker_id,
                now,
                run=RunPatch.ended(RunStatus.FAILED, error=reason),
                events=(*events, EventDraft(RunStatus.FAILED, run.status, detail=reason)),
            ),
        )
        return Outcome.FAILED
    if not write_running:
        return _lease(rt, run, step, run.version, now, claimed=False)
    if step.status is StepStatus.RUNNING:
        events.append(
            EventDraft(
                "recovered_running",
                step_index=step.index,
                detail=f"attempt {step.attempts} was interrupted",
            )
        )
    if run.status is RunStatus.PENDING:
        events.append(EventDraft(RunStatus.RUNNING, RunStatus.PENDING))
    events.append(
        EventDraft(StepStatus.RUNNING, step.status, step.index, f"attempt {step.attempts + 1}")
    )
    version = commit(
        rt,
        Checkpoint(
            run.run_id,
            run.version,
            rt.worker_id,
            now,
            run=RunPatch(
                status=RunStatus.RUNNING, owner=rt.worker_id, lease_expires_at=now + rt.lease_ttl
            ),
            steps=(
                StepPatch(
                    step.index, status=StepStatus.RUNNING, started_at=now, bump_attempts=True
                ),
            ),
            events=tuple(events),
        ),
    )
    return _lease(rt, run, step, version, now, claimed=True)


def _lease(rt: Runtime, run: Run, step: Step, version: int, now: float, claimed: bool) -> Lease:
    return Lease(
        rt.store,
        rt.clock,
        run.run_id,
        rt.worker_id,
        version,
        rt.lease_ttl,
        expires_at=now + rt.lease_ttl,
        deadline=now + rt.step_time_limit,
        crash=rt.crash,
        kind=step.kind,
        claimed=claimed,
        started_at=now,
    )


def run_namespace(run: Run) -> str:
    """Tells apart two runs that had the same id (a store wiped, an id reused)."""
    return f"{run.created_at:.6f}"


def _execute_and_record(
    rt: Runtime, run: Run, agent: Agent, lease: Lease, recovered: bool
) -> _Stepped:
    assert run.current is not None
    step = replace(run.current, status=StepStatus.RUNNING, attempts=run.current.attempts + 1)
    caller = ToolCaller(
        rt.store,
        rt.cache,
        rt.worker_id,
        rt.lease_ttl,
        lease,
        rt.crash,
        namespace=run_namespace(run),
    )
    try:
        with Heartbeat(lease, also=lambda: caller.renew(step)):
            if step.kind is StepKind.MODEL:
                executed = _model_step(rt, run, agent, step)
            else:
                executed = _tool_step(caller, agent, step, recovered)
    except ToolBusy as busy:
        return _Stepped(_back_off(rt, run, lease, busy.retry_after), agent)
    except LeaseLost:
        return _Stepped(Outcome.LEASE_LOST, agent)
    if lease.lost:
        return _Stepped(Outcome.LEASE_LOST, agent)
    return _record(rt, run, agent, step, lease, executed, caller)


def _tool_step(caller: ToolCaller, agent: Agent, step: Step, recovered: bool) -> _Executed:
    try:
        spec = agent.tool(step.tool or "")
        kwargs = spec.validate(step.args)
        called = caller.call(spec, step, kwargs, recovered=recovered)
    except InDoubt as doubt:
        reason = str(doubt)
        return _Executed(
            StepStatus.IN_DOUBT, error=reason, run_status=RunStatus.WAITING, run_error=reason
        )
    except ToolError as err:  # a store failure is not the tool's: it propagates
        error = str(err)
    else:
        return _Executed(StepStatus.DONE, result=called.result, called=called)
    if agent.on_tool_error == "fail":
        return _Executed(
            StepStatus.FAILED,
            error=error,
            run_status=RunStatus.FAILED,
            run_error=f"step {step.index} failed: {error}",
        )
    return _Executed(StepStatus.FAILED, error=error)


def _model_step(rt: Runtime, run: Run, agent: Agent, step: Step) -> _Executed:
    turn_number = int(step.args.get("turn", 0))
    request = ModelRequest(
        run.run_id, run.goal, turn_number, step.index, history=lambda: rt.store.steps(run.run_id)
    )
    try:
        turn = agent.model.next_turn(request)
    except StoreError:
        raise  # reading the history failed: not the model's fault, retry the step
    except Exception as err:
        error = f"model step {step.index} failed: {type(err).__name__}: {err}"
        return _Executed(
            StepStatus.FAILED, error=error, run_status=RunStatus.FAILED, run_error=error
        )
    if turn.final is not None:
        return _Executed(
            StepStatus.DONE,
            result={"final": turn.final},
            run_status=RunStatus.COMPLETED,
            run_result=turn.final,
        )
    calls = [{"name": c.name, "args": c.args} for c in turn.tool_calls]
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
            step.index + 1 + len(calls),
            StepKind.MODEL,
            StepStatus.PENDING,
            args={"turn": turn_number + 1},
        )
    )
    return _Executed(StepStatus.DONE, result={"tool_calls": calls}, new_steps=tuple(new_steps))


def _record(
    rt: Runtime,
    run: Run,
    agent: Agent,
    step: Step,
    lease: Lease,
    done: _Executed,
    caller: ToolCaller,
) -> _Stepped:
    """The result checkpoint. The next step's message is the caller's to send."""
    now = rt.clock.now()
    events = []
    step_patch = StepPatch(
        step.index, status=done.status, result=done.result, error=done.error, finished_at=now
    )
    if not lease.claimed_before_execution:  # the step went straight through
        if run.status is RunStatus.PENDING:
            events.append(EventDraft(RunStatus.RUNNING, RunStatus.PENDING))
        events.append(EventDraft(done.status, StepStatus.PENDING, step.index, done.error))
        step_patch = replace(step_patch, started_at=lease.started_at, bump_attempts=True)
    else:
        events.append(EventDraft(done.status, StepStatus.RUNNING, step.index, done.error))
    advance = done.status is not StepStatus.IN_DOUBT
    next_cursor = step.index + 1 if advance else step.index
    # The lease is released: the next step's message may reach any worker.
    patch = RunPatch(
        status=RunStatus.RUNNING, owner=None, lease_expires_at=None, wake_at=now + rt.lease_ttl
    )
    if done.run_status is not RunStatus.RUNNING:
        patch = RunPatch.ended(done.run_status, error=done.run_error, result=done.run_result)
        events.append(EventDraft(done.run_status, RunStatus.RUNNING, detail=done.run_error))
    patch = replace(patch, cursor=next_cursor, step_count=run.step_count + len(done.new_steps))
    called = done.called
    checkpoint = Checkpoint(
        run.run_id,
        lease.version,
        rt.worker_id,
        now,
        run=patch,
        steps=(step_patch,),
        new_steps=done.new_steps,
        events=tuple(events),
        tool_record=None if called is None else called.record,
    )
    try:
        lease.persist(lambda: commit(rt, checkpoint), f"the checkpoint of step {step.index}")
    except StaleWriteError:
        if _landed(rt, checkpoint):
            log.info(
                "run=%s step=%d the checkpoint had committed before its connection failed",
                run.run_id,
                step.index,
            )
        else:
            log.warning(
                "run=%s step=%d v=%d result not recorded: the run was taken over",
                run.run_id,
                step.index,
                lease.version,
            )
            if called is not None:
                caller.recorded(step, called, committed=False)
            return _Stepped(Outcome.LEASE_LOST, agent)
    if called is not None:
        caller.recorded(step, called, committed=True)
    if done.run_status is not RunStatus.RUNNING:
        return _Stepped(Outcome(done.run_status.value), agent)
    rt.crash("after_result_checkpoint", step.kind)
    return _Stepped(Outcome.ADVANCED, agent, next_cursor)


def _landed(rt: Runtime, checkpoint: Checkpoint) -> bool:
    """Did a checkpoint that reported a lost connection (and then failed its retry as
    stale) commit after all? Then the run is at the very next version, at our
    timestamp, with our cursor and status: no other writer (a cancel, the
    sweeper) could have produced exactly that."""
    try:
        run = rt.store.load(checkpoint.run_id)
    except StoreError:
        return False
    wanted = checkpoint.run
    return (
        run.version == checkpoint.expected_version + 1
        and run.updated_at == checkpoint.now
        and run.cursor == wanted.cursor
        and run.status == (RunStatus.RUNNING if wanted.status is KEEP else wanted.status)
    )


def _back_off(rt: Runtime, run: Run, lease: Lease, retry_after: float) -> Outcome:
    now = rt.clock.now()
    try:
        commit(
            rt,
            Checkpoint(
                run.run_id,
                lease.version,
                rt.worker_id,
                now,
                run=RunPatch(owner=None, lease_expires_at=None, wake_at=now + retry_after),
                events=(
                    EventDraft(
                        "tool_busy", step_index=run.cursor, detail=f"retry in {retry_after:.1f}s"
                    ),
                ),
            ),
        )
    except StaleWriteError:
        return Outcome.LEASE_LOST
    return Outcome.BUSY
