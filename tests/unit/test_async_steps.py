"""``async def`` tools and models through the whole step path: the same
validation, schema, effects, waits and errors as plain ones; a step's loop
kept from call to call; the step's time limit cancelling the coroutine."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

import harness
from harness.engine import recovery
from harness.engine.creation import create_run
from harness.engine.taskresult import TaskResult
from harness.errors import InvalidToolArgs, StepTimedOut
from harness.models import ModelRequest, ModelTurn, ToolCall, take_turn
from harness.providers.base import tool_schema
from harness.records import RunStatus, StepStatus
from harness.store.memory import MemoryStore
from harness.tools import ToolContext
from tests.rig import Rig

#: What the tools and models below saw: (what, key or turn, the loop's id).
SEEN: list[tuple[str, Any, int]] = []


def _loop_id() -> int:
    return id(asyncio.get_running_loop())


@harness.tool(effect="idempotent")
async def fetch(city: str, ctx: harness.ToolContext, days: int = 1) -> dict[str, Any]:
    """Fetch a forecast."""
    await asyncio.sleep(0)
    SEEN.append(("fetch", ctx.idempotency_key, _loop_id()))
    return {"city": city, "days": days}


@harness.tool(effect="idempotent")
def fetch_plain(city: str, ctx: harness.ToolContext, days: int = 1) -> dict[str, Any]:
    """Fetch a forecast."""
    return {"city": city, "days": days}


@harness.tool(effect="read_only")
async def returns(value: Any) -> Any:
    return value


@harness.tool(effect="read_only")
async def fails() -> None:
    raise ValueError("upstream said no")


@harness.tool(effect="read_only")
async def odd() -> Any:
    return {1, 2}  # not JSON


@harness.tool(effect="idempotent")
async def waits_for_payment() -> harness.Deferred:
    return harness.Deferred(timeout=60, signal="paid")


class AsyncScripted:
    """A model whose ``next_turn`` is a coroutine function."""

    records_responses = False

    def __init__(self, turns: list[dict[str, Any]], hang_on: int | None = None) -> None:
        self.turns = harness.ScriptedModel(turns)
        self.hang_on = hang_on

    async def next_turn(self, request: ModelRequest) -> ModelTurn:
        SEEN.append(("model", request.turn, _loop_id()))
        if request.turn == self.hang_on:
            try:
                await asyncio.sleep(60)
            finally:
                SEEN.append(("model finally", request.turn, _loop_id()))
        await asyncio.sleep(0)
        return self.turns.next_turn(request)


def _calls(*names_args: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    return {"tool_calls": [{"name": n, "args": a} for n, a in names_args]}


def _agent(name: str, model: Any, tools: list[Any]) -> str:
    harness.register_agent(harness.Agent(name=name, model=model, tools=tools, max_attempts=3))
    return name


@pytest.fixture
def rig(memory_store: MemoryStore) -> Iterator[Rig]:
    SEEN.clear()
    yield Rig(memory_store)


# -- the tool itself ------------------------------------------------------------


def test_an_async_tool_is_described_and_validated_like_its_plain_twin() -> None:
    assert fetch.is_async and not fetch_plain.is_async
    assert fetch.context_param == "ctx" and fetch.description == "Fetch a forecast."
    assert tool_schema(fetch) == tool_schema(fetch_plain)
    assert fetch.validate({"city": "Oslo"}) == fetch_plain.validate({"city": "Oslo"})
    with pytest.raises(InvalidToolArgs, match="days"):
        fetch.validate({"city": "Oslo", "days": "many"})


def test_an_async_tool_is_awaited_when_called_and_awaitable_from_async_code() -> None:
    ctx = ToolContext("run", 3, 1)
    assert fetch.invoke({"city": "Oslo", "days": 2}, ctx) == {"city": "Oslo", "days": 2}

    async def users_code() -> Any:
        return await fetch(city="Rome", ctx=ctx)

    assert asyncio.run(users_code()) == {"city": "Rome", "days": 1}


def test_an_async_tool_called_synchronously_inside_a_running_loop_still_runs() -> None:
    async def users_code() -> Any:
        return returns.invoke({"value": [1, 2]}, ToolContext("run", 1, 1))

    assert asyncio.run(users_code()) == [1, 2]


def test_an_async_generator_is_refused_at_registration() -> None:
    async def stream() -> Any:
        yield 1

    with pytest.raises(TypeError, match="async generator is not a tool"):
        harness.tool(stream)


def test_an_async_tool_past_its_time_cancels_and_says_so() -> None:
    ends: list[str] = []

    @harness.tool(effect="read_only")
    async def slow() -> None:
        try:
            await asyncio.sleep(60)
        finally:
            ends.append("finally")

    with pytest.raises(StepTimedOut, match=r"tool 'slow' ran past the step's time limit"):
        slow.invoke({}, ToolContext("run", 1, 1), timeout=0.05)
    assert ends == ["finally"]


# -- on the step path -----------------------------------------------------------


def test_a_run_of_async_tools_and_an_async_model_completes_on_one_loop(rig: Rig) -> None:
    model = AsyncScripted(
        [
            _calls(("fetch", {"city": "Oslo"}), ("fetch", {"city": "Rome", "days": 3})),
            {"final": "ok"},
        ]
    )
    run_id = create_run(rig.runtime(), _agent("u-async", model, [fetch]), "g")
    assert rig.drive()[-1] is TaskResult.COMPLETED
    assert rig.load(run_id).result == "ok"
    steps = rig.store.steps(run_id)
    assert [s.result for s in steps[1:3]] == [
        {"city": "Oslo", "days": 1},
        {"city": "Rome", "days": 3},
    ]
    assert [what for what, _, _ in SEEN] == ["model", "fetch", "fetch", "model"]
    assert len({loop for _, _, loop in SEEN}) == 1  # one loop for this thread, every call


def test_an_async_tools_errors_and_results_are_handled_as_a_plain_tools(rig: Rig) -> None:
    model = harness.ScriptedModel(
        [
            _calls(
                ("fails", {}),
                ("returns", {"value": {"a": 1}}),
                ("odd", {}),
            ),
            _calls(("waits_for_payment", {})),
            {"final": "x"},
        ]
    )
    run_id = create_run(
        rig.runtime(), _agent("u-async-kinds", model, [fails, returns, odd, waits_for_payment]), "g"
    )
    assert rig.drive()[-1] is TaskResult.WAITING
    steps = rig.store.steps(run_id)
    (failed, kept, refused), deferred = steps[1:4], steps[5]
    assert failed.status is StepStatus.FAILED
    assert failed.error == "tool 'fails' raised ValueError: upstream said no"
    assert (kept.status, kept.result) == (StepStatus.DONE, {"a": 1})
    assert refused.status is StepStatus.FAILED and "cannot be kept" in (refused.error or "")
    assert deferred.status is StepStatus.DEFERRED
    assert rig.load(run_id).status is RunStatus.WAITING


ATTEMPTS: list[tuple[str, int, str]] = []


@harness.tool(effect="idempotent")
async def stalls_once(ctx: harness.ToolContext) -> str:
    ATTEMPTS.append(("start", ctx.attempt, ctx.idempotency_key))
    try:
        if ctx.attempt == 1:
            await asyncio.sleep(60)
        return "second time lucky"
    finally:
        ATTEMPTS.append(("finally", ctx.attempt, ctx.idempotency_key))


@harness.tool(effect="at_most_once")
async def charges_slowly(ctx: harness.ToolContext) -> str:
    ATTEMPTS.append(("start", ctx.attempt, ctx.idempotency_key))
    try:
        await asyncio.sleep(60)
        return "charged"
    finally:
        ATTEMPTS.append(("finally", ctx.attempt, ctx.idempotency_key))


@harness.tool(effect="at_most_once")
async def charges_then_unwinds(ctx: harness.ToolContext) -> str:
    """A client that turns its cancellation into an error of its own."""
    ATTEMPTS.append(("start", ctx.attempt, ctx.idempotency_key))
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        raise ConnectionAbortedError("payment aborted mid-request") from None
    return "charged"


def _timed_rig(store: MemoryStore) -> Rig:
    ATTEMPTS.clear()
    return Rig(store, options={"step_time_limit": 0.1})


def test_the_step_time_limit_cancels_an_async_tool_and_recovery_calls_it_again(
    memory_store: MemoryStore,
) -> None:
    rig = _timed_rig(memory_store)
    turns = [_calls(("stalls_once", {})), {"final": "done"}]
    run_id = create_run(
        rig.runtime(), _agent("u-stalls", harness.ScriptedModel(turns), [stalls_once]), "g"
    )
    assert rig.drive(limit=2) == [TaskResult.ADVANCED, TaskResult.LEASE_LOST]
    assert [("start", 1, f"{run_id}:1"), ("finally", 1, f"{run_id}:1")] == ATTEMPTS
    step = rig.store.steps(run_id)[1]
    assert step.status is not StepStatus.FAILED and step.error is None  # nothing recorded
    rig.clock.advance(rig.lease_ttl + 1)  # the lease lapses, as for a plain tool at the limit
    recovery.sweep(rig.runtime("sweeper"))
    assert rig.drive(worker="w2")[-1] is TaskResult.COMPLETED
    assert rig.store.steps(run_id)[1].result == "second time lucky"
    assert [a for a in ATTEMPTS if a[0] == "start"] == [
        ("start", 1, f"{run_id}:1"),
        ("start", 2, f"{run_id}:1"),
    ]


@pytest.mark.parametrize("tool", [charges_slowly, charges_then_unwinds], ids=lambda t: t.name)
def test_a_timed_out_at_most_once_async_call_goes_in_doubt(
    memory_store: MemoryStore, tool: Any
) -> None:
    """Cut off mid-call, whatever the coroutine raised on its way out: not the
    tool's failure (the model would call it again), but a call in doubt."""
    rig = _timed_rig(memory_store)
    turns = [_calls((tool.name, {})), {"final": "done"}]
    run_id = create_run(
        rig.runtime(), _agent(f"u-{tool.name}", harness.ScriptedModel(turns), [tool]), "g"
    )
    assert rig.drive(limit=2)[-1] is TaskResult.LEASE_LOST
    assert rig.store.steps(run_id)[1].status is StepStatus.RUNNING
    rig.clock.advance(rig.lease_ttl + 1)
    recovery.sweep(rig.runtime("sweeper"))
    assert rig.drive(worker="w2") == [TaskResult.WAITING]
    assert rig.store.steps(run_id)[1].status is StepStatus.IN_DOUBT
    assert [a[0] for a in ATTEMPTS if a[0] == "start"] == ["start"]  # called once, never again


