"""Reading a run as it happens: its stream (harness.streams) and its flight
recorder, merged into one sequence of events, each with an id to resume after.

- ``token`` ``{"step", "attempt", "text"}``: a piece of a model step's answer,
  in order. ``discard`` ``{"step", "attempt"}``: that attempt's pieces so far
  will not be recorded (its worker died, its call is retried): drop them.
- ``step``: a transition, exactly as ``GET /api/runs/{id}/history`` lists it.
- ``end`` ``{"status"}``: the run completed, failed, was cancelled (or a replay
  diverged); nothing follows. A completed run that gets a message moves again:
  follow it anew.

An event's id is ``{history}:{stream}``: the last flight-recorder event and
the last stream entry given so far, so ``Last-Event-ID`` resumes both where
they were, without a repeat. Each round reads the stream, then the recorder;
pieces come before the transitions read in the same round, which may put a
piece of a step's next call before the transition that began it (a reader
goes by each event's ``step``, not by their order).

The recorder is read every :data:`POLL` seconds (one more query when it has
news, for the run's status), the stream as it is written (the table every
:data:`TABLE_POLL` seconds). The end is said only once the status that says
it was read before the recorder was: every transition, and every piece
written before them, is given first.

Many followers in one process share their reads (:class:`Sources` makes
them, one set per event loop): the Redis streams are read by one
``XREAD BLOCK`` over all of them (harness.streams.hub), the recorders by
one query a round for all of them, the rounds on a grid of :data:`POLL`
seconds common to every follower (harness.streams.recorder). A read that
must see everything written before it (the last before an ``end``) is
still a read of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import re
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from harness.errors import BadInput
from harness.records import JSON, Run, RunStatus, StepStatus
from harness.records import Event as RecordedEvent
from harness.store.values import StreamEntry, StreamKind
from harness.streams.hub import Hub, Subscription, position
from harness.streams.publish import stream_key
from harness.streams.recorder import Recorder

if TYPE_CHECKING:
    import redis.asyncio

    from harness.store import ReadStore

log = logging.getLogger(__name__)

#: Seconds between reads of the flight recorder.
POLL = 0.5
#: Seconds between reads of the stream's table, where there is no Redis.
TABLE_POLL = 0.1
#: A comment is sent after this many quiet seconds, so proxies keep the
#: connection and a client learns that it has gone.
KEEPALIVE = 15.0
#: Seconds before a stream that could not be read is read again.
REDIS_RETRY = 1.0
#: Entries and events read at most at once.
BATCH = 1000
#: Connections to Redis an event loop's followers hold at most: the hub's
#: one, and reads that do not wait (a follower catching up, or making sure).
CONNECTIONS = 16
#: The longest ``Last-Event-ID`` taken.
MAX_ID = 64
#: The run's ends, as the flight recorder says them.
TERMINAL = frozenset(s.value for s in RunStatus if s.terminal)
_ID = re.compile(r"([0-9]{1,18}):([0-9]{1,18}(?:-[0-9]{1,18})?)")


@dataclass(frozen=True)
class Cursor:
    """Where a reader is: the last recorder event and stream entry given."""

    history: int = 0
    stream: str = "0"

    def __str__(self) -> str:
        return f"{self.history}:{self.stream}"

    @classmethod
    def parse(cls, text: str | None, field: str = "Last-Event-ID") -> Cursor:
        """From a ``Last-Event-ID`` (none or empty: the start). Raises BadInput."""
        if not text:
            return cls()
        found = _ID.fullmatch(text) if len(text) <= MAX_ID else None
        if found is None:
            raise BadInput(field, f"{text[:MAX_ID]!r} is not an id this stream gave")
        return cls(int(found[1]), found[2])


@dataclass(frozen=True)
class Event:
    """One event of the feed; ``kind`` None: a keep-alive comment."""

    kind: str | None
    data: JSON = None
    id: str | None = None

    def encode(self) -> bytes:
        """As Server-Sent Events put it on the wire (the data is one line of JSON)."""
        if self.kind is None:
            return b": keepalive\n\n"
        data = json.dumps(self.data, separators=(",", ":"))
        return f"id: {self.id}\nevent: {self.kind}\ndata: {data}\n\n".encode()

    def to_dict(self) -> dict[str, JSON]:
        """As ``harness follow --json`` prints it: one object a line."""
        return {"id": self.id, "event": self.kind, "data": self.data}


KEEPALIVE_EVENT = Event(None)


class StreamSource(Protocol):
    """A run's stream, read after an entry's id."""

    async def read(self, after: str, wait: float) -> list[tuple[str, StreamEntry]]:
        """The entries after ``after``, oldest first; waiting up to ``wait``
        seconds for one if there is none yet. A read that does not wait sees
        every entry written before it began."""

    def close(self) -> None:
        """The reader is done with the stream."""


class RedisSource:
    """A run's Redis stream, read with a blocking ``XREAD``."""

    def __init__(self, client: redis.asyncio.Redis, run: Run) -> None:
        self._client = client
        self.key = stream_key(run.run_id, run.lineage)
        self._down = False

    async def read(self, after: str, wait: float) -> list[tuple[str, StreamEntry]]:
        import redis

        block = max(1, int(wait * 1000)) if wait > 0 else None  # 0 would block forever
        try:
            answer: Any = await self._client.xread({self.key: after}, count=BATCH, block=block)
        except redis.RedisError as err:
            # The stream is a view: the transitions go on without it, and it is
            # read again after the wait (a reader misses what Redis lost, no more).
            if not self._down:
                log.warning("run=%s the answers' stream cannot be read: %s", self.key, err)
            self._down = True
            await asyncio.sleep(max(wait, REDIS_RETRY))
            return []
        self._down = False
        if not answer:
            return []
        entries = answer[0][1] if isinstance(answer, list) else next(iter(answer.values()))[0]
        return [(_text(i), StreamEntry.decode(fields[b"e"])) for i, fields in entries]

    def close(self) -> None:
        """Nothing is held between reads."""


