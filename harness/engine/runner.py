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

Steps 1 and 3 are one statement for a call of an ``idempotent`` tool whose
message carries a :class:`ClaimHint` (the run's state as the previous step
left it): the claim is written, guarded by that state, and returns the run
as a load would have; if the run is not in that state nothing is written and
the message takes the path above.

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
import time
import uuid
from dataclasses import replace

from harness import observability, toolsets
from harness.agents import Agent, get_agent
from harness.engine import (
    billing,
    checkpointing,
    children,
    conversation,
    gates,
    hints,
    offering,
    probes,
    transitions,
    waits,
)
from harness.engine.cassette import Cassette
from harness.engine.checkpointing import run_namespace
from harness.engine.executor import ToolBusy
from harness.engine.hints import ClaimHint
from harness.engine.leases import Heartbeat, Lease
from harness.engine.runtime import Runtime, commit, dispatch
from harness.engine.steps import model_request, model_step, tool_step
from harness.engine.taskresult import Stepped, TaskResult
from harness.errors import AgentNotFound, LeaseLost, RunNotFound, StaleWriteError, StoreError
from harness.models import ModelRequest
from harness.observability import tracing
from harness.records import Run, RunStatus, Step, StepKind, StepStatus
from harness.store import Checkpoint
from harness.tools import ToolEffect

log = logging.getLogger(__name__)

#: Re-exported for the callers that mark or recognise a sweeper re-send.
SWEEPER = transitions.SWEEPER


def run_step(
    rt: Runtime, run_id: str, cursor: int | None = None, hint: ClaimHint | None = None
) -> TaskResult:
    """Carry ``run_id`` forward by one step, if this worker should; then send the
    next step's message. In throughput mode (``Agent.steps_per_task`` above 1)
    the following steps that are safe to rerun are executed here first, each
    with its own checkpoints, before the message is sent: as many as the
    agent allows, and none started after ``rt.chain_budget`` seconds, so the
    chain stays inside the task's time limit. ``hint``: the message's
    :class:`ClaimHint`, if it came with one."""
    probe = probes.parse(run_id)
    if probe is not None:
        _delivered(rt, *probe)
        return TaskResult.PROBE
    started = rt.clock.now()
    stepped, tried = None, None
    if hint is not None and cursor is not None:
        stepped, tried = _claim_on_hint(rt, run_id, cursor, hint)
    if stepped is None:
        stepped = _one_step(rt, run_id, cursor, tried=tried)
    executed = 1
    while stepped.outcome is TaskResult.ADVANCED and stepped.agent is not None:
        if executed >= stepped.agent.steps_per_task:
            break
        if rt.clock.now() - started >= rt.chain_budget:
            break
        chained = _one_step(rt, run_id, stepped.next_cursor, chaining=True)
        if chained.outcome is TaskResult.HOP:  # the next step needs a task of its own
            break
        stepped = chained
        executed += 1
    if stepped.outcome in (TaskResult.ADVANCED, TaskResult.RESCHEDULED):
        dispatch(rt, run_id, stepped.next_cursor, delay=stepped.delay, hint=stepped.hint)
    return stepped.outcome


def _claim_on_hint(
    rt: Runtime, run_id: str, cursor: int, hint: ClaimHint
) -> tuple[Stepped | None, Checkpoint | None]:
    """Claim the step at ``cursor`` as the message's hint says the run is, and
    execute it: the load and the RUNNING checkpoint in one statement. Taken
    only where a load would lead to that same claim, whatever it found: a
    call of an idempotent tool needing no approval (:func:`hints.may_claim`),
    in a run in the state the guard checks. The tool's effect and approval
    are read from this worker's registry, not trusted from the sender's.
    (None, the claim tried, if any): the claim did not land, or its
    reply was lost (:func:`_one_step` tells which): handle the message by a
    load."""
    try:
        agent = get_agent(hint.agent)
    except AgentNotFound:
        return None, None
    if not hints.may_claim(agent, cursor, hint.tool):
        return None, None
    now = rt.clock.now()
    owner = _new_owner(rt)
    checkpoint = transitions.claim_pending(
        run_id, hint.version, cursor, hint.attempts, worker=owner, now=now, ttl=rt.lease_ttl
    )
    began = time.perf_counter()
    claimed = rt.store.claim_loaded(checkpoint, hints.guard(hint, cursor))
    if claimed is None:
        return None, checkpoint
    run, version = claimed
    write = time.perf_counter() - began
    observability.committed(checkpoint, version, kind=StepKind.TOOL, duration=None, write=write)
    return _execute_claimed(rt, run, agent, owner, version, now), None


