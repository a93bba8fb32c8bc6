"""Every transition of a run, in one place.

Each function here is pure: it turns the run as loaded (and what happened to
it) into the :class:`~harness.store.Checkpoint` that records the transition.
The runner, the sweeper and the operator actions decide *when* a transition
happens and handle its failure; what it writes is decided here, and nowhere
else builds a checkpoint. The whole state machine::

    run   pending ──claim/record──> running ──record(final)───> completed
                                      │ ├──record(in doubt)──> waiting ──resolve──> running
                                      │ └──fail / record(fail)──> failed       (or failed)
          running ──await_approval──> waiting ──decide (approve/reject)──> running
          running ──pause (asked for, or a budget spent)──> paused ──resume──> running
          any run not ended ──cancel──> cancelled
          another run's settled steps before a model turn ──fork──> a new run, pending
                                  at that turn (the steps copied, never re-executed)
          an ended run ──replay──> a new run, pending, its tool calls served from the
                                  ended one ──record(a call off the recording)──> diverged

    step  pending ──claim──> running ──record──> done | failed | in_doubt
                 └──────── record (straight through, no RUNNING write) ──┘
          running ──back_off──> what it was before the claim (not an attempt, not a crash)
          running ──reschedule──> pending, woken later (a provider's transient
                                  failure, counted in ``retries``; or a rate limit)
          in_doubt ──resolve──> pending (retry) | done (succeeded) | failed
          pending ──await_approval──> awaiting_approval ──decide──> pending, with the word

Who owns a run is the ``owner`` column: a worker id (its lease, live or
lapsed), ``None`` (unleased, a step message in flight), or a mark with a
lease already lapsed that sends the next step down the careful path:
:data:`SWEEPER` (re-sent by the sweeper), :data:`BACKED_OFF` (a claim gave
way to a busy idempotency key; a step left RUNNING by that claim is not a
new interruption) or :data:`RESCHEDULED` (the step waits for a provider
until ``wake_at``; a message that comes earlier is dropped).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from harness.models import Usage
from harness.records import (
    JSON,
    ForkOrigin,
    ReplayOrigin,
    Run,
    RunStatus,
    Step,
    StepKind,
    StepStatus,
    idempotency_key,
)
from harness.store import KEEP, Checkpoint, EventDraft, RunPatch, StepPatch, ToolRecord

#: The owner the sweeper writes, lease already lapsed, on a run it re-sends.
SWEEPER = "sweeper"
#: The owner a claim leaves when it gives way to a busy idempotency key.
BACKED_OFF = "backed-off"
#: The worker name of operator actions in the flight recorder.
OPERATOR = "operator"
#: The owner of a run whose step waits for a provider (a retry, a rate limit).
RESCHEDULED = "rescheduled"
#: Owners that are marks, not workers: taking such a run over is no takeover.
MARKS = frozenset({SWEEPER, BACKED_OFF, RESCHEDULED})
#: The lease expiry a mark writes: lapsed on every clock, however skewed.
LAPSED = 0.0
#: Re-sends of a run that does not move wait TTL x 2^n, n capped here (32 x TTL).
MAX_RESEND_DOUBLINGS = 5


@dataclass(frozen=True)
class StepOutcome:
    """What executing one step produced; :func:`record` writes it."""

    status: StepStatus
    result: JSON = None
    error: str | None = None
    new_steps: tuple[Step, ...] = ()
    #: The tool call's result for the durable idempotency record, stored in
    #: the same transaction (first writer wins).
    record: ToolRecord | None = None
    run_status: RunStatus = RunStatus.RUNNING
    run_result: str | None = None
    run_error: str | None = None
    #: A model step's tokens, as the provider reported them, and their price.
    usage: Usage | None = None
    cost_usd: float | None = None
    #: How the outcome was obtained, for the step's event (a replay's call
    #: served from its recording, or made live).
    note: str | None = None

    @property
    def detail(self) -> str | None:
        """The step event's detail: the error, with the note before it."""
        if self.note is None or self.error is None:
            return self.note or self.error
        return f"{self.note}: {self.error}"

    @property
    def next_cursor_offset(self) -> int:
        """An in-doubt step keeps the cursor; every other outcome moves past it."""
        return 0 if self.status is StepStatus.IN_DOUBT else 1


@dataclass(frozen=True)
class Reschedule:
    """What executing a step produced instead of an outcome: come back in
    ``delay`` seconds. ``retry``: a transient failure, counted in the step's
    ``retries``; otherwise a wait for a shared rate limit, counted nowhere."""

    delay: float
    reason: str
    retry: bool


