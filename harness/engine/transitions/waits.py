"""The transitions of runs that wait on the world: a deferred step's answer
(a completion, a signal, a child run's end), its timeout or a sleep's
wake-up, the run waiting at its next model turn until every deferred step
of the turn before has its answer, and its return to running.

A deferred step itself is recorded by :func:`execution.record` (its outcome
:attr:`Happened.DEFERRED`): the step ``deferred``, the run moving on to the
turn's other calls, ``deferred_from`` marking where the next model turn
must look. An answer is a :class:`~harness.store.Completion`, written beside
the version and guarded by the step's status, so the first answer wins (a
completion racing the timeout has one winner, and the history says which)
and no worker carrying another call of the turn is fenced.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from harness.engine.transitions.resends import MAX_RESEND_DOUBLINGS
from harness.records import JSON, Run, RunStatus, Step, StepStatus, Wait, WaitKind
from harness.store import Checkpoint, Completion, EventDraft, RunPatch
from harness.waiting import MAX_WAIT, slept, timed_out

#: The event of a step that deferred, in the flight recorder and history.
DEFERRED = StepStatus.DEFERRED.value


def waiting_steps(steps: Sequence[Step]) -> list[Step]:
    """The steps among ``steps`` still waiting for their answer."""
    return [s for s in steps if s.status is StepStatus.DEFERRED]


def due(step: Step, now: float) -> bool:
    """Has ``step``'s timeout (or its sleep) run out at ``now``?"""
    wait = step.wait
    return wait is not None and wait.until is not None and wait.until <= now


def answer(
    step: Step,
    *,
    result: JSON = None,
    error: str | None = None,
    by: str,
    worker: str,
    now: float,
    signal: int | None = None,
    usage: tuple[int, int, float] | None = None,
) -> Completion:
    """The answer to deferred ``step``: ``result``, or ``error`` (a failed call
    the model is told of), given ``by`` (what the history says answered it)."""
    status = StepStatus.FAILED if error is not None else StepStatus.DONE
    event = EventDraft(status, StepStatus.DEFERRED, step.index, by)
    return Completion(
        step.run_id,
        step.index,
        status,
        None if error is not None else result,
        error,
        event,
        worker,
        now,
        signal=signal,
        usage=usage,
    )


def time_out(step: Step, *, worker: str, now: float) -> Completion:
    """The answer a deferred step gets when its time is up: a sleep's
    ``{"slept": seconds}``, or an error the model sees ("no answer within N s")."""
    wait = step.wait
    assert wait is not None and wait.until is not None
    if wait.kind is WaitKind.SLEEP:
        return answer(step, result=slept(wait), by="woke: its sleep ended", worker=worker, now=now)
    error = timed_out(wait)
    return answer(step, error=error, by=f"timed out: {error}", worker=worker, now=now)


def child_answer(step: Step, child: Run, *, worker: str, now: float) -> Completion:
    """The answer a child run's end gives the step that started it: its final
    answer, or its failure; its usage is added to the parent's."""
    usage = (child.input_tokens, child.output_tokens, child.cost_usd)
    by = f"child run {child.run_id} {child.status.value}"
    if child.status is RunStatus.COMPLETED:
        return answer(step, result=child.result, by=by, worker=worker, now=now, usage=usage)
    reason = child.error or "no reason given"
    error = f"child run {child.run_id} {child.status.value}: {reason}"
    return answer(step, error=error, by=by, worker=worker, now=now, usage=usage)


def wake_time(waiting: Sequence[Step], *, now: float, ttl: float, checks: int) -> float:
    """When the sweeper should look at a run waiting on ``waiting``: its first
    timeout or sleep's end, and sooner:

    - one TTL after it began to wait (``checks`` 0): the worker that made it
      wait may have died before it looked for an answer that came meanwhile
      (after that, every answer marks the waiting run due itself);
    - while it waits on a child, a look that the child's end was not lost (a
      process that died between the child's last checkpoint and its answer),
      spaced out like re-sends: one TTL, doubling to 32 TTLs.

    So a run waiting on a callback, a signal or a sleep costs the sweeper one
    look, then none until its time comes."""
    times = [s.wait.until for s in waiting if s.wait is not None and s.wait.until is not None]
    on_child = any(s.wait is not None and s.wait.kind is WaitKind.CHILD for s in waiting)
    if checks == 0 or on_child:
        times.append(now + ttl * 2 ** min(checks, MAX_RESEND_DOUBLINGS))
    return min(times) if times else now + MAX_WAIT


def describe(waiting: Sequence[Step]) -> str:
    """What the run waits for, one line: ``step 2 (signal 'paid', until ...)``."""
    parts = []
    for step in waiting:
        wait = step.wait or Wait(WaitKind.CALLBACK)
        until = "" if wait.until is None else f", until {_when(wait.until)}"
        parts.append(f"step {step.index} ({wait.describe()}{until})")
    return "waits for " + ", ".join(parts)


def _when(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


def await_deferred(
    run: Run, waiting: Sequence[Step], *, worker: str, now: float, ttl: float
) -> Checkpoint:
    """The run reached a model turn while calls of the turn before still
    wait for their answers: it waits, holding no worker, until they are in
    (or the first of them is due, when the sweeper wakes it)."""
    wake_at = wake_time(waiting, now=now, ttl=ttl, checks=0)
    return Checkpoint(
        run.run_id,
        run.version,
        worker,
        now,
        run=RunPatch(
            status=RunStatus.WAITING,
            owner=None,
            lease_expires_at=None,
            wake_at=wake_at,
            resends=0,
            blocked=None,
        ),
        events=(EventDraft(RunStatus.WAITING, run.status, detail=describe(waiting)),),
    )


def still_waiting(
    run: Run, waiting: Sequence[Step], *, worker: str, now: float, ttl: float
) -> Checkpoint:
    """The sweeper looked at a waiting run and found it still waiting: its
    next look, no event (nothing happened to the run)."""
    wake_at = wake_time(waiting, now=now, ttl=ttl, checks=run.resends + 1)
    return Checkpoint(
        run.run_id,
        run.version,
        worker,
        now,
        run=RunPatch(wake_at=wake_at, resends=run.resends + 1),
    )


def resume_waiting(run: Run, *, worker: str, now: float, ttl: float) -> Checkpoint:
    """Every deferred step has its answer: the run moves on to its model turn."""
    return Checkpoint(
        run.run_id,
        run.version,
        worker,
        now,
        run=RunPatch(
            status=RunStatus.RUNNING,
            owner=None,
            lease_expires_at=None,
            wake_at=now + ttl,
            resends=0,
            deferred_from=None,
        ),
        events=(
            EventDraft(
                RunStatus.RUNNING, RunStatus.WAITING, detail="every deferred call has its answer"
            ),
        ),
    )
