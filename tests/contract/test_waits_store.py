"""The store's Waits part on every backend: a deferred step's answer written
beside the version (the first wins, a signal taken once, a child's usage
added, a waiting run nudged), kept signals, children, due waits and counts.

Runs are inserted as a worker would have left them (``create_run`` with
their steps), so each rule is seen on the store alone, with no engine.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from sqlalchemy import func, select

from harness.engine import transitions
from harness.engine.transitions import waits as tw
from harness.records import (
    JSON,
    ParentRef,
    Run,
    RunStatus,
    Step,
    StepKind,
    StepStatus,
    Wait,
    WaitKind,
)
from harness.runs import archive
from harness.runs.prune import prune
from harness.store import Checkpoint, Completion, RunPatch, SignalDraft, Store, schema
from harness.store.memory import MemoryStore
from harness.store.sql import SQLStore
from tests.seeding import DAY

NOW = 1_000_000.0
R = RunStatus
S = StepStatus


def _step(
    run_id: str, index: int, status: StepStatus, wait: Wait | None = None, *, turn: int = -1
) -> Step:
    """A tool call, or (``turn`` given) a model turn."""
    if turn >= 0:
        return Step(run_id, index, StepKind.MODEL, status, attempts=1, args={"turn": turn})
    return Step(
        run_id, index, StepKind.TOOL, status, attempts=1, tool="ship", args={"n": index}, wait=wait
    )


def insert(
    store: Store,
    run_id: str,
    status: RunStatus = R.WAITING,
    *,
    deferred: Sequence[int] = (1,),
    wait: Wait | None = None,
    wake_at: float | None = NOW + 60,
    steps: int = 3,
    **fields: Any,
) -> Run:
    """A run whose model turn 0 asked for tool calls 1..steps-2, ``deferred``
    of them deferred (on ``wait``), standing at model step ``steps - 1``."""
    wait = wait or Wait(WaitKind.CALLBACK, NOW + 60, 60.0)
    rows = []
    for i in range(steps):
        last = i == steps - 1
        status_i = S.PENDING if last else S.DEFERRED if i in deferred else S.DONE
        turn = 0 if i == 0 else 1 if last else -1
        rows.append(_step(run_id, i, status_i, wait if i in deferred else None, turn=turn))
    run, _ = transitions.new_run(run_id, "agent", "goal", NOW)
    run = replace(
        run,
        status=status,
        cursor=steps - 1,
        step_count=steps,
        deferred_from=min(deferred) if deferred else None,
        **fields,
    )
    _, inserted = store.create_run(run, rows, wake_at or 0.0, transitions.created(run))
    assert inserted
    if wake_at is None:  # a run waiting on an operator has no wake-up
        patch(store, run_id, wake_at=None)
    return store.load(run_id)


def patch(store: Store, run_id: str, **values: Any) -> None:
    """Columns a new run is not inserted with, written as a checkpoint would."""
    run = store.load(run_id)
    store.checkpoint(Checkpoint(run_id, run.version, "t", NOW, run=RunPatch(**values)))


def done(
    run_id: str,
    index: int = 1,
    *,
    result: JSON = None,
    error: str | None = None,
    signal: int | None = None,
    usage: tuple[int, int, float] | None = None,
    by: str = "test",
    now: float = NOW + 5,
) -> Completion:
    step = _step(run_id, index, S.DEFERRED)
    return tw.answer(
        step,
        result=result,
        error=error,
        by=by,
        worker="w",
        now=now,
        signal=signal,
        usage=usage,
    )


def step_at(store: Store, run_id: str, index: int) -> Step:
    return store.steps(run_id, index, 1)[0]


def keep(store: Store, run_id: str, name: str = "paid", sid: str | None = None) -> int | None:
    return store.keep_signal(SignalDraft(run_id, name, {"n": 1}, None, sid, NOW))


# -- complete_deferred --------------------------------------------------------------


def test_the_first_answer_wins_and_a_second_matches_nothing(store: Store) -> None:
    insert(store, "r1")
    before = store.load("r1")
    assert store.complete_deferred(done("r1", result={"tracking": "T1"}))
    assert not store.complete_deferred(done("r1", result={"tracking": "T2"}))
    step = step_at(store, "r1", 1)
    assert (step.status, step.result, step.error) == (S.DONE, {"tracking": "T1"}, None)
    assert step.finished_at == NOW + 5
    assert step.wait is not None and step.wait.kind is WaitKind.CALLBACK  # kept, answered
    after = store.load("r1")
    assert after.version == before.version  # beside the version: nobody fenced
    answers = [e for e in store.events("r1") if e.step_index == 1]
    assert [(e.to_status, e.from_status, e.detail) for e in answers] == [
        ("done", "deferred", "test")
    ]
    assert answers[0].version == before.version


def test_an_error_answer_fails_the_step_without_a_result(store: Store) -> None:
    insert(store, "r1")
    assert store.complete_deferred(done("r1", result={"x": 1}, error="refused"))
    step = step_at(store, "r1", 1)
    assert (step.status, step.result, step.error) == (S.FAILED, None, "refused")


def test_a_step_not_deferred_takes_no_answer(store: Store) -> None:
    insert(store, "r1", R.RUNNING, deferred=(), wake_at=NOW + 30, steps=3)
    # step 1 done, step 2 the pending model step
    assert not store.complete_deferred(done("r1", 1, result={"x": 1}))
    assert not store.complete_deferred(done("r1", 2, result={"x": 1}))
    assert not store.complete_deferred(done("r1", 9, result={"x": 1}))
    assert not store.complete_deferred(done("nope", 1, result={"x": 1}))
    assert step_at(store, "r1", 1).result is None
    assert [e for e in store.events("r1") if e.step_index is not None] == []


def test_an_ended_run_takes_no_answer(store: Store) -> None:
    for status in (R.CANCELLED, R.FAILED, R.COMPLETED):
        run_id = f"r-{status.value}"
        insert(store, run_id, status, wake_at=None)
        assert not store.complete_deferred(done(run_id, result={"x": 1}))
        assert step_at(store, run_id, 1).status is S.DEFERRED


def test_a_signal_is_taken_once_and_a_second_taker_writes_nothing(store: Store) -> None:
    insert(store, "r1", deferred=(1, 3), steps=5)
    kept = keep(store, "r1")
    assert kept is not None
    assert store.complete_deferred(done("r1", 1, result={"n": 1}, signal=kept))
    assert not store.complete_deferred(done("r1", 3, result={"n": 1}, signal=kept))
    assert step_at(store, "r1", 3).status is S.DEFERRED  # not even the step
    assert step_at(store, "r1", 3).result is None
    assert [e.step_index for e in store.events("r1") if e.step_index is not None] == [1]
    assert store.kept_signals("r1") == []


def test_a_signal_that_does_not_exist_refuses_the_whole_answer(store: Store) -> None:
    insert(store, "r1")
    assert not store.complete_deferred(done("r1", result={"n": 1}, signal=12345))
    assert step_at(store, "r1", 1).status is S.DEFERRED


def test_a_childs_usage_is_added_to_the_parents(store: Store) -> None:
    insert(store, "r1")
    patch(store, "r1", input_tokens=10, output_tokens=5, cost_usd=0.25)
    assert store.complete_deferred(done("r1", result="x", usage=(100, 50, 0.5)))
    run = store.load("r1")
    assert (run.input_tokens, run.output_tokens, run.cost_usd) == (110, 55, 0.75)
    assert not store.complete_deferred(done("r1", result="x", usage=(100, 50, 0.5)))
    assert store.load("r1").input_tokens == 110  # the loser added nothing


def test_a_waiting_run_with_a_wake_up_is_nudged_to_now(store: Store) -> None:
    insert(store, "waits", wake_at=NOW + 3600)
    assert store.complete_deferred(done("waits", result=1, now=NOW + 7))
    assert store.load("waits").wake_at == NOW + 7


def test_a_run_without_a_wake_up_or_not_waiting_keeps_its_own(store: Store) -> None:
    insert(store, "operator", wake_at=None)  # waiting on an operator: no wake_at
    assert store.complete_deferred(done("operator", result=1))
    assert store.load("operator").wake_at is None
    insert(store, "moving", R.RUNNING, wake_at=NOW + 30)
    assert store.complete_deferred(done("moving", result=1))
    assert store.load("moving").wake_at == NOW + 30


def test_a_large_answer_is_stored_whole(store: Store) -> None:
    insert(store, "r1")
    big = {"text": "x" * 200_000}
    assert store.complete_deferred(done("r1", result=big))
    assert step_at(store, "r1", 1).result == big


# -- kept signals ------------------------------------------------------------------


def test_a_senders_id_is_kept_once_per_run(store: Store) -> None:
    insert(store, "r1")
    insert(store, "r2")
    first = keep(store, "r1", sid="tx-1")
    assert first is not None
    assert keep(store, "r1", sid="tx-1") is None  # the sender's retry
    assert keep(store, "r1", "other", sid="tx-1") is None  # the id, whatever the name
    assert keep(store, "r2", sid="tx-1") is not None  # another run's own
    assert [s.id for s in store.kept_signals("r1")] == [first]


def test_signals_without_an_id_never_collide(store: Store) -> None:
    insert(store, "r1")
    ids = [keep(store, "r1") for _ in range(3)]
    assert None not in ids and len(set(ids)) == 3


def test_kept_signals_are_oldest_first_and_taken_ones_leave(store: Store) -> None:
    insert(store, "r1", deferred=(1, 3), steps=5)
    a = keep(store, "r1", "paid", sid="a")
    b = store.keep_signal(SignalDraft("r1", "shipped", None, "lost", None, NOW + 1))
    c = keep(store, "r1", "paid", sid="c")
    kept = store.kept_signals("r1")
    assert [s.id for s in kept] == [a, b, c]
    assert [(s.name, s.data, s.error, s.signal_id) for s in kept] == [
        ("paid", {"n": 1}, None, "a"),
        ("shipped", None, "lost", None),
        ("paid", {"n": 1}, None, "c"),
    ]
    assert all(s.run_id == "r1" for s in kept)
    assert store.complete_deferred(done("r1", 1, result={"n": 1}, signal=b))
    assert [s.id for s in store.kept_signals("r1")] == [a, c]
    assert store.kept_signals("r2") == []


# -- children, due waits, counts -----------------------------------------------------


def test_children_are_the_runs_a_runs_steps_started(store: Store) -> None:
    insert(store, "p")
    insert(store, "p:3", R.RUNNING, deferred=(), parent=ParentRef("p", 3))
    insert(store, "p:1", R.COMPLETED, deferred=(), parent=ParentRef("p", 1))
    insert(store, "other:1", R.RUNNING, deferred=(), parent=ParentRef("other", 1))
    children = store.children("p")
    assert [(c.run_id, c.parent) for c in children] == [
        ("p:1", ParentRef("p", 1)),
        ("p:3", ParentRef("p", 3)),
    ]
    assert store.children("p:1") == []


def test_due_waits_are_waiting_runs_on_deferred_steps_past_their_wake_up(store: Store) -> None:
    insert(store, "due", wake_at=NOW - 10)
    insert(store, "earlier", wake_at=NOW - 20)
    insert(store, "later", wake_at=NOW + 10)
    insert(store, "moving", R.RUNNING, wake_at=NOW - 10)
    insert(store, "paused", R.PAUSED, wake_at=NOW - 10)
    # a run waiting on an approval: no deferred_from, even when its wake_at passed
    insert(store, "approval", deferred=(), wake_at=NOW - 10)
    insert(store, "operator", wake_at=None)
    assert [r.run_id for r in store.due_waits(NOW)] == ["earlier", "due"]
    assert [r.run_id for r in store.due_waits(NOW, limit=1)] == ["earlier"]
    assert store.due_waits(NOW - 20) == []  # strictly before now


def test_wait_counts_are_deferred_steps_by_kind_and_kept_signals(store: Store) -> None:
    assert store.wait_counts() == {"signals_kept": 0}
    insert(store, "cb", deferred=(1, 3), steps=5)
    insert(store, "sig", wait=Wait(WaitKind.SIGNAL, NOW + 60, 60.0, signal="paid"))
    insert(store, "nap", R.RUNNING, wait=Wait(WaitKind.SLEEP, NOW + 60, 60.0))
    insert(store, "kid", wait=Wait(WaitKind.CHILD, None, None, child="kid:1"))
    insert(store, "gone", R.CANCELLED, wake_at=None)  # an ended run's waits count no more
    keep(store, "sig", "early")
    taken = keep(store, "cb")
    keep(store, "cb")
    assert store.complete_deferred(done("cb", 3, result=1, signal=taken))
    assert store.wait_counts() == {
        "callback": 1,
        "signal": 1,
        "sleep": 1,
        "child": 1,
        "signals_kept": 2,
    }


# -- export, import and prune --------------------------------------------------------


def signal_rows(store: Store, run_id: str) -> int:
    """The run's signal rows, taken or not."""
    if isinstance(store, MemoryStore):
        return store.table_sizes(run_id)["harness_signals"]
    assert isinstance(store, SQLStore)
    query = select(func.count()).select_from(schema.signals)
    with store.engine.connect() as conn:
        return int(conn.execute(query.where(schema.signals.c.run_id == run_id)).scalar_one())


