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
from enum import StrEnum
from typing import NamedTuple

from harness import catalog, observability
from harness.agents import Agent, get_agent
from harness.engine import billing, gates, hints, probes, transitions
from harness.engine.cassette import Cassette
from harness.engine.executor import Called, ToolBusy
from harness.engine.hints import ClaimHint
from harness.engine.leases import Heartbeat, Lease, write_while_held
from harness.engine.runtime import Runtime, commit, dispatch
from harness.engine.steps import model_request, model_step, tool_step
from harness.engine.transitions import StepOutcome
from harness.errors import (
    AgentNotFound,
    BadInput,
    LeaseLost,
    RunConflict,
    RunNotFound,
    StaleWriteError,
    StoreError,
)
from harness.inputs import storable
from harness.models import ModelRequest
from harness.observability import tracing
from harness.records import Run, RunStatus, Step, StepKind, StepStatus
from harness.store import Checkpoint, RunPatch
from harness.tools import ToolEffect

log = logging.getLogger(__name__)

#: Re-exported for the callers that mark or recognise a sweeper re-send.
SWEEPER = transitions.SWEEPER


class Outcome(StrEnum):
    """What one step task did; the Celery task returns it for Flower to show."""

    ADVANCED = "advanced"
    COMPLETED = "completed"
    FAILED = "failed"
    WAITING = "waiting"
    NO_RUN = "no_run"
    NO_AGENT = "no_agent"  # no agent of that name here: left for a worker that has it
    NOT_MOVABLE = "not_movable"
    STALE = "stale"
    LEASED = "leased"
    RACED = "raced"
    LEASE_LOST = "lease_lost"  # taken over (a stall outlived the lease) mid-step
    CANCELLED = "cancelled"  # cancelled by an operator mid-step
    DIVERGED = "diverged"  # a replay's call left its recording: the replay stops
    BUSY = "busy"  # another executor holds the step's key: backed off
    DUPLICATE = "duplicate"  # a second copy of a step under way elsewhere: dropped
    PAUSED = "paused"  # held at a step boundary: asked for, or a budget spent
    RESCHEDULED = "rescheduled"  # waits for a provider (a retry, a rate limit)
    EARLY = "early"  # a message for a rescheduled step, before its time: dropped
    HOP = "hop"  # throughput mode: the next step needs a task of its own
    PROBE = "probe"  # the sweeper's delivery probe (harness.engine.probes): noted


class _Stepped(NamedTuple):
    outcome: Outcome
    agent: Agent | None = None
    next_cursor: int = -1  # set when ADVANCED or RESCHEDULED
    delay: float = 0.0  # set when RESCHEDULED
    hint: ClaimHint | None = None  # may be set when ADVANCED


def create_run(rt: Runtime, agent_name: str, goal: str, run_id: str | None = None) -> str:
    """Create a run with its first model step, then dispatch it; its id.
    Idempotent on an explicit ``run_id`` (see :func:`create`)."""
    return create(rt, agent_name, goal, run_id)[0].run_id


def create(rt: Runtime, agent_name: str, goal: str, run_id: str | None = None) -> tuple[Run, bool]:
    """Create a run with its first model step, then dispatch it: (the run,
    True). An explicit ``run_id`` that holds this same run (the agent and
    goal) already is left as it is: (that run, False); one that holds
    another is a :class:`RunConflict` (:func:`refuse_other`). The agent must
    be registered here or carried by a live worker (harness.catalog); its
    code is needed only where a worker runs it."""
    now = rt.clock.now()
    run, steps = transitions.new_run(run_id or uuid.uuid4().hex, agent_name, goal, now)
    try:
        catalog.require(rt.store, agent_name, now)
    except AgentNotFound:
        if run_id is None:
            raise
        existing = _existing(rt, run_id)  # no worker carries it now: a repeat is still a no-op
        if existing is None:
            raise
        refuse_other(existing, run)
        return existing, False
    stored, created = rt.store.create_run(
        run, steps, wake_at=now + rt.lease_ttl, created=transitions.created(run)
    )
    if not created:
        # Also when our own insert committed and only its reply was lost (the
        # retry met the row): then no message is sent now, and the sweeper
        # starts the run one lease TTL later (its wake_at).
        refuse_other(stored, run)
        return stored, False
    observability.created(run.run_id, agent_name, stored.version, rt.worker_id)
    dispatch(rt, run.run_id, 0)
    return stored, True


