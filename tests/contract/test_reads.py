"""The store's read methods and the read service on them, on every backend.

``query_runs`` pages by keyset on (created_at, run_id) descending and
filters; ``events_after`` reads the flight recorder from an event id. The
read service (harness.reads) turns them into pages with opaque cursors.
"""

from __future__ import annotations

import time

import pytest

from harness.clock import SystemClock
from harness.engine import transitions
from harness.errors import BadCursor, RunNotFound
from harness.reads import MAX_PAGE, Reads, RunQuery, decode_cursor
from harness.records import Run, RunStatus
from harness.store import EventDraft, keyset_cursor
from harness.store.sql import SQLStore
from tests.contract.test_store_contract import apply, first_step, grow

T0 = 1_700_000_000.0


def add_run(
    store: SQLStore,
    run_id: str,
    created_at: float,
    *,
    agent: str = "a",
    status: RunStatus = RunStatus.PENDING,
) -> Run:
    run = Run(
        run_id=run_id,
        agent=agent,
        goal=f"goal of {run_id}",
        status=status,
        cursor=0,
        version=1,
        step_count=1,
        created_at=created_at,
        updated_at=created_at,
    )
    created, inserted = store.create_run(
        run, [first_step(run_id)], created_at, transitions.created(run)
    )
    assert inserted
    return created


def ids(runs: list[Run]) -> list[str]:
    return [r.run_id for r in runs]


@pytest.fixture
def reads(store: SQLStore) -> Reads:
    return Reads(store, SystemClock(), running_alert=900.0)


# -- store.query_runs ----------------------------------------------------------


def test_query_runs_newest_first_ties_broken_by_run_id(store: SQLStore) -> None:
    add_run(store, "b", T0)
    add_run(store, "old", T0 - 10)
    add_run(store, "a", T0)
    add_run(store, "c", T0)
    add_run(store, "new", T0 + 10)

    assert ids(store.query_runs(RunQuery(limit=10))) == ["new", "c", "b", "a", "old"]
    assert ids(store.query_runs(RunQuery(limit=2))) == ["new", "c"]
    assert store.query_runs(RunQuery(limit=10, agent="nobody")) == []


def test_query_runs_keyset_starts_strictly_after_the_given_run(store: SQLStore) -> None:
    for run_id in ("a", "b", "c"):
        add_run(store, run_id, T0)
    add_run(store, "old", T0 - 1)

    assert ids(store.query_runs(RunQuery(limit=10, cursor=keyset_cursor(T0, "c")))) == [
        "b",
        "a",
        "old",
    ]
    assert ids(store.query_runs(RunQuery(limit=10, cursor=keyset_cursor(T0, "a")))) == ["old"]
    assert ids(store.query_runs(RunQuery(limit=10, cursor=keyset_cursor(T0 - 1, "old")))) == []
    # a keyset between stored values (the run it named was deleted, say)
    assert ids(store.query_runs(RunQuery(limit=10, cursor=keyset_cursor(T0, "bb")))) == [
        "b",
        "a",
        "old",
    ]


def test_query_runs_filters_combine(store: SQLStore) -> None:
    add_run(store, "x1", T0, agent="x")
    add_run(store, "x2", T0 + 1, agent="x", status=RunStatus.COMPLETED)
    add_run(store, "y1", T0 + 2, agent="y")
    add_run(store, "x3", T0 + 3, agent="x")

    assert ids(store.query_runs(RunQuery(limit=10, agent="x"))) == ["x3", "x2", "x1"]
    assert ids(store.query_runs(RunQuery(limit=10, status=RunStatus.PENDING))) == ["x3", "y1", "x1"]
    assert ids(store.query_runs(RunQuery(limit=10, agent="x", status=RunStatus.PENDING))) == [
        "x3",
        "x1",
    ]
    # created_after inclusive, created_before exclusive: [after, before)
    assert ids(store.query_runs(RunQuery(limit=10, created_after=T0 + 1))) == ["x3", "y1", "x2"]
    assert ids(store.query_runs(RunQuery(limit=10, created_before=T0 + 1))) == ["x1"]
    window = store.query_runs(RunQuery(limit=10, created_after=T0 + 1, created_before=T0 + 3))
    assert ids(window) == ["y1", "x2"]
    keyset = store.query_runs(
        RunQuery(limit=10, agent="x", created_after=T0, cursor=keyset_cursor(T0 + 3, "x3"))
    )
    assert ids(keyset) == ["x2", "x1"]