class Decision(StrEnum):
    """How an operator settles an in-doubt step."""

    RETRY = "retry"  # call the tool again
    SUCCEEDED = "succeeded"  # it did happen; here is its result
    FAIL = "fail"  # treat the call as failed


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


def _takeover(run: Run) -> tuple[EventDraft, ...]:
    # Leases are released after each step, so a worker's name still there means it lapsed.
    if run.owner is None or run.owner in MARKS:
        return ()
    return (EventDraft("lease_takeover", detail=f"from {run.owner}"),)


def claim(run: Run, step: Step, *, worker: str, now: float, ttl: float) -> Checkpoint:
    """Take the lease and mark the step RUNNING ("about to execute"), an attempt.

    A step found RUNNING was interrupted (its executor died or lost the run),
    and is counted as recovered, unless a back-off left it so.
    """
    events = list(_takeover(run))
    if step.status is StepStatus.RUNNING and run.owner != BACKED_OFF:
        detail = f"attempt {step.attempts} was interrupted"
        events.append(EventDraft("recovered_running", step_index=step.index, detail=detail))
    if run.status is RunStatus.PENDING:
        events.append(EventDraft(RunStatus.RUNNING, RunStatus.PENDING))
    events.append(
        EventDraft(StepStatus.RUNNING, step.status, step.index, f"attempt {step.attempts + 1}")
    )
    return _claimed(run.run_id, run.version, step.index, events, worker=worker, now=now, ttl=ttl)


def claim_pending(
    run_id: str, version: int, index: int, attempts: int, *, worker: str, now: float, ttl: float
) -> Checkpoint:
    """:func:`claim` of a running, unleased run at ``version`` whose step
    ``index`` is PENDING after ``attempts`` attempts: the checkpoint a worker
    can write without loading the run, when the message says that is the
    run's state (:class:`harness.store.ClaimGuard` makes the write hold only
    if it is)."""
    event = EventDraft(StepStatus.RUNNING, StepStatus.PENDING, index, f"attempt {attempts + 1}")
    return _claimed(run_id, version, index, [event], worker=worker, now=now, ttl=ttl)


def _claimed(
    run_id: str,
    version: int,
    index: int,
    events: list[EventDraft],
    *,
    worker: str,
    now: float,
    ttl: float,
) -> Checkpoint:
    return Checkpoint(
        run_id,
        version,
        worker,
        now,
        run=RunPatch(
            status=RunStatus.RUNNING,
            owner=worker,
            lease_expires_at=now + ttl,
            # Not a re-send's far-off wake-up: if this worker dies, the sweeper
            # must find the run one TTL from now.
            wake_at=now + ttl,
            resends=0,
            blocked=None,
        ),
        steps=(StepPatch(index, status=StepStatus.RUNNING, started_at=now, bump_attempts=True),),
        events=tuple(events),
    )


def renew(run_id: str, version: int, *, worker: str, now: float, ttl: float) -> Checkpoint:
    """Extend a lease (or write it, for a step that went straight through).
    Not a transition: no event, but the version moves, fencing off the past."""
    return Checkpoint(
        run_id, version, worker, now, run=RunPatch(owner=worker, lease_expires_at=now + ttl)
    )


def fail(run: Run, reason: str, *, worker: str, now: float) -> Checkpoint:
    """End the run as failed before its step executes (a budget is exhausted)."""
    return Checkpoint(
        run.run_id,
        run.version,
        worker,
        now,
        run=RunPatch.stopped(RunStatus.FAILED, error=reason),
        events=(*_takeover(run), EventDraft(RunStatus.FAILED, run.status, detail=reason)),
    )


def unstorable(step: Step, outcome: StepOutcome, problem: str, *, fail_run: bool) -> StepOutcome:
    """What ``outcome`` becomes when a value in it cannot be stored (one that no
    door checked): the step's failure, saying why, so it is recorded once
    instead of retried; the run fails with it if ``fail_run`` (a model step,
    or ``on_tool_error="fail"``). What the turn cost is kept."""
    error = f"the outcome of step {step.index} could not be stored: {problem}"
    return StepOutcome(
        StepStatus.FAILED,
        error=error,
        run_status=RunStatus.FAILED if fail_run else RunStatus.RUNNING,
        run_error=error if fail_run else None,
        usage=outcome.usage,
        cost_usd=outcome.cost_usd,
    )