def _existing(rt: Runtime, run_id: str) -> Run | None:
    try:
        return rt.store.load(run_id)
    except RunNotFound:
        return None


def refuse_other(stored: Run, asked: Run) -> None:
    """Raise :class:`RunConflict` unless ``stored``, found under ``asked``'s
    id when ``asked`` was inserted, is the run asked for: the same agent and
    goal, and the same origin (a fork's, a replay's). The one rule for every
    create with an explicit id; compared with what the store holds after the
    insert lost, never with a read before it, so of two racing creates one
    wins and the other is told what won."""
    if (stored.agent, stored.goal, stored.forked_from, stored.replay_of) == (
        asked.agent,
        asked.goal,
        asked.forked_from,
        asked.replay_of,
    ):
        return
    goal = stored.goal if len(stored.goal) <= 80 else stored.goal[:79] + "…"
    what = f"agent {stored.agent} and goal {goal!r}"
    if stored.forked_from is not None:
        what += f", forked from {stored.forked_from.run_id} at step {stored.forked_from.step}"
    if stored.replay_of is not None:
        what += f", a replay of {stored.replay_of.run_id}"
        what += " with live read_only calls" * stored.replay_of.live_read_only
    raise RunConflict(f"run {stored.run_id} exists with {what}: another run, not created", stored)


def run_step(
    rt: Runtime, run_id: str, cursor: int | None = None, hint: ClaimHint | None = None
) -> Outcome:
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
        return Outcome.PROBE
    started = rt.clock.now()
    stepped, tried = None, None
    if hint is not None and cursor is not None:
        stepped, tried = _claim_on_hint(rt, run_id, cursor, hint)
    if stepped is None:
        stepped = _one_step(rt, run_id, cursor, tried=tried)
    executed = 1
    while stepped.outcome is Outcome.ADVANCED and stepped.agent is not None:
        if executed >= stepped.agent.steps_per_task:
            break
        if rt.clock.now() - started >= rt.chain_budget:
            break
        chained = _one_step(rt, run_id, stepped.next_cursor, chaining=True)
        if chained.outcome is Outcome.HOP:  # the next step needs a task of its own
            break
        stepped = chained
        executed += 1
    if stepped.outcome in (Outcome.ADVANCED, Outcome.RESCHEDULED):
        dispatch(rt, run_id, stepped.next_cursor, delay=stepped.delay, hint=stepped.hint)
    return stepped.outcome


def _claim_on_hint(
    rt: Runtime, run_id: str, cursor: int, hint: ClaimHint
) -> tuple[_Stepped | None, Checkpoint | None]:
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
) -> _Stepped:
    """Execute the call that ``owner`` claimed on a hint at ``now``: ``run``
    as it was before the claim, ``version`` the claim's."""
    step = run.current
    assert step is not None  # the guard found it
    lease = _lease(rt, run, step, owner, version, now, claimed=True)
    return _execute(rt, run, agent, step, lease, None)