class HubSource:
    """A run's Redis stream as the event loop's :class:`~harness.streams.hub.Hub`
    reads it; a read that does not wait, or made while this reader is behind,
    reads it directly (and never blocks a connection)."""

    def __init__(self, hub: Hub, direct: RedisSource) -> None:
        self._hub = hub
        self._direct = direct
        self._sub: Subscription | None = None

    async def read(self, after: str, wait: float) -> list[tuple[str, StreamEntry]]:
        sub = self._sub
        if wait > 0 and sub is None:
            sub = self._sub = self._hub.subscribe(self._direct.key, after)
        if sub is None or wait <= 0 or sub.behind:
            entries = await self._direct.read(after, 0.0)
            if sub is not None:
                last = entries[-1][0] if entries else after
                if not sub.behind:
                    sub.caught_up(last)
                elif len(entries) < BATCH:
                    self._hub.rejoin(sub, last)
            return entries
        entries = sub.take(after)
        if not entries:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await sub.ready.wait()
            entries = sub.take(after)
        return entries

    def close(self) -> None:
        if self._sub is not None:
            self._hub.unsubscribe(self._sub)
            self._sub = None


class TableSource:
    """A run's stream in the run store's table, polled."""

    def __init__(self, store: ReadStore, run_id: str) -> None:
        self._store = store
        self._run_id = run_id

    async def read(self, after: str, wait: float) -> list[tuple[str, StreamEntry]]:
        last = int(after.partition("-")[0])  # an id from Redis, had the setting changed
        rows = await asyncio.to_thread(self._store.stream_after, self._run_id, last, BATCH)
        if not rows and wait > 0:
            await asyncio.sleep(min(wait, TABLE_POLL))
            rows = await asyncio.to_thread(self._store.stream_after, self._run_id, last, BATCH)
        return [(str(i), entry) for i, entry in rows]

    def close(self) -> None:
        """Nothing is held between reads."""


def ended(run: Run) -> bool:
    """Nothing more will happen to the run: it has ended, and no message of
    a user's waits to continue it."""
    if run.status is RunStatus.COMPLETED:
        return run.inbox_at is None
    return run.status.terminal


