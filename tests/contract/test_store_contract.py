"""The run store contract, run against every backend (SQLite, PostgreSQL, memory).

Each test states one promise of :class:`harness.store.Store`: atomic
compare-and-swap checkpoints, O(1) writes, one-round-trip loads, the
flight recorder, the sweeper's query, durable idempotency records and
migrations. Costs are counted in SQL statements, never timed: those tests,
and the migrations', take ``sql_store`` (the SQL backends only).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, event, exc, text

from harness.engine import transitions
from harness.errors import RunNotFound, StaleWriteError, StoreError
from harness.records import JSON, Event, Run, RunStatus, Step, StepKind, StepStatus
from harness.store import Checkpoint, EventDraft, RunPatch, RunQuery, StepPatch, ToolRecord
from harness.store.migrate import current_revision, ensure_current, head_revision, upgrade
from harness.store.sql import SQLStore, make_engine
from tests.services import POSTGRES_ADMIN_URL, require

WORKER = "worker-1"
RACERS = 8
UNMIGRATED_DB = "harness_unmigrated"
PAYLOAD: dict[str, JSON] = {
    "nested": {"list": [1, 2.5, None, True, "x"], "empty": {}, "deep": {"a": {"b": [[]]}}},
    "unicode": "naïve café ☕ 日本語 🚀",
    "quotes": 'a "b" \\ c \n d',
}
FALSY: list[JSON] = [0, 0.0, "", [], {}, False, None]
DDL_OR_WRITE = ("CREATE", "ALTER", "DROP", "INSERT", "UPDATE", "DELETE")


# -- builders ------------------------------------------------------------------


def make_step(run_id: str, index: int, **fields: Any) -> Step:
    """A tool step; ``fields`` override any column."""
    values: dict[str, Any] = {
        "kind": StepKind.TOOL,
        "status": StepStatus.PENDING,
        "tool": "echo",
        "args": {"n": index},
    }
    values.update(fields)
    return Step(run_id=run_id, index=index, **values)


def first_step(run_id: str) -> Step:
    return make_step(run_id, 0, kind=StepKind.MODEL, tool=None, args={"goal": run_id})


def make_run(
    store: SQLStore,
    run_id: str,
    *,
    status: RunStatus = RunStatus.PENDING,
    created_at: float | None = None,
    wake_at: float | None = None,
) -> Run:
    """Create a run through the store (which must insert it) and return it as loaded."""
    now = time.time() if created_at is None else created_at
    run = Run(
        run_id=run_id,
        agent="contract-agent",
        goal=f"goal of {run_id}",
        status=status,
        cursor=0,
        version=0,
        step_count=1,
        created_at=now,
        updated_at=now,
    )
    created, inserted = store.create_run(
        run, [first_step(run_id)], now if wake_at is None else wake_at, transitions.created(run)
    )
    assert inserted
    return created


def cp(
    run: Run,
    /,
    *,
    version: int | None = None,
    worker: str | None = WORKER,
    now: float | None = None,
    **parts: Any,
) -> Checkpoint:
    """A checkpoint of ``run`` at its loaded version (or ``version``)."""
    return Checkpoint(
        run_id=run.run_id,
        expected_version=run.version if version is None else version,
        worker=worker,
        now=time.time() if now is None else now,
        **parts,
    )


def apply(store: SQLStore, run: Run, /, **parts: Any) -> Run:
    """Checkpoint ``run`` and return it reloaded."""
    store.checkpoint(cp(run, **parts))
    return store.load(run.run_id)


def grow(store: SQLStore, run: Run, length: int, batch: int = 1000) -> Run:
    """Append tool steps until the run has ``length`` steps; the cursor ends on the last."""
    for start in range(run.step_count, length, batch):
        stop = min(start + batch, length)
        new_steps = tuple(make_step(run.run_id, i) for i in range(start, stop))
        run = apply(store, run, run=RunPatch(cursor=stop - 1, step_count=stop), new_steps=new_steps)
    return run


def lease(store: SQLStore, run: Run, owner: str, expires_at: float) -> Run:
    return apply(store, run, run=RunPatch(owner=owner, lease_expires_at=expires_at))


def result_checkpoint(run: Run) -> Checkpoint:
    """What a finished step writes: run row, the step, its successor, two events."""
    now = time.time()
    index = run.cursor
    return cp(
        run,
        now=now,
        run=RunPatch(
            status=RunStatus.RUNNING, cursor=index + 1, step_count=run.step_count + 1, wake_at=now
        ),
        steps=(StepPatch(index, status=StepStatus.DONE, result={"ok": index}, finished_at=now),),
        new_steps=(make_step(run.run_id, run.step_count),),
        events=(
            EventDraft("done", "running", index, "ok"),
            EventDraft("pending", None, index + 1),
        ),
    )


def snapshot(store: SQLStore, run_id: str) -> tuple[Run, list[Step], list[Event]]:
    return store.load(run_id), store.steps(run_id), store.events(run_id)


@contextmanager
def counting(store: SQLStore) -> Iterator[list[str]]:
    """Collect every SQL statement the store's engine sends while the block runs."""
    statements: list[str] = []

    def record(
        _conn: Any, _cursor: Any, statement: str, _params: Any, _context: Any, _many: bool
    ) -> None:
        statements.append(statement)

    event.listen(store.engine, "before_cursor_execute", record)
    try:
        yield statements
    finally:
        event.remove(store.engine, "before_cursor_execute", record)