def _claim_landed(rt: Runtime, run: Run, tried: Checkpoint) -> _Stepped | None:
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
) -> _Stepped:
    """``tried``: a claim on the message's hint that did not answer with the run."""
    try:
        run = rt.store.load(run_id, at=cursor)
    except RunNotFound:
        log.warning("run=%s does not exist: dropping its message", run_id)
        return _Stepped(Outcome.NO_RUN)
    landed = None if tried is None else _claim_landed(rt, run, tried)
    if landed is not None:
        return landed
    if not run.status.movable:
        return _Stepped(Outcome.NOT_MOVABLE)
    if cursor is not None and cursor != run.cursor:
        log.info(
            "run=%s stale message for step %d (cursor is %d): dropped", run_id, cursor, run.cursor
        )
        return _Stepped(Outcome.STALE)
    now = rt.clock.now()
    if run.lease_live(now):  # even our own: another thread of this process may hold it
        log.info(
            "run=%s step=%d v=%d held by %s: duplicate message dropped",
            run_id,
            run.cursor,
            run.version,
            run.owner,
        )
        return _Stepped(Outcome.LEASED)
    if run.pause_requested:
        # At a step boundary (no live lease: nothing executing that we know of).
        checkpoint = transitions.pause(run, "paused by an operator", worker=rt.worker_id, now=now)
        stopped = _stop(rt, checkpoint, Outcome.PAUSED, None)
        if stopped.outcome is Outcome.PAUSED:
            # A withdrawal may have raced our pause: then resume the run.
            resumed = gates.withdrawn_meanwhile(rt, run_id)
            if resumed is not None and _committed(rt, resumed):
                return _Stepped(Outcome.ADVANCED, None, run.cursor)
        return stopped
    if run.owner == transitions.RESCHEDULED and run.wake_at is not None and now < run.wake_at:
        log.info(
            "run=%s step=%d waits %.1fs more: early message dropped",
            run_id,
            run.cursor,
            run.wake_at - now,
        )
        return _Stepped(Outcome.EARLY)
    try:
        agent = get_agent(run.agent)
    except AgentNotFound:
        # The same words from every worker, whatever it has registered: recorded once.
        _blocked(rt, run, f"no agent named {run.agent!r} on the worker that took it", now)
        return _Stepped(Outcome.NO_AGENT)
    step = run.current
    if step is None or step.status not in (StepStatus.PENDING, StepStatus.RUNNING):
        _blocked(rt, run, f"no runnable step at cursor {run.cursor}", now)
        return _Stepped(Outcome.NOT_MOVABLE)
    if chaining and not _safe_to_chain(agent, run, step):
        return _Stepped(Outcome.HOP, agent)
    reason = gates.over_limits(agent, run, step, now)
    if reason is not None:
        return _fail(rt, run, reason, agent, now)
    # Built once: a budget's reservation and the call read the same history.
    request = model_request(rt, run, agent, step) if step.kind is StepKind.MODEL else None
    spent = gates.over_spend(rt, agent, run, step, request)
    if spent is not None:
        if agent.on_budget == "pause" and spent.raisable:
            checkpoint = transitions.pause(run, spent.reason, worker=rt.worker_id, now=now)
            return _stop(rt, checkpoint, Outcome.PAUSED, agent)
        return _fail(rt, run, spent.reason, agent, now)
    if (
        step.kind is StepKind.TOOL
        and step.approval is None
        and run.replay_of is None  # a replay's calls are served, or made only if read_only
        and agent.needs_approval(step.tool)
    ):
        checkpoint = transitions.await_approval(run, step, worker=rt.worker_id, now=now)
        stopped = _stop(rt, checkpoint, Outcome.WAITING, agent)
        if stopped.outcome is Outcome.WAITING:
            # A word given ahead may have raced our wait: then act on it.
            decided = gates.word_given_meanwhile(rt, run_id)
            if decided is not None and _committed(rt, decided):
                return _Stepped(Outcome.ADVANCED, agent, step.index)
        return stopped
    lease = _claim(rt, run, agent, step, now)
    if lease is None:
        return _Stepped(Outcome.RACED, agent)
    return _execute(rt, run, agent, step, lease, request)


def _execute(
    rt: Runtime, run: Run, agent: Agent, step: Step, lease: Lease, request: ModelRequest | None
) -> _Stepped:
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


def _stop(rt: Runtime, checkpoint: Checkpoint, outcome: Outcome, agent: Agent | None) -> _Stepped:
    """A transition made instead of executing the step (a limit, a budget, a
    pause, an approval to wait for); RACED if another writer came first."""
    return _Stepped(outcome if _committed(rt, checkpoint) else Outcome.RACED, agent)


def _fail(rt: Runtime, run: Run, reason: str, agent: Agent, now: float) -> _Stepped:
    """End ``run`` failed instead of executing its step; a model call of that
    step that was paid for before (its response recorded by an executor that
    died) is charged to the run (harness.engine.billing)."""
    stopped = _stop(
        rt, transitions.fail(run, reason, worker=rt.worker_id, now=now), Outcome.FAILED, agent
    )
    if stopped.outcome is Outcome.FAILED:
        billing.bill_recorded(rt, run)
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
        if not _landed(rt, checkpoint):
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