def test_query_runs_returns_whole_runs(store: SQLStore) -> None:
    stored = add_run(store, "r", T0 + 0.123456789, agent="agent-r")
    (listed,) = store.query_runs(RunQuery(limit=1))
    assert listed.created_at == stored.created_at == T0 + 0.123456789
    assert listed.to_dict() == stored.to_dict()
    assert listed.current == stored.current  # the step at its cursor, as a load has it


# -- store.events_after --------------------------------------------------------


def test_events_after_pages_one_runs_recorder(store: SQLStore) -> None:
    run = add_run(store, "r", T0)
    add_run(store, "other", T0)
    for n in range(4):
        run = apply(store, run, events=(EventDraft(f"e{n}", step_index=n),))
    every = store.events_after("r")

    assert [e.to_status for e in every] == ["pending", "e0", "e1", "e2", "e3"]
    assert [e.to_dict() for e in every] == [e.to_dict() for e in store.events("r")]
    first = every[0].id
    assert [e.to_status for e in store.events_after("r", first)] == ["e0", "e1", "e2", "e3"]
    assert [e.to_status for e in store.events_after("r", first, limit=2)] == ["e0", "e1"]
    assert [e.to_status for e in store.events_after("r", limit=1)] == ["pending"]
    assert store.events_after("r", every[-1].id) == []
    assert store.events_after("nope") == []


def test_events_after_runs_reads_many_recorders_each_from_its_own_event(
    store: SQLStore,
) -> None:
    runs = {name: add_run(store, name, T0) for name in ("a", "b", "quiet")}
    for n in range(3):
        for name in ("a", "b"):
            runs[name] = apply(store, runs[name], events=(EventDraft(f"{name}{n}", step_index=n),))
    every = {name: store.events_after(name) for name in runs}
    after = {"a": every["a"][1].id, "b": every["b"][0].id, "quiet": every["quiet"][-1].id}

    found = store.events_after_runs(after, limit=10)

    assert sorted(found) == ["a", "b"]  # a run with nothing new is left out
    for name in ("a", "b"):
        assert [e.to_dict() for e in found[name]] == [
            e.to_dict() for e in store.events_after(name, after[name])
        ]
    assert [e.to_status for e in found["a"]] == ["a1", "a2"]
    limited = store.events_after_runs({"a": 0, "b": 0, "nope": 0}, limit=2)
    assert {k: [e.to_status for e in v] for k, v in limited.items()} == {
        "a": ["pending", "a0"],
        "b": ["pending", "b0"],
    }
    assert store.events_after_runs({}, limit=5) == {}


def test_events_after_runs_reads_a_hundred_and_fifty_runs_at_once(store: SQLStore) -> None:
    names = [f"r{n:03}" for n in range(150)]
    for name in names:
        add_run(store, name, T0)

    found = store.events_after_runs(dict.fromkeys(names, 0), limit=5)

    assert sorted(found) == names
    assert all([e.to_status for e in found[name]] == ["pending"] for name in names)


# -- the read service ----------------------------------------------------------