def assert_same_json(got: JSON, want: JSON) -> None:
    """Equal and of the same type (``False == 0`` in Python, not in JSON)."""
    assert got == want
    assert type(got) is type(want)


# -- create_run ----------------------------------------------------------------


def test_create_run_inserts_run_first_step_and_pending_event(store: SQLStore) -> None:
    now = time.time()
    run = make_run(store, "r1", created_at=now, wake_at=now + 5)

    assert (run.run_id, run.status, run.version, run.cursor, run.step_count) == (
        "r1",
        RunStatus.PENDING,
        0,
        0,
        1,
    )
    assert (run.created_at, run.wake_at, run.owner, run.lease_expires_at) == (
        now,
        now + 5,
        None,
        None,
    )
    assert run.current == first_step("r1")
    assert store.steps("r1") == [first_step("r1")]
    [created] = store.events("r1")
    assert (created.to_status, created.from_status, created.version, created.step_index) == (
        "pending",
        None,
        0,
        None,
    )


def test_create_run_again_returns_existing_run_without_duplicates(store: SQLStore) -> None:
    original = make_run(store, "r1")
    existing = apply(store, original, run=RunPatch(status=RunStatus.RUNNING))
    steps, events = store.steps("r1"), store.events("r1")

    other = replace(original, goal="another goal", agent="another-agent")
    again, inserted = store.create_run(
        other,
        [make_step("r1", 0, args={"other": True})],
        time.time() + 60,
        transitions.created(other),
    )

    assert inserted is False
    assert again == existing
    assert store.steps("r1") == steps
    assert store.events("r1") == events


# -- load ----------------------------------------------------------------------


def test_load_returns_the_step_at_the_cursor(store: SQLStore) -> None:
    run = grow(store, make_run(store, "r1"), 3)
    assert run.cursor == 2
    assert run.current == make_step("r1", 2)

    back = apply(store, run, run=RunPatch(cursor=1))
    assert back.current == make_step("r1", 1)

    past_end = apply(store, back, run=RunPatch(cursor=3))
    assert past_end.current is None


def test_a_load_at_a_cursor_reads_that_step_only_if_the_run_is_there(store: SQLStore) -> None:
    run = grow(store, make_run(store, "r1"), 3)
    there = store.load("r1", at=2)
    assert there == run and there.current == make_step("r1", 2)
    elsewhere = store.load("r1", at=1)  # a stale message's cursor: step 1 exists
    assert elsewhere == replace(run, current=None)
    with pytest.raises(RunNotFound):
        store.load("no-such-run", at=0)


def test_a_load_at_a_cursor_is_one_statement(sql_store: SQLStore) -> None:
    grow(sql_store, make_run(sql_store, "r1"), 3)
    with counting(sql_store) as statements:
        there = sql_store.load("r1", at=2)
    assert len(statements) == 1
    assert there.current == make_step("r1", 2)


def test_load_unknown_run_raises_run_not_found(store: SQLStore) -> None:
    make_run(store, "r1")
    with pytest.raises(RunNotFound) as raised:
        store.load("no-such-run")
    assert raised.value.run_id == "no-such-run"


def test_load_is_one_statement(sql_store: SQLStore) -> None:
    grow(sql_store, make_run(sql_store, "r1"), 5)

    with counting(sql_store) as statements:
        run = sql_store.load("r1")

    assert len(statements) == 1, statements
    assert run.current == make_step("r1", 4)


# -- checkpoint ----------------------------------------------------------------


