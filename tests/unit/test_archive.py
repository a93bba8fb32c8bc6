"""The export document's checks, and ``harness export`` / ``harness import``.

Every malformed document is refused with one clear line and nothing written:
truncated, tampered, from a newer harness, of another format, with counts
that lie, rows of another run, unknown fields, wrong types, gaps.
"""

from __future__ import annotations

import contextlib
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
from harness.runs import archive
from harness.runs import document as sections
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


def _signal(doc: Doc, **over: Any) -> Doc:
    row = {
        "run_id": doc["run"]["run_id"],
        "name": "paid",
        "signal_id": None,
        "data": {"forged": True},
        "error": None,
        "created_at": 1.0,
        "taken_step": None,
        "taken_at": None,
        **over,
    }
    doc["signals"] = [row]
    doc["manifest"]["counts"]["signals"] = 1
    return rehashed(doc)


def foreign_signal(doc: Doc) -> Doc:
    """A kept signal for another run, which the import would hand to it."""
    return _signal(doc, run_id="victim")


def signal_as_an_early_answer_of_no_step(doc: Doc) -> Doc:
    return _signal(doc, name="@someone")


def child_of_another_id(doc: Doc) -> Doc:
    """A run that claims a parent whose child it cannot be (its id is not the parent's)."""
    doc["run"]["parent_run"] = "boss"
    doc["run"]["parent_step"] = 3
    return rehashed(doc)


def waits_on_anothers_child(doc: Doc) -> Doc:
    """A call that says it waited on a child it did not start: its end is another's."""
    doc["steps"][1]["wait"] = {"kind": "child", "until": None, "child": "boss:1"}
    return rehashed(doc)


def half_a_parent(doc: Doc) -> Doc:
    doc["run"]["parent_run"] = "boss"
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


def nested(depth: int) -> Any:
    value: Any = "bottom"
    for _ in range(depth):
        value = {"a": value}
    return value


def nul_goal(doc: Doc) -> Doc:
    doc["run"]["goal"] = "a\x00b"  # PostgreSQL's text cannot hold it
    return rehashed(doc)


def nul_step_error(doc: Doc) -> Doc:
    doc["steps"][1]["error"] = "broken\x00"
    return rehashed(doc)


def nul_event_detail(doc: Doc) -> Doc:
    doc["events"][2]["detail"] = "\x00"
    return rehashed(doc)


def nul_record_tool(doc: Doc) -> Doc:
    doc["tool_records"][0]["tool"] = "archive\x00echo"
    return rehashed(doc)


def huge_version(doc: Doc) -> Doc:
    doc["run"]["version"] = 2**40
    return rehashed(doc)


def attempts_past_the_column(doc: Doc) -> Doc:
    doc["steps"][2]["attempts"] = 2**31  # PostgreSQL's integer stops at 2**31 - 1
    return rehashed(doc)


def event_version_past_the_column(doc: Doc) -> Doc:
    doc["events"][4]["version"] = 2**31
    return rehashed(doc)


def negative_tokens(doc: Doc) -> Doc:
    doc["run"]["input_tokens"] = -1
    return rehashed(doc)


def far_future(doc: Doc) -> Doc:
    doc["run"]["created_at"] = 1e15
    return rehashed(doc)


def before_1970(doc: Doc) -> Doc:
    doc["steps"][1]["started_at"] = -5.0
    return rehashed(doc)


def absurd_cost(doc: Doc) -> Doc:
    doc["run"]["cost_usd"] = 1e300
    return rehashed(doc)


def zero_token_budget(doc: Doc) -> Doc:
    doc["run"]["max_tokens"] = 0  # `harness resume` raises a budget to at least 1
    return rehashed(doc)


def deep_result(doc: Doc) -> Doc:
    doc["steps"][1]["result"] = nested(65)
    return rehashed(doc)


def deep_record(doc: Doc) -> Doc:
    doc["tool_records"][1]["result"] = [nested(900)]
    return rehashed(doc)


def nan_in_result(doc: Doc) -> Doc:
    doc["steps"][1]["result"] = {"payload": {"n": float("nan")}}  # json.dumps writes NaN
    return rehashed(doc)


def huge_int_in_args(doc: Doc) -> Doc:
    doc["steps"][1]["args"] = {"payload": 10**1200}
    return rehashed(doc)


def model_turn_not_a_number(doc: Doc) -> Doc:
    doc["steps"][2]["args"] = {"turn": "one"}
    return rehashed(doc)


def model_step_approved(doc: Doc) -> Doc:
    doc["steps"][2]["approval"] = {"decision": "approved", "by": "op", "at": 1.0}
    return rehashed(doc)


def empty_approval(doc: Doc) -> Doc:
    doc["steps"][1]["approval"] = {}
    return rehashed(doc)


