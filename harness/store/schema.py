"""Every table and every SQL statement of the run store, in one place.

Only :mod:`harness.store.sql` executes these. Statements are built with
SQLAlchemy Core so one definition serves SQLite and PostgreSQL.

Cost model (principle 8): a run's row holds its cursor, status, version and
lease; steps are rows keyed by (run_id, idx); so a checkpoint touches a fixed
number of rows whatever the run's length, and loading a run for recovery is
one SELECT joining the run to the step at its cursor.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    Boolean,
    Column,
    ColumnElement,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    and_,
    bindparam,
    case,
    cast,
    exists,
    false,
    func,
    insert,
    literal_column,
    or_,
    select,
    true,
    tuple_,
    union_all,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql import Delete, Insert, Select, Update
from sqlalchemy.sql.dml import ReturningDelete
from sqlalchemy.sql.selectable import ScalarSelect

from harness.records import RunStatus, StepKind, StepStatus
from harness.store import ClaimGuard

if TYPE_CHECKING:
    from harness.store import Delivered

metadata = MetaData()

runs = Table(
    "harness_runs",
    metadata,
    Column("run_id", String(128), primary_key=True),
    Column("agent", String(200), nullable=False),
    Column("goal", Text, nullable=False),
    Column("status", String(16), nullable=False),
    Column("cursor", Integer, nullable=False),
    Column("version", Integer, nullable=False),
    Column("step_count", Integer, nullable=False),
    Column("owner", String(200)),
    Column("lease_expires_at", Float),
    # When the next step message should have been processed; the sweeper
    # re-dispatches a movable, unleased run once this time has passed.
    Column("wake_at", Float),
    Column("result", Text),
    Column("error", Text),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    # Sweeper re-sends since the run last moved (migration 0004).
    Column("resends", Integer, nullable=False, server_default="0"),
    # Why no worker could carry the run, recorded once (migration 0004).
    Column("blocked", Text),
    # Provider-reported tokens and their price, summed by each model step's
    # result checkpoint (migration 0005).
    Column("input_tokens", Integer, nullable=False, server_default="0"),
    Column("output_tokens", Integer, nullable=False, server_default="0"),
    Column("cost_usd", Float, nullable=False, server_default="0"),
    # Budgets raised by an operator for this run, and a pause asked for: both
    # written without moving the version, so a step in flight still records
    # its result (migration 0006).
    Column("max_tokens", Integer),
    Column("max_cost_usd", Float),
    Column("pause_requested", Boolean, nullable=False, server_default=false()),
    # The run a fork copied its first steps from, and the model step it
    # continued at; null for a run that is not a fork (migration 0007).
    Column("forked_from_run", String(128)),
    Column("forked_from_step", Integer),
    # The recorded run a replay is served from, and whether a call that
    # diverges from it may still be made when its tool is read_only (0008).
    Column("replay_of_run", String(128)),
    Column("replay_live_reads", Boolean, nullable=False, server_default=false()),
)
# On status alone: an index on a column every checkpoint changes (wake_at)
# would rule out heap-only updates and make each lookup slower as a run ages.
Index("ix_harness_runs_status", runs.c.status)
# The listing's keyset (newest first); neither column ever changes, so
# checkpoints stay heap-only updates (migration 0004).
Index("ix_harness_runs_created", runs.c.created_at, runs.c.run_id)
# A fork's children (`harness list --forked-from`) and prune's ancestry walk;
# the column never changes after insert, so checkpoints stay heap-only (0007).
Index("ix_harness_runs_forked_from", runs.c.forked_from_run)
# A recording's replays (`harness list --replay-of`); never changes after insert (0008).
Index("ix_harness_runs_replay_of", runs.c.replay_of_run)

steps = Table(
    "harness_steps",
    metadata,
    Column("run_id", String(128), primary_key=True),
    Column("idx", Integer, primary_key=True),
    Column("kind", String(8), nullable=False),
    Column("status", String(32), nullable=False),
    Column("attempts", Integer, nullable=False),
    Column("tool", String(200)),
    Column("args", Text, nullable=False),  # JSON
    Column("result", Text),  # JSON
    Column("error", Text),
    Column("started_at", Float),
    Column("finished_at", Float),
    # Transient model failures retried so far (migration 0005).
    Column("retries", Integer, nullable=False, server_default="0"),
    # An operator's approval or rejection of the call, JSON (migration 0006).
    Column("approval", Text),
    # The blob holding the result when it is too large for the row, "sha256:<hex>";
    # ``result`` is NULL then (harness.store.blobs, migration 0009).
    Column("result_blob", String(80)),
)

events = Table(
    "harness_events",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", String(128), nullable=False),
    Column("version", Integer, nullable=False),
    Column("step_index", Integer),
    Column("from_status", String(32)),
    Column("to_status", String(32), nullable=False),
    Column("worker", String(200)),
    Column("at", Float, nullable=False),
    Column("detail", Text),
)
Index("ix_harness_events_run", events.c.run_id, events.c.id)

tool_results = Table(
    "harness_tool_results",
    metadata,
    Column("key", String(200), primary_key=True),
    Column("run_id", String(128), nullable=False),
    Column("step_index", Integer, nullable=False),
    Column("tool", String(200), nullable=False),
    Column("result", Text),  # JSON; NULL when it is in a blob (migration 0009)
    Column("created_at", Float, nullable=False),
    Column("result_blob", String(80)),  # as harness_steps.result_blob
)

# Durable counters for what leaves no row behind (a rejected stale write).
counters = Table(
    "harness_counters",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("value", Integer, nullable=False),
)

# The sweeper's delivery probes, one row per lane (harness.engine.probes):
# when its last probe was sent, and the newest one a worker took off the lane
# (every message sent before it has been delivered). Migration 0010.
lanes = Table(
    "harness_lanes",
    metadata,
    Column("lane", String(32), primary_key=True),
    Column("probe_sent_at", Float),
    Column("delivered_before", Float),
)

# Every sweep, whoever ran it (beat, `harness sweep`, a worker that took the
# sweep over): the age of the last one, and which worker swept when. The
# newest rows only, and the newest of each kind (record_sweep prunes). 0012.
sweeps = Table(
    "harness_sweeps",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("kind", String(16), nullable=False),
    Column("worker", String(200), nullable=False),
    # The time the sweep judged runs by (its start), and its end.
    Column("started_at", Float, nullable=False),
    Column("finished_at", Float, nullable=False),
    Column("redispatched", Integer, nullable=False),
)

# The lease of the one worker that sweeps while beat does not (harness.worker.
# takeover): a row taken by compare-and-set, renewed each sweep. 0012.
sweep_lease = Table(
    "harness_sweep_lease",
    metadata,
    Column("name", String(32), primary_key=True),
    Column("holder", String(200)),
    Column("expires_at", Float),
)

# Results too large for their rows (harness.store.blobs), each owned by one
# run: a prune deletes a run's blobs on the primary key's prefix, a fork or an
# import writes blobs of its own (migration 0009).
blobs = Table(
    "harness_blobs",
    metadata,
    Column("run_id", String(128), primary_key=True),
    Column("digest", String(80), primary_key=True),  # "sha256:<hex>" of the text
    Column("size", Integer, nullable=False),  # bytes
    Column("data", Text),  # the JSON text; NULL: a file in HARNESS_BLOB_DIR
)

# The agent catalog (harness.catalog): one row per agent each worker carries,
# written when the worker starts and refreshed while it lives (``last_seen``);
# a clean stop deletes its rows, a dead worker's stop being refreshed. Not a
# run's: no run refers to it, and an export leaves it out (migration 0013).
agents = Table(
    "harness_agents",
    metadata,
    Column("worker", String(200), primary_key=True),  # the Celery node name
    Column("agent", String(200), primary_key=True),
    Column("definition_hash", String(80), nullable=False),  # "sha256:<hex>"
    Column("tools", Text, nullable=False),  # JSON: [{"name", "effect", "requires_approval"}]
    Column("started_at", Float, nullable=False),  # the worker's first publish
    Column("last_seen", Float, nullable=False),
)

#: Columns that say where a value is stored, not what it is: reads resolve
#: them, and an export leaves them out (harness.store.blobs).
STORAGE_COLUMNS: dict[str, tuple[str, ...]] = {
    steps.name: ("result_blob",),
    tool_results.name: ("result_blob",),
}

ALL_TABLES = (
    runs,
    steps,
    events,
    tool_results,
    counters,
    blobs,
    lanes,
    sweeps,
    sweep_lease,
    agents,
)

#: The statuses a worker carries a run forward in, as stored.
MOVABLE = tuple(s.value for s in RunStatus if s.movable)


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


RUN_ID = bindparam("run_id", type_=runs.c.run_id.type)
GUARD_CURSOR = bindparam("g_cursor", type_=Integer)
EXPECTED = bindparam("expected", type_=Integer)


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
        writes.append(record.on_conflict_do_nothing().cte("tool_record"))
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


def request_pause(run_id: str, requested: bool, statuses: frozenset[RunStatus]) -> Update:
    """Ask a run to stop at its next step boundary (or withdraw the ask) while
    its status is one of ``statuses`` (harness.store.PauseNote); the version
    is not moved, so a step in flight is not fenced."""
    return (
        update(runs)
        .where(
            runs.c.run_id == run_id,
            runs.c.status.in_(sorted(s.value for s in statuses)),
            runs.c.pause_requested.is_not(requested),
        )
        .values(pause_requested=requested)
    )


def note_approval(run_id: str, index: int, status: StepStatus, values: dict[str, Any]) -> Update:
    """An operator's word on a call not reached yet, while it is ``status``
    (harness.store.ApprovalNote): recorded once (a second word matches no
    row), without moving the run's version."""
    return (
        update(steps)
        .where(
            steps.c.run_id == run_id,
            steps.c.idx == index,
            steps.c.status == status.value,
            steps.c.approval.is_(None),
        )
        .values(**values)
    )


