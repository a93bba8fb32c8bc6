"""Streamed provider calls: OpenAI and Anthropic through their real SDKs.

The providers call with streaming and assemble the turn the unstreamed
response would have been; each piece of text reaches the request's
``on_text`` as it arrives. Real HTTP round trips to the local wire-format
server (tests.wire), which streams every reply in deltas of a few characters
and can cut a stream midway or end it with an error event.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from typing import Any

import anthropic
import openai
import pytest

import harness
from harness.agents import register_agent
from harness.engine.creation import create_run
from harness.engine.taskresult import TaskResult
from harness.errors import RetryableModelError
from harness.models import ModelRequest, ModelTurn, Usage
from harness.providers.base import Deltas, ProviderModel, tool_call
from harness.records import RunStatus
from harness.store.memory import MemoryStore
from tests.rig import Rig
from tests.wire import WireServer

PROVIDERS = ("openai", "anthropic")


@harness.tool(effect="read_only")
def weather(city: str, unit: str = "C") -> dict[str, Any]:
    """The weather in a city."""
    return {"city": city, "temp": 21, "unit": unit}


def model_for(provider: str, **params: Any) -> ProviderModel:
    if provider == "openai":
        return harness.OpenAIModel("gpt-test", **params)
    return harness.AnthropicModel("claude-test", **params)


def request(goal: str, **fields: Any) -> ModelRequest:
    return ModelRequest(
        run_id="r", goal=goal, turn=0, step_index=0, history=list, tools=[weather], **fields
    )


# The turns as the unstreamed responses say them, read the way the providers
# read them before they streamed.


def unstreamed(provider: str, goal: str) -> ModelTurn:
    messages: list[dict[str, Any]] = [{"role": "user", "content": goal}]
    if provider == "openai":
        with openai.OpenAI(max_retries=0) as oai:
            reply = oai.chat.completions.create(model="gpt-test", messages=messages)  # type: ignore[arg-type]
        choice = reply.choices[0]
        calls = tuple(
            tool_call(c.function.name, c.function.arguments, c.id)  # type: ignore[union-attr]
            for c in choice.message.tool_calls or ()
        )
        usage = None
        if reply.usage is not None:
            details = reply.usage.prompt_tokens_details
            cached = {} if details is None else {"cached_tokens": details.cached_tokens or 0}
            usage = Usage(reply.usage.prompt_tokens, reply.usage.completion_tokens, cached)
        text, stop = choice.message.content, choice.finish_reason
    else:
        with anthropic.Anthropic(max_retries=0) as ant:
            message = ant.messages.create(model="claude-test", max_tokens=1024, messages=messages)  # type: ignore[arg-type]
        text = "".join(b.text for b in message.content if b.type == "text") or None
        calls = tuple(
            tool_call(b.name, b.input if isinstance(b.input, str) else _json(b.input), b.id)
            for b in message.content
            if b.type == "tool_use"
        )
        usage, stop = None, message.stop_reason
        reported = getattr(message, "usage", None)
        if reported is not None:
            cache = {
                name: value
                for name in ("cache_read_input_tokens", "cache_creation_input_tokens")
                if (value := getattr(reported, name)) is not None
            }
            usage = Usage(
                reported.input_tokens + sum(cache.values()), reported.output_tokens, cache
            )
    if calls:
        return ModelTurn(tool_calls=calls, text=text, usage=usage, stop_reason=stop)
    return ModelTurn(final=text or "", usage=usage, stop_reason=stop)


def _json(value: object) -> str:
    return json.dumps(value)


TURNS: dict[str, dict[str, Any]] = {
    "final text": {"text": "Paris is 21C and sunny today.", "usage": {"input_tokens": 40}},
    "tool calls": {
        "text": "Looking both up.",
        "tool_calls": [
            {"name": "weather", "args": {"city": "Paris"}},
            {"name": "weather", "args": {"city": "Oslo", "unit": "F"}},
            {"name": "weather", "args": {"city": 'São Paulo, "the" city'}},
        ],
        "usage": {
            "input_tokens": 100,
            "output_tokens": 20,
            "cached_tokens": 40,
            "cache_creation_tokens": 7,
        },
    },
    "calls alone": {"tool_calls": [{"name": "weather", "args": {}}]},
    "bad arguments": {"tool_calls": [{"name": "weather", "raw_arguments": '{"city": "Par'}]},
    "a list": {"tool_calls": [{"name": "weather", "raw_arguments": "[1, 2]"}]},
    "no usage": {"text": "ok", "usage": None},
    "cut short": {"text": "a long story", "stop": "length", "usage": {"output_tokens": 3}},
}


@pytest.mark.parametrize("goal", list(TURNS))
@pytest.mark.parametrize("provider", PROVIDERS)
def test_the_streamed_turn_is_the_unstreamed_one(
    provider: str, goal: str, wire: WireServer
) -> None:
    spec = dict(TURNS[goal])
    if provider == "openai" and "usage" in spec and spec["usage"] is not None:
        spec["usage"] = {k: v for k, v in spec["usage"].items() if k != "cache_creation_tokens"}
    wire.script(goal, [spec])
    turn = model_for(provider).next_turn(request(goal))
    expected = unstreamed(provider, goal)
    if expected.usage is None:  # charged its reservation, said so: as before
        assert turn.usage is not None and turn.usage.estimated
        expected = replace(expected, usage=turn.usage)
    assert turn == expected
    body = wire.requests[0].body
    assert body["stream"] is True
    if provider == "openai":
        assert body["stream_options"] == {"include_usage": True}
    assert wire.billed(goal, 0) == 2  # the streamed call, then the reference one


@pytest.mark.parametrize("provider", PROVIDERS)
def test_the_usage_of_a_stream_is_recorded_once_as_before(
    provider: str, wire: WireServer, memory_store: MemoryStore
) -> None:
    rig = Rig(memory_store)
    register_agent(harness.Agent(name="bot", model=model_for(provider), tools=[weather]))
    wire.script("tool calls", [TURNS["tool calls"], {"text": "done"}])
    run_id = create_run(rig.runtime(), "bot", "tool calls")
    rig.drive()
    done = rig.load(run_id)
    assert done.status is RunStatus.COMPLETED, done.error
    step = rig.store.steps(run_id)[0]
    first = step.to_dict()
    if provider == "openai":
        assert first["usage"] == {"input_tokens": 100, "output_tokens": 20, "cached_tokens": 40}
    else:
        assert first["usage"] == {
            "input_tokens": 147,
            "output_tokens": 20,
            "cache_read_input_tokens": 40,
            "cache_creation_input_tokens": 7,
        }
    assert [c["args"] for c in step.result["tool_calls"]] == [
        c["args"] for c in TURNS["tool calls"]["tool_calls"]
    ]
    assert (wire.billed("tool calls", 0), wire.billed("tool calls", 1)) == (1, 1)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_the_delta_hook_gets_the_text_in_order_as_it_comes(provider: str, wire: WireServer) -> None:
    wire.script("final text", [TURNS["final text"]])
    wire.script("tool calls", [TURNS["tool calls"]])
    pieces: list[str] = []
    final = model_for(provider).next_turn(request("final text", on_text=pieces.append))
    assert len(pieces) > 1 and "".join(pieces) == final.final == TURNS["final text"]["text"]
    pieces.clear()
    calls = model_for(provider).next_turn(request("tool calls", on_text=pieces.append))
    assert len(pieces) > 1 and "".join(pieces) == calls.text == "Looking both up."


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_delta_hook_that_raises_does_not_break_the_call(
    provider: str, wire: WireServer, caplog: pytest.LogCaptureFixture
) -> None:
    wire.script("final text", [TURNS["final text"]])
    seen: list[str] = []

    def broken(text: str) -> None:
        seen.append(text)
        raise ConnectionError("the publisher is down")

    with caplog.at_level(logging.WARNING, logger="harness.providers.base"):
        turn = model_for(provider).next_turn(request("final text", on_text=broken))
    assert turn.final == TURNS["final text"]["text"]
    assert "".join(seen) == turn.final  # every delta was still offered to it
    warnings = [r for r in caplog.records if "text-delta hook failed" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].exc_info is not None


def test_a_hook_is_called_only_with_text() -> None:
    got: list[str] = []
    deltas = Deltas(got.append, "m")
    deltas("")
    deltas("a")
    Deltas(None, "m")("b")
    assert got == ["a"]


def run_bot(provider: str, goal: str, rig: Rig, **options: Any) -> str:
    register_agent(harness.Agent(name="bot", model=model_for(provider), tools=[weather], **options))
    run_id = create_run(rig.runtime(), "bot", goal)
    rig.drive()
    return run_id


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_stream_cut_midway_is_retried_and_recorded_once(
    provider: str, wire: WireServer, memory_store: MemoryStore
) -> None:
    """A call that dies mid-stream is a retryable model error, as a dropped
    connection is: nothing of it is recorded, the step is retried, and the
    turn recorded is the whole response of the retry, billed once."""
    rig = Rig(memory_store)
    wire.script("cut", [{**TURNS["tool calls"], "faults": [{"cut": 6}]}, {"text": "done"}])
    run_id = run_bot(provider, "cut", rig)
    done = rig.load(run_id)
    assert done.status is RunStatus.COMPLETED, done.error
    first = rig.store.steps(run_id)[0]
    assert first.retries == 1
    assert first.result["text"] == "Looking both up." and len(first.result["tool_calls"]) == 3
    retried = [e.detail for e in rig.store.events(run_id) if e.to_status == "retry_scheduled"]
    assert len(retried) == 1 and "the stream was cut" in (retried[0] or "")
    assert wire.wait_idle(5.0)
    assert (wire.calls("cut", 0), wire.billed("cut", 0)) == (2, 1)


@pytest.mark.parametrize(
    ("provider", "kind", "retried"),
    [
        ("openai", "server_error", True),
        ("anthropic", "overloaded_error", True),
        ("anthropic", "api_error", True),
        ("anthropic", "invalid_request_error", False),
    ],
)
def test_an_error_the_stream_reports_is_retried_when_transient(
    provider: str, kind: str, retried: bool, wire: WireServer, memory_store: MemoryStore
) -> None:
    rig = Rig(memory_store)
    wire.script("mid", [{"text": "a long answer", "faults": [{"cut": 4, "error": kind}]}])
    run_id = run_bot(provider, "mid", rig)
    done = rig.load(run_id)
    if retried:
        assert done.status is RunStatus.COMPLETED, done.error
        assert wire.wait_idle(5.0)  # the first stream's handler withdraws its bill last
        assert done.result == "a long answer" and wire.billed("mid", 0) == 1
    else:
        assert done.status is RunStatus.FAILED
        assert f"the stream reported {kind}" in (done.error or "")
        assert wire.calls("mid", 0) == 1


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_429_before_the_stream_starts_is_retried_after_retry_after(
    provider: str, wire: WireServer, memory_store: MemoryStore
) -> None:
    rig = Rig(memory_store)
    wire.script("busy", [{"text": "finally", "faults": [{"status": 429, "retry_after": 30}]}])
    register_agent(harness.Agent(name="bot", model=model_for(provider), tools=[weather]))
    run_id = create_run(rig.runtime(), "bot", "busy")
    start = rig.clock.now()
    assert rig.drive(limit=1) == [TaskResult.RESCHEDULED]
    waiting = rig.load(run_id)
    assert waiting.wake_at is not None and 30 <= waiting.wake_at - start <= 33
    assert "HTTP 429" in (waiting.current.error or "")  # type: ignore[union-attr]
    rig.drive()
    assert rig.load(run_id).result == "finally"
    assert (wire.calls("busy", 0), wire.billed("busy", 0)) == (2, 1)
    assert all(r.body["stream"] is True for r in wire.requests)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_stream_that_ends_before_its_end_makes_no_turn(provider: str, wire: WireServer) -> None:
    """A connection closed cleanly midway (no broken chunk for the HTTP library
    to see): without OpenAI's finish reason or Anthropic's message_stop, the
    events are no turn but a retryable error."""
    wire.script("short", [{"text": "a long answer"}])
    model = model_for(provider)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "short"}]
    if provider == "openai":
        with model.client().chat.completions.create(
            model="gpt-test", messages=messages, stream=True
        ) as stream:
            events = list(stream)
        head = events[:-1]  # all but the chunk with the finish reason
    else:
        with model.client().messages.create(
            model="claude-test", max_tokens=64, messages=messages, stream=True
        ) as stream:
            events = list(stream)
        head = events[:-1]  # all but message_stop
    assert model.assemble(iter(events), Deltas(None, model.name)).final == "a long answer"
    with pytest.raises(RetryableModelError, match="the stream ended before the response did"):
        model.assemble(iter(head), Deltas(None, model.name))


def test_an_openai_stream_that_ends_before_any_choice_is_retried() -> None:
    """A proxy that ends the body cleanly after an upstream failure: no
    finish reason came, so it is a stream ended early, not a reply."""
    from harness.errors import RetryableModelError
    from harness.providers.base import Deltas

    model = harness.OpenAIModel("gpt-x")
    with pytest.raises(RetryableModelError, match="ended before"):
        model.assemble(iter([]), Deltas(None, model.name))
