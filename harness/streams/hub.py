"""One reader of the Redis streams that an event loop's followers watch.

A follower of its own would hold a blocking ``XREAD`` per run: a hundred
watchers are a hundred connections and a hundred round trips for every
round of pieces. The :class:`Hub` holds one ``XREAD BLOCK`` over every
followed stream (each from the position its followers have reached) and
hands what it reads to each follower's :class:`Subscription`; a follower
waits on its own subscription, never on Redis.

What a follower can count on, with :class:`HubSource` as its stream:

- **Every entry once, in order.** A subscription keeps the last entry it
  was given; the hub gives a follower only the entries after it, and a
  follower's read takes only those after the position it asks from.
- **A read that must see everything written before it sees it.** A read
  that does not wait (the feed's read after the recorder said the run
  ended, and its catch-up from a ``Last-Event-ID``) is a read of Redis of
  its own, never of what the hub happened to have read.
- **Joining costs a round trip.** A follower that joins while the hub's
  read is under way wakes it: the hub's read also waits on a stream of its
  own (``harness:hub:{random}``, one entry, expiring), and a join writes an
  entry there, so the read returns and the next one includes the newcomer.
  Where that write is refused (a read-only user), the newcomer waits for
  the read under way to end, :data:`BLOCK` seconds at most.
- **A slow follower holds no one back, and loses nothing.** The hub never
  waits for a follower: it appends to the follower's queue. A queue that
  would pass :data:`QUEUE` entries is emptied and the follower is marked
  behind: it reads the stream for itself from where it is (Redis keeps
  what it has not taken) until a read finds it caught up, and then rejoins.
- **Redis down**: the hub logs once and reads again after
  :data:`~harness.streams.feed.REDIS_RETRY`; a follower's wait ends empty
  at its deadline, so the flight recorder's transitions keep flowing.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from harness.store.values import StreamEntry

if TYPE_CHECKING:
    import redis.asyncio

log = logging.getLogger(__name__)

#: Seconds the hub's read blocks when no stream has news: how long a
#: follower that joined meanwhile reads for itself, at most.
BLOCK = 0.5
#: Entries a follower may leave waiting before it must read for itself.
QUEUE = 10_000
#: Entries read at most at once, from each stream.
BATCH = 1000
#: Seconds before a read that failed is made again.
RETRY = 1.0
#: Milliseconds the hub's wake-up stream outlives its last use.
WAKE_TTL_MS = 60_000

Entries = list[tuple[str, StreamEntry]]


def position(entry_id: str) -> tuple[int, int]:
    """An entry's id, comparable: Redis's ``ms-seq`` or the table's number."""
    first, _, second = entry_id.partition("-")
    return int(first), int(second or 0)


class Subscription:
    """A follower's place at the hub: its stream, the last entry it was
    given, and the entries the hub read for it that it has not taken."""

    def __init__(self, key: str, after: str) -> None:
        self.key = key
        self.given = position(after)  # the last entry given (by the hub or a read of its own)
        self.given_id = after
        self.queue: deque[tuple[str, StreamEntry]] = deque()
        self.ready = asyncio.Event()
        self.joined = False  # a read of the hub includes the stream
        self.behind = False  # the queue overflowed: read for yourself

    def give(self, entries: Entries) -> None:
        """Hand over the entries after the last one given (called by the hub)."""
        fresh = [(i, e) for i, e in entries if position(i) > self.given]
        if not fresh:
            return
        if len(self.queue) + len(fresh) > QUEUE:
            self.queue.clear()
            self.behind = True
        else:
            self.queue.extend(fresh)
            self.given_id, _ = fresh[-1]
            self.given = position(self.given_id)
        self.ready.set()

    def take(self, after: str) -> Entries:
        """The queued entries after ``after``, oldest first, BATCH at most."""
        last = position(after)
        while self.queue and position(self.queue[0][0]) <= last:
            self.queue.popleft()
        taken: Entries = []
        while self.queue and len(taken) < BATCH:
            taken.append(self.queue.popleft())
        if not self.queue:
            self.ready.clear()
        return taken

    def caught_up(self, after: str) -> None:
        """The follower has read up to ``after`` itself."""
        if position(after) > self.given:
            self.given, self.given_id = position(after), after