#: The statuses a run never leaves, as stored.
TERMINAL = tuple(s.value for s in RunStatus if s.terminal)


def late_result(run_id: str, index: int, values: dict[str, Any]) -> Update:
    """The response of a model call that returned after its run ended, on its
    step: only while the run has ended and the step has no result yet, so that
    a call is charged once (a second writer matches no row)."""
    ended = exists().where(runs.c.run_id == run_id, runs.c.status.in_(TERMINAL))
    return (
        update(steps)
        .where(
            steps.c.run_id == run_id,
            steps.c.idx == index,
            steps.c.kind == StepKind.MODEL.value,
            steps.c.result.is_(None),
            steps.c.result_blob.is_(None),
            ended,
        )
        .values(**values)
    )


def add_usage(run_id: str, input_tokens: int, output_tokens: int, cost_usd: float) -> Update:
    """Add a call's usage to the run's, without moving its version."""
    return (
        update(runs)
        .where(runs.c.run_id == run_id)
        .values(
            input_tokens=runs.c.input_tokens + input_tokens,
            output_tokens=runs.c.output_tokens + output_tokens,
            cost_usd=runs.c.cost_usd + cost_usd,
        )
    )


def run_version(run_id: str) -> Select[Any]:
    return select(runs.c.version).where(runs.c.run_id == run_id)


