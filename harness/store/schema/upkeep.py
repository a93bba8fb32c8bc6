"""Statements of the store's upkeep: durable idempotency records, delivery
lanes, sweeps and the sweep lease, counts for metrics and health, and the
agent catalog (harness.catalog)."""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import Label, and_, case, func, insert, literal_column, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql import Delete, Insert, Select, Update
from sqlalchemy.sql.selectable import ScalarSelect

from harness.records import RunStatus, StepStatus
from harness.store.schema.tables import (
    ALL_TABLES,
    SAME_AS_STEP,
    agents,
    counters,
    events,
    lanes,
    runs,
    steps,
    sweep_lease,
    sweeps,
    tool_results,
)

#: A record with the step it was made for (a primary-key lookup of the step).
RECORD_WITH_STEP = tool_results.outerjoin(
    steps, and_(steps.c.run_id == tool_results.c.run_id, steps.c.idx == tool_results.c.step_index)
)


def record_result() -> tuple[Label[Any], Label[Any]]:
    """A record's ``result`` and ``result_blob`` as the record holds them, or,
    for one kept once with its step (:data:`SAME_AS_STEP`), as the step does
    (inline, or a blob reference): read from :data:`RECORD_WITH_STEP`. A
    record naming a step that holds no result (only an outside edit makes
    one: a partial restore, a hand-edited row) keeps :data:`SAME_AS_STEP`,
    which the readers refuse (harness.store.sql.rows.whole_records), rather
    than reading as a record without a value."""
    held = or_(steps.c.result.is_not(None), steps.c.result_blob.is_not(None))
    shared = and_(tool_results.c.result_blob == SAME_AS_STEP, held)
    return (
        case((shared, steps.c.result), else_=tool_results.c.result).label("result"),
        case((shared, steps.c.result_blob), else_=tool_results.c.result_blob).label("result_blob"),
    )


def select_tool_result(key: str) -> Select[Any]:
    """One idempotency record's result, or its blob reference (with its key
    and step, which an error about it names)."""
    return (
        select(
            tool_results.c.key, tool_results.c.run_id, tool_results.c.step_index, *record_result()
        )
        .select_from(RECORD_WITH_STEP)
        .where(tool_results.c.key == key)
    )


def insert_tool_result_if_absent(dialect: str, values: dict[str, Any]) -> Insert:
    """First writer wins: a replay never overwrites a stored result."""
    if dialect == "postgresql":
        return postgresql.insert(tool_results).values(**values).on_conflict_do_nothing()
    return sqlite.insert(tool_results).values(**values).on_conflict_do_nothing()


def insert_record(dialect: str, values: dict[str, Any], shared: str | None) -> Insert:
    """A checkpoint's idempotency record: first writer wins, but a record
    already holding ``shared``, the very text its step's result now holds, is
    made to name the step's instead (harness.store.sql.rows.kept_once)."""
    if shared is None:
        return insert_tool_result_if_absent(dialect, values)
    made = (postgresql.insert if dialect == "postgresql" else sqlite.insert)(tool_results)
    return made.values(**values).on_conflict_do_update(
        index_elements=[tool_results.c.key],
        set_={"result": None, "result_blob": SAME_AS_STEP},
        where=tool_results.c.result == shared,
    )


@functools.cache
def insert_tool_result_unless_taken(dialect: str) -> Insert:
    """:func:`insert_tool_result_if_absent` built once, its values given as
    the execution's parameters: building the statement with its values cost
    more CPU than the insert's round trip (0.31 against 0.13 ms here)."""
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    return insert(tool_results).on_conflict_do_nothing()


def select_tool_records(keys: list[str]) -> Select[Any]:
    """The idempotency records under ``keys`` (primary-key lookups), which a
    fork copies under its own run's keys."""
    return (
        select(
            tool_results.c.key,
            tool_results.c.step_index,
            tool_results.c.tool,
            tool_results.c.run_id,
            *record_result(),
        )
        .select_from(RECORD_WITH_STEP)
        .where(tool_results.c.key.in_(keys))
    )


def insert_tool_records() -> Insert:
    """Idempotency records of a new run (a fork's copied steps): the run's id is
    new, so a key already taken means the insert, and its transaction, fail."""
    return tool_results.insert()


def select_lanes() -> Select[Any]:
    return select(lanes.c.lane, lanes.c.probe_sent_at, lanes.c.delivered_before)


def note_probe_sent(dialect: str, lane: str, at: float) -> Insert:
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    statement = insert(lanes).values(lane=lane, probe_sent_at=at)
    return statement.on_conflict_do_update(
        index_elements=[lanes.c.lane], set_={"probe_sent_at": statement.excluded.probe_sent_at}
    )


def note_delivered(dialect: str, lane: str, sent_at: float) -> Insert:
    """Raise the lane's ``delivered_before`` to ``sent_at``, never lower it."""
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    statement = insert(lanes).values(lane=lane, delivered_before=sent_at)
    newer = statement.excluded.delivered_before
    return statement.on_conflict_do_update(
        index_elements=[lanes.c.lane],
        set_={
            "delivered_before": case(
                (func.coalesce(lanes.c.delivered_before, newer) > newer, lanes.c.delivered_before),
                else_=newer,
            )
        },
    )