class Hub:
    """Reads every subscribed stream with one ``XREAD BLOCK`` at a time, on
    the event loop that first subscribes (a task, started then)."""

    def __init__(self, client: redis.asyncio.Redis, block: float = BLOCK) -> None:
        self._client = client
        self._block = block
        self._streams: dict[str, set[Subscription]] = {}
        self._joined = asyncio.Event()  # set when a subscription is added
        self._task: asyncio.Task[None] | None = None
        self._down = False
        self._wake_key = f"harness:hub:{uuid.uuid4().hex}"
        self._reading = False  # an XREAD is under way
        self._waking: asyncio.Task[None] | None = None
        self._wake_refused = False
        self._closed = False
        self.reads = 0  # XREADs made, for tests and measurements

    def subscribe(self, key: str, after: str) -> Subscription:
        """A new follower of ``key``, from entry ``after``."""
        sub = Subscription(key, after)
        self._streams.setdefault(key, set()).add(sub)
        self._join()
        return sub

    def _join(self) -> None:
        """A subscription needs the hub's next read: start the hub, or wake
        its read under way (one wake-up at a time)."""
        self._joined.set()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())
        elif self._reading and not self._wake_refused and self._waking is None:
            self._waking = asyncio.get_running_loop().create_task(self._wake())

    async def _wake(self) -> None:
        import redis

        try:
            async with self._client.pipeline(transaction=False) as pipe:
                pipe.xadd(self._wake_key, {"w": "1"}, maxlen=1, approximate=False)
                pipe.pexpire(self._wake_key, WAKE_TTL_MS)
                await pipe.execute()
        except redis.RedisError as err:
            # Refused (a read-only user or replica): from now on newcomers wait
            # for the read under way to end. Redis out of reach: the hub's read
            # says so, once.
            if isinstance(err, redis.ResponseError):
                self._wake_refused = True
                log.warning("the streams' reader cannot be woken: %s", err)
        finally:
            self._waking = None

    def unsubscribe(self, sub: Subscription) -> None:
        """The follower is gone: its stream is read no more for it."""
        subs = self._streams.get(sub.key)
        if subs is not None:
            subs.discard(sub)
            if not subs:
                del self._streams[sub.key]

    def rejoin(self, sub: Subscription, at: str) -> None:
        """A follower that was behind has read up to ``at``, the stream's end
        then: the hub reads for it again, from there."""
        sub.given, sub.given_id = position(at), at
        sub.behind = False
        sub.joined = False
        self._join()

    async def aclose(self) -> None:
        """Stop reading (the followers' waits end empty)."""
        # redis-py can let a read run on after its task is cancelled (seen with
        # redis-py 8.1: seconds, until a timeout of its own): the loop checks
        # this flag, and the client's connections are closed under the read.
        self._closed = True
        self._joined.set()
        tasks = {t for t in (self._task, self._waking) if t is not None}
        for task in tasks:
            task.cancel()
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=0.1)
            if pending:
                await self._client.connection_pool.disconnect()
                await asyncio.wait(pending)
        self._task = self._waking = None

    async def _run(self) -> None:
        while not self._closed:
            wanted = self._wanted()
            if not wanted:
                self._joined.clear()
                await self._joined.wait()
                continue
            self._joined.clear()
            answer = await self._read(wanted)
            for key, entries in answer.items():
                for sub in list(self._streams.get(key, ())):
                    if sub.joined and not sub.behind:
                        sub.give(entries)

    def _wanted(self) -> dict[str, str]:
        """Each followed stream, from the earliest entry a follower of it needs;
        the followers counted are joined from now on."""
        wanted: dict[str, str] = {}
        for key, subs in self._streams.items():
            earliest = None
            for sub in subs:
                if sub.behind:
                    continue
                sub.joined = True
                if earliest is None or sub.given < earliest.given:
                    earliest = sub
            if earliest is not None:
                wanted[key] = earliest.given_id
        return wanted

    async def _read(self, wanted: dict[str, str]) -> dict[str, Entries]:
        import redis

        self.reads += 1
        streams: Any = {**wanted, self._wake_key: "$"}  # "$": what is added from now on
        self._reading = True
        try:
            answer: Any = await self._client.xread(
                streams, count=BATCH, block=max(1, int(self._block * 1000))
            )
        except redis.RedisError as err:
            if self._closed:  # its connection closed under it
                return {}
            if not self._down:
                log.warning("the answers' streams cannot be read: %s", err)
            self._down = True
            await asyncio.sleep(RETRY)
            return {}
        finally:
            self._reading = False
        self._down = False
        return _decoded(answer, self._wake_key)


def _decoded(answer: Any, wake_key: str) -> dict[str, Entries]:
    """An ``XREAD`` answer (RESP2's list or RESP3's map), each entry decoded
    once; the hub's wake-up stream left out."""
    if not answer:
        return {}
    pairs = answer if isinstance(answer, list) else [(k, v[0]) for k, v in answer.items()]
    found = {_text(key): entries for key, entries in pairs}
    found.pop(wake_key, None)
    return {key: list(_entries(key, entries)) for key, entries in found.items()}


def _entries(key: str, entries: Any) -> Iterator[tuple[str, StreamEntry]]:
    for entry_id, fields in entries:
        try:
            yield _text(entry_id), StreamEntry.decode(fields[b"e"])
        except (KeyError, ValueError, TypeError) as err:
            # Not written by a tap (someone else's entry under our key): skipped,
            # so that one stream's stranger does not stop every follower's reads.
            log.warning("%s entry %s is not a stream entry, skipped: %r", key, entry_id, err)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
