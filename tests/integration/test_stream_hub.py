"""One reader of Redis streams for an event loop's followers (harness.streams.hub),
against a real Redis: every follower gets its entries once and in order from
the hub's shared reads; a follower joining while the hub's read is blocked
is served at once; one that leaves is read for no more; a slow one is cut
loose (its queue bounded) and catches up by itself, holding no one back; an
entry no tap wrote is skipped; a Redis that cannot be reached leaves the
followers' waits empty, not broken.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import pytest
import redis
import redis.asyncio

from harness.records import Run, RunStatus
from harness.store.values import StreamEntry, StreamKind
from harness.streams import RedisSink, hub
from harness.streams.feed import HubSource, RedisSource
from harness.streams.hub import Hub

pytestmark = pytest.mark.redis

Entries = list[tuple[str, StreamEntry]]
_created = itertools.count(1)


def a_run(name: str) -> Run:
    return Run(
        run_id=name,
        agent="a",
        goal="g",
        status=RunStatus.RUNNING,
        cursor=0,
        version=1,
        step_count=1,
        created_at=next(_created),
    )


def pieces(*texts: str) -> list[StreamEntry]:
    return [StreamEntry(0, 1, StreamKind.TOKEN, text) for text in texts]


async def until(check: Callable[[], Awaitable[bool]], what: str, timeout: float = 10.0) -> None:
    """Wait for ``check`` with a deadline (never a sleep that hopes)."""
    async with asyncio.timeout(timeout):
        while not await check():
            await asyncio.sleep(0.005)
    assert await check(), what


class Follower:
    """A reader of one run's stream through the hub, as the feed reads it:
    from the last entry it has, waiting up to a second."""

    def __init__(self, the_hub: Hub, client: redis.asyncio.Redis, run: Run) -> None:
        self.source = HubSource(the_hub, RedisSource(client, run))
        self.after = "0"
        self.texts: list[str] = []

    async def read(self, wait: float = 1.0) -> Entries:
        entries = await self.source.read(self.after, wait)
        if entries:
            self.after = entries[-1][0]
        self.texts += [entry.text for _, entry in entries]
        return entries

    async def has(self, count: int) -> bool:
        if len(self.texts) < count:
            await self.read(0.05)
        return len(self.texts) >= count


Body = Callable[[redis.asyncio.Redis, RedisSink], Coroutine[Any, Any, None]]


def run(redis_url: str, body: Body, reader_url: str | None = None) -> None:
    """``body`` on an event loop of its own, with a client of that loop's
    (of ``reader_url`` if given; the sink writes as ``redis_url``)."""

    async def main() -> None:
        client = redis.asyncio.Redis.from_url(reader_url or redis_url)
        try:
            await asyncio.wait_for(body(client, RedisSink(redis.Redis.from_url(redis_url), 60)), 60)
        finally:
            await client.aclose()

    asyncio.run(main())


def test_many_followers_get_every_entry_once_in_order_from_shared_reads(redis_url: str) -> None:
    run(redis_url, _many_followers_get_every_entry_once_in_order_from_shared_reads)


async def _many_followers_get_every_entry_once_in_order_from_shared_reads(
    client: redis.asyncio.Redis, sink: RedisSink
) -> None:
    the_hub = Hub(client, block=5.0)
    runs = [a_run(f"r{n}") for n in range(30)]
    followers = [Follower(the_hub, client, run) for run in runs]
    twice = Follower(the_hub, client, runs[0])  # a second reader of one stream
    for f in [*followers, twice]:
        await f.read(0.01)  # subscribed
    for round_ in range(5):
        for run in runs:
            sink.append(run.run_id, run.lineage, pieces(f"{run.run_id}.{round_}"))

    for f, run in [*zip(followers, runs, strict=True), (twice, runs[0])]:
        await until(lambda f=f: f.has(5), f"{run.run_id}'s five pieces")
        assert f.texts == [f"{run.run_id}.{n}" for n in range(5)]
    # 31 followers of 150 entries: a handful of XREADs, not one per follower per entry.
    assert the_hub.reads < 31 * 5
    for f in [*followers, twice]:
        f.source.close()
    await the_hub.aclose()


def test_a_follower_joining_during_a_blocked_read_is_read_for_at_once(redis_url: str) -> None:
    run(redis_url, _a_follower_joining_during_a_blocked_read_is_read_for_at_once)


async def _a_follower_joining_during_a_blocked_read_is_read_for_at_once(
    client: redis.asyncio.Redis, sink: RedisSink
) -> None:
    the_hub = Hub(client, block=60.0)  # a read that would outlast the test
    first, second = a_run("first"), a_run("second")
    early = Follower(the_hub, client, first)
    await early.read(0.01)
    await until(lambda: _reading(the_hub), "the hub blocked in its read")

    late = Follower(the_hub, client, second)
    sink.append(second.run_id, second.lineage, pieces("hello"))

    await until(lambda: late.has(1), "the newcomer's piece, long before the read's block ends")
    assert late.texts == ["hello"]
    early.source.close()
    late.source.close()
    await the_hub.aclose()


def test_a_follower_that_leaves_is_read_for_no_more_and_the_others_go_on(redis_url: str) -> None:
    run(redis_url, _a_follower_that_leaves_is_read_for_no_more_and_the_others_go_on)


async def _a_follower_that_leaves_is_read_for_no_more_and_the_others_go_on(
    client: redis.asyncio.Redis, sink: RedisSink
) -> None:
    the_hub = Hub(client, block=0.2)
    stay, leave = a_run("stay"), a_run("leave")
    staying, leaving = Follower(the_hub, client, stay), Follower(the_hub, client, leave)
    await staying.read(0.01)
    await leaving.read(0.01)
    leaving.source.close()

    sink.append(leave.run_id, leave.lineage, pieces("unread"))
    sink.append(stay.run_id, stay.lineage, pieces("read"))

    await until(lambda: staying.has(1), "the staying follower's piece")
    assert staying.texts == ["read"]
    assert leaving.texts == []
    assert [s.key for subs in the_hub._streams.values() for s in subs] == [
        staying.source._direct.key
    ]
    staying.source.close()
    assert the_hub._streams == {}
    await the_hub.aclose()


def test_a_slow_follower_is_cut_loose_at_its_bound_and_catches_up_by_itself(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hub never waits for a follower: one that does not read while more
    than QUEUE entries arrive loses its queue (memory stays bounded) and reads
    the stream itself from where it is; the others go on meanwhile."""
    monkeypatch.setattr(hub, "QUEUE", 5)
    run(redis_url, _slow_follower)


