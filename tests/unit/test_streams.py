"""Answers as they are written (harness.streams), in process on the memory
store: a tap writes the first piece at once and coalesces the rest; a call
after others of its step first discards theirs; a failing stream never fails
the call; the feed merges the stream with the flight recorder, ends after
the last transition, and resumes after any id it gave without a repeat."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import harness
from harness.engine import conversation
from harness.engine.creation import create_run
from harness.engine.taskresult import TaskResult
from harness.errors import BadInput, RetryableModelError
from harness.records import RunStatus
from harness.store import StreamEntry, StreamKind
from harness.store.memory import MemoryStore
from harness.streams import StoreSink, Tap
from harness.streams.feed import Cursor, Event, TableSource, follow
from tests.rig import Rig

ANSWER = "Refunded 42.00 for order 1234."


class Sink:
    """Keeps what a tap writes, each write apart; fails if told to."""

    def __init__(self, fail: bool = False) -> None:
        self.writes: list[list[StreamEntry]] = []
        self.fail = fail

    interval = 0.01

    def append(self, run_id: str, lineage: str, entries: Sequence[StreamEntry]) -> None:
        if self.fail:
            raise ConnectionError("redis is down")
        self.writes.append(list(entries))

    def trim(self, now: float) -> None:
        pass


def _token(text: str, attempt: int = 1, step: int = 0) -> StreamEntry:
    return StreamEntry(step, attempt, StreamKind.TOKEN, text)


def test_a_tap_writes_the_first_piece_at_once_and_coalesces_the_next() -> None:
    now = [0.0]
    sink = Sink()
    tap = Tap(sink, "r1", "i1", 0, 1, clock=lambda: now[0], interval=0.01)
    tap("Hel")
    assert sink.writes == [[_token("Hel")]]
    now[0] = 0.005
    tap("lo, ")
    tap("world")
    assert len(sink.writes) == 1  # within the interval: held
    now[0] = 0.02
    tap("!")
    assert sink.writes[1] == [_token("lo, world!")]
    tap("")  # no text: nothing to write
    tap.close()
    assert len(sink.writes) == 2


def test_a_later_attempt_discards_the_earlier_ones_before_its_first_piece() -> None:
    sink = Sink()
    tap = Tap(sink, "r1", "i1", 4, 3)
    tap("again")
    assert sink.writes == [
        [
            StreamEntry(4, 1, StreamKind.DISCARD),
            StreamEntry(4, 2, StreamKind.DISCARD),
            _token("again", 3, 4),
        ]
    ]
    quiet = Sink()
    Tap(quiet, "r1", "i1", 4, 2).close()  # a call that wrote no text discards all the same
    assert quiet.writes == [[StreamEntry(4, 1, StreamKind.DISCARD)]]


def test_a_stream_that_cannot_be_written_goes_quiet(caplog: pytest.LogCaptureFixture) -> None:
    sink = Sink(fail=True)
    tap = Tap(sink, "r1", "i1", 0, 1, interval=0.0)
    tap("a")
    tap("b")
    tap.close()
    assert tap.quiet and sink.writes == []
    assert [r.getMessage() for r in caplog.records if "stream" in r.getMessage()] == [
        "run=r1 step=0 attempt=1 the answer's stream could not be written (redis is down); "
        "the call goes on unwatched"
    ]


class Flaky:
    """Writes half an answer, then fails as a cut stream does; then answers."""

    name = "test:flaky"
    records_responses = False

    def __init__(self) -> None:
        self.calls = 0

    def next_turn(self, request: harness.ModelRequest) -> harness.ModelTurn:
        self.calls += 1
        assert request.on_text is not None
        request.on_text("Refun")
        if self.calls == 1:
            raise RetryableModelError("test: the stream was cut")
        request.on_text(ANSWER[len("Refun") :])
        return harness.ModelTurn(final=ANSWER)


FLAKY = Flaky()
harness.register_agent(harness.Agent(name="s-flaky", model=FLAKY, tools=[]))
harness.register_agent(
    harness.Agent(name="s-scripted", model=harness.ScriptedModel([{"final": ANSWER}]), tools=[])
)
harness.register_agent(
    harness.Agent(
        name="s-chat",
        model=harness.ScriptedModel([{"final": "Warm or cold?"}, {"final": "Then Tromsø."}]),
        tools=[],
    )
)


@pytest.fixture
def rig(memory_store: MemoryStore) -> Iterator[Rig]:
    FLAKY.calls = 0
    yield Rig(memory_store, options={"streams": StoreSink(memory_store, 3600.0)})


def _pieces(store: MemoryStore, run_id: str) -> list[StreamEntry]:
    return [e for _, e in store.stream_after(run_id, 0)]


def test_a_scripted_answer_is_streamed_a_word_at_a_time(rig: Rig) -> None:
    run_id = create_run(rig.runtime(), "s-scripted", "refund")
    assert rig.drive()[-1] is TaskResult.COMPLETED
    pieces = _pieces(rig.store, run_id)  # type: ignore[arg-type]
    # Run straight through (no attempt counted in the store), the call first
    # discards its own number, should a call that died have used it.
    assert pieces[0] == StreamEntry(0, 1, StreamKind.DISCARD)
    assert {(p.step, p.attempt, p.kind) for p in pieces[1:]} == {(0, 1, StreamKind.TOKEN)}
    assert "".join(p.text for p in pieces) == rig.load(run_id).result == ANSWER
    assert "discard" not in [e.kind for e in _follow(rig.store, run_id)]  # none for a reader


def test_a_retried_call_discards_what_the_first_wrote(rig: Rig) -> None:
    run_id = create_run(rig.runtime(), "s-flaky", "refund")
    assert rig.drive()[-1] is TaskResult.COMPLETED
    pieces = _pieces(rig.store, run_id)  # type: ignore[arg-type]
    assert (
        [(p.attempt, p.kind.value, p.text) for p in pieces]
        == [
            (1, "discard", ""),  # straight through: its own number first
            (1, "token", "Refun"),
            (1, "discard", ""),
            (2, "token", "Refun"),
            (2, "token", ANSWER[len("Refun") :]),
        ]
    )
    kept = "".join(p.text for p in pieces if p.attempt == 2)
    assert kept == rig.load(run_id).result == ANSWER


def _follow(store: MemoryStore, run_id: str, after: str | None = None) -> list[Event]:
    async def read() -> list[Event]:
        run = store.load(run_id)
        source = TableSource(store, run_id)
        return [e async for e in follow(store, source, run, Cursor.parse(after), poll=0.01)]

    return asyncio.run(asyncio.wait_for(read(), 10))


def _answer(events: list[Event], attempt: int) -> str:
    return "".join(
        str(e.data["text"])
        for e in events
        if e.kind == "token" and isinstance(e.data, dict) and e.data["attempt"] == attempt
    )


def test_the_feed_of_an_ended_run_reads_as_it_happened(rig: Rig) -> None:
    run_id = create_run(rig.runtime(), "s-flaky", "refund")
    rig.drive()
    events = _follow(rig.store, run_id)  # type: ignore[arg-type]
    kinds = [e.kind for e in events]
    assert kinds[-1] == "end" and events[-1].data == {"status": "completed"}
    assert "discard" in kinds and _answer(events, 2) == ANSWER
    steps: list[Any] = [e.data for e in events if e.kind == "step"]
    done = next(i for i, e in enumerate(events) if e.kind == "step" and _to(e) == "done")
    assert all(i < done for i, e in enumerate(events) if e.kind == "token")  # before its record
    assert [s["id"] for s in steps] == sorted(s["id"] for s in steps)
    assert len(steps) == len(rig.store.events(run_id))


def test_a_conversation_read_after_the_fact_has_each_answer_before_its_record(rig: Rig) -> None:
    rt = rig.runtime()
    run_id = create_run(rt, "s-chat", "a weekend away")
    rig.drive()
    conversation.send_message(rt, run_id, "cold")
    rig.drive()
    events = _follow(rig.store, run_id)  # type: ignore[arg-type]
    said: list[tuple[str | None, Any]] = []
    for e in events:
        if e.kind == "token" and said and said[-1][0] == "text":
            said[-1] = ("text", said[-1][1] + _text(e))  # pieces coalesce as they come
        elif e.kind == "token":
            said.append(("text", _text(e)))
        elif e.kind != "step" or _to(e) in ("done", "completed"):
            said.append((e.kind, _to(e)))
    assert said == [
        ("text", "Warm or cold?"),
        ("step", "done"),
        ("step", "completed"),
        ("step", "done"),  # the user's message
        ("text", "Then Tromsø."),
        ("step", "done"),
        ("step", "completed"),
        ("end", None),
    ]


def _text(event: Event) -> str:
    return str(event.data["text"]) if isinstance(event.data, dict) else ""


def _to(event: Event) -> Any:
    return event.data.get("to") if isinstance(event.data, dict) else None


def test_the_feed_resumes_after_any_id_it_gave_without_a_repeat(rig: Rig) -> None:
    run_id = create_run(rig.runtime(), "s-flaky", "refund")
    rig.drive()
    events = _follow(rig.store, run_id)  # type: ignore[arg-type]
    for k, event in enumerate(events[:-1]):
        assert event.id is not None
        assert _follow(rig.store, run_id, event.id) == events[k + 1 :]  # type: ignore[arg-type]


def test_the_feed_of_a_moving_run_follows_it_to_its_end(rig: Rig) -> None:
    run_id = create_run(rig.runtime(), "s-scripted", "refund")

    async def watch() -> list[Event]:
        run = rig.store.load(run_id)
        source = TableSource(rig.store, run_id)
        feed = follow(rig.store, source, run, Cursor(), poll=0.01)
        first = await anext(feed)  # the run's creation: the feed is under way
        await asyncio.to_thread(rig.drive)
        return [first] + [e async for e in feed]

    events = asyncio.run(asyncio.wait_for(watch(), 10))
    assert events[-1].data == {"status": RunStatus.COMPLETED.value}
    assert _answer(events, 1) == ANSWER


@settings(deadline=None, database=None)
@given(st.one_of(st.text(max_size=80), st.from_regex(r"[0-9]{1,25}:[0-9]{1,25}(-[0-9]{1,25})?")))
def test_a_last_event_id_is_one_the_feed_gave_or_refused_in_words(text: str) -> None:
    try:
        cursor = Cursor.parse(text)
    except BadInput as err:
        assert err.field == "Last-Event-ID"
        return
    assert Cursor.parse(str(cursor)) == cursor  # as the feed gives it back


def test_a_call_run_again_after_its_worker_died_discards_what_that_one_wrote(rig: Rig) -> None:
    run_id = create_run(rig.runtime(), "s-scripted", "refund")
    run = rig.load(run_id)
    # A worker ran the step straight through (no RUNNING checkpoint) and died
    # mid-answer: its pieces are in the stream, its attempt nowhere in the store.
    dead = Tap(StoreSink(rig.store, 3600.0), run_id, run.lineage, 0, 1, again=True)
    dead("Refunded 4")
    assert rig.drive()[-1] is TaskResult.COMPLETED
    events = _follow(rig.store, run_id)  # type: ignore[arg-type]
    kinds = [e.kind for e in events if e.kind in ("token", "discard")]
    assert kinds[0] == "token" and kinds.count("discard") == 1
    after = events[[e.kind for e in events].index("discard") + 1 :]
    assert _answer(after, 1) == rig.load(run_id).result == ANSWER


def test_a_slow_sink_widens_the_coalescing_instead_of_taking_every_piece() -> None:
    now = [0.0]

    class Slow(Sink):
        def append(self, run_id: str, lineage: str, entries: Sequence[StreamEntry]) -> None:
            super().append(run_id, lineage, entries)
            now[0] += 0.05  # each write waits 50 ms (SQLite's one writer, a slow Redis)

    sink = Slow()
    tap = Tap(sink, "r", "i1", 0, 1, clock=lambda: now[0], interval=0.01)
    for _ in range(100):  # a provider's pieces, 1 ms apart
        now[0] += 0.001
        tap("tok ")
    tap.close()
    assert len(sink.writes) <= 12  # one a 10 ms interval after each write, not one a piece
    assert "".join(e.text for w in sink.writes for e in w) == "tok " * 100


def test_the_feed_does_not_end_a_run_that_a_message_continued(rig: Rig) -> None:
    rt = rig.runtime()
    run_id = create_run(rt, "s-chat", "a weekend away")
    rig.drive()
    seen = rig.store.load(run_id)  # as GET .../events loads it before its body starts
    assert seen.status is RunStatus.COMPLETED and seen.inbox_at is None
    conversation.send_message(rt, run_id, "cold")  # comes just after

    async def read() -> list[Event]:
        feed = follow(rig.store, TableSource(rig.store, run_id), seen, Cursor(), poll=0.01)
        first = await anext(feed)
        driving = asyncio.create_task(asyncio.to_thread(rig.drive))  # the turn it continues
        events = [first] + [e async for e in feed]
        await driving
        return events

    events = asyncio.run(asyncio.wait_for(read(), 10))
    assert [_to(e) for e in events if e.kind == "step" and e.data["step_index"] is None] == [  # type: ignore[index]
        "pending",
        "running",
        "completed",
        "running",
        "completed",
    ]
    assert events[-1].kind == "end" and _answer(events, 1).endswith("Then Tromsø.")