def rejected_yet_done(doc: Doc) -> Doc:
    doc["steps"][1]["approval"] = {"decision": "rejected", "by": "op", "at": 1.0}
    return rehashed(doc)


def _moving_at_step_5(doc: Doc, status: str, at_cursor: str) -> Doc:
    """The run as if stopped at its third call (step 5), the final turn (6) to come."""
    doc["run"].update(status=status, cursor=5, result=None)
    doc["steps"][5].update(status=at_cursor, result=None, finished_at=None)
    doc["steps"][6].update(status="pending", result=None, started_at=None, finished_at=None)
    doc["steps"][6]["attempts"] = 0
    doc["tool_records"].pop()
    doc["manifest"]["counts"]["tool_records"] -= 1
    return rehashed(doc)


def running_in_doubt(doc: Doc) -> Doc:
    return _moving_at_step_5(doc, "running", "in_doubt")


def waiting_on_a_pending_step(doc: Doc) -> Doc:
    return _moving_at_step_5(doc, "waiting", "pending")


def paused_awaiting_approval(doc: Doc) -> Doc:
    return _moving_at_step_5(doc, "paused", "awaiting_approval")


def done_after_the_cursor(doc: Doc) -> Doc:
    doc["run"].update(status="cancelled", cursor=3)
    for i in (3, 4, 6):
        doc["steps"][i]["status"] = "pending"
    return rehashed(doc)


def a_later_turn_before_its_calls(doc: Doc) -> Doc:
    _moving_at_step_5(doc, "running", "pending")
    doc["steps"][5], doc["steps"][6] = doc["steps"][6], doc["steps"][5]
    doc["steps"][5]["idx"], doc["steps"][6]["idx"] = 5, 6
    return rehashed(doc)


def deep_document() -> bytes:
    return b'{"format": "harness-run", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"


def huge_integer_literal(doc: Doc) -> bytes:
    text = archive.dumps(doc).decode()
    return text.replace('"attempts": 1', '"attempts": ' + "1" * 5000, 1).encode()