def _execute_claimed(
    rt: Runtime, run: Run, agent: Agent, owner: str, version: int, now: float
) -> Stepped:
    """Execute the call that ``owner`` claimed on a hint at ``now``: ``run``
    as it was before the claim, ``version`` the claim's."""
    step = run.current
    assert step is not None  # the guard found it
    lease = _lease(rt, run, step, owner, version, now, claimed=True)
    return _execute(rt, run, agent, step, lease, None)


def _claim_landed(rt: Runtime, run: Run, tried: Checkpoint) -> Stepped | None:
    """Had the claim ``tried`` on a hint landed, its reply lost (a connection
    that dropped as it committed)? Then ``run``, as loaded, carries its owner
    (one execution's own name) at the very next version, and the call is ours
    to execute, as the load path's claim does after :func:`_landed`. None if not."""
    step = run.current
    if run.owner != tried.worker or run.version != tried.expected_version + 1 or step is None:
        return None
    if not run.lease_live(rt.clock.now()):
        return None  # lapsed before we knew it was ours: taken over as any lapsed lease
    try:
        agent = get_agent(run.agent)
    except AgentNotFound:
        return None  # checked before the claim: a registry changed since; the lease lapses
    log.info(
        "run=%s step=%d the claim had committed before its reply was lost", run.run_id, step.index
    )
    # The run and the step as the claim found them (claim_pending's state).
    before = replace(
        run,
        version=tried.expected_version,
        owner=None,
        lease_expires_at=None,
        current=replace(
            step, status=StepStatus.PENDING, attempts=step.attempts - 1, started_at=None
        ),
    )
    assert tried.worker is not None
    return _execute_claimed(rt, before, agent, tried.worker, run.version, tried.now)


def _delivered(rt: Runtime, lane: str, sent_at: float) -> None:
    """A probe came off ``lane``: every message sent down it before
    ``sent_at`` has been delivered. A failure to note it only delays a
    re-send until the next probe."""
    try:
        rt.store.note_delivered(lane, sent_at)
    except StoreError as err:
        log.warning("probe of lane %s not noted: %s", lane, err)


def _one_step(
    rt: Runtime,
    run_id: str,
    cursor: int | None,
    chaining: bool = False,
    tried: Checkpoint | None = None,
) -> Stepped:
    """Carry the run one step on a message: load it, take its step if this
    worker should, and execute it or make the transition that stands in its
    place. ``tried``: a claim on the message's hint that did not answer with
    the run."""
    try:
        run = rt.store.load(run_id, at=cursor)
    except RunNotFound:
        log.warning("run=%s does not exist: dropping its message", run_id)
        return Stepped(TaskResult.NO_RUN)
    landed = None if tried is None else _claim_landed(rt, run, tried)
    if landed is not None:
        return landed
    now = rt.clock.now()
    held = _not_ours(rt, run, cursor, now)
    if held is not None:
        return held
    try:
        agent = offering.for_run(rt.store, get_agent(run.agent), run, now)
    except AgentNotFound:  # the same words from every worker, whatever it has: recorded once
        _blocked(rt, run, f"no agent named {run.agent!r} on the worker that took it", now)
        return Stepped(TaskResult.NO_AGENT)
    except toolsets.ToolsetUnavailable as err:  # a server down: it may come back
        _blocked(rt, run, f"its tools cannot be offered: {err}", now)  # re-sent, further apart
        return Stepped(TaskResult.NO_AGENT)
    except toolsets.ToolsetError as err:  # no worker of this deploy will carry it: it ends
        return _fail(rt, run, f"its tools cannot be offered: {err}", get_agent(run.agent), now)
    step = run.current
    if step is None or step.status not in (StepStatus.PENDING, StepStatus.RUNNING):
        _blocked(rt, run, f"no runnable step at cursor {run.cursor}", now)
        return Stepped(TaskResult.NOT_MOVABLE)
    if chaining and not _safe_to_chain(agent, run, step):
        return Stepped(TaskResult.HOP, agent)
    return _take(rt, run, agent, step, now)


