"""The store's part in forks, on every backend (SQLite and PostgreSQL).

A fork is inserted in one transaction (run, copied steps, creation event,
the copied idempotency records) or not at all; its origin is stored with it
and lists its children; the idempotency records it copies are read by key.
"""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from harness.engine import transitions
from harness.errors import RunNotFound, StoreError
from harness.records import ForkOrigin, Run, RunStatus, Step, StepKind, StepStatus
from harness.store import RunQuery, ToolRecord, encode_cursor
from harness.store.sql import SQLStore

NOW = 1_700_000_000.0


def recorded_run(store: SQLStore, run_id: str = "origin") -> tuple[Run, list[Step]]:
    """A finished run of two calls (steps 0-4), with their idempotency records."""
    run, (first,) = transitions.new_run(run_id, "agent", "the goal", NOW)
    steps = [
        replace(first, status=StepStatus.DONE, attempts=1, result={"tool_calls": []}),
        Step(run_id, 1, StepKind.TOOL, StepStatus.DONE, 1, tool="t", args={"n": 1}, result=1),
        Step(run_id, 2, StepKind.MODEL, StepStatus.DONE, 1, args={"turn": 1}, result={}),
        Step(run_id, 3, StepKind.TOOL, StepStatus.FAILED, 2, tool="t", error="boom"),
        Step(run_id, 4, StepKind.MODEL, StepStatus.DONE, 1, args={"turn": 2}, result={}),
    ]
    done = replace(run, status=RunStatus.COMPLETED, cursor=5, step_count=5, result="ok")
    stored, created = store.create_run(done, steps, NOW, transitions.created(done))
    assert created
    store.put_tool_result(f"{run_id}:1", run_id, 1, "t", 1, NOW)
    return stored, steps


def make_fork(
    store: SQLStore, origin: Run, steps: list[Step], at: int, fork_id: str, now: float = NOW
) -> tuple[Run, bool]:
    records = store.tool_records([s.idempotency_key for s in steps[:at]])
    made = transitions.fork(
        origin, steps, records, at, run_id=fork_id, agent=origin.agent, goal=origin.goal, now=now
    )
    return store.create_fork(made.run, made.steps, made.records, now + 30, made.created)


def test_a_fork_is_stored_with_its_origin_steps_records_and_event(store: SQLStore) -> None:
    origin, steps = recorded_run(store)
    fork, created = make_fork(store, origin, steps, 4, "fork")
    assert created
    assert fork.forked_from == ForkOrigin("origin", 4)
    assert (fork.status, fork.cursor, fork.version, fork.step_count, fork.wake_at) == (
        RunStatus.PENDING,
        4,
        1,
        5,
        NOW + 30,
    )
    assert fork.current == Step("fork", 4, StepKind.MODEL, StepStatus.PENDING, args={"turn": 2})
    copied = store.steps("fork")
    assert [replace(s, run_id="origin") for s in copied[:4]] == steps[:4]
    assert store.get_tool_result("fork:1") == (True, 1)
    assert store.get_tool_result("fork:3") == (False, None)  # it failed: no record
    (event,) = store.events("fork")
    assert (event.to_status, event.version, event.detail) == (
        "pending",
        1,
        "forked from origin at step 4; agent=agent",
    )
    assert store.load("origin") == origin
    assert store.load("origin").forked_from is None


def test_an_explicit_id_taken_leaves_the_stored_run_as_it_is(store: SQLStore) -> None:
    origin, steps = recorded_run(store)
    first, _ = make_fork(store, origin, steps, 2, "fork")
    again, created = make_fork(store, origin, steps, 4, "fork", now=NOW + 5)
    assert not created and again == first
    assert len(store.steps("fork")) == 3 and len(store.events("fork")) == 1


def test_a_fork_that_cannot_be_written_whole_writes_nothing(store: SQLStore) -> None:
    origin, steps = recorded_run(store)
    # A leftover record under a key the fork needs (a run of that id was deleted).
    store.put_tool_result("fork:1", "fork", 1, "t", "stale", NOW)
    with pytest.raises(StoreError, match="fork fork not created"):
        make_fork(store, origin, steps, 4, "fork")
    with pytest.raises(RunNotFound):
        store.load("fork")
    assert store.steps("fork") == [] and store.events("fork") == []


def test_a_fork_of_a_run_pruned_since_it_was_read_is_refused(store: SQLStore) -> None:
    origin, steps = recorded_run(store)
    records = store.tool_records([s.idempotency_key for s in steps[:4]])
    made = transitions.fork(
        origin, steps, records, 4, run_id="fork", agent=origin.agent, goal="g", now=NOW
    )
    # A prune deletes the origin between fork_run's reads and its insert.
    pruned = store.delete_runs(["origin"], NOW + 1, (RunStatus.COMPLETED,))
    assert pruned.runs == (("origin", RunStatus.COMPLETED),)
    with pytest.raises(RunNotFound, match=r"'origin' was deleted \(pruned\) while the fork"):
        store.create_fork(made.run, made.steps, made.records, NOW + 30, made.created)
    with pytest.raises(RunNotFound):
        store.load("fork")
    assert store.steps("fork") == [] and store.tool_records(["fork:1"]) == []


def test_forks_are_listed_by_origin_a_page_at_a_time(store: SQLStore) -> None:
    origin, steps = recorded_run(store)
    recorded_run(store, "other")
    for i in range(3):
        make_fork(store, origin, steps, 2, f"fork-{i}", now=NOW + i)
    page = store.query_runs(RunQuery(limit=2, forked_from="origin"))
    assert [r.run_id for r in page] == ["fork-2", "fork-1"]
    after = RunQuery(limit=2, forked_from="origin", cursor=encode_cursor(page[-1]))
    assert [r.run_id for r in store.query_runs(after)] == ["fork-0"]
    assert store.query_runs(RunQuery(limit=10, forked_from="other")) == []
    assert (
        store.query_runs(RunQuery(limit=10, forked_from="origin", status=RunStatus.COMPLETED)) == []
    )
    assert {r.run_id for r in store.query_runs(RunQuery(limit=10))} == {
        "origin",
        "other",
        "fork-0",
        "fork-1",
        "fork-2",
    }


def test_a_run_created_with_an_origin_keeps_it(store: SQLStore) -> None:
    """An imported fork goes through create_run: its origin is stored too."""
    run, steps = transitions.new_run("imported", "agent", "goal", time.time())
    imported = replace(run, forked_from=ForkOrigin("gone", 6))
    stored, _ = store.create_run(imported, steps, NOW, transitions.created(imported))
    assert stored.forked_from == ForkOrigin("gone", 6)
    assert [r.run_id for r in store.query_runs(RunQuery(limit=10, forked_from="gone"))] == [
        "imported"
    ]


def test_idempotency_records_are_read_by_key_however_many(store: SQLStore) -> None:
    count = 1_200  # more keys than one statement takes
    for i in range(count):
        store.put_tool_result(f"many:{i}", "many", i, "t", {"i": i}, NOW)
    keys = [f"many:{i}" for i in range(count + 5)]  # five never recorded
    records = store.tool_records(list(reversed(keys)))
    assert records == [ToolRecord(f"many:{i}", i, "t", {"i": i}) for i in range(count)]
    assert store.tool_records([]) == []
