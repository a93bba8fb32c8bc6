"""Retention (``harness prune``) on every backend: what is chosen, what is kept.

Runs are seeded with old timestamps (tests/seeding.py) and pruned through
:func:`harness.runs.prune.prune` on the store, as the CLI does.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from sqlalchemy import text

from harness.errors import BadRetention
from harness.records import RunStatus
from harness.runs.prune import describe, parse_age, prune, statuses_for
from harness.store import Deleted, RowCounts, RunQuery, schema
from harness.store.sql import SQLStore
from tests.seeding import DAY, Seed, expected_rows, row_counts, seed

MONTH = 30 * DAY


def ids(store: SQLStore) -> set[str]:
    return {r.run_id for r in store.query_runs(RunQuery(limit=1000))}


def test_ages_and_statuses_are_chosen_right(store: SQLStore) -> None:
    now = time.time()
    old_terminal = [Seed("done-old"), Seed("failed-old", "failed"), Seed("cancel-old", "cancelled")]
    never = [
        # Old but not finished: never touched, however old.
        *(Seed(f"{s}-old", s) for s in ("pending", "running", "waiting", "paused")),
        # Created long ago, finished recently: age counts from the last update.
        Seed("done-lately", age=2 * DAY, created_age=90 * DAY),
        Seed("done-new", age=DAY),
    ]
    seed(store, [*old_terminal, *never], now)
    kept_rows = {s.run_id: row_counts(store, s.run_id) for s in never}

    report = prune(store, MONTH, now)

    assert ids(store) == {s.run_id for s in never}
    assert {s.run_id: row_counts(store, s.run_id) for s in never} == kept_rows
    for s in old_terminal:
        assert row_counts(store, s.run_id) == dict.fromkeys(kept_rows["done-new"], 0)
    assert report.runs == {"completed": 1, "failed": 1, "cancelled": 1}
    each = expected_rows(old_terminal[0])
    assert (report.rows.steps, report.rows.events, report.rows.tool_records) == (
        3 * each["steps"],
        3 * each["events"],
        3 * each["tool_records"],
    )
    assert report.ancestors_kept == 0 and not report.dry_run


def test_status_narrows_to_one_terminal_status(store: SQLStore) -> None:
    now = time.time()
    seed(store, [Seed("a"), Seed("b", "failed"), Seed("c", "cancelled")], now)
    report = prune(store, MONTH, now, "failed")
    assert report.runs == {"failed": 1}
    assert ids(store) == {"a", "c"}


@pytest.mark.parametrize("status", ["pending", "running", "waiting", "paused", "nonsense"])
def test_a_status_that_is_not_terminal_is_refused(status: str) -> None:
    with pytest.raises(BadRetention, match="only finished runs are pruned"):
        statuses_for(status)


@pytest.mark.parametrize(
    ("text", "seconds"), [("30d", 30 * DAY), ("12h", 43200), ("90m", 5400), ("3600s", 3600)]
)
def test_ages_are_read_with_their_unit(text: str, seconds: float) -> None:
    assert parse_age(text) == seconds


@pytest.mark.parametrize("text", ["30", "d", "-1d", "30 days", "1y", ""])
def test_an_unreadable_age_is_refused(text: str) -> None:
    with pytest.raises(BadRetention, match="cannot read the age"):
        parse_age(text)


def test_a_dry_run_deletes_nothing_and_reports_what_a_prune_deletes(store: SQLStore) -> None:
    now = time.time()
    seeds = [Seed(f"r{i}", ("completed", "failed")[i % 2], steps=2 + i) for i in range(7)]
    seed(store, [*seeds, Seed("p", forked_from="r0", age=DAY)], now)
    before = row_counts(store)

    dry = prune(store, MONTH, now, dry_run=True, batch_size=3)
    assert row_counts(store) == before
    real = prune(store, MONTH, now, batch_size=3)

    assert dry.dry_run and not real.dry_run
    assert (dry.runs, dry.rows, dry.ancestors_kept) == (real.runs, real.rows, real.ancestors_kept)
    assert dry.ancestors_kept == 1  # r0: the parent of p, which is new
    after = row_counts(store)
    assert before["runs"] - after["runs"] == real.run_count == 6
    assert before["steps"] - after["steps"] == real.rows.steps
    assert before["events"] - after["events"] == real.rows.events
    assert before["tool_records"] - after["tool_records"] == real.rows.tool_records


def test_batches_cover_every_run(store: SQLStore) -> None:
    now = time.time()
    # Equal creation times: the keyset's run_id tie-break must not skip any.
    seeds = [Seed(f"run-{i:02}", created_age=40 * DAY) for i in range(25)]
    seed(store, [*seeds, Seed("live", "running")], now)
    report = prune(store, MONTH, now, batch_size=4)
    assert report.run_count == 25
    assert report.batches == 7
    assert ids(store) == {"live"}
    assert row_counts(store)["steps"] == Seed("live").steps


def test_tool_records_of_a_run_whose_id_extends_another_are_kept(store: SQLStore) -> None:
    """Keys are "{run_id}:{idx}": pruning run "a" must not touch "a:b"'s "a:b:1"."""
    now = time.time()
    seed(store, [Seed("a"), Seed("a:b", age=DAY)], now)
    prune(store, MONTH, now)
    assert row_counts(store, "a:b") == expected_rows(Seed("a:b"))
    assert row_counts(store, "a")["tool_records"] == 0


