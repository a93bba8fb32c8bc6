"""Reads of runs, steps and the flight recorder: pages of steps and events,
the run listing, and the sweeper's query for runs that should be moving."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import BigInteger, Text, and_, bindparam, func, or_, select, true, tuple_
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.sql import Select

from harness.store.schema.tables import MOVABLE, events, minute_of, runs, steps

if TYPE_CHECKING:
    from harness.store import Delivered


def select_steps(run_id: str, start: int = 0, limit: int | None = None) -> Select[Any]:
    """A run's steps in order, from index ``start`` (on the primary key)."""
    query = select(steps).where(steps.c.run_id == run_id).order_by(steps.c.idx)
    if start:
        query = query.where(steps.c.idx >= start)
    if limit is not None:
        query = query.limit(limit)
    return query


def select_steps_from() -> Select[Any]:
    """A run's steps from index ``:start`` on, in order, its parameters bound
    by name: the shape of a hot statement (harness.store.sql.statements),
    compiled once. Any plan of it is one range of the primary key."""
    return (
        select(steps)
        .where(steps.c.run_id == bindparam("run_id"), steps.c.idx >= bindparam("start"))
        .order_by(steps.c.idx)
    )


def select_events(run_id: str) -> Select[Any]:
    return select(events).where(events.c.run_id == run_id).order_by(events.c.id)


def select_events_after(run_id: str, after_id: int | None, limit: int | None) -> Select[Any]:
    """A run's flight recorder from the event after ``after_id``, oldest first
    (on the index (run_id, id))."""
    query = select(events).where(events.c.run_id == run_id).order_by(events.c.id)
    if after_id is not None:
        query = query.where(events.c.id > after_id)
    if limit is not None:
        query = query.limit(limit)
    return query


def select_events_after_each() -> Select[Any]:
    """PostgreSQL: for each pair of the arrays ``:runs`` and ``:afters``, that
    run's events after that id, ``:limit`` at most, oldest first: one
    statement whatever the number of runs (so planned once), one range of the
    index (run_id, id) each."""
    wanted = (
        func.unnest(
            bindparam("runs", type_=ARRAY(Text)), bindparam("afters", type_=ARRAY(BigInteger))
        )
        .table_valued("run_id", "after_id")
        .render_derived(name="wanted")
    )
    found = (
        select(events)
        .where(events.c.run_id == wanted.c.run_id, events.c.id > wanted.c.after_id)
        .order_by(events.c.id)
        .limit(bindparam("limit"))
        .lateral("found")
    )
    return select(found).select_from(wanted.join(found, true()))


def query_runs(
    limit: int,
    status: str | None = None,
    agent: str | None = None,
    created_before: float | None = None,
    created_after: float | None = None,
    before: tuple[float, str] | None = None,
    forked_from: str | None = None,
    replay_of: str | None = None,
    replays: bool | None = None,
) -> Select[Any]:
    """A page of runs, each with the step at its cursor, newest first, in the
    total order (created_at, run_id) descending. ``created_after`` is
    inclusive, ``created_before`` exclusive.
    ``before``: the keyset of the previous page's last run; only runs strictly
    after it in this order, so a page is stable while new runs arrive.
    ``forked_from``: only the forks of that run; ``replay_of``: only its
    replays; ``replays``: only replays (True) or only runs that are not (False)."""
    query = (
        select(runs, *(c.label(f"step_{c.name}") for c in steps.c))
        .select_from(
            runs.outerjoin(
                steps, and_(steps.c.run_id == runs.c.run_id, steps.c.idx == runs.c.cursor)
            )
        )
        .order_by(runs.c.created_at.desc(), runs.c.run_id.desc())
        .limit(limit)
    )
    if status is not None:
        query = query.where(runs.c.status == status)
    if agent is not None:
        query = query.where(runs.c.agent == agent)
    if created_after is not None:
        query = query.where(runs.c.created_at >= created_after)
    if created_before is not None:
        query = query.where(runs.c.created_at < created_before)
    if before is not None:
        query = query.where(tuple_(runs.c.created_at, runs.c.run_id) < tuple_(*before))
    if forked_from is not None:
        query = query.where(runs.c.forked_from_run == forked_from)
    if replay_of is not None:
        query = query.where(runs.c.replay_of_run == replay_of)
    if replays is not None:
        is_replay = runs.c.replay_of_run.is_not(None)
        query = query.where(is_replay if replays else ~is_replay)
    return query


def due_runs(now: float, limit: int, delivered: Delivered | None) -> Select[Any]:
    """Runs that should be moving but are not: past ``wake_at``, and unleased or
    with an expired lease. Every movable run has a ``wake_at``; each re-dispatch
    pushes it forward, so a slow run is not re-sent at every sweep.
    ``delivered``: leave out the runs whose message may still be queued.
    By the index on ``wake_minute``: a run whose wake-up is an hour away is
    not read (the status index would read every movable run)."""
    stopped = or_(runs.c.owner.is_(None), runs.c.lease_expires_at < now)
    if delivered is not None:
        queued = []
        if delivered.normal is not None:
            unleased = runs.c.owner.is_(None)
            queued.append(and_(unleased, runs.c.updated_at >= delivered.normal))
        if delivered.recovery is not None:
            # Never NULL (an unleased run has no owner): NOT of a NULL would drop the run.
            resent = func.coalesce(runs.c.owner, "") == delivered.recovery_owner
            queued.append(and_(resent, runs.c.updated_at >= delivered.recovery))
        if queued:
            waiting = and_(or_(*queued), runs.c.wake_at >= delivered.oldest)
            stopped = and_(stopped, ~waiting)
    return (
        select(runs)
        .where(
            runs.c.wake_minute <= minute_of(now),
            runs.c.status.in_(MOVABLE),
            runs.c.wake_at < now,
            stopped,
        )
        .order_by(runs.c.wake_at)
        .limit(limit)
    )