def record(
    run: Run,
    step: Step,
    outcome: StepOutcome,
    *,
    version: int,
    worker: str,
    now: float,
    ttl: float,
    claimed: bool,
    started_at: float,
) -> Checkpoint:
    """The result checkpoint: the step's outcome, the steps the model asked for,
    the cursor moved on, the tool's idempotency record, the lease released.

    ``claimed``: the step was checkpointed RUNNING before it executed; if not
    (it went straight through), this one write also counts its attempt.
    """
    patch = StepPatch(
        step.index,
        status=outcome.status,
        result=outcome.result,
        error=outcome.error,
        finished_at=now,
    )
    events = []
    if claimed:
        events.append(EventDraft(outcome.status, StepStatus.RUNNING, step.index, outcome.detail))
    else:
        if run.status is RunStatus.PENDING:
            events.append(EventDraft(RunStatus.RUNNING, RunStatus.PENDING))
        events.append(EventDraft(outcome.status, StepStatus.PENDING, step.index, outcome.detail))
        patch = replace(patch, started_at=started_at, bump_attempts=True)
    # The lease is released: the next step's message may reach any worker.
    run_patch = RunPatch(
        status=RunStatus.RUNNING, owner=None, lease_expires_at=None, wake_at=now + ttl
    )
    if outcome.run_status is not RunStatus.RUNNING:
        run_patch = RunPatch.stopped(
            outcome.run_status, error=outcome.run_error, result=outcome.run_result
        )
        events.append(EventDraft(outcome.run_status, RunStatus.RUNNING, detail=outcome.run_error))
    run_patch = replace(
        run_patch,
        cursor=step.index + outcome.next_cursor_offset,
        step_count=run.step_count + len(outcome.new_steps),
        resends=0,
        blocked=None,
    )
    if outcome.usage is not None:
        # Summed here, in the step's own checkpoint: the run row always agrees
        # with its steps, and a budget check reads one row.
        run_patch = replace(
            run_patch,
            input_tokens=run.input_tokens + outcome.usage.input_tokens,
            output_tokens=run.output_tokens + outcome.usage.output_tokens,
            cost_usd=run.cost_usd + (outcome.cost_usd or 0.0),
        )
    return Checkpoint(
        run.run_id,
        version,
        worker,
        now,
        run=run_patch,
        steps=(patch,),
        new_steps=outcome.new_steps,
        events=tuple(events),
        tool_record=outcome.record,
    )


def back_off(
    run: Run,
    step: Step,
    *,
    version: int,
    worker: str,
    now: float,
    retry_after: float,
    reason: str,
    claimed: bool,
) -> Checkpoint:
    """Give the run back for ``retry_after`` seconds (another executor holds the
    step's idempotency key). ``step`` is as loaded, before the claim: it gets
    back that status and attempt count, since waiting is neither an attempt
    nor an interruption. Only the lease holder may write this."""
    restored = StepPatch(
        step.index, status=step.status, attempts=step.attempts, started_at=step.started_at
    )
    from_status = StepStatus.RUNNING if claimed else step.status
    return Checkpoint(
        run.run_id,
        version,
        worker,
        now,
        run=RunPatch(owner=BACKED_OFF, lease_expires_at=LAPSED, wake_at=now + retry_after),
        steps=(restored,) if claimed else (),
        events=(
            EventDraft(
                "backed_off", from_status, step.index, f"{reason}; retry in {retry_after:.1f}s"
            ),
        ),
    )


def reschedule(
    run: Run,
    step: Step,
    wait: Reschedule,
    *,
    version: int,
    worker: str,
    now: float,
    claimed: bool,
) -> Checkpoint:
    """Put the step back to sleep until ``now + wait.delay``: the provider
    failed transiently, or its shared rate limit has no room. The worker slot
    is free meanwhile, and a crash loses nothing: the wake-up is ``wake_at``,
    which the sweeper honours if the delayed message is lost. ``step`` is as
    loaded: it gets back that attempt count (a wait is not an interruption)
    and goes PENDING; a retry adds one to ``retries`` and records why on the
    step, so ``show`` says what it is waiting for."""
    patch = StepPatch(
        step.index,
        status=StepStatus.PENDING,
        attempts=step.attempts,
        started_at=step.started_at,
        error=wait.reason if wait.retry else KEEP,
        retries=step.retries + 1 if wait.retry else KEEP,
    )
    from_status = StepStatus.RUNNING if claimed else step.status
    kind = "retry_scheduled" if wait.retry else "rate_limited"
    return Checkpoint(
        run.run_id,
        version,
        worker,
        now,
        run=RunPatch(
            status=RunStatus.RUNNING,
            owner=RESCHEDULED,
            lease_expires_at=LAPSED,
            wake_at=now + wait.delay,
            resends=0,
            blocked=None,
        ),
        steps=(patch,),
        events=(EventDraft(kind, from_status, step.index, f"{wait.reason}; in {wait.delay:.1f}s"),),
    )


