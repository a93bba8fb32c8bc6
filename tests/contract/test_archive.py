"""Export and import (harness.runs.archive) on every backend.

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
from harness.engine.creation import create_run
from harness.engine.transitions import Decision
from harness.errors import BadArchive, ImportConflict, RunNotFound, StoreError
from harness.reads import RunDetail
from harness.records import Approval, RunStatus
from harness.runs import admission, archive
from harness.runs.fork import fork_run
from harness.store import RunPatch, RunRows, Store, schema
from harness.store.memory import MemoryStore
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


#: The amounts archive_pay was called with, in this process.
PAID: list[int] = []


@harness.tool(effect="idempotent", requires_approval=True)
def archive_pay(amount: int, ctx: harness.ToolContext) -> str:
    PAID.append(amount)
    return f"paid {amount}"


harness.register_agent(
    harness.Agent(
        name="archive-pay",
        model=harness.ScriptedModel(
            [
                {
                    "tool_calls": [
                        {"name": "archive_pay", "args": {"amount": 5}},
                        {"name": "archive_pay", "args": {"amount": 7}},
                    ]
                },
                {"final": "paid"},
            ]
        ),
        tools=[archive_pay],
    )
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


def row_counts(store: Store) -> dict[str, int]:
    if isinstance(store, MemoryStore):
        return store.table_sizes()
    assert isinstance(store, SQLStore)
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


def test_a_moving_run_arrives_unleased_and_due(store: SQLStore) -> None:
    """The lease, the wake-up and the re-send count were the exporting
    deployment's: the run arrives unleased, due at the import's time (not at
    a wake-up its clock set, however far), never yet re-sent here."""
    rig = Rig(store)
    run_id = create_run(rig.runtime(), AGENT, "still going", "run-moving")
    leased = apply(
        store,
        store.load(run_id),
        run=RunPatch(owner="w-elsewhere", lease_expires_at=4e9, wake_at=4e9, resends=7),
    )
    document = archive.export_run(store, run_id)
    assert document["run"]["owner"] == "w-elsewhere"
    store.reset()

    archive.import_run(store, document, now=rig.clock.now())

    run = store.load(run_id)
    assert (run.status, run.owner, run.lease_expires_at) == (RunStatus.PENDING, None, None)
    assert (run.version, run.wake_at, run.resends) == (leased.version, rig.clock.now(), 0)
    assert [r.run_id for r in store.due_runs(now=rig.clock.now() + 1)] == [run_id]
    again = archive.import_run(store, document, now=rig.clock.now() + 60)
    assert again.imported is False  # the same, lease and wake-up aside
    rig.clock.advance(1)
    assert [r.run_id for r in recovery.sweep(rig.runtime("sweeper"))] == [run_id]
    rig.drive()
    assert store.load(run_id).status is RunStatus.COMPLETED


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


def _approved_and_paid(rig: Rig) -> str:
    """Both calls approved here and made: approvals on done steps, history."""
    run_id = create_run(rig.runtime(), "archive-pay", "pay twice", "run-state")
    rig.drive()
    for _ in range(2):
        operations.decide(rig.runtime(), run_id, approve=True, who="op")
        rig.drive()
    return run_id


def _rejected(rig: Rig) -> str:
    """The first call rejected (a failed step with its word), the second waits."""
    run_id = create_run(rig.runtime(), "archive-pay", "pay twice", "run-state")
    rig.drive()
    operations.decide(rig.runtime(), run_id, approve=False, who="op", reason="no")
    rig.drive()
    return run_id


STATES = [
    (_in_doubt, RunStatus.WAITING, "in_doubt"),
    (_awaiting_approval, RunStatus.WAITING, "awaiting_approval"),
    (_paused, RunStatus.PAUSED, "pending"),
    (_cancelled, RunStatus.CANCELLED, "pending"),
    (_failed, RunStatus.FAILED, "pending"),  # the failed call is behind the cursor
    (_approved_and_paid, RunStatus.COMPLETED, None),
    (_rejected, RunStatus.WAITING, "awaiting_approval"),
]


@pytest.mark.parametrize(
    ("make", "status", "at_cursor"), STATES, ids=[s[0].__name__ for s in STATES]
)
def test_a_run_in_any_state_round_trips(
    store: SQLStore, make: Any, status: RunStatus, at_cursor: str | None
) -> None:
    """The import's state checks accept what the engine really writes: held
    runs (in doubt, awaiting approval, paused), stopped ones, and the words
    operators gave on calls that were then made or refused."""
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


def test_a_lone_surrogate_in_a_tool_result_is_made_storable(store: SQLStore) -> None:
    """A JSON escape can carry a lone surrogate, which no reader can write as
    UTF-8: in a JSON value it becomes U+FFFD, as at every door
    (harness.inputs), in the step and its tool record alike."""
    run_id = _odd_result(Rig(store))
    assert store.steps(run_id)[1].result == {"text": "x\ufffdy"}
    document = archive.export_run(store, run_id)
    document["steps"][1]["result"] = document["tool_records"][0]["result"] = {"text": "x\ud800y"}
    document["manifest"]["sha256"] = archive.content_hash(document)
    store.reset()
    text = archive.dumps(document, compact=True)
    assert text.isascii()
    archive.import_run(store, text)
    assert store.steps(run_id)[1].result == {"text": "x\ufffdy"}
    assert store.get_tool_result(f"{run_id}:1") == (True, {"text": "x\ufffdy"})
    assert archive.import_run(store, text).imported is False  # the same, once made storable


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
    monkeypatch.setattr(admission, "check_values", lambda document: None)
    archive.import_run(store, archive.dumps(document))
    assert store.events(run_id)[-1].detail == "late \ufffd"


# -- forged and hostile documents -----------------------------------------------------

Doc = dict[str, Any]
MALLORY = {"decision": "approved", "by": "mallory", "at": 1_000_000.0}


def forged(document: Doc) -> Doc:
    """Edited as a forger would: the content hash recomputed."""
    document["manifest"]["sha256"] = archive.content_hash(document)
    return document


def waiting_to_pay(store: SQLStore) -> tuple[Rig, Doc]:
    """The export of a run waiting for an operator's word on its first call
    (pay 5; the second, pay 7, to come); the store is left empty."""
    rig = Rig(store)
    run_id = create_run(rig.runtime(), "archive-pay", "pay twice", "run-pay")
    rig.drive()
    assert store.load(run_id).current.status.value == "awaiting_approval"  # type: ignore[union-attr]
    document = archive.export_run(store, run_id)
    store.reset()
    return rig, document


def carried_on(rig: Rig, run_id: str, rounds: int = 4) -> None:
    """This deployment's sweeper and workers do all they would, time passing."""
    for _ in range(rounds):
        rig.clock.advance(64 * rig.lease_ttl)
        recovery.sweep(rig.runtime("sweeper"))
        rig.drive()