def insert_steps() -> Insert:
    return steps.insert()


def insert_events() -> Insert:
    return events.insert()


def insert_run() -> Insert:
    return runs.insert()


def select_steps(run_id: str, start: int = 0, limit: int | None = None) -> Select[Any]:
    """A run's steps in order, from index ``start`` (on the primary key)."""
    query = select(steps).where(steps.c.run_id == run_id).order_by(steps.c.idx)
    if start:
        query = query.where(steps.c.idx >= start)
    if limit is not None:
        query = query.limit(limit)
    return query


def select_events(run_id: str) -> Select[Any]:
    return select(events).where(events.c.run_id == run_id).order_by(events.c.id)


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


def select_events_after(run_id: str, after_id: int | None, limit: int | None) -> Select[Any]:
    """A run's flight recorder from the event after ``after_id``, oldest first
    (on the index (run_id, id))."""
    query = select(events).where(events.c.run_id == run_id).order_by(events.c.id)
    if after_id is not None:
        query = query.where(events.c.id > after_id)
    if limit is not None:
        query = query.limit(limit)
    return query


def due_runs(now: float, limit: int, delivered: Delivered | None) -> Select[Any]:
    """Runs that should be moving but are not: past ``wake_at``, and unleased or
    with an expired lease. Every movable run has a ``wake_at``; each re-dispatch
    pushes it forward, so a slow run is not re-sent at every sweep.
    ``delivered``: leave out the runs whose message may still be queued."""
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
        .where(runs.c.status.in_(MOVABLE), runs.c.wake_at < now, stopped)
        .order_by(runs.c.wake_at)
        .limit(limit)
    )


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


def ping() -> Select[Any]:
    """``SELECT 1``: whether the database answers, reading no table."""
    return select(literal_column("1"))


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


