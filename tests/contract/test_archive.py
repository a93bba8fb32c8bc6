"""Export and import (harness.replay.archive) on every backend.

A run really carried by the runner (in-process, tests/rig.py) is exported,
the store emptied, the document imported: the run reads back the same, its
re-export is the same document, it forks like the original, and a document
that fails halfway through the transaction leaves no row behind.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from sqlalchemy import func, select

import harness
from harness.engine import operations, recovery
from harness.engine.runner import create_run
from harness.errors import BadArchive, ImportConflict, RunNotFound, StoreError
from harness.reads import RunDetail
from harness.records import RunStatus
from harness.replay import archive
from harness.replay.fork import fork_run
from harness.store import RunPatch, RunRows, Store, schema
from harness.store.migrate import upgrade
from harness.store.sql import SQLStore, make_engine
from tests.contract.test_store_contract import apply
from tests.rig import Rig

AGENT = "archive-agent"
RUN = "run-archive"
PAYLOAD = {"text": "naïve café ☕ 日本語 🚀", "quotes": 'a "b" \\ c', "n": [1, 2.5, None, True]}


@harness.tool(effect="idempotent")
def archive_echo(payload: dict[str, Any], ctx: harness.ToolContext) -> dict[str, Any]:
    return {"payload": payload, "key": ctx.idempotency_key}


def _turns(count: int) -> list[dict[str, Any]]:
    turns: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "archive_echo", "args": {"payload": {**PAYLOAD, "i": i}}}]}
        for i in range(count)
    ]
    return [*turns, {"final": f"{count} echoes ☕"}]


harness.register_agent(
    harness.Agent(name=AGENT, model=harness.ScriptedModel(_turns(3)), tools=[archive_echo])
)


class Crash(BaseException):
    """The worker dies mid-call (a SIGKILL, in-process)."""


@harness.tool(effect="at_most_once")
def archive_send(ctx: harness.ToolContext) -> str:
    if ctx.attempt == 1:
        raise Crash
    return "sent"


@harness.tool(effect="read_only")
def archive_odd(ctx: harness.ToolContext) -> dict[str, str]:
    return {"text": "x\ud800y"}  # a lone surrogate: JSON can carry it, UTF-8 cannot


@harness.tool(effect="idempotent", requires_approval=True)
def archive_charge(ctx: harness.ToolContext) -> str:
    return "charged"


@harness.tool(effect="idempotent")
def archive_broken(ctx: harness.ToolContext) -> str:
    raise ValueError("broken")


def _one_call(name: str, tool: Any, **options: Any) -> None:
    turns = [{"tool_calls": [{"name": tool.name, "args": {}}]}, {"final": "ok"}]
    harness.register_agent(
        harness.Agent(name=name, model=harness.ScriptedModel(turns), tools=[tool], **options)
    )


_one_call("archive-send", archive_send)
_one_call("archive-odd", archive_odd)
_one_call("archive-charge", archive_charge)
_one_call("archive-broken", archive_broken, on_tool_error="fail")


def finished_run(store: Store, run_id: str = RUN) -> str:
    """A run of three tool calls and a final answer, carried to the end."""
    rig = Rig(store)
    create_run(rig.runtime(), AGENT, "echo three times", run_id)
    rig.drive()
    assert store.load(run_id).status is RunStatus.COMPLETED
    return run_id


def shown(store: SQLStore, run_id: str) -> dict[str, Any]:
    """What ``harness show --json`` prints."""
    return RunDetail(store.load(run_id), store.steps(run_id)).to_dict()


def history(store: SQLStore, run_id: str) -> list[dict[str, Any]]:
    """The flight recorder in order, without the ids a store assigns."""
    return [{k: v for k, v in e.to_dict().items() if k != "id"} for e in store.events(run_id)]


def without_manifest_time(document: dict[str, Any]) -> dict[str, Any]:
    document = copy.deepcopy(document)
    del document["manifest"]["exported_at"], document["manifest"]["sha256"]
    return document


def row_counts(store: SQLStore) -> dict[str, int]:
    tables = (schema.runs, schema.steps, schema.events, schema.tool_results)
    with store.engine.connect() as conn:
        return {
            t.name: conn.execute(select(func.count()).select_from(t)).scalar_one() for t in tables
        }


@pytest.fixture
def other_sqlite(tmp_path: Any) -> Iterator[SQLStore]:
    """A second, empty SQLite store."""
    engine = make_engine(f"sqlite:///{tmp_path / 'other.db'}")
    upgrade(engine)
    s = SQLStore(engine)
    yield s
    s.close()


def test_round_trip_into_an_empty_store(store: SQLStore) -> None:
    run_id = finished_run(store)
    document = archive.export_run(store, run_id)
    before, recorded = shown(store, run_id), history(store, run_id)
    assert document["manifest"]["counts"] == {"steps": 7, "events": 13, "tool_records": 3}
    store.reset()

    result = archive.import_run(store, archive.dumps(document))

    assert (result.run_id, result.imported, result.status) == (run_id, True, "completed")
    assert shown(store, run_id) == before
    assert history(store, run_id) == recorded
    again = archive.export_run(store, run_id)
    assert without_manifest_time(again) == without_manifest_time(document)
    assert again["manifest"]["sha256"] != document["manifest"]["sha256"]  # exported_at moved


def test_a_run_moves_between_backends(other_sqlite: SQLStore, store: SQLStore) -> None:
    """SQLite to each backend, and the tool records come along: a repeat of a
    call is answered from the imported record."""
    run_id = finished_run(other_sqlite)
    document = archive.export_run(other_sqlite, run_id)

    assert archive.import_run(store, document).imported
    assert shown(store, run_id) == shown(other_sqlite, run_id)
    assert store.get_tool_result(f"{run_id}:1") == other_sqlite.get_tool_result(f"{run_id}:1")


def test_importing_again_is_a_no_op_and_other_content_is_refused(store: SQLStore) -> None:
    run_id = finished_run(store)
    document = archive.export_run(store, run_id)
    counts = row_counts(store)

    again = archive.import_run(store, document)
    assert (again.imported, again.line) == (False, f"{run_id} already imported (completed)")
    assert row_counts(store) == counts

    other = copy.deepcopy(document)
    other["steps"][1]["result"] = {"payload": "something else"}
    other["manifest"]["sha256"] = archive.content_hash(other)  # a valid document
    with pytest.raises(ImportConflict, match=r"its steps differ\): not overwritten"):
        archive.import_run(store, other)
    assert row_counts(store) == counts
    assert shown(store, run_id)["steps"][1]["result"] != {"payload": "something else"}


def test_a_moving_run_arrives_unleased_for_the_sweeper(store: SQLStore) -> None:
    rig = Rig(store)
    run_id = create_run(rig.runtime(), AGENT, "still going", "run-moving")
    leased = apply(
        store, store.load(run_id), run=RunPatch(owner="w-elsewhere", lease_expires_at=9e9)
    )
    document = archive.export_run(store, run_id)
    assert document["run"]["owner"] == "w-elsewhere"
    store.reset()

    archive.import_run(store, document)

    run = store.load(run_id)
    assert (run.status, run.owner, run.lease_expires_at) == (RunStatus.PENDING, None, None)
    assert run.version == leased.version
    assert [r.run_id for r in store.due_runs(now=(run.wake_at or 0) + 1)] == [run_id]
    assert archive.import_run(store, document).imported is False  # the same, lease aside


def test_an_imported_run_forks_like_the_original(other_sqlite: SQLStore, store: SQLStore) -> None:
    """The fork of the original and the fork of its import, carried to the end,
    have the same steps; the fork copies the imported tool records."""
    run_id = finished_run(other_sqlite)
    archive.import_run(store, archive.export_run(other_sqlite, run_id))
    forks = []
    for s in (other_sqlite, store):
        rig = Rig(s)
        fork_id = fork_run(rig.runtime(), run_id, 4, new_run_id="run-fork")
        rig.drive()
        forks.append(shown(s, fork_id))
    assert forks[0]["forked_from"] == {"run_id": run_id, "step": 4}
    assert forks[0]["status"] == "completed"
    assert forks[0]["steps"] == forks[1]["steps"]


def test_a_failure_inside_the_transaction_writes_nothing(store: SQLStore) -> None:
    """Rows that pass the document's checks but not the database's (here a
    duplicate step index, then a NULL where none is allowed, each after some
    rows went in) roll the whole import back."""
    run_id = finished_run(store)
    rows = store.run_rows(run_id)
    store.reset()

    duplicate = replace(rows, steps=(*rows.steps, rows.steps[-1]))
    with pytest.raises(StoreError, match=f"run {run_id} not imported"):
        store.import_run(duplicate)
    broken_event = {**rows.events[-1], "to_status": None}
    late_failure = replace(rows, events=(*rows.events, broken_event))
    with pytest.raises(StoreError):
        store.import_run(late_failure)

    assert row_counts(store) == dict.fromkeys(row_counts(store), 0)
    with pytest.raises(RunNotFound):
        store.run_rows(run_id)
    assert store.import_run(rows) is True  # the good rows still go in


def test_a_rejected_document_writes_nothing(store: SQLStore) -> None:
    run_id = finished_run(store)
    document = archive.export_run(store, run_id)
    store.reset()
    text = archive.dumps(document)
    with pytest.raises(BadArchive, match="not valid JSON at line"):
        archive.import_run(store, text[: len(text) // 2])
    tampered = copy.deepcopy(document)
    tampered["steps"][1]["result"]["payload"]["n"] = 3
    with pytest.raises(BadArchive, match="tampered or corrupted"):
        archive.import_run(store, tampered)
    assert row_counts(store) == dict.fromkeys(row_counts(store), 0)


def test_run_rows_reads_every_table(store: SQLStore) -> None:
    """The rows of an export (read in one transaction): the run row, its steps
    in order, its events without their ids."""
    run_id = finished_run(store)
    rows: RunRows = store.run_rows(run_id)
    assert rows.run["step_count"] == len(rows.steps)
    assert [s["idx"] for s in rows.steps] == list(range(len(rows.steps)))
    assert "id" not in rows.events[0]
    with pytest.raises(RunNotFound):
        store.run_rows("no-such-run")


def _in_doubt(rig: Rig) -> str:
    run_id = create_run(rig.runtime(), "archive-send", "send once", "run-state")
    rig.drive(limit=1)
    with pytest.raises(Crash):
        rig.drive(limit=1)
    rig.clock.advance(rig.lease_ttl + 1)
    recovery.sweep(rig.runtime("sweeper"))
    rig.drive()
    return run_id


def _awaiting_approval(rig: Rig) -> str:
    run_id = create_run(rig.runtime(), "archive-charge", "charge", "run-state")
    rig.drive()
    return run_id


def _paused(rig: Rig) -> str:
    run_id = create_run(rig.runtime(), AGENT, "pause me", "run-state")
    rig.drive(limit=2)
    operations.pause(rig.runtime(), run_id, "op")
    rig.drive()
    return run_id


def _cancelled(rig: Rig) -> str:
    run_id = create_run(rig.runtime(), AGENT, "cancel me", "run-state")
    rig.drive(limit=1)
    operations.cancel(rig.runtime(), run_id, "no longer wanted")
    return run_id


def _failed(rig: Rig) -> str:
    run_id = create_run(rig.runtime(), "archive-broken", "fail", "run-state")
    rig.drive()
    return run_id


def _odd_result(rig: Rig) -> str:
    run_id = create_run(rig.runtime(), "archive-odd", "odd text", "run-state")
    rig.drive()
    return run_id


STATES = [
    (_in_doubt, RunStatus.WAITING, "in_doubt"),
    (_awaiting_approval, RunStatus.WAITING, "awaiting_approval"),
    (_paused, RunStatus.PAUSED, "pending"),
    (_cancelled, RunStatus.CANCELLED, "pending"),
    (_failed, RunStatus.FAILED, "pending"),  # the failed call is behind the cursor
    (_odd_result, RunStatus.COMPLETED, None),
]


@pytest.mark.parametrize(
    ("make", "status", "at_cursor"), STATES, ids=[s[0].__name__ for s in STATES]
)
def test_a_run_in_any_state_round_trips(
    store: SQLStore, make: Any, status: RunStatus, at_cursor: str | None
) -> None:
    """The import's state checks accept what the engine really writes: held
    runs (in doubt, awaiting approval, paused), stopped ones, and a tool
    result holding a lone surrogate (the file is ASCII, so it reads back)."""
    run_id = make(Rig(store))
    run = store.load(run_id)
    steps = store.steps(run_id)
    assert run.status is status
    assert (steps[run.cursor].status.value if run.cursor < len(steps) else None) == at_cursor
    document = archive.export_run(store, run_id)
    before, recorded = shown(store, run_id), history(store, run_id)
    text = archive.dumps(document)
    assert text.isascii()
    store.reset()

    assert archive.import_run(store, text).imported
    assert shown(store, run_id) == before
    assert history(store, run_id) == recorded
    again = archive.export_run(store, run_id)
    assert without_manifest_time(again) == without_manifest_time(document)


def test_a_lone_surrogate_in_a_tool_result_round_trips_as_stored(store: SQLStore) -> None:
    """The store keeps a lone surrogate as U+FFFD (harness.inputs), and the
    export and import carry that value unchanged."""
    run_id = _odd_result(Rig(store))
    assert store.steps(run_id)[1].result == {"text": "x\ufffdy"}
    document = archive.export_run(store, run_id)
    store.reset()
    archive.import_run(store, archive.dumps(document, compact=True))
    assert store.steps(run_id)[1].result == {"text": "x\ufffdy"}
    assert store.get_tool_result(f"{run_id}:1") == (True, {"text": "x\ufffdy"})


def test_text_the_database_refuses_is_stored_as_the_store_stores_it(
    store: SQLStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Were the text check to miss a lone surrogate, the store's own boundary
    makes it storable: the import lands whole, nothing fails half-way."""
    run_id = finished_run(store)
    document = archive.export_run(store, run_id)
    store.reset()
    document["events"][-1]["detail"] = "late \udfff"
    document["manifest"]["sha256"] = archive.content_hash(document)
    monkeypatch.setattr(archive, "_check_text", lambda rows: None)
    archive.import_run(store, archive.dumps(document))
    assert store.events(run_id)[-1].detail == "late \ufffd"
