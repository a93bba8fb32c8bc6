"""A run row's incarnation, on every backend (SQLite, PostgreSQL, memory).

Whenever a store inserts a run row (a new run, a fork, a replay, a child, an
import) it makes the row a fresh nonce, never copied from what it is given;
every read of the run carries it (a load, a claim on a hint, a listing); no
write changes it; an export leaves it out. So a run made again under an id,
even with its creation time (an import keeps it), is another incarnation,
and a worker's memory of the first (harness.engine.transcripts) is not used.
A row made before migration 0017 has none, and is read and written as before.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from sqlalchemy import update

from harness.engine import transitions
from harness.errors import BadArchive
from harness.records import ParentRef, Run, RunStatus, Step, StepKind, StepStatus
from harness.runs import archive
from harness.runs.prune import prune
from harness.store import ClaimGuard, RunPatch, RunQuery, Store, schema
from harness.store.memory import MemoryStore
from harness.store.migrate import downgrade, upgrade
from harness.store.sql import SQLStore, make_engine
from tests.contract.test_store_contract import apply

NOW = 1_700_000_000.0


def finished(store: Store, run_id: str = "r") -> Run:
    """A completed run of a model turn, a call and an answer, as created."""
    run, (first,) = transitions.new_run(run_id, "agent", "goal", NOW)
    steps = [
        replace(first, status=StepStatus.DONE, attempts=1, result={"tool_calls": []}),
        Step(run_id, 1, StepKind.TOOL, StepStatus.DONE, 1, tool="t", args={}, result=1),
        Step(run_id, 2, StepKind.MODEL, StepStatus.DONE, 1, args={"turn": 1}, result={}),
    ]
    done = replace(run, status=RunStatus.COMPLETED, cursor=3, step_count=3, result="ok")
    stored, created = store.create_run(done, steps, NOW, transitions.created(done))
    assert created
    return stored


def test_a_new_run_has_an_incarnation_every_read_returns(store: Store) -> None:
    run, steps = transitions.new_run("r", "agent", "goal", NOW)
    created, _ = store.create_run(run, steps, NOW, transitions.created(run))
    assert run.incarnation is None and created.incarnation  # the store's to make
    assert store.load("r").incarnation == created.incarnation
    assert store.load("r", at=0).incarnation == created.incarnation
    (listed,) = store.query_runs(RunQuery())
    assert listed.incarnation == created.incarnation
    moved = apply(store, created, run=RunPatch(status=RunStatus.RUNNING, cursor=0))  # type: ignore[arg-type]
    assert moved.version == created.version + 1 and moved.incarnation == created.incarnation


def test_a_claim_on_a_hint_returns_it(store: Store) -> None:
    run = Run(
        "r", "agent", "goal", RunStatus.RUNNING, cursor=1, version=1, step_count=2,
        created_at=NOW, updated_at=NOW,
    )  # fmt: skip
    steps = [
        Step("r", 0, StepKind.MODEL, StepStatus.DONE, 1, args={"turn": 0}, result={}),
        Step("r", 1, StepKind.TOOL, StepStatus.PENDING, tool="put", args={"n": 1}),
    ]
    created, _ = store.create_run(run, steps, NOW, transitions.created(run))
    claim = transitions.claim_pending("r", 1, 1, 0, worker="w/1", now=NOW, ttl=30.0)
    claimed = store.claim_loaded(claim, ClaimGuard(cursor=1, agent="agent", tool="put", attempts=0))
    assert claimed is not None and claimed[0].incarnation == created.incarnation


def test_a_run_made_again_under_its_id_is_another_incarnation(store: Store) -> None:
    """Pruned and created again at the very same time: only the nonce differs."""
    first = finished(store)
    prune(store, older_than=1, now=NOW + 10)
    again = finished(store)
    assert again.created_at == first.created_at
    assert again.incarnation and again.incarnation != first.incarnation


def test_an_id_taken_keeps_the_stored_incarnation(store: Store) -> None:
    first = finished(store)
    run, steps = transitions.new_run("r", "agent", "goal", NOW)
    stored, created = store.create_run(run, steps, NOW, transitions.created(run))
    assert not created and stored.incarnation == first.incarnation


def test_a_fork_a_replay_and_a_child_each_get_their_own(store: Store) -> None:
    origin = finished(store)
    steps = store.steps("r")
    made = transitions.fork(
        origin, steps, [], 2, run_id="fork", agent="agent", goal="goal", now=NOW
    )
    fork, _ = store.create_fork(made.run, made.steps, made.records, NOW, made.created)
    replay, replay_steps = transitions.replay(
        origin, run_id="replay", agent="agent", live_read_only=False, now=NOW
    )
    replayed, _ = store.create_run(replay, replay_steps, NOW, transitions.created(replay))
    child, child_steps = transitions.new_run("child", "agent", "sub-goal", NOW)
    child = replace(child, parent=ParentRef("r", 1))
    born, _ = store.create_run(child, child_steps, NOW, transitions.created(child))
    nonces = {origin.incarnation, fork.incarnation, replayed.incarnation, born.incarnation}
    assert None not in nonces and len(nonces) == 4


def test_an_export_leaves_it_out_and_an_import_makes_a_new_one(store: Store) -> None:
    first = finished(store)
    document = archive.export_run(store, "r")
    assert "incarnation" not in document["run"]  # type: ignore[operator]
    prune(store, older_than=1, now=NOW + 10)
    assert archive.import_run(store, document, now=NOW + 20).imported
    imported = store.load("r")
    assert imported.created_at == first.created_at
    assert imported.incarnation and imported.incarnation != first.incarnation
    # Importing it again is a no-op, not a conflict, and changes nothing.
    assert not archive.import_run(store, document, now=NOW + 30).imported
    assert store.load("r").incarnation == imported.incarnation
    again = archive.export_run(store, "r")["run"]
    assert again == {**document["run"], "wake_at": None}  # type: ignore[dict-item]  # finished
    other = MemoryStore()
    archive.import_run(other, document, now=NOW + 20)
    assert other.load("r").incarnation not in (None, imported.incarnation)


def test_a_document_that_names_one_is_refused(store: Store) -> None:
    """The format has no such field: a document carrying one was written by
    hand, and the strict reading refuses it (nothing is written)."""
    finished(store)
    document = archive.export_run(store, "r")
    prune(store, older_than=1, now=NOW + 10)
    forged = {**document, "run": {**document["run"], "incarnation": "f" * 16}}  # type: ignore[dict-item]
    forged["manifest"] = {**document["manifest"], "sha256": ""}  # type: ignore[dict-item]
    forged["manifest"]["sha256"] = archive.content_hash(forged)  # type: ignore[index]
    with pytest.raises(BadArchive, match="incarnation"):
        archive.import_run(store, forged, now=NOW + 20)
    assert not store.query_runs(RunQuery())


def _forget_incarnation(store: Store, run_id: str) -> None:
    """Make ``run_id``'s row as migration 0017 leaves an older one: NULL."""
    if isinstance(store, MemoryStore):
        store._tables.runs[run_id]["incarnation"] = None
        return
    assert isinstance(store, SQLStore)
    with store.engine.begin() as conn:
        conn.execute(
            update(schema.runs).where(schema.runs.c.run_id == run_id).values(incarnation=None)
        )


