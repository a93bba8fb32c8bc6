"""The export document's checks, and ``harness export`` / ``harness import``.

Every malformed document is refused with one clear line and nothing written:
truncated, tampered, from a newer harness, of another format, with counts
that lie, rows of another run, unknown fields, wrong types, gaps.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from pydantic import BaseModel
from sqlalchemy import Table

from harness import api
from harness.cli import main
from harness.errors import BadArchive
from harness.replay import archive
from harness.store import schema
from harness.store.sql import SQLStore
from tests.contract.test_archive import finished_run, row_counts
from tests.unit.test_cli import assert_one_line_error

Doc = dict[str, Any]


@pytest.fixture
def document(sqlite_store: SQLStore) -> Doc:
    """A finished run's export; the store is left empty."""
    doc = archive.export_run(sqlite_store, finished_run(sqlite_store))
    sqlite_store.reset()
    return doc


def rehashed(doc: Doc) -> Doc:
    """A document edited by someone who also fixed its hash."""
    doc["manifest"]["sha256"] = archive.content_hash(doc)
    return doc


def truncated(doc: Doc) -> bytes:
    text = archive.dumps(doc)
    return text[: len(text) * 2 // 3]


def tampered(doc: Doc) -> Doc:
    doc["steps"][1]["result"]["payload"]["text"] = "changed"
    return doc


def newer(doc: Doc) -> Doc:
    doc["schema_version"] = 2
    doc["future"] = {"blobs": []}
    return rehashed(doc)


def other_format(doc: Doc) -> Doc:
    doc["format"] = "langgraph-checkpoint"
    return rehashed(doc)


def lying_counts(doc: Doc) -> Doc:
    doc["manifest"]["counts"]["events"] += 1
    return rehashed(doc)


def foreign_event(doc: Doc) -> Doc:
    doc["events"][3]["run_id"] = "someone-else"
    return rehashed(doc)


def unknown_field(doc: Doc) -> Doc:
    doc["steps"][2]["colour"] = "blue"
    return rehashed(doc)


def wrong_type(doc: Doc) -> Doc:
    doc["steps"][2]["attempts"] = "1"
    return rehashed(doc)


def bad_status(doc: Doc) -> Doc:
    doc["run"]["status"] = "finished"
    return rehashed(doc)


def gap(doc: Doc) -> Doc:
    del doc["steps"][1]
    doc["manifest"]["counts"]["steps"] -= 1
    return rehashed(doc)


def short_step_count(doc: Doc) -> Doc:
    doc["run"]["step_count"] -= 1
    return rehashed(doc)


def stray_record(doc: Doc) -> Doc:
    doc["tool_records"][0]["key"] = f"{doc['run']['run_id']}:99"
    return rehashed(doc)


def nan_time(doc: Doc) -> Doc:
    doc["run"]["created_at"] = float("nan")
    return rehashed(doc)


def infinite_time(doc: Doc) -> Doc:
    doc["run"]["updated_at"] = float("inf")
    return rehashed(doc)


def tool_step_without_tool(doc: Doc) -> Doc:
    doc["steps"][1]["tool"] = None
    return rehashed(doc)


def model_step_with_tool(doc: Doc) -> Doc:
    doc["steps"][2]["tool"] = "archive_echo"
    return rehashed(doc)


def pending_with_nothing_to_run(doc: Doc) -> Doc:
    doc["run"]["status"] = "pending"  # cursor 7 == step_count 7
    return rehashed(doc)


def waiting_on_a_settled_step(doc: Doc) -> Doc:
    doc["run"].update(status="waiting", cursor=6)
    return rehashed(doc)


def unsettled_before_cursor(doc: Doc) -> Doc:
    doc["steps"][3]["status"] = "in_doubt"
    return rehashed(doc)


def running_off_cursor(doc: Doc) -> Doc:
    doc["run"].update(status="cancelled", cursor=5)
    doc["steps"][5]["status"] = "pending"
    doc["steps"][6]["status"] = "running"
    return rehashed(doc)


def half_a_fork(doc: Doc) -> Doc:
    doc["run"]["forked_from_run"] = "origin"
    return rehashed(doc)


def fork_beyond_the_steps(doc: Doc) -> Doc:
    doc["run"].update(forked_from_run="origin", forked_from_step=7)
    return rehashed(doc)


def surrogate_goal(doc: Doc) -> Doc:
    doc["run"]["goal"] = "x\ud800y"  # escaped in the file, valid JSON
    return rehashed(doc)


def surrogate_event_detail(doc: Doc) -> Doc:
    doc["events"][2]["detail"] = "\udfff"
    return rehashed(doc)


def no_hash(doc: Doc) -> Doc:
    del doc["manifest"]["sha256"]
    return doc


CASES: list[tuple[Callable[[Doc], Any], str]] = [
    (truncated, "not valid JSON at line "),
    (tampered, "tampered or corrupted: the content hash does not match the manifest"),
    (newer, "written by a newer harness: schema_version 2, this one reads 1"),
    (other_format, "not a harness run export (format 'langgraph-checkpoint'"),
    (lying_counts, "counts do not match: the manifest says 14 events, the document has 13"),
    (foreign_event, "event 3 belongs to run 'someone-else', not 'run-archive'"),
    (unknown_field, "steps.2.colour: Extra inputs are not permitted"),
    (wrong_type, "steps.2.attempts: Input should be a valid integer"),
    (bad_status, "run.status: Input should be 'pending'"),
    (gap, "step indexes must be 0..5 in order: index 2 at position 1"),
    (short_step_count, "the run says 6 steps (cursor 7), the document has 7"),
    (stray_record, "tool record 'run-archive:99' is not the key of a step of this run"),
    (nan_time, "run.created_at: Input should be a finite number"),
    (infinite_time, "run.updated_at: Input should be a finite number"),
    (tool_step_without_tool, "step 1 (tool, done) names no tool"),
    (model_step_with_tool, "step 2 (model, done) names a tool ('archive_echo')"),
    (pending_with_nothing_to_run, "a pending run has no step at its cursor 7 (it has 7)"),
    (waiting_on_a_settled_step, "a waiting run's step at its cursor 6 is already done"),
    (unsettled_before_cursor, "step 3 (tool, in_doubt) is before the cursor 7: not done or failed"),
    (running_off_cursor, "step 6 (model, running) is not at the cursor 5"),
    (half_a_fork, "forked_from_run and forked_from_step go together"),
    (fork_beyond_the_steps, "forked_from_step 7 is not a step of the run (it has 7)"),
    (surrogate_goal, "run goal: not text a database can hold (surrogates not allowed"),
    (surrogate_event_detail, "event 2 detail: not text a database can hold"),
    (no_hash, "no content hash: manifest.sha256 is missing"),
    (lambda doc: b"", "the document is empty"),
    (lambda doc: b"\xff\xfe{}", "not UTF-8 text"),
    (lambda doc: [doc], "not a harness run export (format 'list'"),
]


@pytest.mark.parametrize(("mangle", "message"), CASES, ids=[c[0].__name__ for c in CASES])
def test_a_bad_document_is_refused_and_writes_nothing(
    document: Doc, sqlite_store: SQLStore, mangle: Callable[[Doc], Any], message: str
) -> None:
    bad = mangle(copy.deepcopy(document))
    source = bad if isinstance(bad, bytes) else json.dumps(bad)
    with pytest.raises(BadArchive) as raised:
        archive.import_run(sqlite_store, source)
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)
    assert set(row_counts(sqlite_store).values()) == {0}


