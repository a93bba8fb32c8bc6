"""Blobs (harness.store.blobs) on every backend, kept in the table and in a directory.

A result longer than the threshold is stored beside its row, which holds only
the reference, and every read returns the whole value: load, steps, the
idempotency record, a fork's copy, an export. The blob commits with the
checkpoint that names it or not at all, and goes with its run when pruned.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Table, select

import harness
from harness.engine import transitions
from harness.engine.creation import create_run
from harness.errors import RunNotFound, StaleWriteError, StoreError
from harness.reads import RunDetail
from harness.records import JSON, Run, RunStatus, Step, StepKind, StepStatus
from harness.runs import archive
from harness.runs.fork import fork_run
from harness.store import RunPatch, StepPatch, ToolRecord, schema
from harness.store.blobs import BlobStore, digest_of, run_folder
from harness.store.sql import SQLStore
from tests.contract.test_store_contract import apply, counting, cp, make_run, result_checkpoint
from tests.rig import Rig

THRESHOLD = 1024
NOW = 1_700_000_000.0
AGENT = "blob-agent"


def big(tag: str, size: int = 4 * THRESHOLD) -> dict[str, JSON]:
    """A result whose JSON is about ``size`` bytes, distinct per ``tag``."""
    return {"tag": tag, "rows": ["naïve ☕ " + "x" * 90] * (size // 100)}


def text_of(value: JSON) -> str:
    return json.dumps(value)


@harness.tool(effect="idempotent")
def blob_report(n: int) -> dict[str, JSON]:
    return big(f"report {n}", 200_000)


harness.register_agent(
    harness.Agent(
        name=AGENT,
        model=harness.ScriptedModel(
            [
                {"tool_calls": [{"name": "blob_report", "args": {"n": 1}}]},
                {"tool_calls": [{"name": "blob_report", "args": {"n": 2}}]},
                {"final": "two reports"},
            ]
        ),
        tools=[blob_report],
    )
)


@pytest.fixture(params=["table", "directory"])
def store(request: pytest.FixtureRequest, database_url: str, tmp_path: Path) -> Iterator[SQLStore]:
    """A store keeping results above 1 KiB as blobs, in its table or in a directory."""
    directory = tmp_path / "blobs" if request.param == "directory" else None
    s = SQLStore.from_url(database_url, blobs=BlobStore(THRESHOLD, directory))
    yield s
    s.close()


def rows(store: SQLStore, table: Table, run_id: str) -> list[dict[str, Any]]:
    query = select(table).where(table.c.run_id == run_id).order_by(*table.primary_key.columns)
    with store.engine.connect() as conn:
        return [dict(r) for r in conn.execute(query).mappings()]


def blob_rows(store: SQLStore, run_id: str) -> dict[str, Any]:
    """The run's blobs, digest to what the table holds (None: a file)."""
    return {r["digest"]: r["data"] for r in rows(store, schema.blobs, run_id)}


def blob_file(store: SQLStore, run_id: str, value: JSON) -> Path:
    assert store.blobs.directory is not None
    name = digest_of(text_of(value).encode()).removeprefix("sha256:")
    return store.blobs.directory / run_folder(run_id) / f"{name}.json"


def assert_stored_once(store: SQLStore, run_id: str, value: JSON) -> None:
    """The run has this value's blob, in the table or as a whole file."""
    digest = digest_of(text_of(value).encode())
    stored = blob_rows(store, run_id)
    assert digest in stored
    if store.blobs.directory is None:
        assert stored[digest] == text_of(value)
    else:
        assert stored[digest] is None
        assert blob_file(store, run_id, value).read_text() == text_of(value)


def recorded_run(store: SQLStore, run_id: str) -> Run:
    """A finished run: a model turn, a large tool result with its record, a final turn."""
    run, (first,) = transitions.new_run(run_id, "agent", "the goal", NOW)
    steps = [
        replace(first, status=StepStatus.DONE, attempts=1, result=big(f"{run_id} turn")),
        Step(run_id, 1, StepKind.TOOL, StepStatus.DONE, 1, tool="t", result=big(f"{run_id} t")),
        Step(run_id, 2, StepKind.MODEL, StepStatus.DONE, 1, args={"turn": 1}, result={}),
    ]
    done = replace(run, status=RunStatus.COMPLETED, cursor=3, step_count=3, result="ok")
    stored, created = store.create_run(done, steps, NOW, transitions.created(done))
    assert created
    store.put_tool_result(f"{run_id}:1", run_id, 1, "t", big(f"{run_id} t"), NOW)
    return stored


