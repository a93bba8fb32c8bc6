"""A worker's memory of its conversations (harness.engine.transcripts), on
the in-memory store: a turn reads only the steps after the settled ones it
kept, and what it sends is what a whole read would make, turn after turn;
and nothing kept is ever served once the store says otherwise (a run made
again under its id, with or without the same creation time, an export
imported again after a prune, a takeover by a worker that appended steps,
a deferred answer, a late charge), nor kept past its bound."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

import harness
from harness.engine import conversation, transitions, waits
from harness.engine.creation import create_run
from harness.engine.transcripts import History, TranscriptCache, settled, weight
from harness.providers.transcript import exchanges
from harness.records import RunStatus, Step, StepKind, StepStatus
from harness.runs import archive
from harness.runs.prune import prune
from harness.store.memory import MemoryStore
from harness.store.memory import rows as memory_rows
from tests.rig import Rig

#: What each turn's model was sent (through the cache) and what a whole read makes.
SENT: list[tuple[list[Any], list[Any]]] = []


class Witness:
    """Calls a tool on the first turn after each user message, then answers;
    notes the exchanges it was given beside those of a whole read."""

    name = "test:witness"
    records_responses = False

    def __init__(self) -> None:
        self.store: MemoryStore | None = None

    def next_turn(self, request: harness.ModelRequest) -> harness.ModelTurn:
        assert request.exchanges is not None and self.store is not None
        given = request.exchanges()
        steps = MemoryStore.steps(self.store, request.run_id)  # not counted
        whole = exchanges(steps, request.step_index)
        SENT.append((given, whole))
        if given and given[-1].user:
            call = {"name": "fetch", "args": {"n": request.turn}}
            return harness.ModelTurn.from_result({"tool_calls": [call]})
        return harness.ModelTurn(final=f"answer {request.turn}")


@harness.tool(effect="read_only")
def fetch(n: int) -> dict[str, Any]:
    return {"n": n, "body": "x" * 50}


WITNESS = Witness()
harness.register_agent(harness.Agent(name="t-witness", model=WITNESS, tools=[fetch]))


class Counting(MemoryStore):
    """The in-memory store, noting each read of a run's steps (its start)
    while ``counting``."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[int] = []
        self.counting = True

    def steps(self, run_id: str, start: int = 0, limit: int | None = None) -> list[Step]:
        if self.counting:
            self.reads.append(start)
        return super().steps(run_id, start, limit)


@pytest.fixture
def store() -> Iterator[Counting]:
    SENT.clear()
    store = Counting()
    WITNESS.store = store
    yield store
    WITNESS.store = None


def rig_on(store: MemoryStore, cache: TranscriptCache) -> Rig:
    return Rig(store, options={"transcripts": cache})


def converse(rig: Rig, run_id: str, turns: int, worker: str = "w1") -> None:
    """``turns`` messages, each answered; the steps read by the turns (not by
    the sends) counted."""
    store = rig.store
    assert isinstance(store, Counting)
    for n in range(turns):
        store.counting = False
        conversation.send_message(rig.runtime(worker), run_id, f"message {n}")
        store.counting = True
        rig.drive(worker)
        assert rig.load(run_id).status is RunStatus.COMPLETED


def test_a_turn_reads_only_the_steps_after_those_kept(store: Counting) -> None:
    cache = TranscriptCache()
    rig = rig_on(store, cache)
    run_id = create_run(rig.runtime(), "t-witness", "hello")
    rig.drive()
    converse(rig, run_id, 5)
    assert SENT and all(given == whole for given, whole in SENT)
    # The first answer; a message, a call, an answer each turn, but the last answer.
    assert len(SENT[-1][0]) == 1 + 5 * 3 - 1
    assert cache.kept(run_id) == _last_turn(store, run_id)  # every step behind it
    # The first two turns read the run whole (no step was behind the first);
    # each since, from its last kept step on.
    assert store.reads[:2] == [0, 0] and all(start > 0 for start in store.reads[2:])
    assert len(store.reads) == 1 + 5 * 2 and cache.hits == 5 * 2 - 1


def test_another_worker_carries_turns_between(store: Counting) -> None:
    """A takeover: turns carried by a worker with a memory of its own append
    steps this one never saw; its next turn reads them from its last kept step."""
    mine, theirs = TranscriptCache(), TranscriptCache()
    rig = rig_on(store, mine)
    run_id = create_run(rig.runtime(), "t-witness", "hello")
    rig.drive()
    converse(rig, run_id, 2)
    before = mine.kept(run_id)
    converse(rig_on(store, theirs), run_id, 3, worker="w2")
    assert mine.kept(run_id) == before
    SENT.clear()
    converse(rig, run_id, 1)
    assert SENT and all(given == whole for given, whole in SENT)
    assert mine.kept(run_id) == _last_turn(store, run_id)