def select_tool_result(key: str) -> Select[Any]:
    """One idempotency record's result, or its blob reference."""
    return select(tool_results.c.run_id, tool_results.c.result, tool_results.c.result_blob).where(
        tool_results.c.key == key
    )


def insert_tool_result_if_absent(dialect: str, values: dict[str, Any]) -> Insert:
    """First writer wins: a replay never overwrites a stored result."""
    if dialect == "postgresql":
        return postgresql.insert(tool_results).values(**values).on_conflict_do_nothing()
    return sqlite.insert(tool_results).values(**values).on_conflict_do_nothing()


def delete_all() -> list[Delete]:
    """Empty every table (tests and ``harness demo``)."""
    return [table.delete() for table in ALL_TABLES]


# -- fork (issue 12) ------------------------------------------------------------


def select_tool_records(keys: list[str]) -> Select[Any]:
    """The idempotency records under ``keys`` (primary-key lookups), which a
    fork copies under its own run's keys."""
    return select(
        tool_results.c.key,
        tool_results.c.step_index,
        tool_results.c.tool,
        tool_results.c.run_id,
        tool_results.c.result,
        tool_results.c.result_blob,
    ).where(tool_results.c.key.in_(keys))


def insert_tool_records() -> Insert:
    """Idempotency records of a new run (a fork's copied steps): the run's id is
    new, so a key already taken means the insert, and its transaction, fail."""
    return tool_results.insert()


def lock_fork_origin(run_id: str) -> Select[Any]:
    """A fork's origin row, read in the fork's insert transaction with a lock
    that conflicts with DELETE (PostgreSQL FOR KEY SHARE, what a foreign key
    takes; it does not block a checkpoint's UPDATE): a prune deleting the
    origin waits for the fork, or the fork waits for the prune and finds no
    row. SQLite has no row locks (SQLAlchemy drops the clause): its write
    transactions are serial already."""
    return select(runs.c.run_id).where(runs.c.run_id == run_id).with_for_update(key_share=True)


# -- export and import (harness.replay.archive) ---------------------------------

#: Text columns that hold JSON: the store decodes them for an export, and
#: encodes them again on import, so a document carries values, not strings.
JSON_COLUMNS: dict[str, tuple[str, ...]] = {
    steps.name: ("args", "result", "approval"),
    tool_results.name: ("result",),
}


def select_run_row(run_id: str) -> Select[Any]:
    """Every column of one run row, whatever columns the table has."""
    return select(runs).where(runs.c.run_id == run_id)


def select_run_tool_records(run_id: str) -> Select[Any]:
    """A run's durable idempotency records, in step order."""
    return (
        select(tool_results)
        .where(tool_results.c.run_id == run_id)
        .order_by(tool_results.c.step_index, tool_results.c.key)
    )


# -- prune: retention (harness prune, harness.replay.prune) ---------------------
#
# Candidates are found on the index (created_at, run_id): a run last updated
# before the cutoff was created before it too, and there is deliberately no
# index on updated_at (every checkpoint changes it). Each batch's rows are
# then deleted by their own indexes: runs and steps by primary key, events by
# (run_id, id), tool records by their exact keys "{run_id}:{idx}" (the table
# has no run_id index; exact keys, unlike a key range, hold under any collation).


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


# -- blobs: results stored beside their rows (harness.store.blobs) --------------


def select_blobs(run_id: str, digests: list[str]) -> Select[Any]:
    """Some of a run's blobs, (digest, data), on the primary key; data NULL: a file."""
    return select(blobs.c.digest, blobs.c.data).where(
        blobs.c.run_id == run_id, blobs.c.digest.in_(digests)
    )


def insert_blobs_if_absent(dialect: str) -> Insert:
    """A run's blobs; one it has already (the same text: a blob is named by its
    hash) is kept."""
    dialect_insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    return dialect_insert(blobs).on_conflict_do_nothing()


def delete_run_blobs(run_ids: list[str]) -> Delete:
    """The blobs of these (deleted) runs, on the primary key's prefix."""
    return blobs.delete().where(blobs.c.run_id.in_(run_ids))


def select_blob_files() -> Select[Any]:
    """(run_id, digest) of every blob kept as a file."""
    return select(blobs.c.run_id, blobs.c.digest).where(blobs.c.data.is_(None))


# -- agent catalog (issue 21) -----------------------------------------------------


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