# -- the row holds a reference, reads the value ------------------------------------


def test_a_large_result_round_trips_and_its_row_holds_only_the_reference(
    store: SQLStore,
) -> None:
    run = make_run(store, "r1")
    value = big("r1")
    record = ToolRecord("r1:0", 0, "echo", value)
    checkpoint = result_checkpoint(run)
    patch = replace(checkpoint.steps[0], result=value)
    store.checkpoint(replace(checkpoint, steps=(patch,), tool_record=record))

    assert store.steps("r1")[0].result == value
    assert store.get_tool_result("r1:0") == (True, value)
    assert store.tool_records(["r1:0"]) == [record]
    digest = digest_of(text_of(value).encode())
    (step, _) = rows(store, schema.steps, "r1")
    assert (step["result"], step["result_blob"]) == (None, digest)
    (stored,) = rows(store, schema.tool_results, "r1")
    assert (stored["result"], stored["result_blob"]) == (None, digest)
    # The step's result and its record are one text: one blob.
    assert list(blob_rows(store, "r1")) == [digest]
    assert_stored_once(store, "r1", value)
    assert rows(store, schema.blobs, "r1")[0]["size"] == len(text_of(value))


def test_load_reads_a_large_result_at_the_cursor(store: SQLStore) -> None:
    run = make_run(store, "r1")
    value = big("at the cursor")
    run = apply(store, run, steps=(StepPatch(0, status=StepStatus.FAILED, result=value),))
    assert run.current is not None and run.current.result == value


def test_up_to_the_threshold_a_result_stays_in_its_row(store: SQLStore) -> None:
    run = make_run(store, "r1")
    at = "x" * (THRESHOLD - 2)  # its JSON, with the quotes, is THRESHOLD bytes
    over = "x" * (THRESHOLD - 1)
    store.checkpoint(cp(run, steps=(StepPatch(0, result=at),)))
    assert rows(store, schema.steps, "r1")[0]["result"] == text_of(at)
    assert blob_rows(store, "r1") == {}
    run = store.load("r1")
    store.checkpoint(cp(run, steps=(StepPatch(0, result=over),)))
    assert rows(store, schema.steps, "r1")[0]["result"] is None
    assert store.steps("r1")[0].result == over


def test_a_result_shaped_like_a_reference_is_stored_as_itself(store: SQLStore) -> None:
    """A tool may return anything, a would-be reference too: the reference is
    a column of its own, so no value is ever taken for one."""
    run = make_run(store, "r1")
    digest = digest_of(text_of(big("other")).encode())
    lookalike = {"$blob": digest, "bytes": 4096, "result_blob": digest}
    store.checkpoint(cp(run, steps=(StepPatch(0, result=lookalike),)))
    store.put_tool_result("r1:0", "r1", 0, "echo", digest, NOW)
    assert store.steps("r1")[0].result == lookalike
    assert store.get_tool_result("r1:0") == (True, digest)
    assert [r["result_blob"] for r in rows(store, schema.steps, "r1")] == [None]


def test_a_smaller_result_written_later_drops_the_reference(store: SQLStore) -> None:
    run = make_run(store, "r1")
    run = apply(store, run, steps=(StepPatch(0, result=big("first")),))
    store.checkpoint(cp(run, steps=(StepPatch(0, result={"small": True}),)))
    assert store.steps("r1")[0].result == {"small": True}
    assert rows(store, schema.steps, "r1")[0]["result_blob"] is None


def test_a_stale_checkpoint_writes_no_blob_row(store: SQLStore) -> None:
    run = make_run(store, "r1")
    apply(store, run, run=RunPatch(owner="someone else"))
    stale = result_checkpoint(run)
    stale = replace(stale, steps=(replace(stale.steps[0], result=big("lost")),))
    with pytest.raises(StaleWriteError):
        store.checkpoint(stale)
    assert blob_rows(store, "r1") == {}
    assert store.steps("r1")[0].result is None
    # A file is written before the transaction: it is left, named by no row.
    expected = [] if store.blobs.directory is None else [blob_file(store, "r1", big("lost"))]
    assert store.orphan_blobs() == expected