async def follow(
    store: ReadStore,
    source: StreamSource,
    run: Run,
    cursor: Cursor,
    *,
    poll: float = POLL,
    keepalive: float = KEEPALIVE,
    clock: Callable[[], float] = time.monotonic,
    recorder: Recorder | None = None,
) -> AsyncGenerator[Event]:
    """The run's events after ``cursor`` until it ends (``run``: as loaded
    before the first), with a keep-alive after ``keepalive`` quiet seconds.
    ``recorder``: the event loop's reader of flight recorders, shared by its
    followers (none: one of this follower's own)."""
    reader = Recorder(store) if recorder is None else recorder
    try:
        pace = _Pace(poll, keepalive, clock)
        async for event in _follow(store, source, reader, run, cursor, pace):
            yield event
    finally:
        source.close()
        if recorder is None:
            await reader.aclose()


@dataclass(frozen=True)
class _Pace:
    """How often a follower reads the recorder and says it is alive, by which clock."""

    poll: float
    keepalive: float
    clock: Callable[[], float]

    def next_poll(self) -> float:
        """The next instant of a grid shared by every follower on the clock,
        so that a process's followers read their recorders together."""
        return (math.floor(self.clock() / self.poll) + 1) * self.poll


async def _follow(
    store: ReadStore,
    source: StreamSource,
    recorder: Recorder,
    run: Run,
    cursor: Cursor,
    pace: _Pace,
) -> AsyncGenerator[Event]:
    run_id, clock = run.run_id, pace.clock
    # A discard of an attempt no piece came from before it (a call's discard of
    # its own number, should another have used it) is not given: a reader
    # resuming rebuilds what came before, so every reader is told the same.
    pieces = await _attempts_before(source, cursor.stream)
    over = ended(run)  # read before the recorder next is
    due = said = clock()
    while True:
        events: list[RecordedEvent] = []
        final = False
        if over or clock() >= due:
            final = over
            events = await recorder.events_after(run_id, cursor.history)
            if events and not over:
                run = await asyncio.to_thread(store.load, run_id)
                over = ended(run)
            due = pace.next_poll()
        wait = 0.0 if events or over else max(0.0, due - clock())
        entries = await source.read(cursor.stream, wait)
        for given in _merged(entries, events):
            if isinstance(given, RecordedEvent):
                cursor = replace(cursor, history=given.id)
                yield Event("step", given.to_dict(), str(cursor))
            else:
                entry_id, entry = given
                cursor = replace(cursor, stream=entry_id)
                attempt = (entry.step, entry.attempt)
                if entry.kind is StreamKind.TOKEN:
                    pieces.add(attempt)
                elif attempt not in pieces:
                    continue
                yield _entry_event(entry, cursor)
        if entries or events:
            said = clock()
        if final and any(e.version > run.version for e in events):
            run = await asyncio.to_thread(store.load, run_id)  # moved on since: look again
            over = ended(run)
            continue
        if final and len(events) < BATCH and len(entries) < BATCH:
            yield Event("end", {"status": run.status.value}, str(cursor))
            return
        if clock() - said >= pace.keepalive:
            said = clock()
            yield KEEPALIVE_EVENT


async def _attempts_before(source: StreamSource, until: str) -> set[tuple[int, int]]:
    """The (step, attempt) of the pieces in the stream up to entry ``until``."""
    seen: set[tuple[int, int]] = set()
    after, last = "0", position(until)
    while position(after) < last:
        entries = await source.read(after, 0.0)
        for entry_id, entry in entries:
            if position(entry_id) > last:
                return seen
            if entry.kind is StreamKind.TOKEN:
                seen.add((entry.step, entry.attempt))
        if len(entries) < BATCH:
            return seen
        after = entries[-1][0]
    return seen


def _merged(
    entries: list[tuple[str, StreamEntry]], events: list[RecordedEvent]
) -> Iterator[tuple[str, StreamEntry] | RecordedEvent]:
    """One round's entries and transitions, each in its own order, the pieces
    of a step before the transition that records it (or any later step's,
    or the run's end before a later step): a run read after the fact reads
    as it happened."""
    pending = deque(entries)
    later: list[int | None] = []  # the step of the next step's transition, for each
    upcoming = None
    for event in reversed(events):
        later.append(upcoming)
        upcoming = upcoming if event.step_index is None else event.step_index
    for event, before in zip(events, reversed(later), strict=True):
        while pending and _records(event, before, pending[0][1].step):
            yield pending.popleft()
        yield event
    yield from pending


