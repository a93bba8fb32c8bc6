"""Pydantic AI agents one step per task (harness.register_pydantic_ai), on the
in-memory store: each model request and each tool call a step of its own, the
agent re-run up to it; the same output and transcript as a plain ``run_sync``."""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_ai import Agent, ModelRetry, RunContext
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel

import harness
from harness.engine.creation import create_run
from harness.engine.taskresult import TaskResult
from harness.pydantic_agents import live
from harness.records import RunStatus, StepKind, StepStatus
from harness.store.memory import MemoryStore
from tests.rig import Rig

#: Every tool call made, in order: what the ledger of a real run counts from outside.
CALLS: list[tuple[str, Any]] = []
#: The messages each call of the model got: the transcript, as the model saw it.
SEEN: list[list[ModelMessage]] = []


class Forecast(BaseModel):
    city: str
    high: int
    summary: str


def _model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Looks up the city, then the forecast, then answers (once with a bad
    answer, which the validator sends back)."""
    SEEN.append(list(messages))
    turn = sum(isinstance(m, ModelResponse) for m in messages)
    if turn == 0:
        return ModelResponse(parts=[ToolCallPart("find_city", {"name": "oslo"}, "c1")])
    if turn == 1:
        return ModelResponse(
            parts=[TextPart("checking"), ToolCallPart("forecast", {"city": "Oslo"}, "c2")]
        )
    summary = "too short" if turn == 2 else "cold and clear all day"
    args = {"city": "Oslo", "high": -3, "summary": summary}
    return ModelResponse(parts=[ToolCallPart(info.output_tools[0].name, args, "c3")])


def weather_agent(name: str = "weather") -> Agent[None, Forecast]:
    agent = Agent(FunctionModel(_model), output_type=Forecast, name=name)

    @agent.tool_plain
    def find_city(name: str) -> str:
        """The city's proper name."""
        CALLS.append(("find_city", name))
        return name.title()

    @agent.tool
    async def forecast(ctx: RunContext[None], city: str) -> dict[str, Any]:
        """Tomorrow's forecast."""
        CALLS.append(("forecast", city))
        return {"city": city, "high": -3}

    @agent.output_validator
    def long_enough(ctx: RunContext[None], out: Forecast) -> Forecast:
        # Decided by what the run holds (its retry count), never by outside
        # state: every step re-runs this and must decide the same.
        if len(out.summary) < 10:
            raise ModelRetry("the summary must be a sentence")
        return out

    return agent


@pytest.fixture
def rig(memory_store: MemoryStore) -> Iterator[Rig]:
    CALLS.clear()
    SEEN.clear()
    yield Rig(memory_store)


def _plain(agent: Agent[Any, Any], prompt: str) -> tuple[Any, list[list[ModelMessage]]]:
    result = agent.run_sync(prompt)
    seen = list(SEEN)
    CALLS.clear()
    SEEN.clear()
    return result.output, seen


@pytest.fixture
def rerun_each_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """No run kept parked between steps: each step re-runs the agent from its
    start, as it does when the run's previous step was taken elsewhere."""
    monkeypatch.setattr(live, "KEPT", 0)


@pytest.mark.parametrize("kept", ["kept-live", "rerun-each-step"])
def test_a_run_completes_with_the_plain_runs_output_and_transcript(
    rig: Rig, kept: str, request: pytest.FixtureRequest
) -> None:
    if kept == "rerun-each-step":
        request.getfixturevalue("rerun_each_step")
    agent = weather_agent(f"weather-{kept}")
    output, transcript = _plain(agent, "weather in oslo?")
    registered = harness.register_pydantic_ai(agent)
    run_id = create_run(rig.runtime(), registered.name, "weather in oslo?")
    assert rig.drive()[-1] is TaskResult.COMPLETED
    run = rig.load(run_id)
    assert run.status is RunStatus.COMPLETED
    steps = rig.store.steps(run_id)
    # The run's result is the output, as a JSON object.
    assert steps[-1].result is not None and steps[-1].result["final"] == output.model_dump()
    assert CALLS == [("find_city", "oslo"), ("forecast", "Oslo")]  # each tool called once
    # One step per model request and per tool call, in order.
    kinds = [(s.kind, s.tool) for s in steps]
    assert kinds == [
        (StepKind.MODEL, None),
        (StepKind.TOOL, "find_city"),
        (StepKind.MODEL, None),
        (StepKind.TOOL, "forecast"),
        (StepKind.MODEL, None),  # the answer the validator refused
        (StepKind.MODEL, None),
    ]
    assert all(s.status is StepStatus.DONE for s in steps)
    # The model was asked once per model step, with what a plain run sends it.
    assert _comparable(SEEN) == _comparable(transcript)


def _comparable(transcript: list[list[ModelMessage]]) -> list[list[Any]]:
    """The transcript without the timestamps and ids each run stamps anew."""
    keep: list[list[Any]] = []
    for messages in transcript:
        keep.append([[_part(p) for p in m.parts] for m in messages])
    return keep