def _not_ours(rt: Runtime, run: Run, cursor: int | None, now: float) -> Stepped | None:
    """The answer to a message whose step is not this worker's to take now:
    the run is not movable, the message is stale, a live lease holds the run,
    a pause was asked for (made here, at a step boundary), or a rescheduled
    step's time has not come. None: the step may be taken."""
    run_id = run.run_id
    if not run.status.movable:
        return Stepped(TaskResult.NOT_MOVABLE)
    if cursor is not None and cursor != run.cursor:
        log.info(
            "run=%s stale message for step %d (cursor is %d): dropped", run_id, cursor, run.cursor
        )
        return Stepped(TaskResult.STALE)
    if run.lease_live(now):  # even our own: another thread of this process may hold it
        log.info(
            "run=%s step=%d v=%d held by %s: duplicate message dropped",
            run_id,
            run.cursor,
            run.version,
            run.owner,
        )
        return Stepped(TaskResult.LEASED)
    if run.pause_requested:
        return _pause_at_boundary(rt, run, now)
    if run.owner == transitions.RESCHEDULED and run.wake_at is not None and now < run.wake_at:
        log.info(
            "run=%s step=%d waits %.1fs more: early message dropped",
            run_id,
            run.cursor,
            run.wake_at - now,
        )
        return Stepped(TaskResult.EARLY)
    return None


def _pause_at_boundary(rt: Runtime, run: Run, now: float) -> Stepped:
    """Make the pause an operator asked for, now that the run is at a step
    boundary (no live lease: nothing executing that we know of)."""
    checkpoint = transitions.pause(run, "paused by an operator", worker=rt.worker_id, now=now)
    stopped = _stop(rt, checkpoint, TaskResult.PAUSED, None)
    if stopped.outcome is TaskResult.PAUSED:
        # A withdrawal may have raced our pause: then resume the run.
        resumed = gates.withdrawn_meanwhile(rt, run.run_id)
        if resumed is not None and _committed(rt, resumed):
            return Stepped(TaskResult.ADVANCED, None, run.cursor)
    return stopped


def _take(rt: Runtime, run: Run, agent: Agent, step: Step, now: float) -> Stepped:
    """Claim and execute ``step``, unless a limit or a budget ends or pauses
    the run first, or the call waits for an operator's approval."""
    steps = gates.over_steps(agent, run, step)
    if steps is not None and agent.on_budget == "pause":  # `harness resume --max-steps`
        return _stop(
            rt,
            transitions.pause(run, steps, worker=rt.worker_id, now=now),
            TaskResult.PAUSED,
            agent,
        )
    reason = gates.over_limits(agent, run, step, now)
    if reason is not None:
        return _fail(rt, run, reason, agent, now)
    if step.kind is StepKind.MODEL and run.deferred_from is not None:
        # Calls of the turn before deferred: the turn waits for their answers.
        answered = waits.hold_for_answers(rt, run)
        if answered is None:
            return Stepped(TaskResult.WAITING, agent)
        run = answered
    if (
        step.kind is StepKind.MODEL
        # A turn under way, or tried before (its response may be recorded,
        # paid for), keeps its step: the message waits for the next turn.
        and step.status is StepStatus.PENDING
        and step.attempts == 0
        and run.inbox_at is not None
        and run.replay_of is None
    ):
        # The user's messages come before this turn: made steps, then the turn.
        taken = conversation.at_model_turn(rt, run, step)
        if taken is not None:
            return Stepped(TaskResult.RACED if taken < 0 else TaskResult.ADVANCED, agent, taken)
    # Built once: a budget's reservation and the call read the same history.
    request = model_request(rt, run, agent, step) if step.kind is StepKind.MODEL else None
    spent = gates.over_spend(rt, agent, run, step, request)
    if spent is not None:
        if agent.on_budget == "pause" and spent.raisable:
            checkpoint = transitions.pause(run, spent.reason, worker=rt.worker_id, now=now)
            return _stop(rt, checkpoint, TaskResult.PAUSED, agent)
        return _fail(rt, run, spent.reason, agent, now)
    if (
        step.kind is StepKind.TOOL
        and step.approval is None
        and run.replay_of is None  # a replay's calls are served, or made only if read_only
        and agent.needs_approval(step.tool)
    ):
        return _await_approval(rt, run, agent, step, now)
    lease = _claim(rt, run, agent, step, now)
    if lease is None:
        return Stepped(TaskResult.RACED, agent)
    return _execute(rt, run, agent, step, lease, request)