def _last_turn(store: MemoryStore, run_id: str) -> int:
    """The index of the run's last model step (read uncounted)."""
    return max(s.index for s in MemoryStore.steps(store, run_id) if s.kind is StepKind.MODEL)


def _history(cache: TranscriptCache, store: MemoryStore, run_id: str) -> History:
    return cache.read(store, store.load(run_id))


def _conversation(store: MemoryStore, cache: TranscriptCache, turns: int) -> str:
    rig = rig_on(store, cache)
    run_id = create_run(rig.runtime(), "t-witness", "hello", run_id="same-id")
    rig.drive()
    converse(rig, run_id, turns)
    return run_id


@pytest.mark.parametrize("same_time", [False, True])
def test_a_run_made_again_under_its_id_is_read_whole(store: Counting, same_time: bool) -> None:
    """Pruned (the store wiped) and made again: with another creation time the
    kept steps are dropped at once; with the same one (a fixed clock), the
    last kept step reads otherwise and the run is read whole."""
    cache = TranscriptCache()
    run_id = _conversation(store, cache, 3)
    assert cache.kept(run_id) > 0
    old = store.load(run_id)
    store.reset()
    rig = rig_on(store, cache)
    if same_time:
        rig.clock.t = old.created_at
    rig.clock.t += 0 if same_time else 5
    create_run(rig.runtime(), "t-witness", "another goal", run_id=run_id)
    rig.drive()
    converse(rig, run_id, 3)  # as long, so the count of steps does not tell
    assert store.load(run_id).created_at == old.created_at or not same_time
    history = _history(cache, store, run_id)
    assert history.steps == store.steps(run_id)
    assert all(given == whole for given, whole in SENT)


def test_a_run_with_fewer_steps_than_kept_is_read_whole(store: Counting) -> None:
    cache = TranscriptCache()
    run_id = _conversation(store, cache, 3)
    old = store.load(run_id)
    store.reset()
    rig = rig_on(store, cache)
    rig.clock.t = old.created_at
    create_run(rig.runtime(), "t-witness", "shorter", run_id=run_id)
    store.reads.clear()
    history = _history(cache, store, run_id)
    assert [s.index for s in history.steps] == [0] and store.reads == [0]
    assert cache.kept(run_id) == 0


def test_a_kept_step_that_reads_otherwise_drops_the_run(store: Counting) -> None:
    """The check itself: the last kept step, read again, differs (whatever
    changed it): nothing kept is used, and the run is read whole."""
    cache = TranscriptCache()
    run_id = _conversation(store, cache, 2)
    last = cache.kept(run_id) - 1
    row = store._tables.steps[run_id][last]
    row["error"] = "changed behind the cache's back"
    store.reads.clear()
    history = _history(cache, store, run_id)
    assert store.reads == [last, 0]
    assert history.steps[last].error == "changed behind the cache's back"


def test_steps_that_may_still_change_are_not_kept() -> None:
    base = Step("r", 3, StepKind.TOOL, StepStatus.DONE, result={"ok": 1})
    assert settled(base, 4)
    assert not settled(base, 3) and not settled(base, None)  # at or past the cursor
    for status in (StepStatus.DEFERRED, StepStatus.IN_DOUBT, StepStatus.PENDING):
        assert not settled(replace(base, status=status), 10)  # an answer may still come
    model = Step("r", 3, StepKind.MODEL, StepStatus.FAILED)
    assert not settled(model, 10)  # a late charge may give it its result
    assert settled(replace(model, result={"final": "x"}), 10)


def _put(store: MemoryStore, step: Step) -> None:
    """Write ``step`` as the store holds it (a test's shortcut to a shape)."""
    store._tables.steps[step.run_id][step.index] = memory_rows.step_row(step)


def test_a_deferred_step_behind_the_cursor_is_read_until_answered() -> None:
    """Kept only up to the first step that may change; its answer is read."""
    store = MemoryStore()
    cache = TranscriptCache()
    run, steps = transitions.new_run("d", "t-witness", "goal", 100.0)
    store.create_run(run, steps, 130.0, transitions.created(run))
    _put(store, replace(steps[0], status=StepStatus.DONE, result={"tool_calls": []}))
    tool = Step("d", 1, StepKind.TOOL, StepStatus.DEFERRED, tool="fetch")
    _put(store, tool)
    _put(store, replace(tool, index=2, status=StepStatus.DONE, result=1))
    _put(store, Step("d", 3, StepKind.MODEL, StepStatus.PENDING))
    store._tables.runs["d"] |= {"cursor": 3, "step_count": 4}
    history = _history(cache, store, "d")
    assert history.settled == 1 and cache.kept("d") == 1
    _put(store, replace(tool, status=StepStatus.DONE, result="answered"))
    history = _history(cache, store, "d")
    assert history.steps[1].result == "answered" and cache.kept("d") == 3