def _part(part: Any) -> tuple[Any, ...]:
    return (
        part.part_kind,
        getattr(part, "content", None),
        getattr(part, "tool_name", None),
        getattr(part, "args", None),
        getattr(part, "tool_call_id", None),
    )


def test_the_test_model_agent_with_two_tools_runs_as_it_does_plainly(rig: Rig) -> None:
    agent = Agent(TestModel(), output_type=Forecast, name="test-model")

    @agent.tool_plain
    def first(x: int) -> int:
        CALLS.append(("first", x))
        return x + 1

    @agent.tool_plain
    def second(y: str) -> str:
        CALLS.append(("second", y))
        return y * 2

    output, _ = _plain(agent, "go")
    run_id = create_run(rig.runtime(), harness.register_pydantic_ai(agent).name, "go")
    assert rig.drive()[-1] is TaskResult.COMPLETED
    assert rig.store.steps(run_id)[-1].result["final"] == output.model_dump()  # type: ignore[index]
    assert sorted(CALLS) == [("first", 0), ("second", "a")]


def test_a_text_output_is_the_runs_text_result(rig: Rig) -> None:
    agent = Agent(TestModel(custom_output_text="done"), name="texty")
    run_id = create_run(rig.runtime(), harness.register_pydantic_ai(agent).name, "go")
    assert rig.drive()[-1] is TaskResult.COMPLETED
    assert rig.load(run_id).result == "done"


@pytest.mark.usefixtures("rerun_each_step")
def test_agent_code_that_decides_differently_on_a_rerun_fails_the_run_clearly(rig: Rig) -> None:
    agent = Agent(TestModel(), output_type=Forecast, name="fickle")
    told: list[int] = []

    @agent.output_validator
    def once(out: Forecast) -> Forecast:
        told.append(1)
        if len(told) == 1:  # outside state: the next step's re-run decides otherwise
            raise ModelRetry("again")
        return out

    run_id = create_run(rig.runtime(), harness.register_pydantic_ai(agent).name, "go")
    assert rig.drive()[-1] is TaskResult.FAILED
    assert "took another path than when it was recorded" in (rig.load(run_id).error or "")


def test_a_tools_exception_fails_the_run_with_its_message(rig: Rig) -> None:
    agent = Agent(TestModel(), name="broken")

    @agent.tool_plain
    def explode() -> str:
        raise ValueError("upstream said no")

    run_id = create_run(rig.runtime(), harness.register_pydantic_ai(agent).name, "go")
    assert rig.drive()[-1] is TaskResult.FAILED
    assert "upstream said no" in (rig.load(run_id).error or "")


def test_effects_and_approval_are_the_harness_tools(rig: Rig) -> None:
    registered = harness.register_pydantic_ai(
        weather_agent("weather-effects"),
        effects={"forecast": "read_only"},
        requires_approval=["find_city"],
    )
    assert registered.tool_effect("forecast") is harness.ToolEffect.READ_ONLY
    assert registered.tool_effect("find_city") is harness.ToolEffect.IDEMPOTENT
    assert registered.needs_approval("find_city") and not registered.needs_approval("forecast")


def test_registration_refuses_what_it_cannot_run() -> None:
    with pytest.raises(ValueError, match="has no name"):
        harness.register_pydantic_ai(Agent(TestModel()))
    with pytest.raises(ValueError, match="effects names nope: the agent has find_city, forecast"):
        harness.register_pydantic_ai(weather_agent("w2"), effects={"nope": "read_only"})
    with pytest.raises(TypeError, match=r"takes a pydantic_ai\.Agent"):
        harness.register_pydantic_ai(object())


def test_the_pydantic_ai_example(rig: Rig) -> None:
    importlib.import_module("examples.pydantic_agent")
    run_id = create_run(rig.runtime(), "trip-planner", "A weekend in Oslo for two")
    assert rig.drive()[-1] is TaskResult.COMPLETED
    steps = rig.store.steps(run_id)
    assert steps[-1].result is not None
    assert steps[-1].result["final"]["pack"] == ["wool coat", "boots"]
    assert steps[3].result == {
        "result": f"table for 2 at 19:00 in Oslo, ref {steps[3].idempotency_key[-6:]}",
        "kind": "tool_return",
    }


def test_the_steps_time_limit_cancels_a_tool_of_the_agent(memory_store: MemoryStore) -> None:
    agent = Agent(TestModel(), name="stalls")
    ends: list[str] = []

    @agent.tool_plain
    async def stall() -> str:
        try:
            await asyncio.sleep(60)
        finally:
            ends.append("finally")
        return "never"

    rig = Rig(memory_store, options={"step_time_limit": 0.2})
    run_id = create_run(rig.runtime(), harness.register_pydantic_ai(agent).name, "go")
    rig.drive(limit=2)  # the model step, then the call, stopped at the step's limit
    assert ends == ["finally"]  # cancelled, and ended, within its step
    assert rig.store.steps(run_id)[1].status is not StepStatus.DONE
