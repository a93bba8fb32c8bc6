"""The Redis idempotency cache against a real Redis, alone and under the runner."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import harness
from harness.engine import transitions, waits
from harness.engine.checkpointing import run_namespace
from harness.engine.creation import create_run
from harness.engine.executor import ClaimState, RedisCache, cache_key
from harness.engine.runner import run_step
from harness.engine.taskresult import TaskResult
from harness.records import RunStatus, StepStatus
from harness.runs import archive
from harness.runs.prune import prune
from harness.store import Checkpoint, RunPatch, StepPatch
from harness.store.sql import SQLStore
from tests.rig import Rig

calls: list[str] = []


@harness.tool(effect="idempotent")
def pay(amount: int, ctx: harness.ToolContext) -> dict[str, int]:
    calls.append(ctx.idempotency_key)
    return {"paid": amount}


harness.register_agent(
    harness.Agent(
        name="r-pay",
        model=harness.ScriptedModel(
            [{"tool_calls": [{"name": "pay", "args": {"amount": 5}}]}, {"final": "ok"}]
        ),
        tools=[pay],
    )
)


@pytest.fixture
def cache(redis_url: str) -> Iterator[RedisCache]:
    c = RedisCache.from_url(redis_url)
    yield c
    c.client.close()


@pytest.fixture
def rig(sqlite_store: SQLStore, cache: RedisCache) -> Rig:
    calls.clear()
    return Rig(sqlite_store, cache=cache)


def test_claim_is_exclusive_and_completion_is_owner_checked(cache: RedisCache) -> None:
    assert cache.claim("r:1", "a", 10).state is ClaimState.ACQUIRED
    assert cache.claim("r:1", "a", 10).state is ClaimState.ACQUIRED  # re-entrant
    busy = cache.claim("r:1", "b", 10)
    assert busy.state is ClaimState.BUSY and 0 < busy.retry_after <= 10
    cache.complete("r:1", "b", {"from": "b"})  # not b's claim: ignored
    assert cache.claim("r:1", "b", 10).state is ClaimState.BUSY
    cache.complete("r:1", "a", {"from": "a"})
    done = cache.claim("r:1", "b", 10)
    assert (done.state, done.result) == (ClaimState.DONE, {"from": "a"})


def test_release_and_expiry_free_the_key(cache: RedisCache) -> None:
    cache.claim("r:2", "a", 10)
    cache.release("r:2", "b")  # not b's to release
    assert cache.claim("r:2", "b", 10).state is ClaimState.BUSY
    cache.release("r:2", "a")
    assert cache.claim("r:2", "b", 0.05).state is ClaimState.ACQUIRED
    cache.renew("r:2", "b", 10)
    assert cache.client.pttl("harness:idem:r:2") > 1000


def test_redis_down_degrades_to_the_sql_record(rig: Rig) -> None:
    rig.cache = RedisCache.from_url("redis://127.0.0.1:1/0")
    run_id = create_run(rig.runtime(), "r-pay", "g")
    rig.drive()
    assert rig.load(run_id).status is RunStatus.COMPLETED
    assert calls == [f"{run_id}:1"]


def test_busy_key_makes_the_new_owner_back_off(rig: Rig, cache: RedisCache) -> None:
    run_id = create_run(rig.runtime(), "r-pay", "g")
    rig.drive(limit=1)
    key = cache_key(f"{run_id}:1", run_namespace(rig.load(run_id)))
    cache.claim(key, "zombie", 30)  # a stalled executor still holds the key
    assert rig.drive(limit=1) == [TaskResult.BUSY]
    assert calls == []
    run = rig.load(run_id)
    # Given back as it was: waiting on a key is neither an attempt nor a crash.
    assert run.owner == transitions.BACKED_OFF and run.current is not None
    assert (run.current.status, run.current.attempts) == (StepStatus.PENDING, 0)
    assert "backed_off" in [e.to_status for e in rig.store.events(run_id)]
    cache.complete(key, "zombie", {"paid": 5})  # the zombie finishes
    assert run_step(rig.runtime(), run_id) is TaskResult.ADVANCED
    rig.drive()
    assert rig.load(run_id).status is RunStatus.COMPLETED
    assert calls == []  # the zombie's stored result was used


def test_flushed_redis_still_cannot_repeat_a_stored_call(rig: Rig, cache: RedisCache) -> None:
    run_id = create_run(rig.runtime(), "r-pay", "g")
    rig.drive(limit=1)
    key = f"{run_id}:1"
    # the tool ran and its result was stored, then the worker died before the checkpoint
    rig.store.put_tool_result(key, run_id, 1, "pay", {"paid": 5}, rig.clock.now())
    step = rig.store.steps(run_id)[1]
    run = rig.load(run_id)
    rig.store.checkpoint(
        Checkpoint(
            run_id,
            run.version,
            "dead",
            rig.clock.now(),
            run=RunPatch(owner="dead", lease_expires_at=rig.clock.now() - 1),
            steps=(StepPatch(step.index, status=StepStatus.RUNNING, bump_attempts=True),),
        )
    )
    cache.client.flushdb()  # Redis restarted: the cache is empty
    assert run_step(rig.runtime(), run_id) is TaskResult.ADVANCED
    assert calls == []
    assert rig.store.steps(run_id)[1].result == {"paid": 5}


settled: list[str] = []


@harness.tool(effect="idempotent")
def await_tx() -> harness.Deferred:
    return harness.Deferred(timeout=600, signal="tx")


@harness.tool(effect="idempotent")
def settle(tx: str) -> dict[str, str]:
    settled.append(tx)
    return {"settled": tx}


class Settler:
    """Waits for a transaction id, then settles the one its answer named."""

    records_responses = False

    def next_turn(self, request: harness.ModelRequest) -> harness.ModelTurn:
        if request.turn == 0:
            return harness.ModelTurn.from_result({"tool_calls": [{"name": "await_tx", "args": {}}]})
        if request.turn == 1:
            tx = next(s.result for s in request.history() if s.index == 1)["tx"]
            call = {"name": "settle", "args": {"tx": tx}}
            return harness.ModelTurn.from_result({"tool_calls": [call]})
        return harness.ModelTurn(final="settled")


harness.register_agent(harness.Agent(name="r-settle", model=Settler(), tools=[await_tx, settle]))


def test_a_run_imported_again_never_meets_its_first_incarnations_results(rig: Rig) -> None:
    """Exported while it waits, answered A and settled (step 3's result cached
    in Redis), pruned, imported again and answered B: step 3, the same key,
    is now a call to settle B, which must be made, not served A's result."""
    settled.clear()
    run_id = create_run(rig.runtime(), "r-settle", "g")
    rig.drive()
    exported = archive.export_run(rig.store, run_id)
    waits.signal(rig.runtime(), run_id, "tx", {"tx": "A"})
    rig.drive()
    assert rig.load(run_id).status is RunStatus.COMPLETED and settled == ["A"]
    first = rig.load(run_id)
    rig.clock.advance(10)
    prune(rig.store, older_than=1, now=rig.clock.now())
    archive.import_run(rig.store, exported, now=rig.clock.now())
    assert run_namespace(rig.load(run_id)) != run_namespace(first)
    waits.signal(rig.runtime(), run_id, "tx", {"tx": "B"})
    rig.drive()
    assert rig.load(run_id).status is RunStatus.COMPLETED
    assert settled == ["A", "B"]
    assert rig.store.steps(run_id)[3].result == {"settled": "B"}