def test_fork_ancestors_of_kept_runs_are_kept(store: SQLStore) -> None:
    now = time.time()
    seed(
        store,
        [
            # a <- b <- c: c is recent, so b and a (its ancestors) stay.
            Seed("a", created_age=50 * DAY),
            Seed("b", forked_from="a", created_age=45 * DAY),
            Seed("c", forked_from="b", age=DAY),
            # d <- e: both old, both go.
            Seed("d"),
            Seed("e", forked_from="d"),
            # f <- g (failed): pruning only completed runs keeps g, so f too.
            Seed("f"),
            Seed("g", "failed", forked_from="f"),
            # h <- i (running): a live fork keeps its parent.
            Seed("h"),
            Seed("i", "running", forked_from="h"),
        ],
        now,
    )
    report = prune(store, MONTH, now, "completed", batch_size=1)
    assert ids(store) == {"a", "b", "c", "f", "g", "h", "i"}
    assert report.ancestors_kept == 4
    assert report.runs == {"completed": 2}
    assert row_counts(store, "a") == expected_rows(Seed("a"))

    # Once c is old and finished too, the whole lineage goes.
    report = prune(store, 0, now)
    assert ids(store) == {"i", "h"}
    assert report.ancestors_kept == 1


def test_the_delete_refuses_a_run_that_changed_since_it_was_chosen(store: SQLStore) -> None:
    now = time.time()
    seed(store, [Seed("old"), Seed("live", "running"), Seed("parent")], now)
    terminal = statuses_for(None)
    cutoff = now - MONTH
    # A fork made after the batch was chosen, and a run that is not finished.
    seed(store, [Seed("fork", "pending", age=0, forked_from="parent")], now)
    deleted = store.delete_runs(["old", "live", "parent"], cutoff, terminal)
    assert deleted.runs == (("old", RunStatus.COMPLETED),)
    assert deleted.rows.steps == Seed("old").steps
    assert ids(store) == {"live", "parent", "fork"}
    assert row_counts(store, "live") == expected_rows(Seed("live"))
    assert row_counts(store, "parent") == expected_rows(Seed("parent"))


def dangling(store: SQLStore) -> set[str]:
    """Runs whose forked_from names a run that is not there."""
    runs = store.query_runs(RunQuery(limit=1000))
    present = {r.run_id for r in runs}
    return {r.run_id for r in runs if r.forked_from and r.forked_from.run_id not in present}


def test_a_fork_made_during_a_batch_two_generations_down_rolls_it_back(
    store: SQLStore,
) -> None:
    now = time.time()
    terminal = statuses_for(None)
    cutoff = now - MONTH
    seed(store, [Seed("p"), Seed("c", forked_from="p")], now)
    assert store.fork_protected(["p", "c"], cutoff, terminal) == set()
    # g, a fork of c, is made after the batch's lineage was read: the guard
    # keeps c (its child g is live) and would delete p, leaving c dangling.
    seed(store, [Seed("g", "pending", age=0, forked_from="c")], now)
    deleted = store.delete_runs(["p", "c"], cutoff, terminal)
    assert deleted.runs == () and deleted.rows == RowCounts()
    assert deleted.kept_children == ("c",)
    assert ids(store) == {"p", "c", "g"} and dangling(store) == set()
    assert row_counts(store, "p") == expected_rows(Seed("p"))