async def _slow_follower(client: redis.asyncio.Redis, sink: RedisSink) -> None:
    the_hub = Hub(client, block=0.2)
    slow_run, fast_run = a_run("slow"), a_run("fast")
    slow, fast = Follower(the_hub, client, slow_run), Follower(the_hub, client, fast_run)
    await slow.read(0.01)
    await fast.read(0.01)
    await until(lambda: _joined(slow), "the slow follower joined")

    for n in range(20):
        sink.append(slow_run.run_id, slow_run.lineage, pieces(f"s{n}"))
        sink.append(fast_run.run_id, fast_run.lineage, pieces(f"f{n}"))
        await until(lambda n=n: fast.has(n + 1), "the fast follower keeps up")
    assert fast.texts == [f"f{n}" for n in range(20)]
    await until(lambda: _behind(slow), "the slow follower cut loose")
    assert len(slow.source._sub.queue) <= 5  # type: ignore[union-attr]

    await until(lambda: slow.has(20), "the slow follower caught up")
    assert slow.texts == [f"s{n}" for n in range(20)]  # every piece, once, in order
    await slow.read(0.01)  # caught up: back with the hub
    assert not slow.source._sub.behind  # type: ignore[union-attr]
    sink.append(slow_run.run_id, slow_run.lineage, pieces("after"))
    await until(lambda: slow.has(21), "a piece read by the hub again")
    assert slow.texts[-1] == "after"
    slow.source.close()
    fast.source.close()
    await the_hub.aclose()


def test_an_entry_no_tap_wrote_is_skipped_and_the_reads_go_on(redis_url: str) -> None:
    run(redis_url, _stranger)


async def _stranger(client: redis.asyncio.Redis, sink: RedisSink) -> None:
    the_hub = Hub(client, block=0.2)
    one, other = a_run("one"), a_run("other")
    ones, others = Follower(the_hub, client, one), Follower(the_hub, client, other)
    await ones.read(0.01)
    await others.read(0.01)
    await until(lambda: _joined(ones), "the follower joined")

    await client.xadd(ones.source._direct.key, {"x": "not an entry"})
    await client.xadd(ones.source._direct.key, {"e": "[not json"})
    sink.append(one.run_id, one.lineage, pieces("fine"))
    sink.append(other.run_id, other.lineage, pieces("also fine"))

    await until(lambda: ones.has(1), "the piece after the strangers")
    await until(lambda: others.has(1), "the other stream's piece")
    assert (ones.texts, others.texts) == (["fine"], ["also fine"])
    ones.source.close()
    others.source.close()
    await the_hub.aclose()


def test_a_reader_that_may_not_write_serves_a_newcomer_after_the_read_under_way(
    redis_url: str,
) -> None:
    """A user allowed to read only (Redis ACL): the wake-up is refused, said
    once, and the newcomer is served when the blocked read ends."""
    admin = redis.Redis.from_url(redis_url)
    user = f"hub-reader-{next(_created)}"
    admin.acl_setuser(
        user, enabled=True, nopass=True, keys=["*"], commands=["+@read", "+@connection"]
    )
    try:
        run(redis_url, _read_only, redis_url.replace("redis://", f"redis://{user}@", 1))
    finally:
        admin.acl_deluser(user)
        admin.close()


async def _read_only(client: redis.asyncio.Redis, sink: RedisSink) -> None:
    the_hub = Hub(client, block=0.5)
    first, second = a_run("first"), a_run("second")
    early = Follower(the_hub, client, first)
    await early.read(0.01)
    await until(lambda: _reading(the_hub), "the hub blocked in its read")
    late = Follower(the_hub, client, second)
    await late.read(0.01)
    sink.append(second.run_id, second.lineage, pieces("hello"))

    await until(lambda: late.has(1), "the newcomer's piece, after the read under way")
    assert late.texts == ["hello"]
    assert the_hub._wake_refused
    early.source.close()
    late.source.close()
    await the_hub.aclose()


def test_a_redis_out_of_reach_leaves_the_followers_waits_empty() -> None:
    asyncio.run(asyncio.wait_for(_out_of_reach(), 30))


async def _out_of_reach() -> None:
    unreachable = redis.asyncio.Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=1)
    the_hub = Hub(unreachable, block=0.1)
    follower = Follower(the_hub, unreachable, a_run("lonely"))

    assert await follower.read(0.2) == []  # the wait ends empty, no error
    assert await follower.read(0.2) == []
    follower.source.close()
    await the_hub.aclose()
    await unreachable.aclose()


async def _reading(the_hub: Hub) -> bool:
    return the_hub._reading


async def _joined(f: Follower) -> bool:
    return f.source._sub is not None and f.source._sub.joined


async def _behind(f: Follower) -> bool:
    return f.source._sub is not None and f.source._sub.behind