def test_steps_read_every_blob_in_one_query(store: SQLStore) -> None:
    run = make_run(store, "r1")
    results = {i: big(f"step {i}") for i in range(1, 21)}
    new_steps = tuple(
        Step("r1", i, StepKind.TOOL, StepStatus.DONE, 1, tool="t", result=results[i])
        for i in results
    )
    apply(store, run, run=RunPatch(step_count=21), new_steps=new_steps)
    with counting(store) as statements:
        steps = store.steps("r1")
    assert [s.result for s in steps[1:]] == list(results.values())
    assert [s.split()[0].upper() for s in statements] == ["SELECT", "SELECT"]


def test_a_checkpoint_with_blobs_is_one_statement_on_postgresql(store: SQLStore) -> None:
    run = make_run(store, "r1")
    checkpoint = result_checkpoint(run)
    checkpoint = replace(
        checkpoint,
        steps=(replace(checkpoint.steps[0], result=big("a")),),
        new_steps=(replace(checkpoint.new_steps[0], result=big("b")),),
        tool_record=ToolRecord("r1:0", 0, "echo", big("a")),
    )
    with counting(store) as statements:
        store.checkpoint(checkpoint)
    if store.dialect == "postgresql":
        assert len(statements) == 1, statements
    assert sorted(blob_rows(store, "r1")) == sorted(
        digest_of(text_of(big(t)).encode()) for t in "ab"
    )


def test_the_first_record_stays_first_with_blobs(store: SQLStore) -> None:
    make_run(store, "r1")
    first, second = big("first"), big("second")
    assert store.put_tool_result("r1:0", "r1", 0, "echo", first, NOW) == first
    assert store.put_tool_result("r1:0", "r1", 0, "echo", second, NOW) == first
    assert store.get_tool_result("r1:0") == (True, first)


def test_blobs_read_back_under_other_settings(store: SQLStore) -> None:
    """Turning blobs off, or another threshold, changes writes, not reads."""
    recorded_run(store, "r1")
    expected = store.steps("r1")
    off = SQLStore(store.engine, blobs=BlobStore(None, store.blobs.directory))
    assert off.steps("r1") == expected
    assert off.get_tool_result("r1:1") == (True, big("r1 t"))
    run = make_run(off, "r2")
    off.checkpoint(cp(run, steps=(StepPatch(0, result=big("inline")),)))
    assert rows(off, schema.steps, "r2")[0]["result"] == text_of(big("inline"))


# -- fork, export and import, prune -------------------------------------------------


def test_a_fork_gets_blobs_of_its_own(store: SQLStore) -> None:
    origin = recorded_run(store, "origin")
    steps = store.steps("origin")
    records = store.tool_records(["origin:0", "origin:1"])
    made = transitions.fork(
        origin, steps, records, 2, run_id="fork", agent="agent", goal="the goal", now=NOW
    )
    store.create_fork(made.run, made.steps, made.records, NOW + 30, made.created)

    assert [s.result for s in store.steps("fork")[:2]] == [s.result for s in steps[:2]]
    assert store.get_tool_result("fork:1") == (True, big("origin t"))
    assert sorted(blob_rows(store, "fork")) == sorted(blob_rows(store, "origin"))
    for value in (big("origin turn"), big("origin t")):
        assert_stored_once(store, "fork", value)


def test_an_export_carries_values_inline_and_an_import_makes_them_blobs(
    store: SQLStore,
) -> None:
    recorded_run(store, "r1")
    document: Any = archive.export_run(store, "r1")
    assert [s["result"] for s in document["steps"][:2]] == [big("r1 turn"), big("r1 t")]
    assert document["tool_records"][0]["result"] == big("r1 t")
    assert all("result_blob" not in row for row in [*document["steps"], *document["tool_records"]])
    before = (store.steps("r1"), store.tool_records(["r1:1"]))
    store.reset()

    assert archive.import_run(store, archive.dumps(document)).imported
    assert (store.steps("r1"), store.tool_records(["r1:1"])) == before
    assert [r["result"] for r in rows(store, schema.steps, "r1")][:2] == [None, None]
    assert_stored_once(store, "r1", big("r1 t"))
    assert not archive.import_run(store, document).imported  # the same content: a no-op