def test_a_prune_that_races_a_fork_retries_the_batch_with_its_new_lineage(
    store: SQLStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = time.time()
    seed(store, [Seed("p"), Seed("c", forked_from="p"), Seed("other")], now)
    real = store.delete_runs
    forks = iter(["g"])

    def racing(run_ids: Sequence[str], *args: Any) -> Deleted:
        for fork in forks:  # once: a fork of c made while the batch is pruned
            seed(store, [Seed(fork, "pending", age=0, forked_from="c")], now)
        return real(run_ids, *args)

    monkeypatch.setattr(store, "delete_runs", racing)
    report = prune(store, MONTH, now)
    assert ids(store) == {"p", "c", "g"} and dangling(store) == set()
    assert report.runs == {"completed": 1}  # other
    assert report.ancestors_kept == 2 and report.skipped == 0


def test_a_batch_that_keeps_racing_forks_is_left_for_the_next_prune(
    store: SQLStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = time.time()
    # x0 <- x1 <- ... <- x5, all old: a batch (by run_id) in lineage order.
    seed(store, [Seed(f"x{i}", forked_from=f"x{i - 1}" if i else None) for i in range(6)], now)
    real = store.delete_runs
    made: list[str] = []

    def racing(run_ids: Sequence[str], *args: Any) -> Deleted:
        # Each attempt, a live fork of a run two generations down the doomed.
        fork = f"f{len(made)}"
        seed(store, [Seed(fork, "pending", age=0, forked_from=run_ids[1])], now)
        made.append(fork)
        return real(run_ids, *args)

    monkeypatch.setattr(store, "delete_runs", racing)
    report = prune(store, MONTH, now, "completed")
    assert len(made) == 3 and report.runs == {} and report.skipped == 6
    assert ids(store) == {f"x{i}" for i in range(6)} | set(made)
    assert dangling(store) == set()
    assert "skipped 6 run(s)" in "\n".join(describe(report))


def test_on_postgresql_a_fork_holding_its_origin_makes_the_delete_wait_and_see_it(
    sql_store: SQLStore,
) -> None:
    """The lock order, with two real transactions: the fork locks its origin
    and inserts its row; the prune's DELETE of the origin waits for it, and
    its check after the DELETE (a new snapshot) sees the fork and rolls back."""
    if sql_store.dialect != "postgresql":
        pytest.skip("SQLite write transactions are serial: no interleaving to test")
    now = time.time()
    seed(sql_store, [Seed("p")], now)
    row = {**_run_row("c", now), "forked_from_run": "p", "forked_from_step": 0}
    with ThreadPoolExecutor(1) as pool, sql_store.engine.connect() as conn:
        conn = conn.execution_options(isolation_level="READ COMMITTED")
        with conn.begin():
            assert conn.execute(schema.lock_fork_origin("p")).first() is not None
            conn.execute(schema.runs.insert(), [row])
            pruning = pool.submit(sql_store.delete_runs, ["p"], now - MONTH, statuses_for(None))
            deadline = time.monotonic() + 10
            while not _waiting_on_a_lock(sql_store):  # poll the server for the lock wait
                if time.monotonic() > deadline:
                    raise TimeoutError("the DELETE never waited for the fork's lock")
                time.sleep(0.02)
        deleted = pruning.result(timeout=10)
    assert deleted.runs == () and deleted.kept_children == ("c",)
    assert ids(sql_store) == {"p", "c"} and dangling(sql_store) == set()


def _run_row(run_id: str, now: float) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "agent": "chain",
        "goal": "g",
        "status": "pending",
        "cursor": 0,
        "version": 1,
        "step_count": 0,
        "created_at": now,
        "updated_at": now,
    }


def _waiting_on_a_lock(store: SQLStore) -> bool:
    query = text(
        "select count(*) from pg_stat_activity where datname = current_database() "
        "and wait_event_type = 'Lock' and query ilike 'DELETE FROM harness_runs%'"
    )
    with store.engine.connect() as conn:
        return bool(conn.execute(query).scalar_one())
