"""The flight recorder as an event loop's followers read it: together.

Each follower of a run reads the run's flight recorder every
:data:`~harness.streams.feed.POLL` seconds. A hundred followers reading on
their own would be two hundred queries a second, each on a thread of the
loop's pool and a connection of the store's (more than the pool keeps:
connections opened and closed again). :class:`Recorder` takes the reads
asked for while one is under way and makes them one query
(``events_after_runs``), on one thread; the feed asks on a shared grid of
times (every follower due at the same instants), so one round is one query.

A read is answered by a query that began after it was asked: a follower
that has just read that its run ended sees every transition before it.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

from harness.records import Event

if TYPE_CHECKING:
    from harness.store import ReadStore

#: Events read at most at once, for each run.
BATCH = 1000


class Recorder:
    """Reads of the flight recorder, made one query for the runs asked at once."""

    def __init__(self, store: ReadStore, limit: int = BATCH) -> None:
        self._store = store
        self._limit = limit
        self._asked: list[tuple[str, int, asyncio.Future[list[Event]]]] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.queries = 0  # statements' rounds made, for tests and measurements

    async def events_after(self, run_id: str, after: int) -> list[Event]:
        """The run's events after event ``after``, :data:`BATCH` at most, read
        by a query that began after this call. Raises what the store raises."""
        answer: asyncio.Future[list[Event]] = asyncio.get_running_loop().create_future()
        self._asked.append((run_id, after, answer))
        self._wake.set()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())
        return await answer

    async def aclose(self) -> None:
        """Stop answering (a read still asked is cancelled)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for _, _, answer in self._asked:
            answer.cancel()
        self._asked = []

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            await asyncio.sleep(0)  # the others due at this instant ask too
            await self._answer()

    async def _answer(self) -> None:
        # A run asked twice from two places (two followers of it) is read from
        # one now, the other in the next round: each gets its own BATCH.
        now: dict[str, int] = {}
        taken, later = [], []
        for asked in self._asked:
            run_id, after, answer = asked
            if answer.done():  # its follower has gone
                continue
            if now.setdefault(run_id, after) == after:
                taken.append(asked)
            else:
                later.append(asked)
        self._asked = later
        if later:
            self._wake.set()
        if not taken:
            return
        self.queries += 1
        try:
            found = await asyncio.to_thread(self._store.events_after_runs, now, self._limit)
        except Exception as err:  # each follower raises it, as its own read would have
            for _, _, answer in taken:
                if not answer.done():
                    answer.set_exception(err)
            return
        for run_id, _, answer in taken:
            if not answer.done():
                answer.set_result(found.get(run_id, []))