def _with_signals(store: Store, run_id: str) -> int:
    """A waiting run with three signals kept, the second taken by its step 1."""
    insert(store, run_id, deferred=(1, 3), steps=5)
    keep(store, run_id, "paid", sid="tx-1")
    taken = store.keep_signal(SignalDraft(run_id, "shipped", None, "lost", None, NOW + 1))
    keep(store, run_id, "paid")
    assert store.complete_deferred(done(run_id, 1, result={"n": 1}, signal=taken))
    assert taken is not None
    return taken


def test_a_runs_signals_travel_in_its_export_and_are_imported(store: Store) -> None:
    _with_signals(store, "r1")
    document = archive.export_run(store, "r1")
    carried = document["signals"]
    assert isinstance(carried, list)
    assert [
        (s["name"], s["signal_id"], s["data"], s["error"], s["taken_step"]) for s in carried
    ] == [  # type: ignore[index]
        ("paid", "tx-1", {"n": 1}, None, None),
        ("shipped", None, None, "lost", 1),
        ("paid", None, {"n": 1}, None, None),
    ]
    assert document["manifest"]["counts"]["signals"] == 3  # type: ignore[index, call-overload]
    kept = [(s.name, s.signal_id, s.data) for s in store.kept_signals("r1")]
    store.reset()
    imported = archive.import_run(store, document, now=NOW + 100)
    assert imported.imported
    assert [(s.name, s.signal_id, s.data) for s in store.kept_signals("r1")] == kept
    assert signal_rows(store, "r1") == 3
    assert keep(store, "r1", sid="tx-1") is None  # the sender's id still known here
    # waiting on its calls: due at once, so the sweeper looks at its timeouts
    assert store.load("r1").wake_at == NOW + 100
    again = archive.import_run(store, document, now=NOW + 200)
    assert not again.imported  # the same content, signals included
    reexported = archive.export_run(store, "r1")
    assert reexported["signals"] == document["signals"]


