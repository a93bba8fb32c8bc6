"""The store's Inbox part on every backend (SQLite, PostgreSQL, memory): a
user's message kept beside the version, the run's inbox marked; a sender's
id received once; the inbox unmarked only when no message waits; a
checkpoint that takes kept messages takes each once, or writes nothing;
completed runs with a message waiting found for the sweeper."""

from __future__ import annotations

import pytest

from harness.engine import transitions
from harness.errors import StaleWriteError
from harness.records import RunStatus
from harness.store import MESSAGE, Checkpoint, RunPatch, Store

NOW = 1_000.0


def _run(store: Store, run_id: str, status: RunStatus = RunStatus.RUNNING) -> None:
    run, steps = transitions.new_run(run_id, "agent", "goal", NOW)
    store.create_run(run, steps, NOW + 30, transitions.created(run))
    if status is not RunStatus.PENDING:
        loaded = store.load(run_id)
        store.checkpoint(Checkpoint(run_id, loaded.version, "t", NOW, run=RunPatch(status=status)))


def test_a_kept_message_marks_the_inbox_beside_the_version(store: Store) -> None:
    _run(store, "r1")
    version = store.load("r1").version
    first = store.keep_message("r1", "hello", NOW + 1)
    store.keep_message("r1", "again", NOW + 2)
    run = store.load("r1")
    assert (run.inbox_at, run.version) == (NOW + 1, version)  # the first keeps its mark
    kept = [s for s in store.kept_signals("r1") if s.name == MESSAGE]
    assert [(s.id, s.data) for s in kept][:1] == [(first, {"text": "hello"})]
    assert [s.data["text"] for s in kept] == ["hello", "again"]


def test_a_senders_id_is_received_once(store: Store) -> None:
    _run(store, "r1")
    assert store.keep_message("r1", "hi", NOW, "m-1") is not None
    assert store.keep_message("r1", "hi", NOW, "m-1") is None
    assert store.keep_message("r1", "hi", NOW, None) is not None
    assert len(store.kept_signals("r1")) == 2


def test_the_inbox_is_unmarked_only_when_no_message_waits(store: Store) -> None:
    _run(store, "r1")
    message = store.keep_message("r1", "hi", NOW)
    assert message is not None
    store.clear_inbox("r1")
    assert store.load("r1").inbox_at == NOW  # it waits: still marked
    run = store.load("r1")
    store.checkpoint(Checkpoint("r1", run.version, "t", NOW, take_signals=((message, 0),)))
    store.clear_inbox("r1")
    assert store.load("r1").inbox_at is None


def test_a_checkpoint_takes_each_message_once_or_writes_nothing(store: Store) -> None:
    _run(store, "r1")
    message = store.keep_message("r1", "hi", NOW)
    assert message is not None
    run = store.load("r1")
    version = store.checkpoint(
        Checkpoint(
            "r1", run.version, "t", NOW, run=RunPatch(cursor=0), take_signals=((message, 1),)
        )
    )
    with pytest.raises(StaleWriteError):  # taken already: the whole checkpoint refused
        store.checkpoint(
            Checkpoint(
                "r1", version, "t", NOW, run=RunPatch(cursor=5), take_signals=((message, 2),)
            )
        )
    assert (store.load("r1").version, store.load("r1").cursor) == (version, 0)
    assert store.kept_signals("r1") == []


def test_completed_runs_with_a_message_waiting_are_found_for_the_sweeper(store: Store) -> None:
    _run(store, "done", RunStatus.COMPLETED)
    _run(store, "moving", RunStatus.RUNNING)
    _run(store, "quiet", RunStatus.COMPLETED)
    store.keep_message("done", "hi", NOW)
    store.keep_message("moving", "hi", NOW)
    assert store.stranded_inboxes(NOW + 1) == ["done"]
    assert store.stranded_inboxes(NOW) == []  # not before its time