def test_the_memory_is_bounded(store: Counting) -> None:
    """By weight (the text of the steps kept): the least recent run goes first,
    and a run heavier than the bound is not kept at all."""
    probe = TranscriptCache()
    rig = rig_on(store, probe)
    first = create_run(rig.runtime(), "t-witness", "one")
    rig.drive()
    converse(rig, first, 2)
    eight = sum(weight(s) for s in MemoryStore.steps(store, first)[:8])
    cache = TranscriptCache(max_weight=eight + eight // 2)
    rig = rig_on(store, cache)
    first = create_run(rig.runtime(), "t-witness", "one")
    second = create_run(rig.runtime(), "t-witness", "two")
    rig.drive()
    converse(rig, first, 2)  # 8 steps behind the last turn
    assert cache.kept(first) == 8
    converse(rig, second, 2)
    assert cache.kept(first) == 0 and cache.kept(second) == 8  # the least recent went
    converse(rig, second, 2)  # 16 steps: too heavy to keep at all
    assert cache.kept(second) == 0
    assert all(given == whole for given, whole in SENT)


#: What the model of each turn after the first was shown of step 1 (a deferred call).
SHOWN: list[Any] = []


@harness.tool(effect="idempotent")
def await_payment() -> harness.Deferred:
    return harness.Deferred(timeout=600, signal="paid")


@harness.tool(effect="read_only")
def quick() -> str:
    return "ok"


class PaymentSpy:
    """Asks for a deferred payment and a quick call, then answers; notes
    what its second turn is shown of the payment's step."""

    records_responses = False

    def next_turn(self, request: harness.ModelRequest) -> harness.ModelTurn:
        if request.turn == 0:
            calls = [{"name": "await_payment", "args": {}}, {"name": "quick", "args": {}}]
            return harness.ModelTurn.from_result({"tool_calls": calls})
        SHOWN.append(next(s.result for s in request.history() if s.index == 1))
        return harness.ModelTurn(final="done")


harness.register_agent(
    harness.Agent(name="t-payment", model=PaymentSpy(), tools=[await_payment, quick])
)


def test_an_export_imported_again_after_a_prune_is_read_whole() -> None:
    """A run waits on its deferred step 1, step 2 done, and is exported; step 1
    is answered A and a worker keeps steps 0-2; the run completes and is
    pruned, the export imported again (its creation time kept, its step
    count the same), and step 1 answered B. The worker's next turn must see
    B: the import is another incarnation, so nothing kept of the first is used."""
    SHOWN.clear()
    store = MemoryStore()
    cache = TranscriptCache()
    rig = rig_on(store, cache)
    run_id = create_run(rig.runtime(), "t-payment", "pay")
    rig.drive()
    assert rig.load(run_id).status is RunStatus.WAITING
    exported = archive.export_run(store, run_id)
    assert "incarnation" not in exported["run"]  # type: ignore[operator]
    waits.signal(rig.runtime(), run_id, "paid", {"tx": "A"})
    rig.drive()
    assert rig.load(run_id).status is RunStatus.COMPLETED
    assert SHOWN == [{"tx": "A"}] and cache.kept(run_id) == 3
    first = store.load(run_id)

    rig.clock.advance(10)
    prune(store, older_than=1, now=rig.clock.now())
    archive.import_run(store, exported, now=rig.clock.now())
    again = store.load(run_id)
    assert again.created_at == first.created_at and again.incarnation != first.incarnation
    waits.signal(rig.runtime(), run_id, "paid", {"tx": "B"})
    rig.drive()
    assert rig.load(run_id).status is RunStatus.COMPLETED
    assert store.steps(run_id)[1].result == {"tx": "B"}
    assert SHOWN == [{"tx": "A"}, {"tx": "B"}]


def test_rows_made_before_incarnations_are_kept_as_before(store: Counting) -> None:
    """A row of an older store has no incarnation (NULL): one value, so its
    turns still read only the steps after those kept."""
    cache = TranscriptCache()
    rig = rig_on(store, cache)
    run_id = create_run(rig.runtime(), "t-witness", "hello")
    store._tables.runs[run_id]["incarnation"] = None
    rig.drive()
    converse(rig, run_id, 3)
    assert store.load(run_id).incarnation is None
    assert cache.kept(run_id) == _last_turn(store, run_id) and cache.hits > 0
    assert SENT and all(given == whole for given, whole in SENT)