def test_an_async_reconcile_is_awaited(memory_store: MemoryStore) -> None:
    async def was_charged(ctx: harness.ToolContext) -> harness.Happened:
        await asyncio.sleep(0)
        return harness.Happened({"charged": ctx.idempotency_key})

    @harness.tool(effect="at_most_once", reconcile=was_charged)
    async def charge(ctx: harness.ToolContext) -> str:
        ATTEMPTS.append(("start", ctx.attempt, ctx.idempotency_key))
        await asyncio.sleep(60)
        return "never"

    rig = _timed_rig(memory_store)
    turns = [_calls(("charge", {})), {"final": "done"}]
    run_id = create_run(
        rig.runtime(), _agent("u-reconciled", harness.ScriptedModel(turns), [charge]), "g"
    )
    rig.drive(limit=2)
    rig.clock.advance(rig.lease_ttl + 1)
    recovery.sweep(rig.runtime("sweeper"))
    assert rig.drive(worker="w2")[-1] is TaskResult.COMPLETED
    assert rig.store.steps(run_id)[1].result == {"charged": f"{run_id}:1"}
    assert len(ATTEMPTS) == 1


def test_an_async_models_timeout_cancels_it_and_is_retried_later(memory_store: MemoryStore) -> None:
    rig = Rig(memory_store, options={"step_time_limit": 0.1})
    model = AsyncScripted([{"final": "late"}], hang_on=0)
    run_id = create_run(rig.runtime(), _agent("u-async-late", model, []), "g")
    assert rig.drive(limit=1) == [TaskResult.RESCHEDULED]
    assert ("model finally", 0, SEEN[0][2]) in SEEN
    step = rig.store.steps(run_id)[0]
    assert step.status is StepStatus.PENDING and step.retries == 1
    assert "timed out after" in (step.error or rig.store.events(run_id)[-1].detail or "")


def test_take_turn_awaits_an_async_model_and_checks_what_it_returns() -> None:
    request = ModelRequest("run", "goal", 0, 0, history=list)
    turn = take_turn(AsyncScripted([_calls(("fetch", {"city": "Oslo"}))]), request)
    assert turn.tool_calls == (ToolCall("fetch", {"city": "Oslo"}),)

    class Wrong:
        async def next_turn(self, request: ModelRequest) -> Any:
            return {"final": "not a turn"}

    with pytest.raises(harness.ModelError, match="not a ModelTurn"):
        take_turn(Wrong(), request)