def _await_approval(rt: Runtime, run: Run, agent: Agent, step: Step, now: float) -> Stepped:
    """Hold the run until an operator approves or rejects the call at ``step``."""
    checkpoint = transitions.await_approval(run, step, worker=rt.worker_id, now=now)
    stopped = _stop(rt, checkpoint, TaskResult.WAITING, agent)
    if stopped.outcome is TaskResult.WAITING:
        # A word given ahead may have raced our wait: then act on it.
        decided = gates.word_given_meanwhile(rt, run.run_id)
        if decided is not None and _committed(rt, decided):
            return Stepped(TaskResult.ADVANCED, agent, step.index)
    return stopped


def _execute(
    rt: Runtime, run: Run, agent: Agent, step: Step, lease: Lease, request: ModelRequest | None
) -> Stepped:
    rt.crash("after_running_checkpoint", step.kind)
    with tracing.step_span(run, step) as span:
        stepped = _execute_and_record(rt, run, agent, lease, request)
        tracing.outcome(span, stepped.outcome)
    return stepped


def _blocked(rt: Runtime, run: Run, reason: str, now: float) -> None:
    """This worker cannot carry ``run``. The message is dropped; the sweeper
    re-sends it, further apart each time, so a worker that can (a rolling
    deploy) still takes it. The reason is recorded once, and only on a
    re-sent run: on the normal path another worker may be executing its
    step without a lease written yet, and only a lease holder may write."""
    log.error("run=%s v=%d cannot move here: %s", run.run_id, run.version, reason)
    if run.owner is None or run.blocked == reason:
        return
    try:
        commit(rt, transitions.block(run, reason, worker=rt.worker_id, now=now))
    except (StaleWriteError, StoreError) as err:
        log.info("run=%s reason not recorded (%s)", run.run_id, err)


def _safe_to_chain(agent: Agent, run: Run, step: Step) -> bool:
    """Throughput mode runs on through a step only if it is pending and safe to rerun."""
    if step.status is not StepStatus.PENDING:
        return False
    effect = agent.tool_effect(step.tool)
    if step.kind is StepKind.MODEL or run.replay_of is not None:
        return True  # a replay's tool call is served, made only if read_only, or not made
    return effect is not None and effect.safe_to_repeat


def _straight_through(agent: Agent, run: Run, step: Step, now: float, ttl: float) -> bool:
    """May this step skip its RUNNING checkpoint? Only a step that is safe to
    run twice, in a run on its normal path: no previous owner's lease had to
    expire, and the message came early enough that the first heartbeat (a
    third of the TTL in) writes the lease well before the run's wake-up time
    (half a TTL: room for a slow beat), so the sweeper cannot re-send a step
    that is under way."""
    if agent.running_checkpoint == "always" or step.status is not StepStatus.PENDING:
        return False
    if run.owner is not None or run.wake_at is None or now + ttl / 2 >= run.wake_at:
        return False
    if step.kind is StepKind.MODEL:
        # A model that is paid for (its responses are recorded) takes the lease
        # first: a duplicate message then finds it held, with or without Redis,
        # instead of buying the same turn a second time.
        return not getattr(agent.model, "records_responses", True)
    # A replay's tool call is served from its recording, or made only if read_only.
    return run.replay_of is not None or agent.tool_effect(step.tool) is ToolEffect.READ_ONLY


