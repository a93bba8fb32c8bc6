"""The statements of a step's hot path: the load joined to the step at the
cursor, the guarded write (CAS on the version), and on PostgreSQL a whole
checkpoint, or a claim written without a load, as one statement.

These are compiled once per shape and run by
:mod:`harness.store.sql.statements`; so they bind named parameters only and
inline their constants.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Column,
    ColumnElement,
    Integer,
    String,
    Table,
    Text,
    and_,
    bindparam,
    cast,
    exists,
    false,
    insert,
    literal_column,
    null,
    select,
    true,
    union_all,
    update,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.sql import Insert, Select, Update

from harness.store import ClaimGuard
from harness.store.schema.tables import SAME_AS_STEP, blobs, events, runs, steps, tool_results


def load_run(at: Any = None) -> Select[Any]:
    """The run joined to the step at its cursor: recovery in one round trip.
    Binds ``run_id``. ``at``: the cursor, when the caller knows it (a bound
    index plans well as a prepared statement; a join on the cursor column
    may not, once the tables have grown)."""
    index = runs.c.cursor if at is None else at
    return (
        select(runs, *(c.label(f"step_{c.name}") for c in steps.c))
        .select_from(
            runs.outerjoin(steps, and_(steps.c.run_id == runs.c.run_id, steps.c.idx == index))
        )
        .where(runs.c.run_id == bindparam("run_id", type_=runs.c.run_id.type))
    )


#: Constants inlined in compiled SQL, which is executed with named parameters only.
ONE = literal_column("1", Integer)
#: The named parameters of the one-statement checkpoint and claim: the run,
#: the cursor the claim guard expects, the version the CAS expects.
RUN_ID = bindparam("run_id", type_=runs.c.run_id.type)
GUARD_CURSOR = bindparam("g_cursor", type_=Integer)
EXPECTED = bindparam("expected", type_=Integer)


def cas_run(run_id: Any, expected_version: Any, values: dict[str, Any]) -> Update:
    """The guarded write: matches only while nobody else has written.
    ``run_id`` and ``expected_version``: values, or bound parameters."""
    return (
        update(runs)
        .where(runs.c.run_id == run_id, runs.c.version == expected_version)
        .values(version=runs.c.version + ONE, **values)
    )


@dataclass(frozen=True)
class CheckpointShape:
    """Which columns and rows a checkpoint writes; the statement's cache key.

    Steps write a handful of shapes, so each is built and compiled once; its
    values are bound as ``r_<column>`` (run), ``s<n>_<column>`` (step patch
    ``n``), ``n<i>_<column>`` (new step ``i``), ``e<i>_<column>`` (event
    ``i``), ``t_<column>`` (tool record) and ``b<i>_<column>`` (blob ``i``),
    with ``run_id`` and ``expected``.
    """

    run_columns: tuple[str, ...]
    step_patches: tuple[tuple[tuple[str, ...], bool], ...] = ()
    new_steps: int = 0
    events: int = 0
    tool_record: bool = False
    blobs: int = 0


@functools.lru_cache(maxsize=256)
def checkpoint_in_one_statement(shape: CheckpointShape) -> Select[Any]:
    """A whole checkpoint as one PostgreSQL statement: one round trip, atomic.

    The CAS on the run row is a data-modifying CTE returning the new version;
    every other write reads from it, so each happens only if the CAS matched
    (and event rows take the new version from it). The statement returns the
    new version, or no row when the run was written by someone else.
    """
    cas, writes = _checkpoint_ctes(shape, cas_run(RUN_ID, EXPECTED, _run_values(shape)))
    return select(cas.c.version).add_cte(*writes)


def claim_in_one_statement(shape: CheckpointShape) -> Select[Any]:
    """A claim written without a load (``SQLStore.claim_loaded``), as one
    PostgreSQL statement: the checkpoint of ``shape``, guarded by
    :func:`claim_guard`, returning what :func:`load_run` returns of the run
    as it was before the claim (every sub-statement of a ``WITH`` reads the
    snapshot taken before any of them writes), and the new version as
    ``claimed_version``; no row if the guard or the version did not match."""
    guarded = cas_run(RUN_ID, EXPECTED, _run_values(shape)).where(*claim_guard(RUN_ID))
    cas, writes = _checkpoint_ctes(shape, guarded)
    before = load_run(at=GUARD_CURSOR).add_columns(cas.c.version.label("claimed_version"))
    return before.join_from(runs, cas, true()).add_cte(*writes)


def claim_guard(run_id: Any) -> list[ColumnElement[bool]]:
    """What a claim written without a load must find, besides its version:
    :meth:`harness.store.ClaimGuard.holds` in SQL (the run running, unleased,
    not asked to pause, not a replay, of agent ``g_agent`` with its cursor at
    ``g_cursor``, and the step there a PENDING call of tool ``g_tool`` after
    ``g_attempts`` attempts), its constants taken from there. Binds those four."""
    cursor = GUARD_CURSOR
    step_there = (
        select(steps.c.idx)
        .where(
            steps.c.run_id == run_id,
            steps.c.idx == cursor,
            steps.c.kind == _text(ClaimGuard.STEP_KIND.value),
            steps.c.status == _text(ClaimGuard.STEP_STATUS.value),
            steps.c.tool == bindparam("g_tool", type_=steps.c.tool.type),
            steps.c.attempts == bindparam("g_attempts", type_=Integer),
        )
        .exists()
    )
    return [
        runs.c.status == _text(ClaimGuard.RUN_STATUS.value),
        runs.c.owner.is_(None),
        runs.c.pause_requested.is_(false()),
        runs.c.replay_of_run.is_(None),
        runs.c.cursor == cursor,
        runs.c.agent == bindparam("g_agent", type_=runs.c.agent.type),
        step_there,
    ]


def _text(value: str) -> ColumnElement[str]:
    """A string constant inlined in the SQL (hot statements bind named values only)."""
    assert value.isidentifier(), value
    return literal_column(f"'{value}'", String)


def _run_values(shape: CheckpointShape) -> dict[str, ColumnElement[Any]]:
    return {c: _bound(f"r_{c}", runs.c[c]) for c in shape.run_columns}


def _checkpoint_ctes(shape: CheckpointShape, write_run: Update) -> tuple[Any, list[Any]]:
    """The CAS ``write_run`` as a CTE returning the new version, and the
    checkpoint's other writes, each made only if the CAS matched."""
    run_id = RUN_ID
    cas = write_run.returning(runs.c.version).cte("cas")
    matched = exists(select(cas.c.version))
    writes: list[Any] = []
    for n, (columns, bump) in enumerate(shape.step_patches):
        values = {c: _bound(f"s{n}_{c}", steps.c[c]) for c in columns}
        patch = patch_step(run_id, _bound(f"s{n}_idx", steps.c.idx), values, bump)
        writes.append(patch.where(matched).cte(f"step_{n}"))
    if shape.new_steps:
        writes.append(_insert_from_cas(steps, "n", shape.new_steps, cas.c.version))
    if shape.events:
        writes.append(_insert_from_cas(events, "e", shape.events, cas.c.version))
    if shape.tool_record:
        names = [c.name for c in tool_results.c]
        chosen = select(*(_bound(f"t_{c.name}", c).label(c.name) for c in tool_results.c))
        record = postgresql.insert(tool_results).from_select(names, chosen.where(matched))
        # First writer wins; a record holding the very text the step's result
        # now holds names the step's instead (schema.upkeep.insert_record).
        shared = cast(bindparam("t_shared", type_=Text), Text)
        record = record.on_conflict_do_update(
            index_elements=[tool_results.c.key],
            set_={"result": null(), "result_blob": _text(SAME_AS_STEP)},
            where=and_(shared.is_not(None), tool_results.c.result == shared),
        )
        writes.append(record.cte("tool_record"))
    if shape.blobs:
        writes.append(_insert_from_cas(blobs, "b", shape.blobs, cas.c.version, keep_taken=True))
    return cas, writes