def test_prune_deletes_a_runs_blobs_with_it(store: SQLStore) -> None:
    recorded_run(store, "old")
    recorded_run(store, "kept")
    pruned = store.delete_runs(["old"], time.time(), (RunStatus.COMPLETED,))
    assert pruned.runs == (("old", RunStatus.COMPLETED),)
    assert blob_rows(store, "old") == {}
    assert_stored_once(store, "kept", big("kept t"))
    assert store.steps("kept")[1].result == big("kept t")
    if store.blobs.directory is not None:
        assert not (store.blobs.directory / run_folder("old")).exists()
    assert store.orphan_blobs() == []


def test_a_run_carried_by_the_runner_shows_whole_results(store: SQLStore) -> None:
    """200 KB tool outputs, carried by the runner: `show --json` sees them whole,
    the rows hold references, and the export and its import agree."""
    rig = Rig(store)
    create_run(rig.runtime(), AGENT, "two reports", "run-big")
    rig.drive()
    shown = RunDetail(store.load("run-big"), store.steps("run-big")).to_dict()
    assert shown["status"] == "completed"
    assert [s["result"] for s in shown["steps"] if s["kind"] == "tool"] == [
        big("report 1", 200_000),
        big("report 2", 200_000),
    ]
    assert all(len(r["result"] or "") <= THRESHOLD for r in rows(store, schema.steps, "run-big"))
    document = archive.export_run(store, "run-big")
    store.reset()
    archive.import_run(store, document)
    assert RunDetail(store.load("run-big"), store.steps("run-big")).to_dict() == shown
    fork_id = fork_run(rig.runtime(), "run-big", 2, new_run_id="run-big-fork")
    rig.drive()
    assert store.load(fork_id).status is RunStatus.COMPLETED
    assert store.steps(fork_id)[1].result == big("report 1", 200_000)


# -- the directory -----------------------------------------------------------------


@pytest.fixture
def files(database_url: str, tmp_path: Path) -> Iterator[SQLStore]:
    s = SQLStore.from_url(database_url, blobs=BlobStore(THRESHOLD, tmp_path / "blobs"))
    yield s
    s.close()


def test_a_lost_or_damaged_file_is_a_clear_store_error(files: SQLStore) -> None:
    recorded_run(files, "r1")
    path = blob_file(files, "r1", big("r1 t"))
    path.write_text(path.read_text()[:-1])
    with pytest.raises(StoreError, match="is damaged"):
        files.steps("r1")
    path.unlink()
    with pytest.raises(StoreError, match="is missing"):
        files.get_tool_result("r1:1")


def test_files_need_the_directory_setting_to_be_read(files: SQLStore) -> None:
    recorded_run(files, "r1")
    elsewhere = SQLStore(files.engine, blobs=BlobStore())
    with pytest.raises(StoreError, match="HARNESS_BLOB_DIR is not set"):
        elsewhere.steps("r1")


def test_a_run_pruned_while_read_is_not_found(files: SQLStore) -> None:
    recorded_run(files, "r1")
    with files.engine.connect() as conn:
        found = conn.execute(select(schema.steps).where(schema.steps.c.run_id == "r1"))
        step_rows = found.mappings().all()
    files.delete_runs(["r1"], time.time(), (RunStatus.COMPLETED,))
    with files.engine.connect() as conn, pytest.raises(RunNotFound):
        files.blobs.fill(conn, step_rows)


def test_any_run_id_is_one_folder_inside_the_directory() -> None:
    for run_id in ("../../etc", "a/b", ".hidden", "%2E", "ü" * 128):
        name = run_folder(run_id)
        assert "/" not in name and not name.startswith(".") and len(name) <= 200
    assert run_folder("../x") != run_folder("%2E%2E%2Fx")
    assert run_folder("ü" * 128).startswith("+")
    assert run_folder("plain-id_1") == "plain-id_1"
