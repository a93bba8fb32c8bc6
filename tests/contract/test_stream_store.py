"""The store's Streams part on every backend (SQLite, PostgreSQL, memory):
a run's entries kept in order with ascending ids, read after an id, a run's
own only; trimmed by age; gone with the run when it is pruned; any text a
model may send (a NUL, a lone surrogate) kept as it came. And a run's Redis
stream is its incarnation's: a run pruned and imported again (its creation
time kept) neither reads nor extends the stream of the first, which Redis
may still hold."""

from __future__ import annotations

import asyncio

import redis
import redis.asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.engine import transitions
from harness.records import Run, RunStatus
from harness.runs import archive
from harness.runs.prune import prune
from harness.store import Checkpoint, RunPatch, Store, StreamEntry, StreamKind
from harness.streams import RedisSink, Tap, stream_key
from harness.streams.feed import RedisSource

NOW = 1_000.0


def _token(step: int, text: str, attempt: int = 1) -> StreamEntry:
    return StreamEntry(step, attempt, StreamKind.TOKEN, text)


def test_entries_are_kept_in_order_and_read_after_an_id(store: Store) -> None:
    store.append_stream("r1", [_token(0, "Hel"), _token(0, "lo")], NOW)
    store.append_stream("r2", [_token(0, "other")], NOW)
    store.append_stream("r1", [StreamEntry(0, 1, StreamKind.DISCARD), _token(0, "Hi", 2)], NOW)
    read = store.stream_after("r1", 0)
    ids = [i for i, _ in read]
    assert ids == sorted(ids) and len(set(ids)) == 4
    assert [e for _, e in read] == [
        _token(0, "Hel"),
        _token(0, "lo"),
        StreamEntry(0, 1, StreamKind.DISCARD),
        _token(0, "Hi", 2),
    ]
    assert [e.text for _, e in store.stream_after("r1", ids[1])] == ["", "Hi"]
    assert [e.text for _, e in store.stream_after("r1", 0, limit=1)] == ["Hel"]
    assert store.stream_after("r1", ids[-1]) == []
    assert store.stream_after("nobody", 0) == []


def test_old_entries_are_trimmed(store: Store) -> None:
    store.append_stream("r1", [_token(0, "old")], NOW)
    store.append_stream("r1", [_token(1, "new")], NOW + 100)
    assert store.trim_streams(NOW + 50) == 1
    assert [e.text for _, e in store.stream_after("r1", 0)] == ["new"]


def test_a_pruned_run_takes_its_stream(store: Store) -> None:
    run, steps = transitions.new_run("r1", "agent", "goal", NOW)
    store.create_run(run, steps, NOW + 30, transitions.created(run))
    loaded = store.load("r1")
    patch = RunPatch(status=RunStatus.COMPLETED)
    store.checkpoint(Checkpoint("r1", loaded.version, "t", NOW, run=patch))
    store.append_stream("r1", [_token(0, "bye")], NOW)
    deleted = store.delete_runs(["r1"], NOW + 10, (RunStatus.COMPLETED,))
    assert [r for r, _ in deleted.runs] == ["r1"]
    assert store.stream_after("r1", 0) == []


@settings(
    max_examples=40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(text=st.text(st.characters(codec=None), max_size=50))
def test_any_text_a_model_sends_is_kept_as_it_came(store: Store, text: str) -> None:
    store.append_stream("fuzz", [_token(3, text)], NOW)
    _, entry = store.stream_after("fuzz", 0)[-1]
    assert entry == _token(3, text)


def test_ids_are_never_given_again_after_a_trim_empties_the_table(store: Store) -> None:
    store.append_stream("r1", [_token(0, "a"), _token(0, "b"), _token(0, "c")], NOW)
    cursor = store.stream_after("r1", 0)[-1][0]  # a reader has read up to here
    store.trim_streams(NOW + 3600)  # the run waited an hour: every row trimmed
    store.append_stream("r1", [_token(1, "after the wait")], NOW + 3700)
    assert [e.text for _, e in store.stream_after("r1", cursor)] == ["after the wait"]


def _redis_stream(url: str, run: Run) -> list[StreamEntry]:
    """What a follower of ``run`` reads of its Redis stream (harness.streams.feed)."""

    async def read() -> list[StreamEntry]:
        client = redis.asyncio.Redis.from_url(url)
        try:
            return [e for _, e in await RedisSource(client, run).read("0", 0)]
        finally:
            await client.aclose()

    return asyncio.run(read())


def test_a_run_imported_again_has_a_redis_stream_of_its_own(store: Store, redis_url: str) -> None:
    run, steps = transitions.new_run("r1", "agent", "goal", NOW)
    store.create_run(run, steps, NOW, transitions.created(run))
    first = store.load("r1")
    sink = RedisSink(redis.Redis.from_url(redis_url), ttl=3600)
    tap = Tap(sink, "r1", first.lineage, 0, 1, interval=0)
    tap("the first incarnation's answer")
    tap.close()
    store.checkpoint(
        Checkpoint("r1", first.version, "w", NOW, run=RunPatch(status=RunStatus.COMPLETED))
    )
    document = archive.export_run(store, "r1")
    prune(store, older_than=1, now=NOW + 10)
    archive.import_run(store, document, now=NOW + 20)
    again = store.load("r1")
    assert again.created_at == first.created_at
    assert stream_key("r1", again.lineage) != stream_key("r1", first.lineage)
    assert _redis_stream(redis_url, again) == []  # the first's is still in Redis
    assert [e.text for e in _redis_stream(redis_url, first)] == ["the first incarnation's answer"]
    Tap(sink, "r1", again.lineage, 0, 1, interval=0)("its own")
    assert [e.text for e in _redis_stream(redis_url, again)] == ["its own"]


def test_a_row_made_before_incarnations_keeps_its_stream_key() -> None:
    """A run in flight across migration 0017 (no incarnation) is followed on
    the key it was written to before (its creation time)."""
    old = transitions.new_run("r1", "agent", "goal", NOW)[0]
    assert old.incarnation is None
    assert stream_key("r1", old.lineage) == f"harness:stream:r1:{NOW:.6f}"