def run_namespace(run: Run) -> str:
    """Tells apart two runs that had the same id (a store wiped, an id reused)."""
    return f"{run.created_at:.6f}"


def _execute_and_record(
    rt: Runtime, run: Run, agent: Agent, lease: Lease, request: ModelRequest | None
) -> _Stepped:
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
                outcome = tool_step(tools, agent, step, lease, loaded.status, namespace)
    except ToolBusy as busy:
        return _Stepped(_back_off(rt, run, loaded, lease, busy), agent)
    except LeaseLost:
        return _Stepped(_fenced(rt, run.run_id), agent)
    if isinstance(outcome, transitions.Reschedule):
        tracing.executed(None)  # never raises: a result in hand is never dropped
        return _reschedule(rt, run, agent, loaded, lease, outcome)
    tracing.executed(outcome)
    return _record(rt, run, agent, step, lease, outcome)


def _reschedule(
    rt: Runtime, run: Run, agent: Agent, loaded: Step, lease: Lease, wait: transitions.Reschedule
) -> _Stepped:
    """The step waits for its provider: give the run back until ``wait.delay``
    from now; the caller sends the delayed message. Written at the lease's
    version, like a result: this execution is the step's rightful one."""
    if lease.lost:
        return _Stepped(_fenced(rt, run.run_id), agent)
    checkpoint = transitions.reschedule(
        run,
        loaded,
        wait,
        version=lease.version,
        worker=rt.worker_id,
        now=rt.clock.now(),
        claimed=lease.claimed_before_execution,
    )
    if not _write_held(rt, lease, checkpoint, "a rescheduling"):
        return _Stepped(_fenced(rt, run.run_id), agent)
    return _Stepped(Outcome.RESCHEDULED, agent, loaded.index, wait.delay)


def _record(
    rt: Runtime, run: Run, agent: Agent, step: Step, lease: Lease, outcome: StepOutcome
) -> _Stepped:
    """The result checkpoint. The next step's message is the caller's to send.

    Whatever way this ends without a commit (the run taken over or cancelled
    while the step ran, the store down for longer than the lease, the process
    told to stop), a tool result in hand is kept for whoever resumes the step.
    """
    if lease.lost:  # taken over, cancelled or past the time limit while it executed
        _keep(rt, run, step, lease, outcome)
        _bill_late(rt, run, agent, step, outcome)
        return _Stepped(_fenced(rt, run.run_id), agent)
    checkpoint = transitions.record(
        run,
        step,
        outcome,
        version=lease.version,
        worker=rt.worker_id,
        now=rt.clock.now(),
        ttl=rt.lease_ttl,
        claimed=lease.claimed_before_execution,
        started_at=lease.started_at or rt.clock.now(),
        fail_on_tool_error=agent.on_tool_error == "fail",
    )
    try:
        version = write_while_held(
            lease,
            lambda: commit(rt, checkpoint, step.kind, lease.started_at),
            f"the checkpoint of step {step.index}",
        )
    except StaleWriteError:
        version = checkpoint.expected_version + 1  # if it landed after all
        if not _landed(rt, checkpoint):
            log.warning(
                "run=%s step=%d v=%d result not recorded: the run moved on without it",
                run.run_id,
                step.index,
                lease.version,
            )
            _keep(rt, run, step, lease, outcome)
            _bill_late(rt, run, agent, step, outcome)
            return _Stepped(_fenced(rt, run.run_id), agent)
        log.info(
            "run=%s step=%d the checkpoint had committed before its connection failed",
            run.run_id,
            step.index,
        )
    except BadInput as err:  # a value that no door checked: the step's failure, recorded once
        if outcome.status is StepStatus.FAILED and outcome.record is None:
            raise  # already the fallback: nothing simpler left to record
        log.error("run=%s step=%d outcome not storable: %s", run.run_id, step.index, err)
        failed = transitions.unstorable(outcome, step, str(err))
        return _record(rt, run, agent, step, lease, failed)
    except BaseException:
        _keep(rt, run, step, lease, outcome)  # first writer wins: harmless if it committed
        raise
    return _recorded(rt, run, agent, step, outcome, checkpoint.run, version)