def _records(event: RecordedEvent, later: int | None, step: int) -> bool:
    """``event`` comes after the pieces of ``step``'s answer; ``later``: the
    step of the next step transition read with it, if any."""
    if event.step_index is None:  # the run's end comes after the steps before it
        return event.to_status in TERMINAL and (later is None or step < later)
    if event.step_index == step:
        return event.to_status != StepStatus.RUNNING.value  # its claim comes first
    return event.step_index > step


def _entry_event(entry: StreamEntry, cursor: Cursor) -> Event:
    data: dict[str, JSON] = {"step": entry.step, "attempt": entry.attempt}
    if entry.kind is StreamKind.TOKEN:
        data["text"] = entry.text
    return Event(entry.kind.value, data, str(cursor))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class Sources:
    """Where runs' streams are read: the Redis of ``redis_url``, else the
    store's table; and the :class:`~harness.streams.recorder.Recorder` that
    reads the flight recorders. The Redis client, its
    :class:`~harness.streams.hub.Hub` and the recorder are made on first use,
    for the event loop that uses them (another loop gets its own)."""

    def __init__(self, store: ReadStore, redis_url: str | None) -> None:
        self._store = store
        self._url = redis_url
        self._client: redis.asyncio.Redis | None = None
        self._hub: Hub | None = None
        self._recorder: Recorder | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def open(self, run: Run) -> StreamSource:
        """The run's stream, for a reader on the running event loop."""
        self._bind()
        if self._client is None or self._hub is None:
            return TableSource(self._store, run.run_id)
        return HubSource(self._hub, RedisSource(self._client, run))

    def recorder(self) -> Recorder:
        """The running event loop's reader of flight recorders."""
        self._bind()
        assert self._recorder is not None
        return self._recorder

    def _bind(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            return
        self._loop = loop
        self._recorder = Recorder(self._store)
        if self._url is not None:
            import redis.asyncio

            # The hub's blocking read waits POLL at most: a socket silent for
            # longer is dead. Reads beyond CONNECTIONS at once wait their turn.
            pool = redis.asyncio.BlockingConnectionPool.from_url(
                self._url,
                max_connections=CONNECTIONS,
                timeout=POLL + 5.0,
                socket_timeout=POLL + 5.0,
                socket_connect_timeout=2.0,
            )
            self._client = redis.asyncio.Redis.from_pool(pool)
            self._hub = Hub(self._client, block=POLL)

    async def aclose(self) -> None:
        if self._hub is not None:
            await self._hub.aclose()
            self._hub = None
        if self._recorder is not None:
            await self._recorder.aclose()
            self._recorder = None
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        self._loop = None


def follow_blocking(
    store: ReadStore, redis_url: str | None, run_id: str, cursor: Cursor
) -> Iterator[Event]:
    """:func:`follow` for code without an event loop (``harness follow``,
    ``harness.follow``): an event loop of its own, closed with the iterator.
    Raises RunNotFound at once, for a run that is not."""
    return _blocking(store, redis_url, store.load(run_id), cursor)


def _blocking(store: ReadStore, redis_url: str | None, run: Run, cursor: Cursor) -> Iterator[Event]:
    loop = asyncio.new_event_loop()
    sources = Sources(store, redis_url)

    async def opened() -> AsyncGenerator[Event]:  # on this loop
        return follow(store, sources.open(run), run, cursor, recorder=sources.recorder())

    events = loop.run_until_complete(opened())
    try:
        while True:
            try:
                yield loop.run_until_complete(anext(events))
            except StopAsyncIteration:
                return
    finally:
        # Interrupted (Ctrl-C), a read may still be under way: cancelled first,
        # so the feed can be closed.
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.wait(pending))
        with contextlib.suppress(RuntimeError):
            loop.run_until_complete(events.aclose())
        loop.run_until_complete(sources.aclose())
        loop.close()
