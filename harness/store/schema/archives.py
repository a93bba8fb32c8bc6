"""Statements that copy, export or delete whole runs: fork (issue 12), export
and import (harness.runs.archive), and prune (harness.runs.prune).

Prune's candidates are found on the index (created_at, run_id): a run last
updated before the cutoff was created before it too, and there is
deliberately no index on updated_at (every checkpoint changes it). Each
batch's rows are then deleted by their own indexes: runs and steps by
primary key, events by (run_id, id), tool records by their exact keys
"{run_id}:{idx}" (the table has no run_id index; exact keys, unlike a key
range, hold under any collation).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, Table, and_, case, exists, func, select, tuple_
from sqlalchemy.sql import Delete, Insert, Select
from sqlalchemy.sql.dml import ReturningDelete

from harness.records import StepKind
from harness.store.schema.tables import events, runs, signals, steps, tool_results
from harness.store.schema.upkeep import RECORD_WITH_STEP, record_result


def lock_fork_origin(run_id: str) -> Select[Any]:
    """A fork's origin row, read in the fork's insert transaction with a lock
    that conflicts with DELETE (PostgreSQL FOR KEY SHARE, what a foreign key
    takes; it does not block a checkpoint's UPDATE): a prune deleting the
    origin waits for the fork, or the fork waits for the prune and finds no
    row. SQLite has no row locks (SQLAlchemy drops the clause): its write
    transactions are serial already."""
    return select(runs.c.run_id).where(runs.c.run_id == run_id).with_for_update(key_share=True)


def select_run_row(run_id: str) -> Select[Any]:
    """Every column of one run row, whatever columns the table has."""
    return select(runs).where(runs.c.run_id == run_id)


def select_run_tool_records(run_id: str) -> Select[Any]:
    """A run's durable idempotency records, in step order, each result as
    stored for it (schema.upkeep.record_result)."""
    resolved = {label.name: label for label in record_result()}
    return (
        select(*(resolved.get(c.name, c) for c in tool_results.c))
        .select_from(RECORD_WITH_STEP)
        .where(tool_results.c.run_id == run_id)
        .order_by(tool_results.c.step_index, tool_results.c.key)
    )


def _prunable(table: Any, cutoff: float, statuses: tuple[str, ...]) -> ColumnElement[bool]:
    """A finished run of a status being pruned, untouched since ``cutoff``."""
    return and_(table.c.status.in_(statuses), table.c.updated_at <= cutoff)


def prune_candidates(
    cutoff: float, statuses: tuple[str, ...], limit: int, after: tuple[float, str] | None
) -> Select[Any]:
    """The next ``limit`` prunable runs, oldest first in (created_at, run_id),
    strictly after the keyset ``after`` (the previous batch's last run)."""
    query = (
        select(runs)
        .where(runs.c.created_at <= cutoff, _prunable(runs, cutoff, statuses))
        .order_by(runs.c.created_at, runs.c.run_id)
        .limit(limit)
    )
    if after is not None:
        query = query.where(tuple_(runs.c.created_at, runs.c.run_id) > tuple_(*after))
    return query


def fork_protected(run_ids: list[str], cutoff: float, statuses: tuple[str, ...]) -> Select[Any]:
    """Which of ``run_ids`` have a fork descendant (child, grandchild...) that
    is not prunable: they are its ancestors and must be kept. A recursive walk
    down the index on forked_from_run; UNION (not ALL) ends even on a cycle."""
    child = runs.alias("fork_child")
    tree = (
        select(
            runs.c.forked_from_run.label("root"), runs.c.run_id, runs.c.status, runs.c.updated_at
        )
        .where(runs.c.forked_from_run.in_(run_ids))
        .cte("fork_descendants", recursive=True)
    )
    tree = tree.union(
        select(tree.c.root, child.c.run_id, child.c.status, child.c.updated_at).where(
            child.c.forked_from_run == tree.c.run_id
        )
    )
    return select(tree.c.root).where(~_prunable(tree, cutoff, statuses)).distinct()


def select_step_keys(run_ids: list[str]) -> Select[Any]:
    """(run_id, idx) of these runs' steps, on the primary key: their tool
    records' keys are ``"{run_id}:{idx}"``."""
    return select(steps.c.run_id, steps.c.idx).where(steps.c.run_id.in_(run_ids))


def _tool_records_of(keys: list[str], run_ids: list[str]) -> ColumnElement[bool]:
    # Exact keys, so each is a probe of the primary key (a join on computed keys
    # was planned as a scan of the whole table). The run_id guard: a record
    # under one of these keys that another run wrote stays with that run.
    return and_(tool_results.c.key.in_(keys), tool_results.c.run_id.in_(run_ids))


def count_run_rows(run_ids: list[str]) -> Select[Any]:
    """How many steps and events these runs have (a dry run)."""

    def count(table: Table) -> Any:
        where = table.c.run_id.in_(run_ids)
        return select(func.count()).select_from(table).where(where).scalar_subquery()

    return select(count(steps).label("steps"), count(events).label("events"))


def count_tool_records(keys: list[str], run_ids: list[str]) -> Select[Any]:
    return select(func.count()).select_from(tool_results).where(_tool_records_of(keys, run_ids))


def delete_tool_records(keys: list[str], run_ids: list[str]) -> Delete:
    return tool_results.delete().where(_tool_records_of(keys, run_ids))


def delete_prunable_runs(
    run_ids: list[str], cutoff: float, statuses: tuple[str, ...]
) -> ReturningDelete[Any]:
    """Delete these runs' rows, each only if still prunable and without a
    direct fork child that is not (a fork made since the batch was chosen);
    returns (run_id, status) of the rows deleted."""
    child = runs.alias("fork_child")
    kept_child = exists().where(
        child.c.forked_from_run == runs.c.run_id, ~_prunable(child, cutoff, statuses)
    )
    return (
        runs.delete()
        .where(runs.c.run_id.in_(run_ids), _prunable(runs, cutoff, statuses), ~kept_child)
        .returning(runs.c.run_id, runs.c.status)
    )


def fork_children_of(run_ids: list[str]) -> Select[Any]:
    """Runs whose fork origin is one of ``run_ids``: after these runs' DELETE,
    in its transaction, each must go too, or the batch rolls back."""
    return select(runs.c.run_id).where(runs.c.forked_from_run.in_(run_ids))


def delete_run_rows(run_ids: list[str]) -> list[Delete]:
    """Delete the events and steps of these (deleted) runs."""
    return [
        events.delete().where(events.c.run_id.in_(run_ids)),
        steps.delete().where(steps.c.run_id.in_(run_ids)),
    ]


def delete_run_signals(run_ids: list[str]) -> Delete:
    """Delete the signals kept for these (deleted) runs, taken or not (by
    the index on (run_id, id))."""
    return signals.delete().where(signals.c.run_id.in_(run_ids))


def select_run_signals(run_id: str) -> Select[Any]:
    """A run's signals, taken or not, oldest first: what an export carries.
    A message taken by a ``user`` step whose arguments hold its very text has
    no data of its own (schema.waits.take_signal): it is read from the step."""
    taken = signals.outerjoin(
        steps, and_(steps.c.run_id == signals.c.run_id, steps.c.idx == signals.c.taken_step)
    )
    moved = and_(
        signals.c.data.is_(None),
        signals.c.taken_step.is_not(None),
        steps.c.kind == StepKind.USER.value,
    )
    data = case((moved, steps.c.args), else_=signals.c.data).label("data")
    return (
        select(*(data if c.name == "data" else c for c in signals.c))
        .select_from(taken)
        .where(signals.c.run_id == run_id)
        .order_by(signals.c.id)
    )


def insert_signals() -> Insert:
    """An imported run's signals; the store gives each a new id."""
    return signals.insert()