def insert_sweep() -> Insert:
    return insert(sweeps)


def prune_sweeps(keep: int) -> Delete:
    """Keep the newest ``keep`` sweeps, and the newest of each kind however old
    (the last beat sweep is news while workers sweep in its place)."""
    newest = select(func.max(sweeps.c.id)).scalar_subquery()
    newest_of_kind = select(func.max(sweeps.c.id)).group_by(sweeps.c.kind)
    return sweeps.delete().where(sweeps.c.id <= newest - keep, sweeps.c.id.not_in(newest_of_kind))


def last_sweep(kinds: tuple[str, ...] | None) -> Select[Any]:
    """The sweep that started last, of one of ``kinds`` (any if None)."""
    query = select(sweeps).order_by(sweeps.c.started_at.desc(), sweeps.c.id.desc()).limit(1)
    return query if kinds is None else query.where(sweeps.c.kind.in_(kinds))


def select_sweeps(limit: int) -> Select[Any]:
    return select(sweeps).order_by(sweeps.c.id.desc()).limit(limit)


def take_sweep_lease(dialect: str, name: str, holder: str, now: float, until: float) -> Insert:
    """Take (or renew) the lease ``name`` for ``holder`` until ``until``: it
    matches a row only if the lease is free, lapsed, or the holder's already."""
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    statement = insert(sweep_lease).values(name=name, holder=holder, expires_at=until)
    return statement.on_conflict_do_update(
        index_elements=[sweep_lease.c.name],
        set_={"holder": statement.excluded.holder, "expires_at": statement.excluded.expires_at},
        where=or_(
            sweep_lease.c.holder.is_(None),
            sweep_lease.c.holder == holder,
            sweep_lease.c.expires_at < now,
        ),
    )


def release_sweep_lease(name: str, holder: str) -> Update:
    return (
        update(sweep_lease)
        .where(sweep_lease.c.name == name, sweep_lease.c.holder == holder)
        .values(holder=None, expires_at=None)
    )


def ping() -> Select[Any]:
    """``SELECT 1``: whether the database answers, reading no table."""
    return select(literal_column("1"))


def count_runs_by_status() -> Select[Any]:
    return select(runs.c.status, func.count()).group_by(runs.c.status)


def count_events_by_kind() -> Select[Any]:
    return select(events.c.to_status, func.count()).group_by(events.c.to_status)


def bump_counter(dialect: str, name: str) -> Insert:
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    statement = insert(counters).values(name=name, value=1)
    return statement.on_conflict_do_update(
        index_elements=[counters.c.name], set_={"value": counters.c.value + 1}
    )


def select_counters() -> Select[Any]:
    return select(counters.c.name, counters.c.value)


def count_running_steps_started_before(cutoff: float) -> Select[Any]:
    """The alert: steps RUNNING for longer than any sane execution time, in runs that
    are running (a cancelled run may leave its last step RUNNING for good)."""
    started = _running_step_started_at()
    running = runs.c.status == RunStatus.RUNNING.value
    return select(func.count()).select_from(runs).where(running, started < cutoff)


def oldest_running_step() -> Select[Any]:
    """The oldest RUNNING step's ``started_at`` in a running run; NULL if none."""
    started = _running_step_started_at()
    return (
        select(func.min(started)).select_from(runs).where(runs.c.status == RunStatus.RUNNING.value)
    )


def _running_step_started_at() -> ScalarSelect[Any]:
    """For each run: its step at the cursor's ``started_at`` if that step is
    RUNNING, the only one of a run's steps that can be, and only in a running
    run (``transitions.claim`` writes both). Read from the running runs (the
    runs' status index), one step lookup each, whatever the history or the
    backlog of pending runs: the steps have no index on their status, which
    every step update would rewrite (migration 0011)."""
    return (
        select(steps.c.started_at)
        .where(
            steps.c.run_id == runs.c.run_id,
            steps.c.idx == runs.c.cursor,
            steps.c.status == StepStatus.RUNNING.value,
        )
        .scalar_subquery()
    )


def delete_all() -> list[Delete]:
    """Empty every table (tests and ``harness demo``)."""
    return [table.delete() for table in ALL_TABLES]


def upsert_agents(dialect: str) -> Insert:
    """A worker's rows, each inserted or, when that worker published it
    before, overwritten (two processes under one node name never collide)."""
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    statement = insert(agents)
    fresh = statement.excluded
    return statement.on_conflict_do_update(
        index_elements=[agents.c.worker, agents.c.agent],
        set_={
            "definition_hash": fresh.definition_hash,
            "tools": fresh.tools,
            "started_at": fresh.started_at,
            "last_seen": fresh.last_seen,
        },
    )


def delete_agents_of(worker: str, keep: list[str] | None = None) -> Delete:
    """The worker's rows, but for the agents in ``keep``."""
    statement = agents.delete().where(agents.c.worker == worker)
    return statement if not keep else statement.where(agents.c.agent.not_in(keep))


def forget_agents_before(cutoff: float) -> Delete:
    """Rows nobody refreshed since ``cutoff``: workers long dead."""
    return agents.delete().where(agents.c.last_seen < cutoff)


def select_agents_seen_since(cutoff: float) -> Select[Any]:
    return select(agents).where(agents.c.last_seen >= cutoff)
