"""Statements of runs waiting on the world (harness.store.Waits): a deferred
step's answer, kept signals, children, waits that are due.

An answer is written beside the version, guarded by the step's status
(``deferred``), so the first of a completion and a timeout wins and neither
fences a worker carrying another step of the run.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    Insert,
    Select,
    Update,
    and_,
    case,
    exists,
    func,
    insert,
    null,
    or_,
    select,
    update,
)

from harness.records import RunStatus, StepStatus
from harness.store.schema.tables import TERMINAL, events, minute_of, runs, signals, steps

#: The detail of the event of a deferred step answered by its timeout.
TIMED_OUT = "timed out:"
#: In the detail of a child run's creation event (transitions.created).
CHILD_OF = "; child of "


def answer_deferred(run_id: str, index: int, values: dict[str, Any]) -> Update:
    """The answer of a deferred step: matches no row once it has one, nor
    once its run has ended (a cancelled run takes no answers)."""
    going = exists().where(runs.c.run_id == run_id, runs.c.status.not_in(TERMINAL))
    return (
        update(steps)
        .where(
            steps.c.run_id == run_id,
            steps.c.idx == index,
            steps.c.status == StepStatus.DEFERRED.value,
            going,
        )
        .values(**values)
    )


def take_signal(signal: int, index: int, now: float, said: str | None = None) -> Update:
    """A kept signal taken by step ``index``: matches no row once taken.
    ``said``: the JSON text of the arguments of the ``user`` step the message
    becomes; a message holding that very text keeps it once, in the step
    (its data NULL from then on: schema.archives.select_run_signals reads it
    from the step)."""
    data: Any = signals.c.data
    if said is not None:
        data = case((signals.c.data == said, null()), else_=signals.c.data)
    return (
        update(signals)
        .where(signals.c.id == signal, signals.c.taken_step.is_(None))
        .values(taken_step=index, taken_at=now, data=data)
    )


def nudge_waiting(run_id: str, now: float) -> Update:
    """A run waiting on its deferred steps is due now (an answer came): the
    sweeper moves it on if whoever gave the answer does not. A run waiting on
    an operator has no ``wake_at``, and keeps none."""
    return (
        update(runs)
        .where(
            runs.c.run_id == run_id,
            runs.c.status == RunStatus.WAITING.value,
            runs.c.wake_at.is_not(None),
        )
        .values(wake_at=now)
    )


def insert_signal() -> Insert:
    return insert(signals)


def select_kept_signals(run_id: str) -> Select[Any]:
    return (
        select(signals)
        .where(signals.c.run_id == run_id, signals.c.taken_step.is_(None))
        .order_by(signals.c.id)
    )


def select_signal_id(run_id: str, signal_id: str) -> Select[Any]:
    return select(signals.c.id).where(signals.c.run_id == run_id, signals.c.signal_id == signal_id)


def select_children(run_id: str) -> Select[Any]:
    return select(runs).where(runs.c.parent_run == run_id).order_by(runs.c.run_id)


def due_waits(now: float, limit: int) -> Select[Any]:
    """Waiting runs with deferred steps (``deferred_from`` set) past their
    ``wake_at``; a run waiting on an operator has neither. By the index on
    ``wake_minute``, so a sweep reads the runs that are due, not the thousands
    that wait for a day (the status index would read every waiting run)."""
    return (
        select(runs)
        .where(
            runs.c.wake_minute <= minute_of(now),
            runs.c.status == RunStatus.WAITING.value,
            runs.c.deferred_from.is_not(None),
            runs.c.wake_at < now,
        )
        .order_by(runs.c.wake_at)
        .limit(limit)
    )


def deferred_waits() -> Select[Any]:
    """What each deferred step of a run not ended waits for (its ``wait``
    JSON): read from the runs with deferred steps (``deferred_from``), by
    the status index, then each one's steps by primary key."""
    return (
        select(steps.c.wait)
        .select_from(
            runs.join(
                steps,
                and_(steps.c.run_id == runs.c.run_id, steps.c.idx >= runs.c.deferred_from),
            )
        )
        .where(
            runs.c.status.in_((RunStatus.RUNNING.value, RunStatus.WAITING.value)),
            runs.c.deferred_from.is_not(None),
            steps.c.status == StepStatus.DEFERRED.value,
        )
    )


def oldest_wait() -> Select[Any]:
    """The deferred step of a run waiting on its deferred steps that started
    first: its run, index and start (the runs by the status index, then
    each one's steps from ``deferred_from`` by primary key)."""
    return (
        select(steps.c.run_id, steps.c.idx, steps.c.started_at)
        .select_from(
            runs.join(
                steps,
                and_(steps.c.run_id == runs.c.run_id, steps.c.idx >= runs.c.deferred_from),
            )
        )
        .where(
            runs.c.status == RunStatus.WAITING.value,
            runs.c.deferred_from.is_not(None),
            steps.c.status == StepStatus.DEFERRED.value,
            steps.c.started_at.is_not(None),
        )
        .order_by(steps.c.started_at, steps.c.run_id, steps.c.idx)
        .limit(1)
    )


def count_wait_events() -> Select[Any]:
    """Timeouts and children started, from the events' details (a scan of
    the events table, as the count of events by kind)."""
    timed_out = events.c.detail.like(f"{TIMED_OUT}%")
    child = and_(
        events.c.to_status == RunStatus.PENDING.value, events.c.detail.like(f"%{CHILD_OF}%")
    )
    return select(
        func.coalesce(func.sum(case((timed_out, 1), else_=0)), 0),
        func.coalesce(func.sum(case((child, 1), else_=0)), 0),
    ).where(or_(timed_out, child))


def count_kept_signals() -> Select[Any]:
    """Signals kept for runs not ended and not taken yet (an ended run's are moot)."""
    return (
        select(func.count())
        .select_from(signals.join(runs, runs.c.run_id == signals.c.run_id))
        .where(signals.c.taken_step.is_(None), runs.c.status.not_in(TERMINAL))
    )


def mark_inbox(run_id: str, now: float) -> Update:
    """A message waits: the run's inbox marked, if it was not. It matches the
    run's row whether or not it was marked, so it takes the row's lock."""
    return (
        update(runs)
        .where(runs.c.run_id == run_id)
        .values(inbox_at=func.coalesce(runs.c.inbox_at, now))
    )


def lock_run(run_id: str) -> Select[Any]:
    """The run's row, locked until the transaction ends (PostgreSQL)."""
    return select(runs.c.run_id).where(runs.c.run_id == run_id).with_for_update()


def stranded_inboxes(before: float, limit: int) -> Select[Any]:
    """Completed runs with a message waiting since before ``before``, by the
    partial index on ``inbox_at`` (only runs with a message waiting are in it)."""
    return (
        select(runs.c.run_id)
        .where(
            runs.c.inbox_at.is_not(None),
            runs.c.inbox_at < before,
            runs.c.status == RunStatus.COMPLETED.value,
        )
        .order_by(runs.c.inbox_at)
        .limit(limit)
    )


def clear_inbox(run_id: str, message: str) -> Update:
    """The run's inbox unmarked, unless a message still waits in it."""
    waiting = exists().where(
        signals.c.run_id == run_id, signals.c.name == message, signals.c.taken_step.is_(None)
    )
    return update(runs).where(runs.c.run_id == run_id, ~waiting).values(inbox_at=None)