def test_checkpoint_bumps_version_by_one_and_keeps_unpatched_columns(store: SQLStore) -> None:
    run = make_run(store, "r1")
    now = time.time()

    version = store.checkpoint(
        cp(run, now=now, run=RunPatch(status=RunStatus.RUNNING, owner=WORKER, lease_expires_at=now))
    )

    assert version == run.version + 1
    loaded = store.load("r1")
    assert loaded == replace(
        run,
        version=version,
        status=RunStatus.RUNNING,
        owner=WORKER,
        lease_expires_at=now,
        updated_at=now,
    )
    assert store.checkpoint(cp(loaded)) == version + 1


def test_stale_checkpoint_raises_and_applies_nothing(store: SQLStore) -> None:
    stale = make_run(store, "r1")
    apply(store, stale, run=RunPatch(status=RunStatus.RUNNING))
    before = snapshot(store, "r1")

    with pytest.raises(StaleWriteError) as raised:
        store.checkpoint(result_checkpoint(stale))

    assert (raised.value.run_id, raised.value.expected_version) == ("r1", stale.version)
    assert snapshot(store, "r1") == before
    assert store.counters() == {"stale_writes": 1}  # counted durably, for `harness stats`


def test_checkpoint_failing_midway_rolls_back_the_run_patch(store: SQLStore) -> None:
    run = make_run(store, "r1")
    before = snapshot(store, "r1")
    duplicate_step = first_step("r1")

    with pytest.raises((StoreError, exc.IntegrityError)):
        store.checkpoint(
            cp(
                run,
                run=RunPatch(status=RunStatus.RUNNING, cursor=1, step_count=2),
                steps=(StepPatch(0, status=StepStatus.DONE, result="done"),),
                new_steps=(duplicate_step,),
                events=(EventDraft("done", "running", 0),),
            )
        )

    assert snapshot(store, "r1") == before


def test_write_cost_does_not_grow_with_run_length(sql_store: SQLStore) -> None:
    short = grow(sql_store, make_run(sql_store, "short"), 5)
    long = grow(sql_store, make_run(sql_store, "long"), 1_000)
    assert (short.step_count, long.step_count) == (5, 1_000)

    with counting(sql_store) as short_statements:
        sql_store.checkpoint(result_checkpoint(short))
    with counting(sql_store) as long_statements:
        sql_store.checkpoint(result_checkpoint(long))

    assert len(long_statements) == len(short_statements), (short_statements, long_statements)
    assert long_statements == short_statements
    assert sql_store.load("long").current == make_step("long", 1_000)


def test_concurrent_checkpoints_on_one_version_exactly_one_wins(store: SQLStore) -> None:
    run = make_run(store, "race")
    barrier = threading.Barrier(RACERS)

    def attempt(n: int) -> int | Exception:
        checkpoint = cp(
            run,
            worker=f"w{n}",
            run=RunPatch(owner=f"w{n}", cursor=1, step_count=2),
            new_steps=(make_step("race", 1, args={"by": n}),),
            events=(EventDraft("claimed", detail=f"w{n}"),),
        )
        barrier.wait(timeout=30)
        try:
            return store.checkpoint(checkpoint)
        except Exception as err:  # every outcome is asserted on below
            return err

    with ThreadPoolExecutor(RACERS) as pool:
        outcomes = list(pool.map(attempt, range(RACERS)))

    wins = [o for o in outcomes if o == run.version + 1]
    stale = [o for o in outcomes if isinstance(o, StaleWriteError)]
    assert (len(wins), len(stale)) == (1, RACERS - 1), outcomes
    final = store.load("race")
    assert final.version == run.version + 1
    assert final.owner is not None
    assert final.current == make_step("race", 1, args={"by": int(final.owner[1:])})
    assert len(store.steps("race")) == 2
    claims = [e for e in store.events("race") if e.to_status == "claimed"]
    assert [(e.worker, e.detail) for e in claims] == [(final.owner, final.owner)]


# -- steps ---------------------------------------------------------------------


def test_step_json_columns_round_trip(store: SQLStore) -> None:
    run = make_run(store, "r1")
    step = make_step(
        "r1",
        1,
        args=PAYLOAD,
        result=[PAYLOAD, "ü", 0, None],
        error="boom: ü",
        attempts=3,
        started_at=1.5,
        finished_at=2.25,
    )

    apply(store, run, run=RunPatch(step_count=2), new_steps=(step,))

    assert store.steps("r1") == [first_step("r1"), step]