def _bound(name: str, column: Column[Any]) -> ColumnElement[Any]:
    # An explicit cast: PostgreSQL cannot infer a type for a NULL in a SELECT list.
    return cast(bindparam(name, type_=column.type), column.type)


def _insert_from_cas(
    table: Table, prefix: str, count: int, version: Any, keep_taken: bool = False
) -> Any:
    """Insert ``count`` rows in their order (event ids are the flight recorder's
    order), only if the CAS matched; an event's version is the run's new one.
    ``keep_taken``: a row whose key is taken is skipped (a blob the run has)."""
    names = [c.name for c in table.c if c.name != "id"]

    def value(n: int, column: str) -> Any:
        if table is events and column == "version":
            return version.label(column)
        return _bound(f"{prefix}{n}_{column}", table.c[column]).label(column)

    chosen = union_all(
        *(
            select(
                literal_column(str(n)).label("ordinal"), *(value(n, c) for c in names)
            ).select_from(version.table)
            for n in range(count)
        )
    ).subquery()
    ordered = select(*(chosen.c[c] for c in names)).order_by(chosen.c.ordinal)
    if keep_taken:
        statement = postgresql.insert(table).from_select(names, ordered).on_conflict_do_nothing()
        return statement.cte(f"insert_{table.name}")
    return insert(table).from_select(names, ordered).cte(f"insert_{table.name}")


def patch_step(run_id: Any, index: Any, values: dict[str, Any], bump_attempts: bool) -> Update:
    if bump_attempts:
        values = {**values, "attempts": steps.c.attempts + ONE}
    return update(steps).where(steps.c.run_id == run_id, steps.c.idx == index).values(**values)


def insert_run() -> Insert:
    return runs.insert()


def insert_steps() -> Insert:
    return steps.insert()


def insert_events() -> Insert:
    return events.insert()