def test_a_row_made_before_incarnations_reads_and_writes_as_before(store: Store) -> None:
    run, steps = transitions.new_run("old", "agent", "goal", NOW)
    store.create_run(run, steps, NOW, transitions.created(run))
    _forget_incarnation(store, "old")
    loaded = store.load("old")
    assert loaded.incarnation is None
    moved = apply(store, loaded, run=RunPatch(status=RunStatus.RUNNING))  # type: ignore[arg-type]
    assert moved.version == loaded.version + 1 and moved.incarnation is None
    assert "incarnation" not in archive.export_run(store, "old")["run"]  # type: ignore[operator]


def test_migration_0018_leaves_older_rows_null_and_they_move_on(database_url: str) -> None:
    """Down to 0017 and up again, on a store holding a run: the column comes
    back NULL for it, and the run is read, written and exported as before."""
    store = SQLStore.from_url(database_url)
    finished(store, "kept")
    store.close()
    engine = make_engine(database_url)
    try:
        downgrade(engine, "0017")
    finally:
        upgrade(engine)
        engine.dispose()
    store = SQLStore.from_url(database_url)
    try:
        assert store.load("kept").incarnation is None
        assert archive.export_run(store, "kept")["run"]["run_id"] == "kept"  # type: ignore[index]
        run, steps = transitions.new_run("new", "agent", "goal", NOW)
        assert store.create_run(run, steps, NOW, transitions.created(run))[0].incarnation
    finally:
        store.close()