def test_step_patch_stores_result_as_json(store: SQLStore) -> None:
    run = make_run(store, "r1")
    now = time.time()

    apply(
        store,
        run,
        steps=(StepPatch(0, status=StepStatus.DONE, result=PAYLOAD, finished_at=now),),
    )

    [step] = store.steps("r1")
    assert step == replace(
        first_step("r1"), status=StepStatus.DONE, result=PAYLOAD, finished_at=now
    )


@pytest.mark.parametrize("value", FALSY, ids=repr)
def test_step_patch_keeps_falsy_results(store: SQLStore, value: JSON) -> None:
    run = make_run(store, "r1")
    apply(store, run, steps=(StepPatch(0, result=value),))
    assert_same_json(store.steps("r1")[0].result, value)


def test_bump_attempts_increments_and_keep_leaves_columns_alone(store: SQLStore) -> None:
    run = make_run(store, "r1")
    step = make_step("r1", 1, result={"r": 1}, error="e", started_at=1.0, attempts=2)
    run = apply(store, run, run=RunPatch(step_count=2), new_steps=(step,))

    run = apply(store, run, steps=(StepPatch(1, bump_attempts=True),))
    assert store.steps("r1") == [first_step("r1"), replace(step, attempts=3)]

    run = apply(store, run, steps=(StepPatch(1, status=StepStatus.RUNNING, bump_attempts=True),))
    assert store.steps("r1")[1] == replace(step, attempts=4, status=StepStatus.RUNNING)

    apply(store, run, steps=(StepPatch(1, result=None, error=None),))
    assert store.steps("r1")[1] == replace(
        step, attempts=4, status=StepStatus.RUNNING, result=None, error=None
    )
    assert store.steps("r1")[0] == first_step("r1")


def test_step_patch_of_only_keep_fields_changes_nothing(store: SQLStore) -> None:
    run = make_run(store, "r1")

    version = store.checkpoint(cp(run, steps=(StepPatch(0),)))

    assert version == run.version + 1
    assert store.steps("r1") == [first_step("r1")]


# -- events --------------------------------------------------------------------


def test_events_are_append_only_ordered_and_carry_the_new_version(store: SQLStore) -> None:
    run = make_run(store, "r1")
    other = make_run(store, "r2")
    t1, t2 = time.time(), time.time() + 1

    v1 = store.checkpoint(
        cp(
            run,
            worker="w1",
            now=t1,
            events=(
                EventDraft("running", "pending", 0, "claimed"),
                EventDraft("step_running", None, 0),
            ),
        )
    )
    first = store.events("r1")
    apply(store, other, events=(EventDraft("running", "pending"),))
    v2 = store.checkpoint(
        cp(run, version=v1, worker="w2", now=t2, events=(EventDraft("done", "running", 0, "ok"),))
    )

    events = store.events("r1")
    assert events[: len(first)] == first
    assert [(e.to_status, e.from_status, e.step_index, e.detail) for e in events] == [
        ("pending", None, None, "agent=contract-agent"),
        ("running", "pending", 0, "claimed"),
        ("step_running", None, 0, None),
        ("done", "running", 0, "ok"),
    ]
    assert [(e.version, e.worker, e.at) for e in events[1:]] == [
        (v1, "w1", t1),
        (v1, "w1", t1),
        (v2, "w2", t2),
    ]
    assert [e.id for e in events] == sorted({e.id for e in events})
    assert {e.run_id for e in events} == {"r1"}


def test_event_counts_count_by_to_status(store: SQLStore) -> None:
    assert store.event_counts() == {}
    run = make_run(store, "r1")
    make_run(store, "r2")

    apply(
        store,
        run,
        events=(EventDraft("running"), EventDraft("done", "running"), EventDraft("done")),
    )

    assert store.event_counts() == {"pending": 2, "running": 1, "done": 2}


# -- due_runs ------------------------------------------------------------------


def test_due_runs_are_movable_overdue_and_unleased_or_expired(store: SQLStore) -> None:
    now = time.time()
    past, future = now - 60, now + 60
    make_run(store, "pending-overdue", wake_at=past - 10)
    make_run(store, "running-overdue", status=RunStatus.RUNNING, wake_at=past)
    lease(store, make_run(store, "lease-expired", wake_at=past - 5), "w9", now - 1)
    lease(
        store, make_run(store, "lease-live", status=RunStatus.RUNNING, wake_at=past), "w9", future
    )
    make_run(store, "not-yet", wake_at=future)
    apply(store, make_run(store, "no-wake", wake_at=past), run=RunPatch(wake_at=None))
    for status in (
        RunStatus.WAITING,
        RunStatus.COMPLETED,
        RunStatus.FAILED,
        RunStatus.CANCELLED,
    ):
        make_run(store, f"{status.value}-overdue", status=status, wake_at=past)

    due = store.due_runs(now)

    assert [r.run_id for r in due] == ["pending-overdue", "lease-expired", "running-overdue"]
    assert store.due_runs(now, limit=1) == due[:1]
    assert store.due_runs(past - 20) == []