def _recorded(
    rt: Runtime,
    run: Run,
    agent: Agent,
    step: Step,
    outcome: StepOutcome,
    moved: RunPatch,
    version: int,
) -> _Stepped:
    """The step's result checkpoint committed ``version``, moving the run as
    ``moved`` says (harness.engine.transitions.record decided how): what
    the run does next, and the hint for the next step's message."""
    if outcome.usage is not None:
        observability.model_usage(_model_name(agent), outcome.usage, outcome.cost_usd)
    if moved.status is not RunStatus.RUNNING:
        assert isinstance(moved.status, RunStatus)  # record always sets it
        return _Stepped(Outcome(moved.status.value), agent)
    rt.crash("after_result_checkpoint", step.kind)
    cursor = step.index + outcome.next_cursor_offset
    hint = hints.hint_for(agent, run, version, cursor, outcome.new_steps)
    return _Stepped(Outcome.ADVANCED, agent, cursor, hint=hint)


def _bill_late(rt: Runtime, run: Run, agent: Agent, step: Step, outcome: StepOutcome) -> None:
    """A model call whose result checkpoint was fenced off was still paid for:
    charged to its run if the run has ended (harness.engine.billing)."""
    if outcome.usage is not None:
        billing.bill_after_end(rt, run.run_id, step.index, outcome.result, _model_name(agent))


def _model_name(agent: Agent) -> str:
    model = agent.model
    return getattr(model, "name", None) or type(model).__name__


def _keep(rt: Runtime, run: Run, step: Step, lease: Lease, outcome: StepOutcome) -> None:
    if outcome.record is not None:
        called = Called(outcome.result, outcome.record)
        rt.executor.preserve(step, called, run_namespace(run), lease)
        log.info("run=%s step=%d result kept for whoever resumes the step", run.run_id, step.index)


def _fenced(rt: Runtime, run_id: str) -> Outcome:
    """Why the run is no longer ours: cancelled by an operator, or taken over."""
    try:
        cancelled = rt.store.load(run_id).status is RunStatus.CANCELLED
    except (StoreError, RunNotFound):
        cancelled = False
    return Outcome.CANCELLED if cancelled else Outcome.LEASE_LOST


def _landed(rt: Runtime, checkpoint: Checkpoint) -> bool:
    """Did a checkpoint that reported a lost connection (and then failed its
    retry as stale) commit after all? Then the run is at the very next
    version, at our timestamp, with every column we wrote: no other writer (a
    cancel, the sweeper) could have produced exactly that."""
    try:
        run = rt.store.load(checkpoint.run_id)
    except StoreError:
        return False
    if run.version != checkpoint.expected_version + 1 or run.updated_at != checkpoint.now:
        return False
    stored = storable(checkpoint.run.values())  # as the store wrote them (harness.inputs)
    return all(getattr(run, column) == value for column, value in stored.items())


def _back_off(rt: Runtime, run: Run, loaded: Step, lease: Lease, busy: ToolBusy) -> Outcome:
    """Another executor holds the step's key: give the run back until it expires.

    Only the lease holder may write. A copy of the step that went straight
    through holds no lease: it is a duplicate of a step under way, and is
    dropped without a write, as is one whose lease is gone.
    """
    if not lease.written or lease.lost:
        log.info("run=%s step=%d duplicate dropped: %s", run.run_id, loaded.index, busy)
        return Outcome.DUPLICATE
    checkpoint = transitions.back_off(
        run,
        loaded,
        version=lease.version,
        worker=rt.worker_id,
        now=rt.clock.now(),
        retry_after=busy.retry_after,
        reason=str(busy),
        claimed=lease.claimed_before_execution,
    )
    if not _write_held(rt, lease, checkpoint, "a back-off"):
        return _fenced(rt, run.run_id)
    return Outcome.BUSY


def _write_held(rt: Runtime, lease: Lease, checkpoint: Checkpoint, what: str) -> bool:
    """Write ``checkpoint`` while ``lease`` holds (retrying a lost connection);
    False if another writer came first and it did not land after all."""
    try:
        write_while_held(
            lease, lambda: commit(rt, checkpoint, lease.kind or None, lease.started_at), what
        )
    except StaleWriteError:
        return _landed(rt, checkpoint)
    return True