def test_a_run_without_signals_exports_as_before_them(store: Store) -> None:
    insert(store, "r1")
    document = archive.export_run(store, "r1")
    assert "signals" not in document
    assert set(document["manifest"]["counts"]) == {"steps", "events", "tool_records"}  # type: ignore[call-overload]


def test_prune_deletes_a_runs_signals_taken_or_not(store: Store) -> None:
    for run_id in ("old", "live"):
        _with_signals(store, run_id)
    patch(store, "old", status=R.COMPLETED, wake_at=None)
    report = prune(store, 30 * DAY, NOW + 40 * DAY)
    assert report.runs == {"completed": 1}
    assert signal_rows(store, "old") == 0
    assert store.kept_signals("old") == []
    assert signal_rows(store, "live") == 3


# -- races -------------------------------------------------------------------------


def _race_one_answer(store: SQLStore, run_id: str) -> list[bool]:
    """A completion and a timeout of ``run_id``'s step 1, released at once."""
    gate = threading.Barrier(2)
    won = [False, False]

    def answer(i: int) -> None:
        gate.wait()
        error = "timed out" if i else None
        won[i] = store.complete_deferred(
            done(run_id, result={"by": i}, error=error, usage=(1, 1, 0.0))
        )

    threads = [threading.Thread(target=answer, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return won


def test_two_threads_racing_one_answer_on_sql_have_one_winner(sql_store: SQLStore) -> None:
    """Two answerers at once (a callback and a timeout, say) on one SQL store:
    exactly one write wins, whatever the interleaving, and one event says so."""
    for n in range(8):
        run_id = f"race-{n}"
        insert(sql_store, run_id, wake_at=NOW + 60)
        won = _race_one_answer(sql_store, run_id)
        assert sorted(won) == [False, True], won
        step = step_at(sql_store, run_id, 1)
        assert step.status is (S.FAILED if won[1] else S.DONE)
        assert [e.step_index for e in sql_store.events(run_id) if e.step_index == 1] == [1]
        assert sql_store.load(run_id).input_tokens == 1