def test_list_runs_pages_cover_every_run_once_while_runs_arrive(
    store: SQLStore, reads: Reads
) -> None:
    for n in range(7):
        add_run(store, f"r{n}", T0 + n // 3)  # ties in created_at across page edges
    expected = ids(store.query_runs(RunQuery(limit=100)))
    seen: list[str] = []
    cursor = None
    while True:
        page = reads.list_runs(RunQuery(limit=3, cursor=cursor))
        seen += ids(page.runs)
        if page.next_cursor is None:
            break
        add_run(store, f"late{len(seen)}", T0 + 100)  # newer: never on a later page
        cursor = page.next_cursor
    assert seen == expected


def test_list_runs_last_page_has_no_cursor(store: SQLStore, reads: Reads) -> None:
    assert reads.list_runs().runs == []
    assert reads.list_runs().next_cursor is None
    add_run(store, "a", T0)
    add_run(store, "b", T0 + 1)
    exact = reads.list_runs(RunQuery(limit=2))
    assert ids(exact.runs) == ["b", "a"]
    assert exact.next_cursor is None  # exactly full: nothing after it
    first = reads.list_runs(RunQuery(limit=1))
    assert first.next_cursor is not None
    assert decode_cursor(first.next_cursor) == (T0 + 1, "b")


def test_list_runs_filters(store: SQLStore, reads: Reads) -> None:
    add_run(store, "x", T0, agent="x")
    add_run(store, "y", T0 + 1, agent="y", status=RunStatus.FAILED)
    assert ids(reads.list_runs(RunQuery(agent="x")).runs) == ["x"]
    assert ids(reads.list_runs(RunQuery(status=RunStatus.FAILED)).runs) == ["y"]
    assert ids(reads.list_runs(RunQuery(created_before=T0 + 1)).runs) == ["x"]
    assert ids(reads.list_runs(RunQuery(created_after=T0 + 1)).runs) == ["y"]


@pytest.mark.parametrize("cursor", ["", "!!!", "bm90IGpzb24", "WzEsMl0", "WyJ4IiwieSJd"])
def test_a_cursor_not_issued_here_is_refused(reads: Reads, cursor: str) -> None:
    with pytest.raises(BadCursor, match="not a cursor"):
        reads.list_runs(RunQuery(cursor=cursor))


@pytest.mark.parametrize("limit", [0, -1, MAX_PAGE + 1])
def test_page_size_is_bounded(reads: Reads, limit: int) -> None:
    with pytest.raises(BadCursor, match="a page holds"):
        RunQuery(limit=limit)
    with pytest.raises(BadCursor, match="a page holds"):
        reads.history("r", limit=limit)


def test_run_detail_and_steps(store: SQLStore, reads: Reads) -> None:
    add_run(store, "r", T0)
    detail = reads.run_detail("r")
    assert detail.run.run_id == "r"
    assert [s.index for s in detail.steps] == [0]
    assert detail.to_dict()["steps"] == [
        {**s.to_dict(), "abandoned": False} for s in store.steps("r")
    ]
    assert reads.steps("r") == detail.steps
    for read in (reads.run_detail, reads.steps, reads.run):
        with pytest.raises(RunNotFound):
            read("nope")


def test_a_long_runs_steps_a_window_at_a_time(store: SQLStore, reads: Reads) -> None:
    run = grow(store, add_run(store, "long", T0), 10)
    assert [s.index for s in store.steps("long", 3, 4)] == [3, 4, 5, 6]
    assert [s.index for s in store.steps("long", 8)] == [8, 9]
    pages, start = [], 0
    while start is not None:
        page = reads.steps_page("long", start, 4)
        assert page.total == run.step_count == 10
        pages.append([s.index for s in page.steps])
        start = page.next_start
    assert pages == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert reads.steps_page("long", 10).steps == []
    with pytest.raises(BadCursor):
        reads.steps_page("long", -1)
    with pytest.raises(RunNotFound):
        reads.steps_page("nope")


def test_history_pages_and_follows_a_live_run(store: SQLStore, reads: Reads) -> None:
    run = add_run(store, "r", T0)
    for n in range(4):
        run = apply(store, run, events=(EventDraft(f"e{n}"),))

    first = reads.history("r", limit=2)
    assert [e.to_status for e in first.events] == ["pending", "e0"]
    second = reads.history("r", first.next_after, limit=2)
    assert [e.to_status for e in second.events] == ["e1", "e2"]
    last = reads.history("r", second.next_after, limit=2)
    assert [e.to_status for e in last.events] == ["e3"]
    assert last.next_after is None
    tail = last.events[-1].id
    assert reads.history("r", tail).events == []  # caught up
    apply(store, run, events=(EventDraft("e4"),))
    assert [e.to_status for e in reads.history("r", tail).events] == ["e4"]
    assert [e.to_status for e in reads.all_history("r")] == [
        "pending",
        "e0",
        "e1",
        "e2",
        "e3",
        "e4",
    ]


def test_history_of_an_unknown_run(reads: Reads) -> None:
    with pytest.raises(RunNotFound):
        reads.history("nope")
    with pytest.raises(RunNotFound):
        reads.history("nope", after_id=5)


def test_stats_counts_runs_by_status(store: SQLStore, reads: Reads) -> None:
    add_run(store, "a", time.time())
    add_run(store, "b", time.time(), status=RunStatus.COMPLETED)
    stats = reads.stats()
    assert stats["runs_by_status"] == {"pending": 1, "completed": 1}
    assert stats["running_steps_older_than_alert"] == 0
    assert stats["running_alert_seconds"] == 900.0
