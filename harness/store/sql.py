"""The run store on SQLAlchemy Core: SQLite (embedded) and PostgreSQL.

SQLite runs in WAL mode with a busy timeout, and write transactions start
with ``BEGIN IMMEDIATE`` so two writers queue instead of deadlocking on a
lock upgrade. PostgreSQL uses psycopg 3 without pre-ping, which would cost a
round trip per operation: after a database restart, the first operation on a
dead connection fails with :class:`StoreError`, SQLAlchemy invalidates the
pool, and the caller's retry (the step task retries on StoreError) connects
afresh. Reads run outside a transaction (one round trip); every write is one
transaction.

Pools: the store's pool keeps one connection per thread that uses it at once
(``pool_size``: under the threads pool, the worker's concurrency up to
``harness.api.STEP_CONNECTIONS``), and lease renewals go through
:meth:`SQLStore.heartbeat_store`, a view on an engine of their own, so a
renewal never queues behind step threads for a connection.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, Integer, Select, bindparam, create_engine, event, exc
from sqlalchemy.engine import URL, ExecutionContext, make_url
from sqlalchemy.sql.compiler import SQLCompiler

from harness.errors import ConfigError, NoteRefused, RunNotFound, StaleWriteError, StoreError
from harness.inputs import json_text, storable
from harness.records import (
    JSON,
    Approval,
    Event,
    ForkOrigin,
    ReplayOrigin,
    Run,
    RunStatus,
    Step,
    StepKind,
    StepStatus,
    idempotency_key,
)
from harness.settings import shown_url
from harness.store import (
    BILLED,
    SWEEPS_KEPT,
    ApprovalNote,
    Checkpoint,
    ClaimGuard,
    Deleted,
    Delivered,
    EventDraft,
    Lane,
    PauseNote,
    PublishedAgent,
    PublishedTool,
    RowCounts,
    RunQuery,
    RunRows,
    StepPatch,
    Sweep,
    SweepKind,
    ToolRecord,
    schema,
)
from harness.store.blobs import BlobBatch, BlobStore

log = logging.getLogger(__name__)

_WRITE = "harness_write"
#: Execution option: run the statement unprepared on PostgreSQL (planned each time).
_PLAN_EACH_TIME = "harness_plan_each_time"
_UNPREPARED = {_PLAN_EACH_TIME: True}
_KEEP_ROWCOUNT = {"preserve_rowcount": True}
#: (kept, overflow) connections when no pool size is given: the CLI, the API.
DEFAULT_POOL = (2, 4)
#: The heartbeat engine's pool: the process's one heartbeat thread, and a spare.
HEARTBEAT_POOL = (1, 1)
T = TypeVar("T")
#: Keys per ``IN`` list when reading idempotency records (SQLite's bound
#: parameters are limited; PostgreSQL plans long lists slowly).
_KEYS_PER_STATEMENT = 500
#: The one row of the sweep lease table (harness.worker.takeover).
_SWEEP_LEASE = "takeover"


def pool_limits(pool_size: int | None) -> tuple[int, int]:
    """(kept, overflow) for a pool used by ``pool_size`` threads at once: one
    connection each, kept open, and a few more opened only for an occasional
    extra user (the sweeper, an operation run in the worker's process)."""
    if pool_size is None:
        return DEFAULT_POOL
    if pool_size < 1:
        raise ConfigError(f"pool size must be positive, not {pool_size}")
    return pool_size, max(2, pool_size // 4)


def make_engine(
    url: str | URL, pool_size: int | None = None, *, max_overflow: int | None = None
) -> Engine:
    """An engine for ``url`` with the harness's connection settings.

    ``pool_size``: how many threads use the engine at once (see
    :func:`pool_limits`); ``max_overflow`` overrides the derived overflow.
    """
    kept, overflow = pool_limits(pool_size)
    overflow = overflow if max_overflow is None else max_overflow
    try:
        parsed = make_url(url)
    except (exc.ArgumentError, ValueError) as err:
        raise ConfigError(f"malformed database URL {shown_url(str(url))!r}: {err}") from None
    if parsed.get_backend_name() == "postgres":  # Heroku's and libpq's spelling
        raise ConfigError(
            f"unusable database URL {parsed.render_as_string(hide_password=True)!r}: "
            "use postgresql:// (SQLAlchemy does not know postgres://)"
        )
    try:
        if parsed.get_backend_name() == "sqlite":
            pool = {} if pool_size is None or _in_memory(parsed) else _pool(kept, overflow)
            return _sqlite_engine(parsed, pool)
        if parsed.get_backend_name() == "postgresql" and parsed.drivername == "postgresql":
            parsed = parsed.set(drivername="postgresql+psycopg")
        engine = create_engine(
            parsed,
            isolation_level="AUTOCOMMIT",
            **_pool(kept, overflow),
            connect_args={
                "connect_timeout": 10,
                # A frozen process holding a row lock must not stall every other
                # worker and the sweeper: give up on the lock, and on an idle
                # transaction, and notice dead peers.
                "options": "-c lock_timeout=5000 -c idle_in_transaction_session_timeout=60000",
                "keepalives": 1,
                "keepalives_idle": 10,
                "keepalives_interval": 5,
                "keepalives_count": 3,
            },
        )
    except (exc.ArgumentError, exc.NoSuchModuleError, ImportError) as err:
        shown = parsed.render_as_string(hide_password=True)
        raise ConfigError(f"unusable database URL {shown!r}: {err}") from None
    if engine.dialect.driver == "psycopg":
        event.listen(engine, "do_execute", _execute_unprepared)
        _cache_checkpoint_statements()
    return engine


def _pool(kept: int, overflow: int) -> dict[str, Any]:
    return {"pool_size": kept, "max_overflow": overflow, "pool_timeout": 10}


def _in_memory(url: URL) -> bool:
    """An in-memory SQLite database: one per connection pool, so never a second engine."""
    return url.database in (None, "", ":memory:") or url.query.get("mode") == "memory"


def _execute_unprepared(
    cursor: Any, statement: str, parameters: Any, context: ExecutionContext
) -> bool:
    """psycopg: honour :data:`_PLAN_EACH_TIME` (psycopg prepares a statement
    after its fifth run otherwise); False lets the dialect execute as usual."""
    if not context.execution_options.get(_PLAN_EACH_TIME):
        return False
    cursor.execute(statement, parameters, prepare=False)
    return True


def _sqlite_engine(url: URL, pool: dict[str, Any]) -> Engine:
    engine = create_engine(url, connect_args={"timeout": 30}, **pool)

    @event.listens_for(engine, "connect")
    def _connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # the harness issues BEGIN itself
        cursor = dbapi_conn.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        if conn.get_execution_options().get(_WRITE):
            conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def _loads(text: str | None) -> JSON:
    return None if text is None else json.loads(text)


def _approval(text: str | None) -> Approval | None:
    return None if text is None else Approval.from_json(json.loads(text))


def _run_values(cp: Checkpoint) -> dict[str, Any]:
    """The run row's new values in ``cp``, as stored."""
    return storable({**cp.run.values(), "updated_at": cp.now})


def _step(row: Mapping[Any, Any], prefix: str = "") -> Step:
    return Step(
        run_id=row[f"{prefix}run_id"],
        index=row[f"{prefix}idx"],
        kind=StepKind(row[f"{prefix}kind"]),
        status=StepStatus(row[f"{prefix}status"]),
        attempts=row[f"{prefix}attempts"],
        tool=row[f"{prefix}tool"],
        args=json.loads(row[f"{prefix}args"]),
        result=_loads(row[f"{prefix}result"]),
        error=row[f"{prefix}error"],
        started_at=row[f"{prefix}started_at"],
        finished_at=row[f"{prefix}finished_at"],
        retries=row[f"{prefix}retries"],
        approval=_approval(row[f"{prefix}approval"]),
    )


def _run(row: Mapping[Any, Any], with_step: bool = False) -> Run:
    current = _step(row, "step_") if with_step and row["step_idx"] is not None else None
    return Run(
        run_id=row["run_id"],
        agent=row["agent"],
        goal=row["goal"],
        status=RunStatus(row["status"]),
        cursor=row["cursor"],
        version=row["version"],
        step_count=row["step_count"],
        owner=row["owner"],
        lease_expires_at=row["lease_expires_at"],
        wake_at=row["wake_at"],
        result=row["result"],
        error=row["error"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        resends=row["resends"],
        blocked=row["blocked"],
        input_tokens=row["input_tokens"],
        output_tokens=row["output_tokens"],
        cost_usd=row["cost_usd"],
        max_tokens=row["max_tokens"],
        max_cost_usd=row["max_cost_usd"],
        pause_requested=bool(row["pause_requested"]),
        forked_from=_fork_origin(row),
        replay_of=_replay_origin(row),
        current=current,
    )


def _fork_origin(row: Mapping[Any, Any]) -> ForkOrigin | None:
    if row["forked_from_run"] is None:
        return None
    return ForkOrigin(row["forked_from_run"], row["forked_from_step"])


def _replay_origin(row: Mapping[Any, Any]) -> ReplayOrigin | None:
    if row["replay_of_run"] is None:
        return None
    return ReplayOrigin(row["replay_of_run"], bool(row["replay_live_reads"]))


def _run_row(run: Run, wake_at: float) -> dict[str, Any]:
    """The row inserting a new run: unleased, woken at ``wake_at``."""
    row = {**run.to_dict(), "wake_at": wake_at, "owner": None}
    row.pop("lease_expires_at")
    origin = row.pop("forked_from")
    row["forked_from_run"] = None if origin is None else origin["run_id"]
    row["forked_from_step"] = None if origin is None else origin["step"]
    replay = row.pop("replay_of")
    row["replay_of_run"] = None if replay is None else replay["run_id"]
    row["replay_live_reads"] = False if replay is None else replay["live_read_only"]
    return storable(row)


def _step_row(step: Step, blobs: BlobBatch) -> dict[str, Any]:
    """A step's row; a result too large for it goes to a blob in ``blobs``."""
    row = {
        "run_id": step.run_id,
        "idx": step.index,
        "kind": step.kind.value,
        "status": step.status.value,
        "attempts": step.attempts,
        "tool": step.tool,
        "args": json_text(step.args, "args"),
        "result": None if step.result is None else json_text(step.result, "result"),
        "error": step.error,
        "started_at": step.started_at,
        "finished_at": step.finished_at,
        "retries": step.retries,
        "approval": None
        if step.approval is None
        else json_text(step.approval.to_json(), "approval"),
    }
    return blobs.offload(step.run_id, storable(row))


def _changes(patch: StepPatch) -> bool:
    return patch.bump_attempts or bool(patch.values())


def _step_values(patch: StepPatch, run_id: str, blobs: BlobBatch) -> dict[str, Any]:
    values = patch.values()
    for column in ("result", "args"):
        if column in values:
            values[column] = json_text(values[column], column)
    if values.get("approval") is not None:
        values["approval"] = json_text(values["approval"].to_json(), "approval")
    return blobs.offload(run_id, storable(values))


def _record_row(run_id: str, record: ToolRecord, now: float, blobs: BlobBatch) -> dict[str, Any]:
    row = {
        "key": record.key,
        "run_id": run_id,
        "step_index": record.step_index,
        "tool": record.tool,
        "result": json_text(record.result, "result"),
        "created_at": now,
    }
    return blobs.offload(run_id, storable(row))


@dataclass(frozen=True)
class _Rows:
    """A checkpoint's step and record rows, encoded before its transaction,
    with the rows of the blobs they name (a blob file is written by then)."""

    patches: tuple[tuple[StepPatch, dict[str, Any]], ...]
    new_steps: tuple[dict[str, Any], ...]
    record: dict[str, Any] | None
    blobs: tuple[dict[str, Any], ...]


class SQLStore:
    """:class:`harness.store.Store` on a SQLAlchemy engine."""

    def __init__(
        self,
        engine: Engine,
        heartbeat_engine: Callable[[], Engine] | None = None,
        blobs: BlobStore | None = None,
    ) -> None:
        """``heartbeat_engine`` makes the engine of :meth:`heartbeat_store`;
        by default one on the same URL with :data:`HEARTBEAT_POOL`. ``blobs``:
        where large results go (harness.store.blobs); by default the table,
        above 64 KiB."""
        self.engine = engine
        self.dialect = engine.dialect.name
        self.blobs = BlobStore() if blobs is None else blobs
        # PostgreSQL connections autocommit (a read or a one-statement checkpoint
        # is one round trip); multi-statement writes ask for a transaction.
        self._transactional = (
            {"isolation_level": "READ COMMITTED"} if self.dialect == "postgresql" else {}
        )
        self._sql_cache: dict[Hashable, tuple[str, tuple[str, ...] | None, tuple[str, ...]]] = {}
        if heartbeat_engine is None and not _in_memory(engine.url):
            kept, overflow = HEARTBEAT_POOL
            heartbeat_engine = functools.partial(
                make_engine, engine.url, kept, max_overflow=overflow
            )
        self._heartbeat_engine = heartbeat_engine
        self._heartbeat: SQLStore | None = None
        self._heartbeat_lock = threading.Lock()

    @classmethod
    def from_url(
        cls, url: str, pool_size: int | None = None, blobs: BlobStore | None = None
    ) -> SQLStore:
        """A store whose pool serves ``pool_size`` threads at once (None: a couple)."""
        return cls(make_engine(url, pool_size), blobs=blobs)

    def heartbeat_store(self) -> SQLStore:
        """This store on a small engine of its own, made on first use, for lease
        renewals: they never wait for a connection behind step threads. It
        shares the compiled statements; an in-memory SQLite store is itself."""
        with self._heartbeat_lock:
            if self._heartbeat is None:
                if self._heartbeat_engine is None:
                    self._heartbeat = self
                else:
                    view = SQLStore(self._heartbeat_engine(), blobs=self.blobs)
                    view._sql_cache = self._sql_cache
                    view._heartbeat = view
                    self._heartbeat = view
            return self._heartbeat

    # -- connections -------------------------------------------------------

    def _read(self, work: Callable[[Connection], T]) -> T:
        """Run ``work`` outside a transaction: one round trip per statement."""

        def attempt() -> T:
            with self.engine.connect() as conn:
                return work(conn)

        return _guarded(attempt)

    def _write(self, work: Callable[[Connection], T]) -> T:
        """Run ``work`` in one transaction (``BEGIN IMMEDIATE`` on SQLite)."""

        def attempt() -> T:
            with self.engine.connect() as conn:
                conn = conn.execution_options(**{_WRITE: True, **self._transactional})
                with conn.begin():
                    return work(conn)

        return _guarded(attempt)

    # -- runs --------------------------------------------------------------

    def create_run(
        self, run: Run, steps: Sequence[Step], wake_at: float, created: EventDraft
    ) -> tuple[Run, bool]:
        row = _run_row(run, wake_at)
        event = _event_row(run.run_id, run.version, None, run.created_at, created)
        batch = self.blobs.batch()
        step_rows = [_step_row(s, batch) for s in steps]
        blobs = self.blobs.stage(batch)

        def insert(conn: Connection) -> None:
            conn.execute(schema.insert_run(), [row])
            conn.execute(schema.insert_steps(), step_rows)
            conn.execute(schema.insert_events(), [event])
            self.blobs.insert(conn, self.dialect, blobs)

        try:
            self._write(insert)
        except exc.IntegrityError:
            return self.load(run.run_id), False
        return self.load(run.run_id), True

    def load(self, run_id: str, at: int | None = None) -> Run:
        if at is None:
            # Planned each time: a generic plan of the join on the cursor column,
            # made while the tables were small, reads a long run's steps one by one.
            row = self._fetch_one(
                "load_run", schema.load_run, {"run_id": run_id}, plan_each_time=True
            )
        else:  # the step's index bound: any plan is two primary-key lookups
            row = self._fetch_one("load_run_at", _load_at, {"run_id": run_id, "at": at})
        if row is None:
            raise RunNotFound(run_id)
        if at is not None and row["cursor"] != at:  # the step read is not the cursor's
            row = {k: None if k in _STEP_COLUMNS else v for k, v in row.items()}
        if row["step_result_blob"] is not None:  # rare: a large result at the cursor
            found = row
            row = self._read(lambda conn: dict(self.blobs.fill(conn, [found], "step_")[0]))
        return _run(row, with_step=True)

    def checkpoint(self, checkpoint: Checkpoint) -> int:
        try:
            rows = self._encode(checkpoint)
            if self.dialect == "postgresql":
                return self._one_statement(checkpoint, rows)
            return self._write(lambda conn: self._apply(conn, checkpoint, rows))
        except StaleWriteError:
            self._count("stale_writes")
            raise
        except exc.IntegrityError as err:
            raise StoreError(
                f"checkpoint of run {checkpoint.run_id} conflicts with "
                f"stored rows: {_describe(err)}"
            ) from err

    def claim_loaded(self, claim: Checkpoint, guard: ClaimGuard) -> tuple[Run, int] | None:
        guards = {
            "g_cursor": guard.cursor,
            "g_agent": guard.agent,
            "g_tool": guard.tool,
            "g_attempts": guard.attempts,
        }
        rows = self._encode(claim)
        if self.dialect == "postgresql":
            params, shape = self._statement_params(claim, rows)
            build = functools.partial(schema.claim_in_one_statement, shape)
            row = self._fetch_one(("claim", shape), build, params | guards)
            if row is None:
                return None
            version = row.pop("claimed_version")
        else:

            def apply(conn: Connection) -> tuple[dict[str, Any], int] | None:
                load = schema.load_run().where(
                    schema.runs.c.version == claim.expected_version,
                    *schema.claim_guard(claim.run_id),
                )
                found = conn.execute(load, {"run_id": claim.run_id} | guards).mappings().first()
                if found is None:
                    return None
                return dict(found), self._apply(conn, claim, rows)

            done = self._write(apply)
            if done is None:
                return None
            row, version = done
        if row["step_result_blob"] is not None:  # a pending call has no result: never
            raise StoreError(f"run {claim.run_id}: a pending step with a stored result")
        return _run(row, with_step=True), version

    def _encode(self, cp: Checkpoint) -> _Rows:
        """The checkpoint's step and record rows, and their blobs staged."""
        batch = self.blobs.batch()
        patches = tuple((p, _step_values(p, cp.run_id, batch)) for p in cp.steps if _changes(p))
        new_steps = tuple(_step_row(s, batch) for s in cp.new_steps)
        record = None
        if cp.tool_record is not None:
            record = _record_row(cp.run_id, cp.tool_record, cp.now, batch)
        return _Rows(patches, new_steps, record, self.blobs.stage(batch))

    def _one_statement(self, cp: Checkpoint, rows: _Rows) -> int:
        """PostgreSQL: the checkpoint as one autocommit statement, one round trip."""
        params, shape = self._statement_params(cp, rows)
        build = functools.partial(schema.checkpoint_in_one_statement, shape)
        row = self._fetch_one(shape, build, params)
        if row is None:
            raise StaleWriteError(cp.run_id, cp.expected_version)
        return int(row["version"])

    def _statement_params(
        self, cp: Checkpoint, rows: _Rows
    ) -> tuple[dict[str, Any], schema.CheckpointShape]:
        """The bound values of a checkpoint's one statement, and its shape."""
        params: dict[str, Any] = {"run_id": cp.run_id, "expected": cp.expected_version}
        run_values = _run_values(cp)
        params |= {f"r_{c}": v for c, v in run_values.items()}
        patches = []
        for n, (patch, values) in enumerate(rows.patches):
            patches.append((tuple(values), patch.bump_attempts))
            params |= {f"s{n}_{c}": v for c, v in values.items()}
            params[f"s{n}_idx"] = patch.index
        for i, step_row in enumerate(rows.new_steps):
            params |= {f"n{i}_{c}": v for c, v in step_row.items()}
        for i, draft in enumerate(cp.events):
            params |= {
                f"e{i}_{c}": v
                for c, v in _event_row(cp.run_id, 0, cp.worker, cp.now, draft).items()
            }
        if rows.record is not None:
            params |= {f"t_{c}": v for c, v in rows.record.items()}
        for i, blob in enumerate(rows.blobs):
            params |= {f"b{i}_{c}": v for c, v in blob.items()}
        shape = schema.CheckpointShape(
            tuple(run_values),
            tuple(patches),
            len(cp.new_steps),
            len(cp.events),
            cp.tool_record is not None,
            len(rows.blobs),
        )
        return params, shape

    def _fetch_one(
        self,
        key: Hashable,
        build: Callable[[], Select[Any]],
        params: dict[str, Any],
        plan_each_time: bool = False,
    ) -> dict[str, Any] | None:
        """The first row of a hot statement, outside a transaction.

        Building and compiling a Core statement, and reading a result's
        metadata, cost more than the round trip itself; so the statement is
        compiled once for this database and run by :func:`_execute_hot`.
        ``plan_each_time``: not a prepared statement on PostgreSQL, whose
        generic plan, made while the tables were small, can read a run's
        steps one by one (measured: a load 3.5x slower at step 10,000 than
        at step 100).
        """
        compiled = self._sql_cache.get(key)
        if compiled is None:
            statement = build()
            sql = statement.compile(dialect=self.engine.dialect)
            assert isinstance(sql, SQLCompiler)
            names = tuple(str(c.key) for c in statement.selected_columns)
            positions = None if sql.positiontup is None else tuple(map(str, sql.positiontup))
            compiled = self._sql_cache[key] = (sql.string, positions, names)
        text, order, names = compiled
        bound = params if order is None else tuple(params[name] for name in order)
        options = _UNPREPARED if plan_each_time else None

        def fetch(conn: Connection) -> dict[str, Any] | None:
            row = _execute_hot(conn, text, bound, options)
            return None if row is None else dict(zip(names, row, strict=True))

        return self._read(fetch)

    def _apply(self, conn: Connection, cp: Checkpoint, rows: _Rows) -> int:
        values = _run_values(cp)
        matched = conn.execute(schema.cas_run(cp.run_id, cp.expected_version, values)).rowcount
        if matched != 1:
            raise StaleWriteError(cp.run_id, cp.expected_version)
        new_version = cp.expected_version + 1
        for patch, patched in rows.patches:
            conn.execute(schema.patch_step(cp.run_id, patch.index, patched, patch.bump_attempts))
        if rows.new_steps:
            conn.execute(schema.insert_steps(), list(rows.new_steps))
        if cp.events:
            events = [_event_row(cp.run_id, new_version, cp.worker, cp.now, e) for e in cp.events]
            conn.execute(schema.insert_events(), events)
        if rows.record is not None:
            conn.execute(schema.insert_tool_result_if_absent(self.dialect, rows.record))
        self.blobs.insert(conn, self.dialect, rows.blobs)
        return new_version

    def steps(self, run_id: str, start: int = 0, limit: int | None = None) -> list[Step]:
        query = schema.select_steps(run_id, start, limit)
        rows = self._read(lambda conn: self.blobs.fill(conn, conn.execute(query).mappings().all()))
        return [_step(r) for r in rows]

    def events(self, run_id: str) -> list[Event]:
        rows = self._read(lambda conn: conn.execute(schema.select_events(run_id)).mappings().all())
        return [
            Event(
                id=r["id"],
                run_id=r["run_id"],
                version=r["version"],
                step_index=r["step_index"],
                from_status=r["from_status"],
                to_status=r["to_status"],
                worker=r["worker"],
                at=r["at"],
                detail=r["detail"],
            )
            for r in rows
        ]

    def query_runs(self, query: RunQuery, limit: int | None = None) -> list[Run]:
        statement = schema.query_runs(
            query.limit if limit is None else limit,
            None if query.status is None else query.status.value,
            query.agent,
            query.created_before,
            query.created_after,
            query.keyset(),
            query.forked_from,
            query.replay_of,
            query.replays,
        )

        def page(conn: Connection) -> list[Mapping[Any, Any]]:
            return self.blobs.fill(conn, conn.execute(statement).mappings().all(), "step_")

        try:
            rows = self._read(page)
        except RunNotFound:  # a listed run was pruned while its blob was read
            rows = self._read(page)  # the page again, without it
        return [_run(r, with_step=True) for r in rows]

    def events_after(
        self, run_id: str, after_id: int | None = None, limit: int | None = None
    ) -> list[Event]:
        query = schema.select_events_after(run_id, after_id, limit)
        rows = self._read(lambda conn: conn.execute(query).mappings().all())
        return [_event(r) for r in rows]

    def due_runs(
        self, now: float, limit: int = 500, delivered: Delivered | None = None
    ) -> list[Run]:
        query = schema.due_runs(now, limit, delivered)
        rows = self._read(lambda conn: conn.execute(query).mappings().all())
        return [_run(r) for r in rows]

    def lanes(self) -> dict[str, Lane]:
        rows = self._read(lambda conn: conn.execute(schema.select_lanes()).all())
        return {name: Lane(sent, delivered) for name, sent, delivered in rows}

    def note_probe_sent(self, lane: str, at: float) -> None:
        self._write(lambda conn: conn.execute(schema.note_probe_sent(self.dialect, lane, at)))

    def note_delivered(self, lane: str, sent_at: float) -> None:
        self._write(lambda conn: conn.execute(schema.note_delivered(self.dialect, lane, sent_at)))

    def record_sweep(self, sweep: Sweep) -> None:
        row = storable(
            {
                "kind": sweep.kind.value,
                "worker": sweep.worker,
                "started_at": sweep.started_at,
                "finished_at": sweep.finished_at,
                "redispatched": sweep.redispatched,
            }
        )

        def insert(conn: Connection) -> None:
            conn.execute(schema.insert_sweep(), [row])
            conn.execute(schema.prune_sweeps(SWEEPS_KEPT))

        self._write(insert)

    def last_sweep(self, kinds: tuple[SweepKind, ...] | None = None) -> Sweep | None:
        query = schema.last_sweep(None if kinds is None else tuple(k.value for k in kinds))
        row = self._read(lambda conn: conn.execute(query).mappings().first())
        return None if row is None else _sweep(row)

    def sweeps(self, limit: int = 100) -> list[Sweep]:
        query = schema.select_sweeps(limit)
        return [_sweep(r) for r in self._read(lambda conn: conn.execute(query).mappings().all())]

    def take_sweep_lease(self, holder: str, now: float, until: float) -> bool:
        statement = schema.take_sweep_lease(self.dialect, _SWEEP_LEASE, holder, now, until)

        def take(conn: Connection) -> bool:
            # An INSERT's rowcount is -1 on psycopg unless asked to be kept.
            return bool(conn.execute(statement, execution_options=_KEEP_ROWCOUNT).rowcount == 1)

        return self._write(take)

    def release_sweep_lease(self, holder: str) -> None:
        statement = schema.release_sweep_lease(_SWEEP_LEASE, holder)
        self._write(lambda conn: conn.execute(statement))

    def event_counts(self) -> dict[str, int]:
        rows = self._read(lambda conn: conn.execute(schema.count_events_by_kind()).all())
        return {str(kind): int(count) for kind, count in rows}

    def ping(self) -> None:
        self._read(lambda conn: conn.execute(schema.ping()).scalar_one())

    def run_counts(self) -> dict[str, int]:
        rows = self._read(lambda conn: conn.execute(schema.count_runs_by_status()).all())
        return {str(status): int(count) for status, count in rows}

    def counters(self) -> dict[str, int]:
        rows = self._read(lambda conn: conn.execute(schema.select_counters()).all())
        return {str(name): int(value) for name, value in rows}

    def running_steps_started_before(self, cutoff: float) -> int:
        query = schema.count_running_steps_started_before(cutoff)
        return int(self._read(lambda conn: conn.execute(query).scalar_one()))

    def oldest_running_step_started_at(self) -> float | None:
        query = schema.oldest_running_step()
        started: float | None = self._read(lambda conn: conn.execute(query).scalar())
        return started

    def _count(self, name: str) -> None:
        """Bump a durable counter; a metric, so a failure here is only logged."""
        try:
            self._write(lambda conn: conn.execute(schema.bump_counter(self.dialect, name)))
        except StoreError as err:
            log.warning("could not count %s: %s", name, err)

    # -- durable idempotency records ----------------------------------------

    def get_tool_result(self, key: str) -> tuple[bool, JSON]:
        def read(conn: Connection) -> Mapping[str, Any] | None:
            row = conn.execute(schema.select_tool_result(key)).mappings().first()
            return None if row is None else self.blobs.fill(conn, [row])[0]

        row = self._read(read)
        return (False, None) if row is None else (True, json.loads(row["result"]))

    def put_tool_result(
        self, key: str, run_id: str, step_index: int, tool: str, result: JSON, now: float
    ) -> JSON:
        batch = self.blobs.batch()
        values = _record_row(run_id, ToolRecord(key, step_index, tool, result), now, batch)
        blobs = self.blobs.stage(batch)

        def insert_or_read(conn: Connection) -> JSON:
            statement = schema.insert_tool_result_if_absent(self.dialect, values)
            # An INSERT's rowcount is -1 on psycopg unless asked to be kept.
            if conn.execute(statement, execution_options=_KEEP_ROWCOUNT).rowcount == 1:
                self.blobs.insert(conn, self.dialect, blobs)
                return result
            row = conn.execute(schema.select_tool_result(key)).mappings().one()
            return json.loads(self.blobs.fill(conn, [row])[0]["result"])

        # Safe to retry after a lost connection: it never overwrites a stored result.
        return self._write(insert_or_read)

    def request_pause(self, note: PauseNote) -> None:
        statement = schema.request_pause(note.run_id, note.requested, note.while_status)
        self._side_write(note.run_id, statement, note.event, note.worker, note.now)

    def note_approval(self, note: ApprovalNote) -> None:
        values: dict[str, Any] = {"approval": json_text(note.approval.to_json(), "approval")}
        if note.args is not None:
            values["args"] = json_text(note.args, "args")
        statement = schema.note_approval(note.run_id, note.index, note.while_status, values)
        self._side_write(note.run_id, statement, note.event, note.worker, note.now)

    def _side_write(
        self, run_id: str, statement: Any, draft: EventDraft, worker: str, now: float
    ) -> None:
        """An operator's note that must not fence a step in flight: the change and
        its event, at the run's current version, in one transaction; NoteRefused
        if the change matched no row."""

        def apply(conn: Connection) -> bool:
            if conn.execute(statement).rowcount != 1:
                return False
            version = conn.execute(schema.run_version(run_id)).scalar_one()
            conn.execute(schema.insert_events(), [_event_row(run_id, version, worker, now, draft)])
            return True

        if not self._write(apply):
            raise NoteRefused(f"run {run_id}: the note ({draft.to_status}) no longer applies")

    def add_late_usage(
        self,
        run_id: str,
        index: int,
        result: JSON,
        input_tokens: int,
        output_tokens: int,
        cost_usd: float,
        worker: str,
        now: float,
        detail: str,
    ) -> bool:
        batch = self.blobs.batch()
        values = _step_values(StepPatch(index, result=result), run_id, batch)
        blobs = self.blobs.stage(batch)
        draft = EventDraft(BILLED, step_index=index, detail=detail)

        def apply(conn: Connection) -> bool:
            # The step first: its guard (no result yet) is what makes this once.
            if conn.execute(schema.late_result(run_id, index, values)).rowcount != 1:
                return False
            conn.execute(schema.add_usage(run_id, input_tokens, output_tokens, cost_usd))
            self.blobs.insert(conn, self.dialect, blobs)
            version = conn.execute(schema.run_version(run_id)).scalar_one()
            conn.execute(schema.insert_events(), [_event_row(run_id, version, worker, now, draft)])
            return True

        # Safe to retry after a lost connection: a second try matches no step.
        return self._write(apply)

    def reset(self) -> None:
        def delete(conn: Connection) -> None:
            for statement in schema.delete_all():
                conn.execute(statement)

        self._write(delete)

    def orphan_blobs(self) -> list[Path]:
        """Files in the blob directory that no blob row names (see
        :meth:`harness.store.blobs.BlobStore.orphans`)."""
        return self._read(self.blobs.orphans)

    def close(self) -> None:
        for engine in self._engines():
            engine.dispose()

    def forget_connections(self) -> None:
        for engine in self._engines():
            engine.dispose(close=False)

    def _engines(self) -> list[Engine]:
        """This store's engine, and its heartbeat store's if one was made."""
        heartbeat = self._heartbeat
        if heartbeat is None or heartbeat is self:
            return [self.engine]
        return [self.engine, heartbeat.engine]

    # -- fork (issue 12) -------------------------------------------------------

    def tool_records(self, keys: Sequence[str]) -> list[ToolRecord]:
        def read(conn: Connection) -> list[ToolRecord]:
            found = []
            for start in range(0, len(keys), _KEYS_PER_STATEMENT):
                chunk = list(keys[start : start + _KEYS_PER_STATEMENT])
                rows = conn.execute(schema.select_tool_records(chunk)).mappings().all()
                found += [
                    ToolRecord(r["key"], r["step_index"], r["tool"], json.loads(r["result"]))
                    for r in self.blobs.fill(conn, rows)
                ]
            return found

        return sorted(self._read(read), key=lambda record: record.step_index)

    def create_fork(
        self,
        run: Run,
        steps: Sequence[Step],
        records: Sequence[ToolRecord],
        wake_at: float,
        created: EventDraft,
    ) -> tuple[Run, bool]:
        row = _run_row(run, wake_at)
        event = _event_row(run.run_id, run.version, None, run.created_at, created)
        # The copied values are written as any others: large ones become the
        # fork's own blobs (a file before the transaction that names it).
        batch = self.blobs.batch()
        step_rows = [_step_row(s, batch) for s in steps]
        record_rows = [_record_row(run.run_id, r, run.created_at, batch) for r in records]
        blobs = self.blobs.stage(batch)

        def insert(conn: Connection) -> None:
            # The origin, locked against a prune's DELETE until this commits
            # (see schema.lock_fork_origin): gone means pruned since it was read.
            origin = run.forked_from
            locked = origin and conn.execute(schema.lock_fork_origin(origin.run_id)).first()
            if origin is not None and locked is None:
                raise RunNotFound(
                    origin.run_id,
                    f"run {origin.run_id!r} was deleted (pruned) while the fork was "
                    "made: no fork created",
                )
            conn.execute(schema.insert_run(), [row])
            conn.execute(schema.insert_steps(), step_rows)
            conn.execute(schema.insert_events(), [event])
            if record_rows:
                conn.execute(schema.insert_tool_records(), record_rows)
            self.blobs.insert(conn, self.dialect, blobs)

        try:
            self._write(insert)
        except exc.IntegrityError as err:
            try:
                return self.load(run.run_id), False
            except RunNotFound:  # no such run: a record with a new key clashed
                raise StoreError(f"fork {run.run_id} not created: {_describe(err)}") from err
        return self.load(run.run_id), True

    # -- prune: retention (harness.replay.prune) --------------------------------

    def prune_candidates(
        self,
        cutoff: float,
        statuses: tuple[RunStatus, ...],
        limit: int,
        after: tuple[float, str] | None = None,
    ) -> list[Run]:
        query = schema.prune_candidates(cutoff, _values(statuses), limit, after)
        rows = self._read(lambda conn: conn.execute(query).mappings().all())
        return [_run(r) for r in rows]

    def fork_protected(
        self, run_ids: Sequence[str], cutoff: float, statuses: tuple[RunStatus, ...]
    ) -> set[str]:
        if not run_ids:
            return set()
        query = schema.fork_protected(list(run_ids), cutoff, _values(statuses))
        return set(self._read(lambda conn: conn.execute(query).scalars().all()))

    def count_run_rows(self, run_ids: Sequence[str]) -> RowCounts:
        if not run_ids:
            return RowCounts()
        ids = list(run_ids)

        def count(conn: Connection) -> RowCounts:
            row = conn.execute(schema.count_run_rows(ids)).one()
            records = sum(
                int(conn.execute(schema.count_tool_records(keys, ids)).scalar_one())
                for keys in _step_keys(conn, ids)
            )
            return RowCounts(int(row.steps), int(row.events), records)

        return self._read(count)

    def delete_runs(
        self, run_ids: Sequence[str], cutoff: float, statuses: tuple[RunStatus, ...]
    ) -> Deleted:
        if not run_ids:
            return Deleted((), RowCounts())
        values = _values(statuses)

        def delete(conn: Connection) -> Deleted:
            # The run rows first, under the guard: only runs actually deleted
            # lose their rows (tool records before steps: keys come from steps).
            query = schema.delete_prunable_runs(list(run_ids), cutoff, values)
            gone = [(str(r), RunStatus(s)) for r, s in conn.execute(query).all()]
            # The guard sees one generation down, and on PostgreSQL only forks
            # committed before the DELETE began. So look again, each time in a
            # new statement (READ COMMITTED: a new snapshot), for runs still
            # here whose origin was just deleted: each goes too, under the same
            # guard (a fork subtree goes whole, in one batch); one that may not
            # is a kept child, and the whole batch rolls back. Sound with
            # create_fork's lock on the origin: a fork that locked P (FOR KEY
            # SHARE) and inserted C holds our DELETE of P until it commits, and
            # the next statement sees C; if our DELETE of P came first, the
            # fork's lock waits for this transaction and finds P gone (it
            # refuses), or, if we roll back, finds P and goes ahead. SQLite's
            # write transactions are serial: there the guard sees every fork.
            frontier = [r for r, _ in gone]
            while frontier:
                children = list(conn.execute(schema.fork_children_of(frontier)).scalars())
                if not children:
                    break
                query = schema.delete_prunable_runs(children, cutoff, values)
                more = [(str(r), RunStatus(s)) for r, s in conn.execute(query).all()]
                frontier = [r for r, _ in more]
                kept = sorted(set(children) - set(frontier))
                if kept:
                    raise _KeptChildren(tuple(kept))
                gone += more
            ids = [r for r, _ in gone]
            if not ids:
                return Deleted((), RowCounts())
            records = sum(
                conn.execute(schema.delete_tool_records(keys, ids)).rowcount
                for keys in _step_keys(conn, ids)
            )
            events, steps = (conn.execute(d).rowcount for d in schema.delete_run_rows(ids))
            conn.execute(schema.delete_run_blobs(ids))
            return Deleted(tuple(gone), RowCounts(steps, events, records))

        try:
            deleted = self._write(delete)
        except _KeptChildren as kept:
            return Deleted((), RowCounts(), kept_children=kept.run_ids)
        self.blobs.remove(r for r, _ in deleted.runs)  # their files, once the rows are gone
        return deleted

    # -- export and import (harness.replay.archive) ---------------------------

    def run_rows(self, run_id: str) -> RunRows:
        def read(conn: Connection) -> RunRows:
            run = conn.execute(schema.select_run_row(run_id)).mappings().first()
            if run is None:
                raise RunNotFound(run_id)
            step_rows = conn.execute(schema.select_steps(run_id)).mappings().all()
            events = conn.execute(schema.select_events(run_id)).mappings().all()
            record_rows = conn.execute(schema.select_run_tool_records(run_id)).mappings().all()
            steps, records = self.blobs.fill(conn, step_rows), self.blobs.fill(conn, record_rows)
            return RunRows(
                dict(run),
                tuple(_decoded(schema.steps.name, row) for row in steps),
                tuple({c: v for c, v in row.items() if c != "id"} for row in events),
                tuple(_decoded(schema.tool_results.name, row) for row in records),
            )

        return self._snapshot(read)

    def import_run(self, rows: RunRows) -> bool:
        run_id = rows.run["run_id"]
        # Encoded as the runner writes them: large results become blobs of this store's.
        batch = self.blobs.batch()
        steps = [batch.offload(run_id, _encoded(schema.steps.name, r)) for r in rows.steps]
        events = [_encoded(schema.events.name, r) for r in rows.events]
        records = [
            batch.offload(run_id, _encoded(schema.tool_results.name, r)) for r in rows.tool_records
        ]
        blobs = self.blobs.stage(batch)

        def insert(conn: Connection) -> bool:
            if conn.execute(schema.run_version(run_id)).first() is not None:
                return False
            conn.execute(schema.insert_run(), [storable(dict(rows.run))])
            tables = (
                (schema.insert_steps(), steps),
                (schema.insert_events(), events),
                (schema.insert_tool_records(), records),
            )
            for statement, table_rows in tables:
                if table_rows:  # events in order: their new ids keep it
                    conn.execute(statement, table_rows)
            self.blobs.insert(conn, self.dialect, blobs)
            return True

        try:
            return self._write(insert)
        except exc.IntegrityError as err:
            if self._read(lambda conn: conn.execute(schema.run_version(run_id)).first()):
                return False  # imported at the same time by someone else
            raise StoreError(f"run {run_id} not imported: {_describe(err)}") from err

    # -- agent catalog (harness.catalog) -------------------------------------------

    def publish_agents(
        self, worker: str, agents: Sequence[PublishedAgent], forget_before: float
    ) -> None:
        rows = [_agent_row(a) for a in agents]
        keep = [a.agent for a in agents]

        def publish(conn: Connection) -> None:
            conn.execute(schema.forget_agents_before(forget_before))
            conn.execute(schema.delete_agents_of(worker, keep))
            if rows:
                conn.execute(schema.upsert_agents(self.dialect), rows)

        self._write(publish)

    def withdraw_agents(self, worker: str) -> None:
        self._write(lambda conn: conn.execute(schema.delete_agents_of(worker)))

    def published_agents(self, seen_since: float) -> list[PublishedAgent]:
        query = schema.select_agents_seen_since(seen_since)
        rows = self._read(lambda conn: conn.execute(query).mappings().all())
        return [_published(r) for r in rows]

    def _snapshot(self, work: Callable[[Connection], T]) -> T:
        """Run read-only ``work`` in one transaction over one snapshot of the
        database: REPEATABLE READ on PostgreSQL; on SQLite a deferred BEGIN (a
        WAL reader sees the database as of its first read)."""

        def attempt() -> T:
            with self.engine.connect() as conn:
                if self.dialect == "postgresql":
                    conn = conn.execution_options(isolation_level="REPEATABLE READ")
                with conn.begin():
                    if self.dialect == "sqlite":
                        conn.exec_driver_sql("BEGIN")
                    return work(conn)

        return _guarded(attempt)


#: psycopg converts a statement's ``%(name)s`` placeholders on every execution
#: unless the statement is at most 4 KB with at most 50 parameters; above that it
#: assumes a one-off (a generated many-row INSERT) and does not cache it. A
#: checkpoint's one statement is one of a few fixed shapes of about 5 KB and 60
#: parameters, more with several new steps, so it was converted anew each time:
#: 0.3 ms of CPU a checkpoint on the development machine, about a tenth of a
#: step's CPU. These limits (bytes, parameters) keep shapes of up to a dozen new
#: steps in psycopg's own cache of 128 statements: about 30 KB an entry, so a
#: few MB a process. They hold for every psycopg user of the process, whose
#: long statements may then take cache entries too. Private psycopg API: if it
#: changes, nothing breaks and tests/contract/test_step_writes.py fails.
PSYCOPG_CACHED_STATEMENT = (16 * 1024, 200)


def _cache_checkpoint_statements() -> None:
    from psycopg import _queries

    for name, limit in zip(
        ("MAX_CACHED_STATEMENT_LENGTH", "MAX_CACHED_STATEMENT_PARAMS"),
        PSYCOPG_CACHED_STATEMENT,
        strict=True,
    ):
        current = getattr(_queries, name, None)
        if isinstance(current, int) and current < limit:
            setattr(_queries, name, limit)


def _execute_hot(conn: Connection, text: str, bound: Any, options: Mapping[str, Any] | None) -> Any:
    """The first row of compiled SQL, run as SQLAlchemy runs the statements a
    dialect issues itself (``Connection._cursor_execute``): a real execution
    context, ``before_cursor_execute``/``after_cursor_execute`` with this
    connection, echo logging, ``do_execute`` hooks, errors wrapped and a dead
    connection invalidated. ``exec_driver_sql`` does the same, and builds a
    result's metadata from the cursor's description besides, which doubled
    the CPU time of a load (measured: 140 us a load, 280 with it). Private
    SQLAlchemy API, pinned in pyproject.toml and held by
    tests/contract/test_instrumentation.py."""
    dialect = conn.dialect
    context: ExecutionContext | None = None
    try:
        context = dialect.execution_ctx_cls._init_statement(
            dialect,
            conn,
            conn.connection,
            conn.get_execution_options().union(options or {}),
            text,
            [bound],
        )
        conn._cursor_execute(context.cursor, text, bound, context)
        return context.cursor.fetchone()
    except dialect.loaded_dbapi.Error as err:  # opening the cursor, or fetching
        cursor = None if context is None else context.cursor
        conn._handle_dbapi_exception(err, text, bound, cursor, context)
    finally:
        if context is not None:
            context.cursor.close()


class _KeptChildren(Exception):
    """Rolls a prune batch back: these runs are forks of runs it deleted."""

    def __init__(self, run_ids: tuple[str, ...]) -> None:
        super().__init__(", ".join(run_ids))
        self.run_ids = run_ids


#: The step's columns in a load's row (schema.load_run).
_STEP_COLUMNS = frozenset(f"step_{c.name}" for c in schema.steps.c)


def _load_at() -> Select[Any]:
    return schema.load_run(at=bindparam("at", type_=Integer))


def _guarded(attempt: Callable[[], T]) -> T:
    """Run ``attempt``; once more on a fresh connection if the old one was dead
    (a database restart); database failures become :class:`StoreError`.
    ``IntegrityError`` passes through for the caller to interpret."""
    for retry in (True, False):
        try:
            return attempt()
        except exc.IntegrityError:
            raise
        except exc.DBAPIError as err:
            if retry and err.connection_invalidated:
                log.warning("database connection lost (%s); retrying once", _describe(err))
                continue
            raise StoreError(_describe(err)) from err
        except exc.TimeoutError as err:
            raise StoreError(f"database connection pool exhausted: {err}") from err
    raise AssertionError("unreachable")


def _sweep(row: Mapping[Any, Any]) -> Sweep:
    return Sweep(
        kind=SweepKind(row["kind"]),
        worker=row["worker"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        redispatched=row["redispatched"],
    )


def _agent_row(agent: PublishedAgent) -> dict[str, Any]:
    return storable(
        {
            "worker": agent.worker,
            "agent": agent.agent,
            "definition_hash": agent.definition_hash,
            "tools": json_text([tool.to_dict() for tool in agent.tools], "tools"),
            "started_at": agent.started_at,
            "last_seen": agent.last_seen,
        }
    )


def _published(row: Mapping[Any, Any]) -> PublishedAgent:
    tools = tuple(
        PublishedTool(t["name"], t["effect"], bool(t["requires_approval"]))
        for t in json.loads(row["tools"])
    )
    return PublishedAgent(
        row["worker"],
        row["agent"],
        row["definition_hash"],
        tools,
        row["started_at"],
        row["last_seen"],
    )


def _event(row: Mapping[Any, Any]) -> Event:
    return Event(
        id=row["id"],
        run_id=row["run_id"],
        version=row["version"],
        step_index=row["step_index"],
        from_status=row["from_status"],
        to_status=row["to_status"],
        worker=row["worker"],
        at=row["at"],
        detail=row["detail"],
    )


def _event_row(
    run_id: str, version: int, worker: str | None, at: float, draft: EventDraft
) -> dict[str, Any]:
    return storable(
        {
            "run_id": run_id,
            "version": version,
            "step_index": draft.step_index,
            "from_status": draft.from_status,
            "to_status": draft.to_status,
            "worker": worker,
            "at": at,
            "detail": draft.detail,
        }
    )


def _values(statuses: tuple[RunStatus, ...]) -> tuple[str, ...]:
    return tuple(s.value for s in statuses)


#: Tool record keys per statement when pruning (bound parameters are limited).
_PRUNE_KEYS = 1000


def _step_keys(conn: Connection, run_ids: list[str]) -> list[list[str]]:
    """The idempotency keys of these runs' steps, in chunks of :data:`_PRUNE_KEYS`."""
    rows = conn.execute(schema.select_step_keys(run_ids)).all()
    keys = [idempotency_key(run_id, idx) for run_id, idx in rows]
    return [keys[i : i + _PRUNE_KEYS] for i in range(0, len(keys), _PRUNE_KEYS)]


def _describe(err: exc.DBAPIError) -> str:
    """One line saying what went wrong with the database, without a traceback."""
    text = str(err.orig).strip().splitlines()[0] if err.orig is not None else str(err)
    if "no such table" in text or ("relation" in text and "does not exist" in text):
        return f"the run store is not migrated ({text}); run `harness migrate`"
    return f"database error: {text}"


def _decoded(table: str, row: Mapping[Any, Any]) -> dict[str, Any]:
    """A row for an export: its JSON columns as values (a blob's resolved,
    see SQLStore.run_rows), without the columns that say where they are stored."""
    stored = schema.STORAGE_COLUMNS.get(table, ())
    values = {c: v for c, v in row.items() if c not in stored}
    for column in schema.JSON_COLUMNS.get(table, ()):
        values[column] = _loads(values[column])
    return values


def _encoded(table: str, row: Mapping[str, Any]) -> dict[str, Any]:
    """A row from an import: its JSON columns as text, as the runner writes them."""
    values = dict(row)
    for column in schema.JSON_COLUMNS.get(table, ()):
        value = values[column]
        # A step's result or approval is NULL until set; a record of a None
        # result holds "null" (its column is NULL only for a blob).
        unset = value is None and table == schema.steps.name
        values[column] = None if unset else json_text(value, f"{table}.{column}")
    return storable(values)
