"""Structured answers through the official SDKs: OpenAI's ``response_format``
(a strict JSON schema) and Anthropic's final-answer tool, against the local
server of both wire formats (tests.wire), which checks both as the real
services do. In process, on the in-memory store, as tests/unit/test_providers.py."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel, field_validator

import harness
from harness.agents import register_agent
from harness.engine import conversation, recovery
from harness.engine.creation import create_run
from harness.engine.taskresult import TaskResult
from harness.models import ModelRequest
from harness.output import FINAL_TOOL, correction, output_schema
from harness.records import RunStatus, StepStatus
from harness.store.memory import MemoryStore
from tests.rig import Rig
from tests.wire import WireServer

PROVIDERS = ("openai", "anthropic")


class Forecast(BaseModel):
    """What to wear in a city."""

    city: str
    celsius: int
    wear: list[str]

    @field_validator("celsius")
    @classmethod
    def earthly(cls, value: int) -> int:
        if not -90 <= value <= 60:
            raise ValueError("no such temperature on Earth")
        return value


OSLO = {"city": "Oslo", "celsius": -3, "wear": ["coat", "hat"]}
#: Matches the schema (OpenAI's strict mode lets it through) but not the validator.
HOT = {"city": "Oslo", "celsius": 300, "wear": []}


@harness.tool(effect="read_only")
def thermometer(city: str) -> dict[str, Any]:
    """The temperature in a city, in degrees Celsius."""
    return {"city": city, "celsius": -3}


def model_for(provider: str) -> Any:
    if provider == "openai":
        return harness.OpenAIModel("gpt-test")
    return harness.AnthropicModel("claude-test")


def agent(provider: str, *, tools: bool = True, **options: Any) -> str:
    name = f"forecaster-{provider}-{'tools' if tools else 'bare'}"
    register_agent(
        harness.Agent(
            name=name,
            model=model_for(provider),
            tools=[thermometer] if tools else [],
            output_type=Forecast,
            **options,
        )
    )
    return name


def answer(provider: str, value: dict[str, Any], *, forced: bool = False) -> dict[str, Any]:
    """A scripted structured answer: OpenAI's content, Anthropic's call of the
    final-answer tool (forced when the agent has no tools, else named)."""
    if provider == "anthropic" and not forced:
        return {"json": value, "json_tool": FINAL_TOOL}
    return {"json": value}


def run(rig: Rig, agent_name: str, goal: str) -> str:
    run_id = create_run(rig.runtime(), agent_name, goal)
    rig.drive()
    return run_id


@pytest.fixture
def rig(memory_store: MemoryStore) -> Rig:
    return Rig(memory_store)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_the_answer_is_asked_for_with_the_providers_structured_output(
    provider: str, wire: WireServer, rig: Rig
) -> None:
    name = agent(provider)
    look = {"tool_calls": [{"name": "thermometer", "args": {"city": "Oslo"}}]}
    wire.script("oslo", [look, answer(provider, OSLO)])
    run_id = run(rig, name, "oslo")

    done = rig.load(run_id)
    assert done.status is RunStatus.COMPLETED, done.error
    assert json.loads(done.result or "") == OSLO
    assert rig.store.steps(run_id)[-1].result["final"] == OSLO  # type: ignore[index]
    schema = output_schema(Forecast)
    for request in wire.requests:  # every turn may still call the tools, or answer
        body = request.body
        if provider == "openai":
            assert body["response_format"] == {
                "type": "json_schema",
                "json_schema": {
                    "name": "Forecast",
                    "schema": schema.schema,
                    "strict": True,
                    "description": "What to wear in a city.",
                },
            }
            assert [t["function"]["name"] for t in body["tools"]] == ["thermometer"]
        else:
            assert [t["name"] for t in body["tools"]] == ["thermometer", FINAL_TOOL]
            assert body["tools"][1]["input_schema"] == schema.schema
            assert "tool_choice" not in body  # a call of final_answer is the answer


@pytest.mark.parametrize("provider", PROVIDERS)
def test_an_agent_with_no_tools_is_asked_only_for_the_answer(
    provider: str, wire: WireServer, rig: Rig
) -> None:
    name = agent(provider, tools=False)
    wire.script("bare", [answer(provider, OSLO, forced=True)])
    done = rig.load(run(rig, name, "bare"))
    assert done.status is RunStatus.COMPLETED, done.error
    assert json.loads(done.result or "") == OSLO
    body = wire.requests[0].body
    if provider == "anthropic":
        assert body["tool_choice"] == {"type": "tool", "name": FINAL_TOOL}
        assert [t["name"] for t in body["tools"]] == [FINAL_TOOL]
    else:
        assert "tools" not in body and body["response_format"]["type"] == "json_schema"


@pytest.mark.parametrize("provider", PROVIDERS)
def test_an_invalid_answer_goes_back_with_its_error_then_a_valid_one_completes(
    provider: str, wire: WireServer, rig: Rig
) -> None:
    name = agent(provider, tools=False)
    wire.script("retry", [answer(provider, HOT, forced=True), answer(provider, OSLO, forced=True)])
    run_id = run(rig, name, "retry")

    done = rig.load(run_id)
    assert done.status is RunStatus.COMPLETED, done.error
    assert json.loads(done.result or "") == OSLO
    first, second = rig.store.steps(run_id)
    assert second.result["final"] == OSLO  # type: ignore[index]
    error = first.result["invalid"]  # type: ignore[index]
    assert error == (
        "1 validation error for Forecast: celsius: Value error, no such temperature on "
        "Earth (given 300)"
    )
    told = correction(error)
    messages = wire.requests[1].body["messages"]
    if provider == "openai":
        assert messages[1:] == [
            {"role": "assistant", "content": json.dumps(HOT)},
            {"role": "user", "content": told},
        ]
    else:  # the call of final_answer, answered with its error
        assert messages[1:] == [
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": "call_0_final", "name": FINAL_TOOL, "input": HOT}
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "call_0_final",
                        "content": told,
                        "is_error": True,
                    }
                ],
            },
        ]
    # Each answer bought once, and the run pays for both (the server's 10 + 20 in, 5 + 5 out).
    assert (wire.billed("retry", 0), wire.billed("retry", 1)) == (1, 1)
    assert (done.input_tokens, done.output_tokens) == (30, 10)
    assert first.result["usage"] == {"input_tokens": 10, "output_tokens": 5}  # type: ignore[index]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_invalid_answers_past_output_retries_fail_the_run_with_the_error(
    provider: str, wire: WireServer, rig: Rig
) -> None:
    name = agent(provider, tools=False, output_retries=1)
    wire.script("hopeless", [answer(provider, HOT, forced=True)] * 2)
    done = rig.load(run(rig, name, "hopeless"))
    assert done.status is RunStatus.FAILED
    assert done.error == (
        "model step 1: the final answer is invalid after 1 retry: 1 validation error for "
        "Forecast: celsius: Value error, no such temperature on Earth (given 300)"
    )
    assert len(wire.requests) == 2
    assert (done.input_tokens, done.output_tokens) == (30, 10)  # the failed answer is paid too


def test_a_text_answer_to_anthropic_is_told_to_use_the_tool(wire: WireServer, rig: Rig) -> None:
    """With tools of its own the model may answer in text: not JSON, it is
    told so, and how to answer."""
    name = agent("anthropic")
    wire.script("prose", [{"text": "Wear a coat."}, answer("anthropic", OSLO)])
    done = rig.load(run(rig, name, "prose"))
    assert done.status is RunStatus.COMPLETED, done.error
    assistant, user = wire.requests[1].body["messages"][1:]
    assert assistant == {"role": "assistant", "content": [{"type": "text", "text": "Wear a coat."}]}
    (told,) = user["content"]
    assert told["type"] == "text" and told["text"].endswith(f"calling the {FINAL_TOOL} tool.")
    assert "Invalid JSON" in told["text"]


class Died(BaseException):
    """A worker killed at a crash point."""


def test_an_invalid_answer_recorded_before_a_crash_is_not_bought_again(
    wire: WireServer, rig: Rig
) -> None:
    """Killed after the invalid answer came, before its step's checkpoint:
    the next worker reads it back, records the retry once, asks once more."""

    def crash(point: str, kind: str) -> None:
        if point == "after_model_returned":
            raise Died

    name = agent("openai", tools=False)
    wire.script("crash", [answer("openai", HOT), answer("openai", OSLO)])
    run_id = create_run(rig.runtime(), name, "crash")
    rig.options["crash"] = crash
    with pytest.raises(Died):
        rig.drive(limit=1)
    rig.options.pop("crash")
    rig.sent.append((run_id, 0))  # redelivered while the dead worker's lease holds
    assert rig.drive() == [TaskResult.LEASED]
    rig.clock.advance(rig.lease_ttl + 1)
    assert len(recovery.sweep(rig.runtime("sweeper"))) == 1
    rig.drive()

    done = rig.load(run_id)
    assert done.status is RunStatus.COMPLETED, done.error
    steps = rig.store.steps(run_id)
    assert [(s.status, s.args.get("invalid_answers")) for s in steps] == [
        (StepStatus.DONE, None),
        (StepStatus.DONE, 1),
    ]
    assert (wire.calls("crash", 0), wire.billed("crash", 0), wire.billed("crash", 1)) == (1, 1, 1)
    assert (done.input_tokens, done.output_tokens) == (30, 10)


# Streamed, as every provider call is, and in a conversation that goes on.


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_structured_answer_is_streamed_and_assembled(provider: str, wire: WireServer) -> None:
    """OpenAI's answer comes as content deltas (each one text for ``on_text``);
    Anthropic's as the final-answer tool's input in ``input_json_delta``s, no
    text: both assembled into the one answer, the tool's call made the final."""
    wire.script("streamed", [answer(provider, OSLO, forced=True)])
    pieces: list[str] = []
    turn = model_for(provider).next_turn(
        ModelRequest(
            run_id="r",
            goal="streamed",
            turn=0,
            step_index=0,
            history=list,
            tools=[],
            output_type=Forecast,
            on_text=pieces.append,
        )
    )
    assert wire.requests[-1].body["stream"] is True
    assert turn.tool_calls == ()
    if provider == "openai":
        assert len(pieces) > 1 and "".join(pieces) == turn.final == json.dumps(OSLO)
    else:
        assert turn.final == OSLO and pieces == []