def test_the_untouched_document_imports(document: Doc, sqlite_store: SQLStore) -> None:
    """The cases above fail for their edit, not for the fixture."""
    assert archive.import_run(sqlite_store, json.dumps(document)).imported


def test_the_hash_ignores_layout_and_covers_the_manifest(document: Doc) -> None:
    assert archive.validate(archive.dumps(document, compact=True))
    assert archive.validate(archive.dumps(document))
    other = copy.deepcopy(document)
    other["manifest"]["harness_version"] = "9.9.9"
    assert archive.content_hash(other) != document["manifest"]["sha256"]


def test_the_document_names_every_column() -> None:
    """A column a migration adds must be given a place in the format (an
    optional field, or a new schema_version) before it can be exported.
    Columns that only say where a value is stored (a blob) are not exported:
    the value travels inline."""
    names: dict[type[BaseModel], Table] = {
        archive.RunDoc: schema.runs,
        archive.StepDoc: schema.steps,
        archive.EventDoc: schema.events,
        archive.ToolRecordDoc: schema.tool_results,
    }
    for model, table in names.items():
        columns = {c.name for c in table.c} - ({"id"} if table is schema.events else set())
        columns -= set(schema.STORAGE_COLUMNS.get(table.name, ()))
        assert set(model.model_fields) == columns, table.name


# -- the command line ---------------------------------------------------------------


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("HARNESS_DATABASE_URL", f"sqlite:///{tmp_path / 'a.db'}")
    monkeypatch.setenv("HARNESS_HOME", str(tmp_path / ".harness"))
    return tmp_path


def cli(*args: str, stdin: bytes | None = None) -> Result:
    return CliRunner().invoke(main, list(args), input=stdin)


def use_database(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    monkeypatch.setenv("HARNESS_DATABASE_URL", url)
    api.reset_runtime()


def test_export_then_import_into_another_store(env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_id = finished_run(api.runtime().store)
    shown = cli("show", run_id, "--json")
    exported = cli("export", run_id)
    assert exported.exit_code == 0, exported.output
    assert json.loads(exported.stdout)["manifest"]["counts"]["steps"] == 7
    assert cli("export", run_id, "--output", str(env / "run.json")).exit_code == 0
    assert not (env / "run.json.partial").exists()

    use_database(monkeypatch, f"sqlite:///{env / 'b.db'}")
    first = cli("import", str(env / "run.json"), "--json")
    assert first.exit_code == 0, first.output
    assert json.loads(first.stdout) == {"run_id": run_id, "imported": True}
    second = cli("import", "-", stdin=exported.stdout_bytes)
    assert (second.exit_code, second.stdout) == (0, f"{run_id} already imported (completed)\n")
    assert cli("show", run_id, "--json").stdout == shown.stdout


def test_cli_errors_are_one_line(env: Path) -> None:
    assert_one_line_error(cli("export", "no-such-run"), "no run with id 'no-such-run'")
    assert_one_line_error(cli("import", str(env / "missing.json")), "cannot read")
    (env / "cut.json").write_text('{"format": "harness-run", "schema_ver')
    assert_one_line_error(cli("import", str(env / "cut.json")), "not valid JSON at line 1")


def test_export_to_an_unwritable_place_is_one_line_and_leaves_nothing(env: Path) -> None:
    run_id = finished_run(api.runtime().store)
    missing = env / "nonexistent" / "x.json"
    assert_one_line_error(
        cli("export", run_id, "-o", str(missing)), f"cannot write {missing}: No such file"
    )
    (env / "out").mkdir()
    before = set(env.iterdir())
    assert_one_line_error(cli("export", run_id, "-o", str(env / "out")), "Is a directory")
    assert set(env.iterdir()) == before and not any((env / "out").iterdir())
    assert cli("export", run_id, "-o", str(env / "out" / "run.json")).exit_code == 0
    assert [p.name for p in (env / "out").iterdir()] == ["run.json"]  # no temporary file left