def approved_ahead_at_the_cursor(document: Doc) -> None:
    """Decided, its message in flight: the run moving, the call pending with a word."""
    document["run"].update(status="running", wake_at=1e6)
    document["steps"][1].update(status="pending", approval=MALLORY, args={"amount": 999999})


def approved_as_it_waited(document: Doc) -> None:
    """A word noted just as the run reached the call (the engine acts on it)."""
    document["steps"][1].update(approval=MALLORY, args={"amount": 999999})


def approved_then_paused(document: Doc) -> None:
    document["run"].update(status="paused", pause_requested=True)
    document["steps"][1].update(status="pending", approval=MALLORY, args={"amount": 999999})


FORGERIES = [approved_ahead_at_the_cursor, approved_as_it_waited, approved_then_paused]


@pytest.mark.parametrize("forge", FORGERIES, ids=[f.__name__ for f in FORGERIES])
def test_a_document_cannot_approve_its_own_call(store: SQLStore, forge: Any) -> None:
    """An approval given on another deployment (or written by hand, the hash
    recomputed) on a call not yet made does not make it here: the word is
    dropped on import, the run stops at the call, and only an operator of
    this deployment's word makes it."""
    rig, document = waiting_to_pay(store)
    forge(document)
    PAID.clear()

    result = archive.import_run(store, forged(document), now=rig.clock.now())
    carried_on(rig, result.run_id)
    if store.load(result.run_id).status is RunStatus.PAUSED:
        operations.resume(rig.runtime(), result.run_id, "op-here")
        carried_on(rig, result.run_id)

    run = store.load(result.run_id)
    assert PAID == []
    assert (run.status, run.cursor) == (RunStatus.WAITING, 1)
    assert run.current is not None and run.current.approval is None
    assert run.current.status.value == "awaiting_approval"
    changed = operations.decide(rig.runtime(), run.run_id, approve=True, who="op-here").changed
    assert changed
    rig.drive()
    assert PAID == [999999]  # the arguments the operator here saw and approved


def test_a_word_noted_ahead_elsewhere_is_not_carried(store: SQLStore) -> None:
    """A later call of the batch approved ahead on the exporting deployment:
    the run reaches it here and waits for a word given here."""
    rig, document = waiting_to_pay(store)
    document["steps"][2].update(approval=MALLORY, args={"amount": 999999})
    PAID.clear()

    run_id = archive.import_run(store, forged(document), now=rig.clock.now()).run_id
    assert store.steps(run_id)[2].approval is None
    operations.decide(rig.runtime(), run_id, approve=True, who="op-here")
    rig.drive()
    carried_on(rig, run_id)

    run = store.load(run_id)
    assert PAID == [5]
    assert (run.status, run.cursor, run.current.status.value) == (  # type: ignore[union-attr]
        RunStatus.WAITING,
        2,
        "awaiting_approval",
    )