def test_an_openai_refusal_streamed_is_the_answer_told_it_is_invalid(
    wire: WireServer, rig: Rig
) -> None:
    """A refusal streams as ``refusal`` deltas instead of content: it is the
    answer, not JSON, so the model is told why and asked again."""
    name = agent("openai", tools=False)
    refusal = "I can't help with that request."
    wire.script("refused", [{"refusal": refusal}, answer("openai", OSLO)])
    run_id = run(rig, name, "refused")
    done = rig.load(run_id)
    assert done.status is RunStatus.COMPLETED, done.error
    first, _ = rig.store.steps(run_id)
    assert first.result["final"] == refusal  # type: ignore[index]
    error = first.result["invalid"]  # type: ignore[index]
    assert wire.requests[1].body["messages"][1:] == [
        {"role": "assistant", "content": refusal},
        {"role": "user", "content": correction(error)},
    ]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_structured_answer_goes_on_in_a_conversation_as_its_json_text(
    provider: str, wire: WireServer, rig: Rig
) -> None:
    """The run's earlier answer, an object (for Anthropic a call of the
    final-answer tool), is sent back as the assistant's text: its JSON, so
    no tool call waits for a result the conversation never gave it."""
    name = agent(provider, tools=False)
    bergen = {"city": "Bergen", "celsius": 4, "wear": ["raincoat"]}
    wire.script(
        "trip", [answer(provider, OSLO, forced=True), answer(provider, bergen, forced=True)]
    )
    run_id = run(rig, name, "trip")
    assert json.loads(rig.load(run_id).result or "") == OSLO
    conversation.send_message(rig.runtime(), run_id, "And Bergen?")
    rig.drive()
    done = rig.load(run_id)
    assert done.status is RunStatus.COMPLETED, done.error
    assert json.loads(done.result or "") == bergen
    messages = wire.requests[-1].body["messages"]
    said = json.dumps(OSLO)
    if provider == "openai":
        assert messages[1:] == [
            {"role": "assistant", "content": said},
            {"role": "user", "content": "And Bergen?"},
        ]
    else:
        assert messages[1:] == [
            {"role": "assistant", "content": [{"type": "text", "text": said}]},
            {"role": "user", "content": "And Bergen?"},
        ]