CASES: list[tuple[Callable[[Doc], Any], str]] = [
    (truncated, "not valid JSON at line "),
    (tampered, "tampered or corrupted: the content hash does not match the manifest"),
    (newer, "written by a newer harness: schema_version 2, this one reads 1"),
    (other_format, "not a harness run export (format 'langgraph-checkpoint'"),
    (lying_counts, "counts do not match: the manifest says 14 events, the document has 13"),
    (foreign_event, "event 3 belongs to run 'someone-else', not 'run-archive'"),
    (foreign_signal, "signal 0 belongs to run 'victim', not 'run-archive'"),
    (signal_as_an_early_answer_of_no_step, "signals.0.name: may not start with '@'"),
    (child_of_another_id, "a child run's id is its parent's and step's, boss:3"),
    (half_a_parent, "run.parent_run and run.parent_step go together"),
    (waits_on_anothers_child, "steps.1.wait: a call waits only on the child it started"),
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
    (
        unsettled_before_cursor,
        "step 3 (tool, in_doubt) is before the cursor 7: not done, failed or deferred",
    ),
    (running_off_cursor, "step 6 (model, running) is not at the cursor 5"),
    (half_a_fork, "forked_from_run and forked_from_step go together"),
    (fork_beyond_the_steps, "forked_from_step 7 is not a step of the run (it has 7)"),
    (surrogate_goal, "run.goal: contains a lone surrogate (at 1), which no column can hold"),
    (surrogate_event_detail, "events.2.detail: contains a lone surrogate (at 0)"),
    (nul_goal, "run.goal: contains a NUL character (at 1), which no column can hold"),
    (nul_step_error, "steps.1.error: contains a NUL character (at 6)"),
    (nul_event_detail, "events.2.detail: contains a NUL character (at 0)"),
    (nul_record_tool, "tool_records.0.tool: contains a NUL character (at 7)"),
    (huge_version, "run.version: Input should be less than or equal to 2147483647"),
    (attempts_past_the_column, "steps.2.attempts: Input should be less than or equal to 21474"),
    (event_version_past_the_column, "events.4.version: Input should be less than or equal to"),
    (negative_tokens, "run.input_tokens: Input should be greater than or equal to 0"),
    (far_future, "run.created_at: Input should be less than or equal to 4102444800"),
    (before_1970, "steps.1.started_at: Input should be greater than or equal to 0"),
    (absurd_cost, "run.cost_usd: Input should be less than or equal to"),
    (zero_token_budget, "run.max_tokens: Input should be greater than or equal to 1"),
    (deep_result, "steps.1.result: nested deeper than 64 levels"),
    (deep_record, "tool_records.1.result: nested deeper than 64 levels"),
    (nan_in_result, "steps.1.result: at payload.n: nan is not a JSON number"),
    (huge_int_in_args, "steps.1.args: at payload: an integer of more than 1000 digits"),
    (model_turn_not_a_number, 'step 2 (model, done): its arguments must be {"turn": N}'),
    (model_step_approved, "step 2 (model, done) carries an approval: only a tool call has one"),
    (empty_approval, "steps.1.approval.decision: Field required"),
    (rejected_yet_done, "step 1 (tool, done) was rejected, yet done"),
    (running_in_doubt, "a running run's step at its cursor 5 is in_doubt: "),
    (waiting_on_a_pending_step, "a waiting run's step at its cursor 5 is pending: "),
    (paused_awaiting_approval, "a paused run's step at its cursor 5 is awaiting_approval: "),
    (done_after_the_cursor, "step 5 (tool, done) is after the cursor 3: not pending"),
    (a_later_turn_before_its_calls, "step 5 (model, pending) is not the run's last step"),
    (lambda doc: deep_document(), "nested too deeply to read"),
    (huge_integer_literal, "not valid JSON: Exceeds the limit (4300 digits)"),
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
    the value travels inline; nor are those that are the store's own (a run's
    incarnation), which an import makes afresh."""
    names: dict[type[BaseModel], Table] = {
        sections.RunDoc: schema.runs,
        sections.StepDoc: schema.steps,
        sections.EventDoc: schema.events,
        sections.ToolRecordDoc: schema.tool_results,
        sections.SignalDoc: schema.signals,
    }
    assigned = {schema.events.name, schema.signals.name}  # ids the importing store gives
    for model, table in names.items():
        columns = {c.name for c in table.c} - ({"id"} if table.name in assigned else set())
        columns -= set(schema.STORAGE_COLUMNS.get(table.name, ()))
        columns -= set(schema.LOCAL_COLUMNS.get(table.name, ()))
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


def test_import_of_deeply_nested_json_is_one_line(env: Path) -> None:
    """Nesting deeper than the JSON reader can follow is an error, not a
    RecursionError traceback, however deep."""
    for depth in (1_000, 100_000):
        path = env / f"deep{depth}.json"
        path.write_bytes(b"[" * depth + b"]" * depth)
        assert_one_line_error(cli("import", str(path)), "nested too deeply to read")
        deep_in_place = b'{"format": "harness-run", "steps": ' + b"[" * depth + b"]" * depth + b"}"
        assert_one_line_error(cli("import", "-", stdin=deep_in_place), "nested too deeply")


def test_a_document_given_as_an_object_must_be_json(document: Doc, sqlite_store: SQLStore) -> None:
    """In Python the document may be a dict: what JSON cannot say in it is
    refused like a bad file, with the field named, never a TypeError. (A
    tuple or a number key is taken as json.dumps writes it: harness.inputs.)"""
    cases: list[tuple[Callable[[Doc], Any], str]] = [
        (lambda d: d["steps"][1].update(result={"ids": {1, 2}}), "not JSON"),
        (lambda d: d["steps"][1].update(result={1: "one", "b": 2}), "not JSON"),
        (lambda d: d["steps"][1].update(result={(1, 2): "pair"}), "not JSON"),
        (lambda d: d["steps"][1].update(result={"n": float("inf")}), "at n: inf is not a JSON"),
        (lambda d: d["steps"][1].update(result=nested(2_000)), "nested deeper than 64"),
    ]
    for mangle, message in cases:
        bad = copy.deepcopy(document)
        mangle(bad)
        # A forger could not hash some of them either: the import must still say why.
        with contextlib.suppress(TypeError, ValueError, RecursionError):
            bad["manifest"]["sha256"] = archive.content_hash(bad)
        with pytest.raises(BadArchive) as raised:
            archive.import_run(sqlite_store, bad)
        assert message in str(raised.value)
    assert set(row_counts(sqlite_store).values()) == {0}


def test_values_at_the_limits_import(document: Doc, sqlite_store: SQLStore) -> None:
    """The bounds are the columns' and the readers', not tighter: the largest
    integer a column holds, times from 0, a NUL inside a JSON string (JSON
    escapes it), a result nested exactly 64 deep."""
    doc = copy.deepcopy(document)
    doc["run"].update(input_tokens=2**31 - 1, version=2**31 - 1, created_at=0.0)
    doc["events"][0]["version"] = 2**31 - 1
    doc["steps"][1]["result"] = {"text": "a\x00b", "deep": nested(63)}
    doc["tool_records"][0]["result"] = doc["steps"][1]["result"]
    archive.import_run(sqlite_store, rehashed(doc))
    run = sqlite_store.load(doc["run"]["run_id"])
    assert (run.version, run.input_tokens) == (2**31 - 1, 2**31 - 1)
    assert sqlite_store.steps(run.run_id)[1].result == doc["steps"][1]["result"]