def resend_delay(run: Run, ttl: float) -> float:
    """How long the sweeper waits after re-sending ``run`` before it may again:
    one TTL at first, doubling with each re-send that did not move the run."""
    return float(ttl * 2 ** min(run.resends, MAX_RESEND_DOUBLINGS))


def redispatch(run: Run, *, now: float, ttl: float) -> Checkpoint:
    """The sweeper re-sends a run that should be moving but is not.

    An unleased run is marked (owner :data:`SWEEPER`, lease lapsed), so its
    next step takes the careful path, RUNNING checkpoint and counted attempt,
    even if the message comes in time. Re-sends that do not move the run are
    spaced out exponentially (:func:`resend_delay`).
    """
    if run.owner == BACKED_OFF:
        reason = "back-off over"
    elif run.owner == RESCHEDULED:
        reason = "wait over, no message came"
    elif run.owner is not None and run.owner != SWEEPER:
        reason = f"lease of {run.owner} expired {now - (run.lease_expires_at or now):.1f}s ago"
    else:
        reason = f"no step message processed {now - (run.wake_at or now):.1f}s after due"
    delay = resend_delay(run, ttl)
    # A rescheduled run's wait is over: marked as re-sent, so the message is not
    # taken for an early one (its wake-up moves on with this re-send).
    marked = run.owner is None or run.owner == RESCHEDULED
    return Checkpoint(
        run.run_id,
        run.version,
        SWEEPER,
        now,
        run=RunPatch(
            wake_at=now + delay,
            resends=run.resends + 1,
            owner=SWEEPER if marked else KEEP,
            lease_expires_at=LAPSED if marked else KEEP,
        ),
        events=(
            EventDraft(
                "redispatched",
                step_index=run.cursor,
                detail=f"{reason}; re-send {run.resends + 1}, next in {delay:g}s at most",
            ),
        ),
    )


def block(run: Run, reason: str, *, worker: str, now: float) -> Checkpoint:
    """Record, once, why a worker could not carry the run (``show`` has it). The
    run stays movable, so a worker that can (a rolling deploy) still takes it."""
    return Checkpoint(
        run.run_id,
        run.version,
        worker,
        now,
        run=RunPatch(blocked=reason),
        events=(EventDraft("blocked", step_index=run.cursor, detail=reason),),
    )


def cancel(run: Run, reason: str, *, now: float) -> Checkpoint:
    """Stop the run for good. A step executing now may finish; its result
    checkpoint then fails, fenced off by the version this bumps."""
    return Checkpoint(
        run.run_id,
        run.version,
        OPERATOR,
        now,
        run=RunPatch.stopped(RunStatus.CANCELLED, error=reason),
        events=(EventDraft(RunStatus.CANCELLED, run.status, detail=reason),),
    )


def resolve(
    run: Run,
    step: Step,
    decision: Decision,
    result: JSON,
    *,
    fail_run: bool,
    now: float,
    ttl: float,
    detail: str,
) -> Checkpoint:
    """Settle the in-doubt ``step`` of a waiting run. ``fail_run``: a call
    marked failed ends the run (the agent's ``on_tool_error="fail"``)."""
    moving = RunPatch(status=RunStatus.RUNNING, error=None, wake_at=now + ttl)
    if decision is Decision.RETRY:
        step_patch = StepPatch(step.index, status=StepStatus.PENDING, error=None)
        run_patch = replace(moving, cursor=step.index)
    elif decision is Decision.SUCCEEDED:
        step_patch = StepPatch(
            step.index, status=StepStatus.DONE, result=result, error=None, finished_at=now
        )
        run_patch = replace(moving, cursor=step.index + 1)
    else:
        error = "the operator marked the in-doubt call as failed"
        step_patch = StepPatch(step.index, status=StepStatus.FAILED, error=error, finished_at=now)
        if fail_run:
            run_patch = RunPatch.stopped(
                RunStatus.FAILED, error=f"step {step.index} failed: {error}"
            )
        else:
            run_patch = replace(moving, cursor=step.index + 1)
    new_status = run_patch.status if isinstance(run_patch.status, RunStatus) else run.status
    return Checkpoint(
        run.run_id,
        run.version,
        OPERATOR,
        now,
        run=run_patch,
        steps=(step_patch,),
        events=(
            EventDraft(str(step_patch.status), StepStatus.IN_DOUBT, step.index, detail),
            EventDraft(new_status, RunStatus.WAITING, detail=detail),
        ),
    )


