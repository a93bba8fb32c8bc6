"""The store's OfferedTools part on every backend (SQLite, PostgreSQL,
memory): a run's record of the tools it was offered is written once (the
first writer wins, a second gets the first's back), read back as written,
a run's own, and gone with the run when it is pruned."""

from __future__ import annotations

from harness.engine import transitions
from harness.records import RunStatus
from harness.store import Checkpoint, RunPatch, Store

NOW = 1_000.0
OFFERED = {"time": [{"name": "get_time", "schema": {"type": "object", "properties": {}}}]}


def test_the_first_record_wins_and_is_read_back(store: Store) -> None:
    assert store.offered_tools("r1") is None
    assert store.offer_tools("r1", OFFERED, NOW) == OFFERED
    later = {"time": []}
    assert store.offer_tools("r1", later, NOW + 1) == OFFERED
    assert store.offered_tools("r1") == OFFERED
    assert store.offered_tools("r2") is None


def test_text_and_nesting_come_back_as_written(store: Store) -> None:
    tools = {"s": [{"description": "Zeit, 時間 \U0001f570", "schema": {"a": [[{"b": None}]]}}]}
    store.offer_tools("r1", tools, NOW)
    assert store.offered_tools("r1") == tools


def test_a_pruned_run_takes_its_record(store: Store) -> None:
    run, steps = transitions.new_run("r1", "agent", "goal", NOW)
    store.create_run(run, steps, NOW + 30, transitions.created(run))
    loaded = store.load("r1")
    store.checkpoint(
        Checkpoint("r1", loaded.version, "t", NOW, run=RunPatch(status=RunStatus.COMPLETED))
    )
    store.offer_tools("r1", OFFERED, NOW)
    store.offer_tools("r2", OFFERED, NOW)
    deleted = store.delete_runs(["r1"], NOW + 10, (RunStatus.COMPLETED,))
    assert [r for r, _ in deleted.runs] == ["r1"]
    assert store.offered_tools("r1") is None
    assert store.offered_tools("r2") == OFFERED