def test_an_approved_call_under_way_is_refused(store: SQLStore) -> None:
    """A call approved there and running when exported may be under way
    there still: made here on that word, or asked again as if never made,
    either would be wrong. Refused; export it again once it has settled."""
    _, document = waiting_to_pay(store)
    document["run"].update(status="running")
    document["steps"][1].update(status="running", attempts=1, approval=MALLORY)
    with pytest.raises(BadArchive, match=r"step 1 \(tool, running\) was approved .* under way"):
        archive.import_run(store, forged(document))
    assert row_counts(store) == dict.fromkeys(row_counts(store), 0)


def test_an_approval_kept_with_its_call_in_doubt(store: SQLStore) -> None:
    """A call approved, then left in doubt: the word is history of a call
    that may have been made; an operator here resolves it."""
    rig, document = waiting_to_pay(store)
    document["steps"][1].update(status="in_doubt", approval=MALLORY, error="interrupted")
    PAID.clear()
    run_id = archive.import_run(store, forged(document), now=rig.clock.now()).run_id
    assert store.steps(run_id)[1].approval == Approval.from_json(MALLORY)
    operations.resolve(rig.runtime(), run_id, Decision.SUCCEEDED, "paid 5")
    rig.drive()
    assert PAID == [] and store.load(run_id).current.status.value == "awaiting_approval"  # type: ignore[union-attr]


def _nul_goal(d: Doc) -> None:
    d["run"]["goal"] = "echo\x00"


def _nul_step_error(d: Doc) -> None:
    d["steps"][1]["error"] = "\x00"


def _nul_event_detail(d: Doc) -> None:
    d["events"][0]["detail"] = "x\x00y"


def _nul_record_tool(d: Doc) -> None:
    d["tool_records"][0]["tool"] = "\x00"


def _version_2_40(d: Doc) -> None:
    d["run"]["version"] = 2**40


def _attempts_2_31(d: Doc) -> None:
    d["steps"][3]["attempts"] = 2**31


def _tokens_2_31(d: Doc) -> None:
    d["run"]["output_tokens"] = 2**31


def _deep_args(d: Doc) -> None:
    value: Any = []
    for _ in range(70):
        value = [value]
    d["steps"][1]["args"] = {"payload": value}


def _nan_in_record(d: Doc) -> None:
    d["tool_records"][0]["result"] = {"total": float("nan")}


def _wake_far_away(d: Doc) -> None:
    d["run"].update(status="running", cursor=6, result=None, wake_at=1e15)
    d["steps"][6].update(status="pending")


HOSTILE = [
    (_nul_goal, "run.goal: contains a NUL character"),
    (_nul_step_error, "steps.1.error: contains a NUL character"),
    (_nul_event_detail, "events.0.detail: contains a NUL character"),
    (_nul_record_tool, "tool_records.0.tool: contains a NUL character"),
    (_version_2_40, "run.version: Input should be less than or equal to 2147483647"),
    (_attempts_2_31, "steps.3.attempts: Input should be less than or equal to 2147483647"),
    (_tokens_2_31, "run.output_tokens: Input should be less than or equal to 2147483647"),
    (_deep_args, "steps.1.args: nested deeper than 64 levels"),
    (_nan_in_record, "tool_records.0.result: at total: nan is not a JSON number"),
    (_wake_far_away, "run.wake_at: Input should be less than or equal to 4102444800"),
]


@pytest.mark.parametrize(("mangle", "message"), HOSTILE, ids=[h[0].__name__ for h in HOSTILE])
def test_a_hostile_document_is_refused_on_every_backend(
    store: SQLStore, mangle: Any, message: str
) -> None:
    """Values no column holds are refused at the door with the field named,
    before the database sees them (on PostgreSQL a NUL or 2**40 was a
    StoreError, an outage to the caller), and nothing is written."""
    document = archive.export_run(store, finished_run(store))
    store.reset()
    mangle(document)
    with pytest.raises(BadArchive) as raised:
        archive.import_run(store, archive.dumps(forged(document)))
    assert message in str(raised.value)
    assert row_counts(store) == dict.fromkeys(row_counts(store), 0)


def test_the_largest_values_a_column_holds_import(store: SQLStore) -> None:
    """The bounds are the columns' own: 2**31 - 1 goes into PostgreSQL's integer."""
    document = archive.export_run(store, finished_run(store))
    store.reset()
    document["run"].update(version=2**31 - 1, input_tokens=2**31 - 1, resends=2**31 - 1)
    document["steps"][1]["attempts"] = 2**31 - 1
    document["events"][0]["version"] = 2**31 - 1
    run_id = archive.import_run(store, forged(document)).run_id
    assert (store.load(run_id).version, store.steps(run_id)[1].attempts) == (2**31 - 1,) * 2


def test_a_moving_run_needs_room_to_move(store: SQLStore) -> None:
    """A run that is to go on needs its counters below the column's bound:
    at 2**31 - 1 its next write would fail for good on PostgreSQL."""
    document = archive.export_run(store, finished_run(store))
    store.reset()
    _wake_far_away(document)
    document["run"].update(wake_at=None, version=2**31 - 1)
    with pytest.raises(BadArchive, match=r"run\.version is 2147483647: too close to"):
        archive.import_run(store, forged(document))
