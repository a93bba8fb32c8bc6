"""Publishing a model call's text: the tap a call writes through, and the
two places a run's stream is kept (Redis, or the run store's table)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from harness.store.values import StreamEntry, StreamKind

if TYPE_CHECKING:
    import redis

    from harness.store import Store

log = logging.getLogger(__name__)

#: A tap writes what came within this many seconds of its last write
#: together: a reader sees text this late at most while the model writes,
#: and a fast stream costs one write per interval, not one per piece.
FLUSH_INTERVAL = 0.01
#: A tap's interval on the run store's table (harness_stream).
TABLE_INTERVAL = 0.1
#: Entries a run's Redis stream keeps at most (approximately: Redis trims
#: whole nodes); the oldest go first.
MAX_ENTRIES = 10_000


def stream_key(run_id: str, lineage: str) -> str:
    """The Redis key of a run's stream. ``lineage`` (:attr:`Run.lineage
    <harness.records.Run.lineage>`, its incarnation) tells apart two runs that
    had the same id: a store wiped, an id reused, a run pruned and imported
    again, whose old stream may still be in Redis (an import keeps the
    creation time, so that could not tell them apart)."""
    return f"harness:stream:{run_id}:{lineage}"


class Sink(Protocol):
    """Where a run's stream is kept; ``interval``: the seconds a tap coalesces
    pieces for (:data:`FLUSH_INTERVAL`, or more for a slower place)."""

    interval: float

    def append(self, run_id: str, lineage: str, entries: Sequence[StreamEntry]) -> None:
        """Add ``entries`` to the run's stream, in order; raise if they could not be."""

    def trim(self, now: float) -> None:
        """Forget what was written more than the TTL before ``now`` (the sweeper
        asks), if the stream does not expire by itself."""


class RedisSink:
    """A Redis stream per run: one round trip a write (the entries, then the
    key's expiry, pipelined)."""

    interval = FLUSH_INTERVAL

    def __init__(self, client: redis.Redis, ttl: float, max_entries: int = MAX_ENTRIES) -> None:
        self._client = client
        self._ttl = max(1, int(ttl))
        self._max = max_entries

    @classmethod
    def from_url(cls, url: str, ttl: float, timeout: float = 1.0) -> RedisSink:
        import redis

        client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
        return cls(client, ttl)

    def append(self, run_id: str, lineage: str, entries: Sequence[StreamEntry]) -> None:
        key = stream_key(run_id, lineage)
        pipe = self._client.pipeline(transaction=False)
        for entry in entries:
            pipe.xadd(key, {"e": entry.encode()}, maxlen=self._max, approximate=True)
        pipe.expire(key, self._ttl)
        pipe.execute()

    def trim(self, now: float) -> None:
        """Nothing: each run's stream expires by itself."""


class StoreSink:
    """The run store's table ``harness_stream``: one transaction a write, at
    most every :data:`TABLE_INTERVAL` a call (SQLite has one writer: a
    checkpoint must not queue behind every piece of every answer)."""

    interval = TABLE_INTERVAL

    def __init__(self, store: Store, ttl: float) -> None:
        self._store = store
        self._ttl = ttl

    def append(self, run_id: str, lineage: str, entries: Sequence[StreamEntry]) -> None:
        self._store.append_stream(run_id, entries, time.time())

    def trim(self, now: float) -> None:
        self._store.trim_streams(now - self._ttl)


class Tap:
    """One model call's text, published as it comes (a request's ``on_text``).

    The first piece is written at once, and so is any piece that comes
    :data:`FLUSH_INTERVAL` or more after the last write; pieces that come
    sooner wait for the next piece or :meth:`close`. The first write starts
    with a ``discard`` for each earlier attempt of the step (see
    :mod:`harness.streams`); :meth:`close` writes them even if no text came.
    With ``again``, it discards its own attempt first too. While ``live()``
    is false (the call's lease has lapsed: the step may be another worker's
    now, whose call has discarded this one) nothing is written; what came
    meanwhile waits for a write while it is true again.
    A write that fails is logged and the tap goes quiet for the rest of the
    call: the call never waits on, or fails for, its watchers."""

    def __init__(
        self,
        sink: Sink,
        run_id: str,
        lineage: str,
        step: int,
        attempt: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        interval: float | None = None,
        live: Callable[[], bool] = lambda: True,
        again: bool = False,
    ) -> None:
        self._sink = sink
        self._live = live
        self._run = (run_id, lineage)
        self._step, self._attempt = step, attempt
        self._clock = clock
        self._interval = sink.interval if interval is None else interval
        earlier = range(1, attempt)
        self._entries = [StreamEntry(step, a, StreamKind.DISCARD) for a in earlier]
        # ``again``: this call's attempt may have been another's (a step run
        # without its RUNNING checkpoint counts no attempt durably): its own
        # number is discarded too, just before its first piece. A call with no
        # text writes no such word (nothing of its own to follow it): a tool-call
        # turn run straight through costs no write.
        self._again = again
        self._pieces: list[str] = []
        self._written = -float("inf")
        self.quiet = False

    def __call__(self, text: str) -> None:
        if self.quiet or not text:
            return
        self._pieces.append(text)
        now = self._clock()
        if now - self._written >= self._interval:
            self._write(now)

    def close(self) -> None:
        """Write what is left (the call has ended, whatever its end)."""
        if not self.quiet:
            self._write(self._clock())

    def _write(self, now: float) -> None:
        if not self._live():
            return
        if self._pieces:
            if self._again:
                self._again = False
                own = StreamEntry(self._step, self._attempt, StreamKind.DISCARD)
                self._entries.append(own)
            text = "".join(self._pieces)
            self._entries.append(StreamEntry(self._step, self._attempt, StreamKind.TOKEN, text))
            self._pieces.clear()
        if not self._entries:
            return
        entries, self._entries = self._entries, []
        try:
            self._sink.append(*self._run, entries)
        except Exception as err:
            self.quiet = True
            log.warning(
                "run=%s step=%d attempt=%d the answer's stream could not be written (%s); "
                "the call goes on unwatched",
                self._run[0],
                self._step,
                self._attempt,
                err,
            )
        self._written = self._clock()  # after the write: a slow sink widens the coalescing
