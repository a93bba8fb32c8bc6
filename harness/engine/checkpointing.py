"""The writes after a step executed, and what happens when one is fenced off.

The runner (harness.engine.runner) executes a step under its lease; this
module writes what came of it: the result checkpoint
(harness.engine.transitions.record decides the run's next state), a
back-off while another executor holds the step's key, or a rescheduling
while a provider asks to wait. Each is written at the lease's version, so a
writer whose lease was taken over fails its write. Then a tool result in
hand is kept for whoever resumes the step, a model call that was paid for is
billed to the run, and the answer says whether the run was cancelled or
taken over. A write whose connection failed is checked: had it landed after
all (:func:`landed`)?
"""

from __future__ import annotations

import logging
from dataclasses import replace

from harness import observability
from harness.agents import Agent
from harness.engine import billing, children, conversation, hints, transitions, waits
from harness.engine.executor import Called, ToolBusy
from harness.engine.leases import Lease, write_while_held
from harness.engine.runtime import Runtime, commit
from harness.engine.taskresult import Stepped, TaskResult
from harness.engine.transitions import Happened, StepOutcome
from harness.errors import BadInput, RunNotFound, StaleWriteError, StoreError
from harness.inputs import storable
from harness.records import Run, RunStatus, Step, StepStatus
from harness.store import Checkpoint, RunPatch

#: The runner's logger: these lines are the step lifecycle's, whichever module writes them.
log = logging.getLogger("harness.engine.runner")


def run_namespace(run: Run) -> str:
    """Tells apart two runs that had the same id (a store wiped, an id
    reused, a run pruned and imported again, whose creation time an import
    keeps): its incarnation (:attr:`Run.lineage`; a row made before
    migration 0017, its creation time, as before)."""
    return run.lineage


def reschedule(
    rt: Runtime, run: Run, agent: Agent, loaded: Step, lease: Lease, wait: transitions.Reschedule
) -> Stepped:
    """The step waits for its provider: give the run back until ``wait.delay``
    from now; the caller sends the delayed message. Written at the lease's
    version, like a result: this execution is the step's rightful one."""
    if lease.lost:
        return Stepped(fenced(rt, run.run_id), agent)
    checkpoint = transitions.reschedule(
        run,
        loaded,
        wait,
        version=lease.version,
        worker=rt.worker_id,
        now=rt.clock.now(),
        claimed=lease.claimed_before_execution,
    )
    if not write_held(rt, lease, checkpoint, "a rescheduling"):
        return Stepped(fenced(rt, run.run_id), agent)
    return Stepped(TaskResult.RESCHEDULED, agent, loaded.index, wait.delay)


def record_result(
    rt: Runtime, run: Run, agent: Agent, step: Step, lease: Lease, outcome: StepOutcome
) -> Stepped:
    """The result checkpoint. The next step's message is the caller's to send.

    Whatever way this ends without a commit (the run taken over or cancelled
    while the step ran, the store down for longer than the lease, the process
    told to stop), a tool result in hand is kept for whoever resumes the step.
    """
    if lease.lost:  # taken over, cancelled or past the time limit while it executed
        _keep(rt, run, step, lease, outcome)
        _bill_late(rt, run, agent, step, outcome)
        return Stepped(fenced(rt, run.run_id), agent)
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
        if not landed(rt, checkpoint):
            log.warning(
                "run=%s step=%d v=%d result not recorded: the run moved on without it",
                run.run_id,
                step.index,
                lease.version,
            )
            _keep(rt, run, step, lease, outcome)
            _bill_late(rt, run, agent, step, outcome)
            return Stepped(fenced(rt, run.run_id), agent)
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
        return record_result(rt, run, agent, step, lease, failed)
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
) -> Stepped:
    """The step's result checkpoint committed ``version``, moving the run as
    ``moved`` says (harness.engine.transitions.record decided how): what
    the run does next, and the hint for the next step's message."""
    if outcome.usage is not None:
        observability.model_usage(_model_name(agent), outcome.usage, outcome.cost_usd)
    if moved.status is not RunStatus.RUNNING:
        assert isinstance(moved.status, RunStatus)  # record always sets it
        children.ended(rt, run, moved.status)  # a child's end answers its parent
        if moved.status is RunStatus.COMPLETED:
            conversation.after_completed(rt, run.run_id)  # a message kept as it completed
        return Stepped(TaskResult(moved.status.value), agent)
    if outcome.happened is Happened.DEFERRED:
        waits.after_deferral(rt, run.run_id, replace(step, wait=outcome.wait))
    rt.crash("after_result_checkpoint", step.kind)
    cursor = step.index + outcome.next_cursor_offset
    hint = hints.hint_for(agent, run, version, cursor, outcome.new_steps)
    return Stepped(TaskResult.ADVANCED, agent, cursor, hint=hint)


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


def fenced(rt: Runtime, run_id: str) -> TaskResult:
    """Why the run is no longer ours: cancelled by an operator, or taken over."""
    try:
        cancelled = rt.store.load(run_id).status is RunStatus.CANCELLED
    except (StoreError, RunNotFound):
        cancelled = False
    return TaskResult.CANCELLED if cancelled else TaskResult.LEASE_LOST


def landed(rt: Runtime, checkpoint: Checkpoint) -> bool:
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


def back_off(rt: Runtime, run: Run, loaded: Step, lease: Lease, busy: ToolBusy) -> TaskResult:
    """Another executor holds the step's key: give the run back until it expires.

    Only the lease holder may write. A copy of the step that went straight
    through holds no lease: it is a duplicate of a step under way, and is
    dropped without a write, as is one whose lease is gone.
    """
    if not lease.written or lease.lost:
        log.info("run=%s step=%d duplicate dropped: %s", run.run_id, loaded.index, busy)
        return TaskResult.DUPLICATE
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
    if not write_held(rt, lease, checkpoint, "a back-off"):
        return fenced(rt, run.run_id)
    return TaskResult.BUSY


def write_held(rt: Runtime, lease: Lease, checkpoint: Checkpoint, what: str) -> bool:
    """Write ``checkpoint`` while ``lease`` holds (retrying a lost connection);
    False if another writer came first and it did not land after all."""
    try:
        write_while_held(
            lease, lambda: commit(rt, checkpoint, lease.kind or None, lease.started_at), what
        )
    except StaleWriteError:
        return landed(rt, checkpoint)
    return True
