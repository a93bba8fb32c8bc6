"""The agent catalog in the store (harness.catalog), on every backend: what
each worker publishes, replaced by its next publish, withdrawn when it stops
cleanly; a dead worker's rows leave the listing once it stops refreshing
them, and are forgotten by a later publish."""

from __future__ import annotations

from harness.store import PublishedAgent, PublishedTool
from harness.store.sql import SQLStore

EFFECT = PublishedTool("effect", "idempotent", False)
EMAIL = PublishedTool("send_email", "at_most_once", True)


def row(
    worker: str,
    agent: str,
    definition: str = "sha256:aa",
    seen: float = 100.0,
    tools: tuple[PublishedTool, ...] = (EFFECT,),
) -> PublishedAgent:
    return PublishedAgent(worker, agent, definition, tools, started_at=50.0, last_seen=seen)


def listed(store: SQLStore, seen_since: float = 0.0) -> list[PublishedAgent]:
    return sorted(store.published_agents(seen_since), key=lambda r: (r.agent, r.worker))


def test_each_worker_publishes_the_agents_it_carries_with_their_tools(store: SQLStore) -> None:
    assert store.published_agents(0.0) == []
    mine = [row("w1@a", "chain"), row("w1@a", "mailer", "sha256:bb", tools=(EFFECT, EMAIL))]
    store.publish_agents("w1@a", mine, forget_before=0.0)
    store.publish_agents("w2@b", [row("w2@b", "chain", seen=101.0)], forget_before=0.0)
    assert listed(store) == [mine[0], row("w2@b", "chain", seen=101.0), mine[1]]


def test_a_publish_replaces_what_the_worker_published_before(store: SQLStore) -> None:
    store.publish_agents("w1@a", [row("w1@a", "chain"), row("w1@a", "old")], 0.0)
    store.publish_agents("w2@b", [row("w2@b", "old")], 0.0)
    again = row("w1@a", "chain", "sha256:cc", seen=130.0, tools=(EMAIL,))
    store.publish_agents("w1@a", [again], 0.0)
    assert listed(store) == [again, row("w2@b", "old")]


def test_a_worker_that_carries_no_agent_leaves_no_row(store: SQLStore) -> None:
    store.publish_agents("w1@a", [row("w1@a", "chain")], 0.0)
    store.publish_agents("w1@a", [], 0.0)
    assert listed(store) == []


def test_rows_not_refreshed_since_leave_the_listing(store: SQLStore) -> None:
    store.publish_agents("dead@a", [row("dead@a", "chain", seen=100.0)], 0.0)
    store.publish_agents("live@b", [row("live@b", "chain", seen=200.0)], 0.0)
    assert [r.worker for r in listed(store, seen_since=150.0)] == ["live@b"]
    assert [r.worker for r in listed(store, seen_since=200.0)] == ["live@b"]
    assert listed(store, seen_since=201.0) == []


def test_a_publish_forgets_every_row_nobody_refreshed_for_long(store: SQLStore) -> None:
    store.publish_agents("dead@a", [row("dead@a", "chain", seen=100.0)], 0.0)
    store.publish_agents("late@c", [row("late@c", "chain", seen=900.0)], 0.0)
    store.publish_agents("live@b", [row("live@b", "chain", seen=5000.0)], forget_before=500.0)
    assert [r.worker for r in listed(store)] == ["late@c", "live@b"]


def test_withdrawing_removes_only_that_workers_rows(store: SQLStore) -> None:
    store.publish_agents("w1@a", [row("w1@a", "chain"), row("w1@a", "mailer")], 0.0)
    store.publish_agents("w2@b", [row("w2@b", "chain")], 0.0)
    store.withdraw_agents("w1@a")
    store.withdraw_agents("never-published@c")
    assert listed(store) == [row("w2@b", "chain")]


def test_a_reset_empties_the_catalog(store: SQLStore) -> None:
    store.publish_agents("w1@a", [row("w1@a", "chain")], 0.0)
    store.reset()
    assert listed(store) == []