def test_a_run_becomes_due_once_its_lease_expires(store: SQLStore) -> None:
    now = time.time()
    run = lease(store, make_run(store, "r1", wake_at=now - 10), "w1", now + 30)
    assert store.due_runs(now) == []
    assert [r.run_id for r in store.due_runs(now + 31)] == ["r1"]
    apply(store, run, run=RunPatch(owner=None, lease_expires_at=None))
    assert [r.run_id for r in store.due_runs(now)] == ["r1"]


# -- durable idempotency records -----------------------------------------------


def test_put_tool_result_first_writer_wins(store: SQLStore) -> None:
    now = time.time()
    assert store.put_tool_result("r1:1", "r1", 1, "echo", {"first": "ü"}, now) == {"first": "ü"}
    assert store.put_tool_result("r1:1", "r1", 1, "echo", {"second": 2}, now + 1) == {"first": "ü"}
    assert store.get_tool_result("r1:1") == (True, {"first": "ü"})


@pytest.mark.parametrize("value", [*FALSY, PAYLOAD], ids=repr)
def test_get_tool_result_tells_absent_from_stored_falsy_values(
    store: SQLStore, value: JSON
) -> None:
    assert store.get_tool_result("r1:1") == (False, None)

    assert_same_json(store.put_tool_result("r1:1", "r1", 1, "echo", value, time.time()), value)

    found, stored = store.get_tool_result("r1:1")
    assert found is True
    assert_same_json(stored, value)
    assert_same_json(store.put_tool_result("r1:1", "r1", 1, "echo", "other", time.time()), value)


def test_concurrent_put_tool_result_agrees_on_one_value(store: SQLStore) -> None:
    barrier = threading.Barrier(RACERS)

    def put(n: int) -> JSON:
        barrier.wait(timeout=30)
        return store.put_tool_result("k", "r1", 1, "echo", {"by": n}, time.time())

    with ThreadPoolExecutor(RACERS) as pool:
        results = list(pool.map(put, range(RACERS)))

    found, stored = store.get_tool_result("k")
    assert found is True
    assert results == [stored] * RACERS


# -- list_runs and reset -------------------------------------------------------


def test_list_runs_newest_first_and_filtered_by_status(store: SQLStore) -> None:
    t = time.time()
    make_run(store, "old", created_at=t)
    make_run(store, "done", created_at=t + 1, status=RunStatus.COMPLETED)
    make_run(store, "new", created_at=t + 2)

    assert [r.run_id for r in store.query_runs(RunQuery(limit=50))] == ["new", "done", "old"]
    assert [r.run_id for r in store.query_runs(RunQuery(limit=2))] == ["new", "done"]
    assert [r.run_id for r in store.query_runs(RunQuery(limit=50, status=RunStatus.PENDING))] == [
        "new",
        "old",
    ]
    assert [r.run_id for r in store.query_runs(RunQuery(limit=50, status=RunStatus.COMPLETED))] == [
        "done"
    ]
    assert store.query_runs(RunQuery(limit=50, status=RunStatus.FAILED)) == []


def test_reset_empties_every_table(store: SQLStore) -> None:
    run = make_run(store, "r1")
    grow(store, run, 3)
    store.put_tool_result("r1:1", "r1", 1, "echo", 1, time.time())

    store.reset()

    assert store.query_runs(RunQuery(limit=50)) == []
    assert store.steps("r1") == []
    assert store.events("r1") == []
    assert store.event_counts() == {}
    assert store.get_tool_result("r1:1") == (False, None)
    with pytest.raises(RunNotFound):
        store.load("r1")
    make_run(store, "r1")


# -- migrations ----------------------------------------------------------------


def test_upgrade_twice_is_a_no_op_returning_head(sql_store: SQLStore) -> None:
    make_run(sql_store, "kept")

    with counting(sql_store) as statements:
        first = upgrade(sql_store.engine)
        second = upgrade(sql_store.engine)

    assert first == second == head_revision() == current_revision(sql_store.engine)
    assert not [s for s in statements if s.lstrip().upper().startswith(DDL_OR_WRITE)], statements
    assert sql_store.load("kept").run_id == "kept"


