"""Where the steps of a Pydantic AI run begin and end: a model response is
recorded the moment its call returns, before the agent's own code runs on it;
a tool step ends when its tool returns; a run that ends after its tool calls
with no new request has ended; a store failure or a provider's transient
failure is retried, not the run's end."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_ai import Agent, ModelRetry, RunContext
from pydantic_ai.exceptions import ModelConnectionError, ModelHTTPError, ModelTimeoutError
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

import harness
from harness.engine import recovery
from harness.engine.creation import create_run
from harness.engine.taskresult import TaskResult
from harness.errors import StoreError
from harness.pydantic_agents import live
from harness.records import RunStatus, StepStatus
from harness.store.memory import MemoryStore
from tests.rig import Rig

BOUGHT: list[int] = []
CALLS: list[Any] = []


class Crash(BaseException):
    """The worker dies here (SIGKILL): nothing after it runs."""


@pytest.fixture(autouse=True)
def _clear() -> None:
    BOUGHT.clear()
    CALLS.clear()


def _answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    BOUGHT.append(1)
    return ModelResponse(parts=[TextPart("answer")])


def _take_over(rig: Rig) -> list[TaskResult]:
    """The lease of a dead worker runs out; the sweeper hands the run on."""
    rig.clock.advance(rig.lease_ttl + 1)
    recovery.sweep(rig.runtime("sweeper"))
    return rig.drive(worker="w2", limit=6)


def test_a_slow_output_validator_does_not_buy_the_response_again(
    memory_store: MemoryStore,
) -> None:
    agent = Agent(FunctionModel(_answer), name="slow-validator")

    @agent.output_validator
    async def check(ctx: RunContext[None], out: str) -> str:
        await asyncio.sleep(0.5)  # e.g. an EXPLAIN of a generated query, past the limit
        return out

    rig = Rig(memory_store, options={"step_time_limit": 0.2})
    run_id = create_run(rig.runtime(), harness.register_pydantic_ai(agent).name, "go")
    assert rig.drive(limit=20)[-1] is TaskResult.FAILED  # every retry ran past the limit...
    assert BOUGHT == [1]  # ...and read the recorded response back
    run, step = rig.load(run_id), rig.store.steps(run_id)[0]
    assert step.retries == 8 and "timed out" in (run.error or "")
    assert step.result is not None and step.result["native"]["response"]["parts"]
    assert run.input_tokens == step.result["usage"]["input_tokens"] > 0  # billed once


def test_a_worker_killed_in_the_agents_code_after_the_response_does_not_buy_it_again(
    memory_store: MemoryStore,
) -> None:
    agent = Agent(FunctionModel(_answer), name="killed-in-validator")
    checked: list[int] = []

    @agent.output_validator
    def check(out: str) -> str:
        checked.append(1)
        if len(checked) == 1:
            raise Crash
        return out

    rig = Rig(memory_store)
    run_id = create_run(rig.runtime(), harness.register_pydantic_ai(agent).name, "go")
    with pytest.raises(Crash):
        rig.drive(limit=2)
    assert _take_over(rig)[-1] is TaskResult.COMPLETED
    assert BOUGHT == [1] and checked == [1, 1]
    assert rig.load(run_id).result == "answer"


def test_a_paid_response_the_agent_then_fails_on_is_kept_and_billed(
    memory_store: MemoryStore,
) -> None:
    agent = Agent(FunctionModel(_answer), name="refuses-every-answer", retries=0)

    @agent.output_validator
    def never(out: str) -> str:
        raise ModelRetry("no")

    rig = Rig(memory_store)
    run_id = create_run(rig.runtime(), harness.register_pydantic_ai(agent).name, "go")
    assert rig.drive(limit=3)[-1] is TaskResult.FAILED
    run = rig.load(run_id)
    step = rig.store.steps(run_id)[0]
    assert step.status is StepStatus.FAILED
    assert step.result is not None and step.result["native"]["response"]["parts"]
    assert run.input_tokens > 0 and run.input_tokens == step.result["usage"]["input_tokens"]
    assert BOUGHT == [1]


def _charge_then_answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    turn = sum(isinstance(m, ModelResponse) for m in messages)
    if turn == 0:
        return ModelResponse(parts=[ToolCallPart("charge", {"n": 1}, "c1")])
    return ModelResponse(parts=[TextPart("ok")])


@pytest.mark.parametrize("effect", ["idempotent", "at_most_once"])
def test_a_tool_step_ends_when_its_tool_returns(memory_store: MemoryStore, effect: str) -> None:
    agent = Agent(FunctionModel(_charge_then_answer), name=f"slow-after-{effect}")

    @agent.instructions
    async def profile(ctx: RunContext[None]) -> str:
        # Slow once a tool has run: agent code of the next model step, not the tool's.
        if any(isinstance(p, ToolReturnPart) for m in ctx.messages for p in m.parts):
            await asyncio.sleep(0.5)
        return "be brief"

    @agent.tool_plain
    def charge(n: int) -> str:
        CALLS.append(n)
        return "charged"

    rig = Rig(memory_store, options={"step_time_limit": 0.3})
    registered = harness.register_pydantic_ai(agent, effects={"charge": effect})
    run_id = create_run(rig.runtime(), registered.name, "go")
    rig.drive(limit=4)
    for _ in range(2):
        _take_over(rig)
    tool = rig.store.steps(run_id)[1]
    assert tool.status is StepStatus.DONE and tool.result == {
        "kind": "tool_return",
        "result": "charged",
    }
    assert CALLS == [1]


class Out(BaseModel):
    answer: str


def _tool_beside_output(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    return ModelResponse(
        parts=[
            ToolCallPart("log_ticket", {"text": "hi"}, "t1"),
            ToolCallPart(info.output_tools[0].name, {"answer": "done"}, "o1"),
        ]
    )


@pytest.mark.parametrize("kept", [64, 0], ids=["kept-live", "rerun-each-step"])
def test_a_tool_beside_the_output_tool_ends_the_run_as_run_sync_does(
    memory_store: MemoryStore, kept: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(live, "KEPT", kept)
    agent = Agent(FunctionModel(_tool_beside_output), output_type=Out, name=f"graceful-{kept}")

    @agent.tool_plain
    def log_ticket(text: str) -> str:
        CALLS.append(text)
        return "ok"

    plain = agent.run_sync("go").output  # end_strategy="graceful", the default
    assert CALLS == ["hi"]
    CALLS.clear()
    rig = Rig(memory_store)
    run_id = create_run(rig.runtime(), harness.register_pydantic_ai(agent).name, "go")
    assert rig.drive(limit=10)[-1] is TaskResult.COMPLETED
    assert json.loads(rig.load(run_id).result or "") == plain.model_dump()
    assert CALLS == ["hi"] and BOUGHT == []


@pytest.mark.parametrize("effect", ["idempotent", "at_most_once"])
def test_a_store_failure_before_a_tool_is_called_is_retried_never_in_doubt(
    memory_store: MemoryStore, effect: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = Agent(FunctionModel(_charge_then_answer), name=f"hiccup-before-{effect}")

    @agent.tool_plain
    def charge(n: int) -> str:
        CALLS.append(n)
        return "charged"

    rig = Rig(memory_store)
    registered = harness.register_pydantic_ai(agent, effects={"charge": effect})
    run_id = create_run(rig.runtime(), registered.name, "go")
    rig.drive(limit=1)  # the model asked for the call
    real, failed = memory_store.steps, []

    def flaky(*args: Any, **kwargs: Any) -> Any:
        if not failed:
            failed.append(1)
            raise StoreError("connection reset")
        return real(*args, **kwargs)

    monkeypatch.setattr(memory_store, "steps", flaky)
    rig.drive(limit=6)  # the tool step cannot read the history: tried again
    assert failed
    assert rig.load(run_id).status is RunStatus.COMPLETED
    assert all(s.status is not StepStatus.IN_DOUBT for s in memory_store.steps(run_id))
    assert CALLS == [1]


@pytest.mark.parametrize("fail_on", ["model"])
def test_a_store_failure_reading_the_history_is_retried_not_the_runs_end(
    memory_store: MemoryStore, fail_on: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = Agent(FunctionModel(_charge_then_answer), name=f"hiccup-{fail_on}")

    @agent.tool_plain
    def charge(n: int) -> str:
        CALLS.append(n)
        return "charged"

    rig = Rig(memory_store)
    run_id = create_run(rig.runtime(), harness.register_pydantic_ai(agent).name, "go")
    rig.drive(limit=1 if fail_on == "tool" else 2)  # up to the step under test
    real, failed = memory_store.steps, []

    def flaky(*args: Any, **kwargs: Any) -> Any:
        if not failed:
            failed.append(1)
            raise StoreError("connection reset")
        return real(*args, **kwargs)

    monkeypatch.setattr(memory_store, "steps", flaky)
    with pytest.raises(StoreError):  # raised as it is: the task is retried
        rig.drive(limit=6)
    assert rig.load(run_id).status is not RunStatus.FAILED
    assert _take_over(rig)[-1] is TaskResult.COMPLETED
    assert CALLS == [1]


def _once(error: Exception) -> Callable[[list[ModelMessage], AgentInfo], ModelResponse]:
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        BOUGHT.append(1)
        if len(BOUGHT) == 1:
            raise error
        return ModelResponse(parts=[TextPart("ok")])

    return model


@pytest.mark.parametrize(
    "error",
    [
        ModelTimeoutError("m", "read timed out"),
        ModelConnectionError("m", "connection reset"),
        ModelHTTPError(503, "m", "unavailable"),
        ModelHTTPError(429, "m", "slow down", retry_after=7.0),
    ],
    ids=["timeout", "connection", "503", "429"],
)
def test_a_providers_transient_failure_is_retried(
    memory_store: MemoryStore, error: Exception
) -> None:
    agent = Agent(FunctionModel(_once(error)), name=f"transient-{type(error).__name__}")
    rig = Rig(memory_store)
    run_id = create_run(rig.runtime(), harness.register_pydantic_ai(agent).name, "go")
    assert rig.drive(limit=1) == [TaskResult.RESCHEDULED]
    step = rig.store.steps(run_id)[0]
    assert step.retries == 1 and type(error).__name__ in (step.error or "")
    rig.clock.advance(120)
    assert rig.drive(limit=3)[-1] is TaskResult.COMPLETED
    assert rig.load(run_id).result == "ok"