def _stop(rt: Runtime, checkpoint: Checkpoint, outcome: TaskResult, agent: Agent | None) -> Stepped:
    """A transition made instead of executing the step (a limit, a budget, a
    pause, an approval to wait for); RACED if another writer came first."""
    return Stepped(outcome if _committed(rt, checkpoint) else TaskResult.RACED, agent)


def _fail(rt: Runtime, run: Run, reason: str, agent: Agent, now: float) -> Stepped:
    """End ``run`` failed instead of executing its step; a model call of that
    step that was paid for before (its response recorded by an executor that
    died) is charged to the run (harness.engine.billing)."""
    stopped = _stop(
        rt, transitions.fail(run, reason, worker=rt.worker_id, now=now), TaskResult.FAILED, agent
    )
    if stopped.outcome is TaskResult.FAILED:
        billing.bill_recorded(rt, run)
        children.ended(rt, run, RunStatus.FAILED)
    return stopped


def _committed(rt: Runtime, checkpoint: Checkpoint) -> bool:
    try:
        commit(rt, checkpoint)
    except StaleWriteError:
        return False
    return True


def _claim(rt: Runtime, run: Run, agent: Agent, step: Step, now: float) -> Lease | None:
    """The lease on ``run`` for this step: checkpointed RUNNING with it, or, for
    a step that goes straight through, not written yet (its first renewal
    claims it, so a long step still keeps others away). None: another writer
    came first."""
    owner = _new_owner(rt)
    if _straight_through(agent, run, step, now, rt.lease_ttl):
        return _lease(rt, run, step, owner, run.version, now, claimed=False)
    checkpoint = transitions.claim(run, step, worker=owner, now=now, ttl=rt.lease_ttl)
    try:
        version = commit(rt, checkpoint, kind=step.kind)
    except StaleWriteError:
        if not checkpointing.landed(rt, checkpoint):
            return None
        version = checkpoint.expected_version + 1  # committed; only the reply was lost
    return _lease(rt, run, step, owner, version, now, claimed=True)


def _new_owner(rt: Runtime) -> str:
    """The owner is this execution, not just this worker: two threads of one
    process are two owners, and a claim that landed is recognisably ours."""
    return f"{rt.worker_id}/{uuid.uuid4().hex[:8]}"


def _lease(
    rt: Runtime, run: Run, step: Step, owner: str, version: int, now: float, claimed: bool
) -> Lease:
    return Lease(
        rt.heartbeat_store or rt.store,
        rt.clock,
        run.run_id,
        owner,
        version,
        rt.lease_ttl,
        expires_at=now + rt.lease_ttl,
        deadline=now + rt.step_time_limit,
        crash=rt.crash,
        kind=step.kind,
        claimed=claimed,
        started_at=now,
    )


def _execute_and_record(
    rt: Runtime, run: Run, agent: Agent, lease: Lease, request: ModelRequest | None
) -> Stepped:
    loaded = run.current
    assert loaded is not None
    step = replace(loaded, status=StepStatus.RUNNING, attempts=loaded.attempts + 1)
    namespace = run_namespace(run)
    tools = rt.executor if run.replay_of is None else Cassette(rt.executor, run.replay_of)
    try:
        with Heartbeat(lease, also=lambda: tools.renew(step, namespace, lease)):
            if request is not None:
                outcome = model_step(rt, run, agent, step, lease, namespace, request)
            else:
                hooks = children.Hooks(rt)
                outcome = tool_step(tools, agent, step, lease, loaded.status, namespace, hooks)
    except ToolBusy as busy:
        return Stepped(checkpointing.back_off(rt, run, loaded, lease, busy), agent)
    except LeaseLost:
        return Stepped(checkpointing.fenced(rt, run.run_id), agent)
    if isinstance(outcome, transitions.Reschedule):
        tracing.executed(None)  # never raises: a result in hand is never dropped
        return checkpointing.reschedule(rt, run, agent, loaded, lease, outcome)
    tracing.executed(outcome)
    outcome = conversation.steer(rt, run, step, outcome)  # a message came meanwhile
    return checkpointing.record_result(rt, run, agent, step, lease, outcome)