def test_upgrade_migrates_a_fresh_sqlite_file_once(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'fresh.db'}")
    try:
        assert current_revision(engine) is None
        assert upgrade(engine) == head_revision()
        assert upgrade(engine) == head_revision()
        assert SQLStore(engine).query_runs(RunQuery(limit=50)) == []
    finally:
        engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def unmigrated_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An existing, empty database that nobody has migrated."""
    if request.param == "sqlite":
        path = tmp_path / "unmigrated.db"
        path.touch()
        yield f"sqlite:///{path}"
        return
    require("postgres")
    admin = create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    drop = text(f'DROP DATABASE IF EXISTS "{UNMIGRATED_DB}" WITH (FORCE)')
    with admin.connect() as conn:
        conn.execute(drop)
        conn.execute(text(f'CREATE DATABASE "{UNMIGRATED_DB}"'))
    try:
        yield POSTGRES_ADMIN_URL.rsplit("/", 1)[0] + f"/{UNMIGRATED_DB}"
    finally:
        with admin.connect() as conn:
            conn.execute(drop)
        admin.dispose()


@pytest.fixture
def unmigrated_store(unmigrated_url: str) -> Iterator[SQLStore]:
    store = SQLStore(make_engine(unmigrated_url))
    yield store
    store.close()


def test_unmigrated_store_says_run_harness_migrate(unmigrated_store: SQLStore) -> None:
    with pytest.raises(StoreError, match="harness migrate"):
        unmigrated_store.load("r1")


def test_ensure_current_without_auto_refuses_an_unmigrated_store(
    unmigrated_store: SQLStore,
) -> None:
    with pytest.raises(StoreError, match="harness migrate"):
        ensure_current(unmigrated_store.engine, auto=False)


def test_ensure_current_with_auto_migrates(unmigrated_store: SQLStore) -> None:
    ensure_current(unmigrated_store.engine, auto=True)

    ensure_current(unmigrated_store.engine, auto=False)
    with pytest.raises(RunNotFound):
        unmigrated_store.load("r1")


# -- the tool record in the result checkpoint --------------------------------------


def test_a_checkpoint_stores_its_tool_record_atomically(store: SQLStore) -> None:
    run = make_run(store, "r1")
    record = ToolRecord("r1:0", 0, "echo", {"sent": "ü"})
    store.checkpoint(replace(result_checkpoint(run), tool_record=record))
    assert store.get_tool_result("r1:0") == (True, {"sent": "ü"})
    assert store.load("r1").current == make_step("r1", 1)


def test_a_fenced_checkpoint_stores_no_tool_record(store: SQLStore) -> None:
    run = make_run(store, "r1")
    apply(store, run, run=RunPatch(owner="someone else"))
    stale = replace(result_checkpoint(run), tool_record=ToolRecord("r1:0", 0, "echo", 1))
    with pytest.raises(StaleWriteError):
        store.checkpoint(stale)
    assert store.get_tool_result("r1:0") == (False, None)


def test_a_checkpoint_keeps_a_tool_record_stored_before_it(store: SQLStore) -> None:
    """First writer wins here too: a record already stored is not overwritten."""
    run = make_run(store, "r1")
    store.put_tool_result("r1:0", "r1", 0, "echo", "first", time.time())
    store.checkpoint(replace(result_checkpoint(run), tool_record=ToolRecord("r1:0", 0, "echo", 2)))
    assert store.get_tool_result("r1:0") == (True, "first")
    assert store.load("r1").version == run.version + 1


def test_a_step_checkpoint_is_one_statement_on_postgresql(sql_store: SQLStore) -> None:
    """Round trips dominate: on PostgreSQL a whole checkpoint is one autocommit
    statement; SQLite, in-process, takes one statement per table in a transaction."""
    run = make_run(sql_store, "r1")
    checkpoint = replace(result_checkpoint(run), tool_record=ToolRecord("r1:0", 0, "echo", 1))
    with counting(sql_store) as statements:
        sql_store.checkpoint(checkpoint)
    if sql_store.dialect == "postgresql":
        assert len(statements) == 1, statements
    else:
        assert [s.split()[0].upper() for s in statements] == [
            "BEGIN",
            "UPDATE",
            "UPDATE",
            "INSERT",
            "INSERT",
            "INSERT",
        ]
