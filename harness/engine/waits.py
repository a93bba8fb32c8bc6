"""Runs that wait on the world: answers to deferred calls, signals, child
runs, timeouts and sleeps, around the pure transitions of
:mod:`harness.engine.transitions.waits`.

Every answer is written beside the version and guarded by the step's
status, so it lands once whoever sends it and however often; the run is
then woken (WAITING to RUNNING, a compare-and-swap) by whoever finds every
deferred step of its turn answered: the answer's sender, the worker that
made the run wait, or the sweeper. Each checks after its own write, so of
two that race, at least one sees the other's; and an answer marks a waiting
run due (``wake_at``), so the sweeper wakes it if everyone else died.

A signal or an answer that comes before its step has deferred is kept
(``harness_signals``) and taken by the step when it defers. A child run's
end answers the step that started it, from the child's own last
checkpoint; the parent, waiting on a child, is looked at by the sweeper
now and then in case that answer was lost with its process.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from harness import callbacks
from harness.engine.runtime import Runtime, commit, dispatch
from harness.engine.transitions import conflict
from harness.engine.transitions import waits as transitions
from harness.errors import RunNotFound, StaleWriteError, StoreError
from harness.records import JSON, ParentRef, Run, RunStatus, Step, StepKind, StepStatus, WaitKind
from harness.store import Completion, KeptSignal, SignalDraft
from harness.waiting import refuse_marker

log = logging.getLogger(__name__)

#: The name under which an answer to step N that came before it deferred is kept.
EARLY = "@step:"

#: How many times a wake-up looks again when another writer moved the run first.
WAKE_TRIES = 3


class Delivery(StrEnum):
    """What became of an answer or a signal."""

    #: A deferred step took it: its result now.
    ANSWERED = "answered"
    #: No step waits for it yet: kept, durably, until one does.
    KEPT = "kept"
    #: Answered (or received) before: nothing changed.
    ALREADY = "already"


@dataclass(frozen=True)
class Delivered:
    """What an answer, a completion or a signal did, as the doors report it."""

    delivery: Delivery
    run_id: str
    step: int | None
    said: str

    @property
    def changed(self) -> bool:
        return self.delivery is not Delivery.ALREADY

    def to_dict(self) -> dict[str, JSON]:
        return {
            "run_id": self.run_id,
            "step": self.step,
            "delivery": self.delivery.value,
            "changed": self.changed,
            "said": self.said,
        }


# -- answers from outside ------------------------------------------------------


def complete(
    rt: Runtime,
    run_id: str,
    index: int | None,
    *,
    result: JSON = None,
    error: str | None = None,
    by: str,
    sender_id: str | None = None,
) -> Delivered:
    """Answer step ``index`` of ``run_id`` (None: the run's oldest deferred
    step) with ``result``, or ``error``. A step that has not deferred yet
    (its call is under way) gets it when it does; one answered before is
    left as it is. ``by``: what the history says answered it."""
    run = rt.store.load(run_id)
    if index is None:
        index = _oldest_deferred(rt, run)
    step = _step(rt, run, index)
    child = None if step.wait is None else step.wait.child
    if step.status is StepStatus.DEFERRED and child is not None and _going(rt, child):
        # Its end answers the step; by hand only a child that is gone (pruned,
        # not imported with its parent) or has ended.
        why = f"step {index} waits on child run {child}, still going: its end answers it"
        raise conflict(run, why)
    if step.status is StepStatus.DEFERRED:
        completion = transitions.answer(
            step, result=result, error=error, by=by, worker=rt.worker_id, now=rt.clock.now()
        )
        if rt.store.complete_deferred(completion):
            wake_if_ready(rt, run_id)
            return Delivered(Delivery.ANSWERED, run_id, index, f"step {index} answered ({by})")
        run, step = rt.store.load(run_id), _step(rt, run, index)  # answered first, or ended
    if step.kind is not StepKind.TOOL:
        raise conflict(run, f"step {index} is a {step.kind.value} step, not a deferred call")
    if step.status.settled and step.wait is None:
        raise conflict(run, f"step {index} ended without deferring ({step.status.value})")
    if step.status.settled:
        said = f"step {index} was answered already ({step.status.value}); nothing changed"
        return Delivered(Delivery.ALREADY, run_id, index, said)
    if run.status.terminal:
        raise conflict(run, f"step {index} takes no answer")
    if step.kind is not StepKind.TOOL or step.status not in (
        StepStatus.PENDING,
        StepStatus.RUNNING,
    ):
        raise conflict(run, f"step {index} is {step.status.value}, not a deferred call")
    draft = SignalDraft(run_id, f"{EARLY}{index}", result, error, sender_id, rt.clock.now())
    if rt.store.keep_signal(draft) is None:
        take_kept(rt, run_id)  # as signal(): the first sender may have died first
        return Delivered(Delivery.ALREADY, run_id, index, f"step {index}: received already")
    taken = take_kept(rt, run_id)  # it may have deferred meanwhile
    if index in taken.values():
        return Delivered(Delivery.ANSWERED, run_id, index, f"step {index} answered ({by})")
    said = f"step {index} has not deferred yet: the answer is kept until it does"
    return Delivered(Delivery.KEPT, run_id, index, said)


def callback(rt: Runtime, token: str, result: JSON, error: str | None) -> Delivered:
    """A POST to a deferred call's callback URL: ``token`` verified (BadToken,
    ExpiredToken), then :func:`complete` of the step it names. A repeat of the
    same URL is the same sender: received once."""
    claim = callbacks.verify(rt.callback_secret, token, rt.clock.now())
    refuse_marker(result, "body")
    sender = "callback:" + hashlib.sha256(token.encode()).hexdigest()[:40]
    return complete(
        rt, claim.run_id, claim.step, result=result, error=error, by="callback", sender_id=sender
    )


def signal(
    rt: Runtime, run_id: str, name: str, data: JSON = None, signal_id: str | None = None
) -> Delivered:
    """Send signal ``name`` to a run: the oldest step deferred on it takes
    it, or it is kept until one asks. ``signal_id``: a sender's retry with
    the same id is received once."""
    run = rt.store.load(run_id)
    if run.status.terminal:
        if signal_id is not None and rt.store.has_signal(run_id, signal_id):
            return _received(run_id, name, signal_id)
        raise conflict(run, f"no step will take signal {name!r}")
    draft = SignalDraft(run_id, name, data, None, signal_id, rt.clock.now())
    kept = rt.store.keep_signal(draft)
    if kept is None:
        take_kept(rt, run_id)  # the first sender may have died before giving it to its step
        return _received(run_id, name, signal_id)
    taken = take_kept(rt, run_id)
    if kept in taken:
        step = taken[kept]
        return Delivered(Delivery.ANSWERED, run_id, step, f"signal {name!r} answered step {step}")
    said = f"signal {name!r} kept: no step waits for it yet"
    return Delivered(Delivery.KEPT, run_id, None, said)


def _received(run_id: str, name: str, signal_id: str | None) -> Delivered:
    said = f"signal {name!r} with id {signal_id!r} was received already; nothing changed"
    return Delivered(Delivery.ALREADY, run_id, None, said)


def take_kept(rt: Runtime, run_id: str, wake: bool = True) -> dict[int, int]:
    """Give each kept signal a deferred step that asks for it (the oldest
    first), and each answer that came early its step: which signal (row id)
    answered which step. ``wake``: then wake the run if that was the last
    answer it waited for (the sweeper wakes it itself)."""
    kept = rt.store.kept_signals(run_id)
    if not kept:
        return {}
    run = rt.store.load(run_id)
    if run.deferred_from is None:
        return {}
    waiting = transitions.waiting_steps(rt.store.steps(run_id, run.deferred_from))
    taken: dict[int, int] = {}
    for signal_ in kept:
        step = _asks_for(signal_, waiting)
        if step is None:
            continue
        by = f"signal {signal_.name!r}" if not signal_.name.startswith(EARLY) else "an early answer"
        if signal_.signal_id and not signal_.name.startswith(EARLY):
            by += f" (id {signal_.signal_id})"
        completion = transitions.answer(
            step,
            result=signal_.data,
            error=signal_.error,
            by=by,
            worker=rt.worker_id,
            now=rt.clock.now(),
            signal=signal_.id,
        )
        if rt.store.complete_deferred(completion):
            taken[signal_.id] = step.index
        waiting.remove(step)  # answered now, by this or by another
    if taken and wake:
        wake_if_ready(rt, run_id)
    return taken


def _asks_for(kept: KeptSignal, waiting: Sequence[Step]) -> Step | None:
    if kept.name.startswith(EARLY):
        index = kept.name[len(EARLY) :]
        return next((s for s in waiting if str(s.index) == index), None)
    for step in waiting:
        if (
            step.wait is not None
            and step.wait.kind is WaitKind.SIGNAL
            and step.wait.signal == kept.name
        ):
            return step
    return None


def _oldest_deferred(rt: Runtime, run: Run) -> int:
    if run.deferred_from is not None:
        waiting = transitions.waiting_steps(rt.store.steps(run.run_id, run.deferred_from))
        if waiting:
            return waiting[0].index
    raise conflict(run, "no step is deferred; name one with --step")


def _step(rt: Runtime, run: Run, index: int) -> Step:
    found = rt.store.steps(run.run_id, index, 1) if 0 <= index < run.step_count else []
    if not found:
        raise conflict(run, f"it has no step {index}")
    return found[0]


# -- the run's side ----------------------------------------------------------


def after_deferral(rt: Runtime, run_id: str, step: Step) -> None:
    """Step ``step`` has just been recorded deferred: take what came for it
    before (a signal, an early answer, the end of a child that was quick)."""
    wait = step.wait
    if wait is not None and wait.kind is WaitKind.CHILD:
        child = _ended_child(rt, step)
        if child is not None:
            now = rt.clock.now()
            completion = transitions.child_answer(step, child, worker=rt.worker_id, now=now)
            if rt.store.complete_deferred(completion):
                wake_if_ready(rt, run_id)
    take_kept(rt, run_id)


def hold_for_answers(rt: Runtime, run: Run) -> Run | None:
    """At a model turn of a run with deferred steps (``deferred_from``): give
    the steps whose time is up their timeout (or their wake-up), and those
    whose child has ended its answer. The run as it now stands if the turn
    may go on (every answer is in: read again, since an answer adds a child's
    usage beside the version); None if the run now waits (or another writer
    moved it)."""
    now = rt.clock.now()
    waiting = _settle_due(rt, run, now)
    if not waiting:
        answered = rt.store.load(run.run_id, at=run.cursor)
        return answered if answered.version == run.version else None
    checkpoint = transitions.await_deferred(
        run, waiting, worker=rt.worker_id, now=now, ttl=rt.lease_ttl
    )
    try:
        commit(rt, checkpoint)
    except StaleWriteError:
        return None
    # An answer may have landed between our read and our wait: act on it.
    take_kept(rt, run.run_id)
    wake_if_ready(rt, run.run_id)
    return None


def _settle_due(rt: Runtime, run: Run, now: float) -> list[Step]:
    """The deferred steps of ``run``'s turn still waiting after those that are
    due (a timeout, a sleep's end, a child that has ended) are answered."""
    assert run.deferred_from is not None
    count = max(run.cursor - run.deferred_from, 0)
    steps = transitions.waiting_steps(rt.store.steps(run.run_id, run.deferred_from, count))
    waiting = []
    for step in steps:
        completion = _due_answer(rt, step, now)
        if completion is None:
            waiting.append(step)
        else:
            rt.store.complete_deferred(completion)  # False: answered meanwhile, as well
    return waiting


def _due_answer(rt: Runtime, step: Step, now: float) -> Completion | None:
    if transitions.due(step, now):
        return transitions.time_out(step, worker=rt.worker_id, now=now)
    wait = step.wait
    if wait is not None and wait.kind is WaitKind.CHILD:
        child = _ended_child(rt, step)
        if child is not None:
            return transitions.child_answer(step, child, worker=rt.worker_id, now=now)
    return None


def wake_if_ready(rt: Runtime, run_id: str) -> int | None:
    """Move a run waiting on its deferred steps on, if every one has its
    answer: its model turn's message sent. The turn's index if this call
    woke it, else None."""
    for _ in range(WAKE_TRIES):
        run = rt.store.load(run_id)
        step = run.current
        if run.status is not RunStatus.WAITING or run.deferred_from is None:
            return None
        if step is None or step.kind is not StepKind.MODEL:
            return None  # it waits on an operator (a later call's approval)
        count = max(run.cursor - run.deferred_from, 0)
        if transitions.waiting_steps(rt.store.steps(run_id, run.deferred_from, count)):
            return None
        now = rt.clock.now()
        try:
            commit(
                rt, transitions.resume_waiting(run, worker=rt.worker_id, now=now, ttl=rt.lease_ttl)
            )
        except StaleWriteError:
            continue  # the sweeper looked at it meanwhile: look again
        dispatch(rt, run_id, run.cursor)
        return run.cursor
    return None


def sweep(rt: Runtime, now: float, limit: int = 500) -> list[tuple[str, int]]:
    """The sweeper's part: runs waiting on deferred steps whose time has come
    (a timeout, a sleep's end, an answer nobody acted on, a look at a child):
    each answered as due, then woken, or given its next look. The runs woken,
    with the turn each was sent on to."""
    woke = []
    for run in rt.store.due_waits(now, limit):
        try:
            cursor = _sweep_one(rt, run, now)
        except (StoreError, RunNotFound) as err:
            log.warning("run=%s waiting run not swept: %s", run.run_id, err)
            continue
        if cursor is not None:
            woke.append((run.run_id, cursor))
    return woke


def _sweep_one(rt: Runtime, run: Run, now: float) -> int | None:
    if run.deferred_from is None:
        return None
    take_kept(rt, run.run_id, wake=False)  # a signal whose sender died before its step took it
    waiting = _settle_due(rt, run, now)
    if not waiting:
        return wake_if_ready(rt, run.run_id)
    later = transitions.still_waiting(run, waiting, worker=rt.worker_id, now=now, ttl=rt.lease_ttl)
    with contextlib.suppress(StaleWriteError):  # moved meanwhile: its writer saw to it
        commit(rt, later)
    return wake_if_ready(rt, run.run_id)  # an answer that landed as we wrote


# -- child runs --------------------------------------------------------------


def _going(rt: Runtime, run_id: str) -> bool:
    try:
        return not rt.store.load(run_id).status.terminal
    except RunNotFound:
        return False


def _ended_child(rt: Runtime, step: Step) -> Run | None:
    """The child run ``step`` waits on, if it has ended, and is the child
    this step started (its ``parent`` names the step): no other run's end,
    whatever a wait names, answers a step."""
    child_id = None if step.wait is None else step.wait.child
    if child_id is None:
        return None
    try:
        child = rt.store.load(child_id)
    except RunNotFound:
        return None
    if child.parent != ParentRef(step.run_id, step.index) or not child.status.terminal:
        return None
    return child
