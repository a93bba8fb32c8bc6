"""The engine's taps (harness.streams), in process on the in-memory store:
every attempt of a model step whose pieces were written and will never be
recorded is discarded in the run's stream, whether the step is called again
or a user's message takes its place."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

import pytest

import harness
from harness.engine import conversation
from harness.engine.creation import create_run
from harness.engine.runner import run_step
from harness.engine.taskresult import TaskResult
from harness.records import StepKind
from harness.store.memory import MemoryStore
from harness.store.values import StreamEntry, StreamKind
from harness.streams import StoreSink, Tap
from tests.rig import Rig

HALF = "The answer bro"


class BrokenOff:
    """Writes part of an answer, then fails as a stream that broke off does
    (retryably); answers in full after that."""

    name = "test:broken-off"
    records_responses = False

    def __init__(self) -> None:
        self.calls = 0

    def next_turn(self, request: harness.ModelRequest) -> harness.ModelTurn:
        self.calls += 1
        assert request.on_text is not None
        if self.calls == 1:
            request.on_text(HALF)
            raise harness.RetryableModelError("the stream broke off")
        request.on_text("Whole.")
        return harness.ModelTurn(final="Whole.")


@pytest.fixture
def rig(memory_store: MemoryStore) -> Iterator[Rig]:
    harness.register_agent(harness.Agent(name="s-broken", model=BrokenOff(), tools=[]))
    yield Rig(memory_store, options={"streams": StoreSink(memory_store, 3600)})


def entries(rig: Rig, run_id: str) -> list[StreamEntry]:
    return [e for _, e in rig.store.stream_after(run_id, 0)]


def token(step: int, attempt: int, text: str) -> StreamEntry:
    return StreamEntry(step, attempt, StreamKind.TOKEN, text)


def discard(step: int, attempt: int) -> StreamEntry:
    return StreamEntry(step, attempt, StreamKind.DISCARD)


def test_a_retried_call_discards_the_pieces_of_the_one_before(rig: Rig) -> None:
    run_id = create_run(rig.runtime(), "s-broken", "hello")
    assert rig.drive()[-1] is TaskResult.COMPLETED
    # Its first call ran straight through (no attempt counted in the store):
    # it discards its own number before its first piece, should another have used it.
    assert entries(rig, run_id) == [
        discard(0, 1),
        token(0, 1, HALF),
        discard(0, 1),
        token(0, 2, "Whole."),
    ]


def test_a_message_that_takes_a_retried_turns_step_discards_its_pieces(rig: Rig) -> None:
    """The step retried becomes the user's message, and the turn a step of
    its own whose calls count from 1: the broken-off attempt of the step
    the message took is discarded all the same."""
    rt = rig.runtime()
    run_id = create_run(rt, "s-broken", "hello")
    assert rig.drive(limit=1) == [TaskResult.RESCHEDULED]
    conversation.send_message(rt, run_id, "hurry")
    assert rig.drive()[-1] is TaskResult.COMPLETED
    assert [s.kind for s in rig.store.steps(run_id)] == [StepKind.USER, StepKind.MODEL]
    assert entries(rig, run_id) == [
        discard(0, 1),  # a call run straight through: its own number first
        token(0, 1, HALF),
        discard(0, 1),  # the message took its step
        discard(1, 1),  # the turn's own first call, straight through
        token(1, 1, "Whole."),
    ]


class Stalled:
    """Its first call writes a piece, then stalls past its lease: another
    worker takes the step over and answers; then the stalled call writes on."""

    name = "test:stalled"

    def __init__(self, rig: Rig) -> None:
        self.rig = rig
        self.calls = 0

    def next_turn(self, request: harness.ModelRequest) -> harness.ModelTurn:
        self.calls += 1
        assert request.on_text is not None
        if self.calls > 1:
            request.on_text("Whole.")
            return harness.ModelTurn(final="Whole.")
        request.on_text("Sta")
        self.rig.clock.advance(self.rig.lease_ttl + 1)
        other = threading.Thread(target=run_step, args=(self.rig.runtime("w2"), request.run_id))
        other.start()
        other.join()
        request.on_text("lled.")
        return harness.ModelTurn(final="Stalled.")


def test_a_call_taken_over_writes_nothing_after_its_discard(memory_store: MemoryStore) -> None:
    """The discard of attempt 1 is its last word: the stalled call, whose
    lease lapsed, no longer writes to the run's stream."""
    rig = Rig(memory_store, options={"streams": StoreSink(memory_store, 3600)})
    harness.register_agent(harness.Agent(name="s-stalled", model=Stalled(rig), tools=[]))
    run_id = create_run(rig.runtime(), "s-stalled", "hello")
    rig.drive(limit=1)
    assert rig.load(run_id).result == "Whole."
    # A takeover discards its own number too (the lapsed call might have run
    # straight through, counting no attempt); a reader is not told it (no piece
    # of attempt 2 came before it).
    assert entries(rig, run_id) == [
        token(0, 1, "Sta"),
        discard(0, 1),
        discard(0, 2),
        token(0, 2, "Whole."),
    ]


class Kept:
    """A sink that keeps each write."""

    def __init__(self) -> None:
        self.writes: list[list[StreamEntry]] = []

    interval = 0.01

    def append(self, run_id: str, lineage: str, entries: Sequence[StreamEntry]) -> None:
        self.writes.append(list(entries))

    def trim(self, now: float) -> None:
        pass


def test_a_tap_holds_its_pieces_while_its_lease_has_lapsed() -> None:
    """Renewed after all, the lease lets them out; lost, they never are."""
    sink, live = Kept(), [False]
    tap = Tap(sink, "r1", "i1", 0, 2, interval=0.0, live=lambda: live[0])
    tap("Hel")
    assert sink.writes == []
    live[0] = True
    tap("lo")
    assert sink.writes == [[discard(0, 1), token(0, 2, "Hello")]]
    live[0] = False
    tap(" there")
    tap.close()
    assert sink.writes == [[discard(0, 1), token(0, 2, "Hello")]]