def await_approval(run: Run, step: Step, *, worker: str, now: float) -> Checkpoint:
    """The run reached a call that needs an operator's word first: the step
    waits, the run is held (never woken by the sweeper) until ``decide``."""
    detail = f"{step.tool} awaits approval"
    return Checkpoint(
        run.run_id,
        run.version,
        worker,
        now,
        run=replace(RunPatch.stopped(RunStatus.WAITING), resends=0, blocked=None),
        steps=(StepPatch(step.index, status=StepStatus.AWAITING_APPROVAL),),
        events=(
            EventDraft(StepStatus.AWAITING_APPROVAL, step.status, step.index, detail),
            EventDraft(RunStatus.WAITING, run.status, detail=detail),
        ),
    )


def decide(
    run: Run,
    step: Step,
    approval: dict[str, JSON],
    args: dict[str, JSON] | None,
    *,
    who: str,
    now: float,
    ttl: float,
    detail: str,
) -> Checkpoint:
    """An operator approved or rejected the call the run waits on: the step is
    pending again with that word on it (and the edited arguments), and the
    run moves; the step task acts on the word, once."""
    patch = StepPatch(step.index, status=StepStatus.PENDING, approval=approval)
    if args is not None:
        patch = replace(patch, args=args)
    return Checkpoint(
        run.run_id,
        run.version,
        who,
        now,
        run=RunPatch(status=RunStatus.RUNNING, error=None, wake_at=now + ttl),
        steps=(patch,),
        events=(
            EventDraft(str(approval["decision"]), StepStatus.AWAITING_APPROVAL, step.index, detail),
            EventDraft(RunStatus.RUNNING, RunStatus.WAITING),
        ),
    )


def pause(run: Run, reason: str, *, worker: str, now: float) -> Checkpoint:
    """Hold the run at a step boundary (asked for by an operator, or its budget
    is spent with ``on_budget="pause"``) until ``resume``."""
    return Checkpoint(
        run.run_id,
        run.version,
        worker,
        now,
        # The request stays set while paused: an operator's withdrawal that
        # raced this write is then visible to the worker that made it.
        run=replace(RunPatch.stopped(RunStatus.PAUSED, error=reason), resends=0),
        events=(*_takeover(run), EventDraft(RunStatus.PAUSED, run.status, run.cursor, reason)),
    )


def resume(
    run: Run,
    *,
    who: str,
    now: float,
    ttl: float,
    max_tokens: int | None = None,
    max_cost_usd: float | None = None,
) -> Checkpoint:
    """Set a paused run moving again, with its budgets raised if given."""
    budgets = []
    if max_tokens is not None:
        budgets.append(f"max_tokens={max_tokens}")
    if max_cost_usd is not None:
        budgets.append(f"max_cost_usd={max_cost_usd:g}")
    return Checkpoint(
        run.run_id,
        run.version,
        who,
        now,
        run=RunPatch(
            status=RunStatus.RUNNING,
            error=None,
            wake_at=now + ttl,
            pause_requested=False,
            max_tokens=KEEP if max_tokens is None else max_tokens,
            max_cost_usd=KEEP if max_cost_usd is None else max_cost_usd,
        ),
        events=(
            EventDraft(
                RunStatus.RUNNING,
                RunStatus.PAUSED,
                run.cursor,
                f"resumed by {who}" + (f"; budget set: {', '.join(budgets)}" if budgets else ""),
            ),
        ),
    )


@dataclass(frozen=True)
class Fork:
    """A new run made of another's recorded past: what :meth:`Store.create_fork`
    inserts. ``records``: the idempotency records of the copied steps, under
    the new run's keys; ``detail``: its creation event's."""

    run: Run
    steps: tuple[Step, ...]
    records: tuple[ToolRecord, ...]
    detail: str


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
    (:func:`harness.replay.fork.fork_points`)."""
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
    return Fork(run, (*copied, fresh), kept, detail)


def replay(
    origin: Run, *, run_id: str, agent: str, live_read_only: bool, now: float
) -> tuple[Run, list[Step]]:
    """A replay of the ended run ``origin`` under ``agent``: a new run on the
    same goal, from its first model turn, whose tool calls are served from
    ``origin``'s steps (harness.engine.cassette); inserted as
    :func:`new_run`'s pair is."""
    run, steps = new_run(run_id, agent, origin.goal, now)
    return replace(run, replay_of=ReplayOrigin(origin.run_id, live_read_only)), steps
