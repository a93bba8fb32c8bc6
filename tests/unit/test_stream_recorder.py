"""The flight recorder as an event loop's followers read it (harness.streams.recorder):
the reads asked for together are one query, each answered from its own
event; a read is answered by a query begun after it was asked; a follower
that goes away or a store that fails spoils no one else's read."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest

from harness.errors import StoreError
from harness.records import Event
from harness.store import EventDraft
from harness.store.memory import MemoryStore
from harness.streams.recorder import Recorder
from tests.contract.test_reads import T0, add_run
from tests.contract.test_store_contract import apply


class Counted(MemoryStore):
    """A memory store that counts its many-run reads, and can fail them."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[dict[str, int]] = []
        self.fail = False

    def events_after_runs(self, after: Mapping[str, int], limit: int) -> dict[str, list[Event]]:
        self.asked.append(dict(after))
        if self.fail:
            raise StoreError("the database went away")
        return super().events_after_runs(after, limit)


def recorded(store: Counted, *names: str) -> None:
    for name in names:
        run = add_run(store, name, T0)  # type: ignore[arg-type]
        for n in range(3):
            run = apply(store, run, events=(EventDraft(f"{name}{n}", step_index=n),))  # type: ignore[arg-type]


def statuses(events: list[Event]) -> list[str]:
    return [e.to_status for e in events]


def run(body: Any) -> Any:
    return asyncio.run(asyncio.wait_for(body, 10))


def test_reads_asked_together_are_one_query_each_from_its_own_event() -> None:
    store = Counted()
    names = [f"r{n}" for n in range(20)]
    recorded(store, *names)
    first = {name: store.events_after(name)[1].id for name in names}

    async def read() -> list[list[Event]]:
        recorder = Recorder(store)
        try:
            return await asyncio.gather(*(recorder.events_after(n, first[n]) for n in names))
        finally:
            await recorder.aclose()

    answers = run(read())

    assert len(store.asked) == 1  # twenty followers, one query
    for name, events in zip(names, answers, strict=True):
        assert statuses(events) == [f"{name}1", f"{name}2"]


def test_two_followers_of_one_run_each_get_their_own_answer() -> None:
    store = Counted()
    recorded(store, "r")
    every = store.events_after("r")

    async def read() -> list[list[Event]]:
        recorder = Recorder(store, limit=2)
        try:
            return await asyncio.gather(
                recorder.events_after("r", 0), recorder.events_after("r", every[2].id)
            )
        finally:
            await recorder.aclose()

    from_start, later = run(read())

    assert statuses(from_start) == ["pending", "r0"]  # its own limit, from its own event
    assert statuses(later) == ["r2"]
    assert len(store.asked) == 2  # one run from two places: a query each


def test_a_read_is_answered_by_a_query_begun_after_it_was_asked() -> None:
    store = Counted()
    recorded(store, "r")
    last = store.events_after("r")[-1].id

    async def read() -> list[str]:
        recorder = Recorder(store)
        try:
            assert await recorder.events_after("r", last) == []
            run_ = store.load("r")
            apply(store, run_, events=(EventDraft("late", step_index=9),))  # type: ignore[arg-type]
            return statuses(await recorder.events_after("r", last))
        finally:
            await recorder.aclose()

    assert run(read()) == ["late"]


def test_a_failing_store_fails_the_reads_of_that_round_and_not_the_next() -> None:
    store = Counted()
    recorded(store, "a", "b")

    async def read() -> tuple[list[BaseException | list[Event]], list[Event]]:
        recorder = Recorder(store)
        try:
            store.fail = True
            failed = await asyncio.gather(
                recorder.events_after("a", 0), recorder.events_after("b", 0), return_exceptions=True
            )
            store.fail = False
            return failed, await recorder.events_after("a", 0)
        finally:
            await recorder.aclose()

    failed, again = run(read())

    assert all(isinstance(f, StoreError) for f in failed)
    assert statuses(again) == ["pending", "a0", "a1", "a2"]


def test_a_follower_gone_before_its_answer_leaves_the_others_theirs() -> None:
    store = Counted()
    recorded(store, "a", "b")

    async def read() -> list[Event]:
        recorder = Recorder(store)
        try:
            gone = asyncio.ensure_future(recorder.events_after("a", 0))
            staying = asyncio.ensure_future(recorder.events_after("b", 0))
            await asyncio.sleep(0)
            gone.cancel()
            return await staying
        finally:
            await recorder.aclose()

    assert statuses(run(read())) == ["pending", "b0", "b1", "b2"]


@pytest.mark.parametrize("followers", [1, 50])
def test_closing_cancels_what_is_still_asked(followers: int) -> None:
    store = Counted()
    recorded(store, "r")

    async def read() -> list[BaseException | list[Event]]:
        recorder = Recorder(store)
        asked = [asyncio.ensure_future(recorder.events_after("r", 0)) for _ in range(followers)]
        await recorder.aclose()
        return await asyncio.gather(*asked, return_exceptions=True)

    answers = run(read())
    assert all(isinstance(a, (asyncio.CancelledError, list)) for a in answers)
