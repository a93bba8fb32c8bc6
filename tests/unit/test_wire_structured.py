"""tests/wire.py's structured output through the official SDKs: OpenAI's
``response_format`` and Anthropic's ``tool_choice``, checked as the real
services check them, and the answers they guarantee."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest
from pydantic import BaseModel

from tests.wire import WireServer

MODEL = "test-model"


class Weather(BaseModel):
    city: str
    celsius: int
    sky: str | None = None


@pytest.fixture
def server() -> Iterator[WireServer]:
    with WireServer() as wire:
        yield wire


@pytest.fixture
def oai(server: WireServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.openai_base_url, api_key="test", max_retries=0) as client:
        yield client


@pytest.fixture
def ant(server: WireServer) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(
        base_url=server.anthropic_base_url, api_key="test", max_retries=0
    ) as client:
        yield client


ASK = [{"role": "user", "content": "weather"}]
OSLO = {"city": "Oslo", "celsius": -3, "sky": "snow"}
CLOSED = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "celsius": {"type": "integer"}},
    "required": ["city", "celsius"],
    "additionalProperties": False,
}


def json_schema(schema: dict[str, Any], *, strict: bool = True, name: str = "W") -> Any:
    return {
        "type": "json_schema",
        "json_schema": {"name": name, "schema": schema, "strict": strict},
    }


def ask_openai(client: openai.OpenAI, **kw: Any) -> Any:
    return client.chat.completions.create(model=MODEL, messages=ASK, **kw)  # type: ignore[arg-type,call-overload]


def ask_anthropic(client: anthropic.Anthropic, **kw: Any) -> Any:
    return client.messages.create(model=MODEL, max_tokens=64, messages=ASK, **kw)  # type: ignore[arg-type,call-overload]


# --- OpenAI ---------------------------------------------------------------------------------


def test_the_sdks_own_strict_schema_is_accepted_and_its_answer_parsed(
    server: WireServer, oai: openai.OpenAI
) -> None:
    """``parse(response_format=Model)`` sends the SDK's strict schema: the server
    takes it as the API does, and the answer is the SDK's parsed model."""
    server.script("weather", [{"json": OSLO}])
    reply = oai.chat.completions.parse(model=MODEL, messages=ASK, response_format=Weather)  # type: ignore[arg-type]
    assert reply.choices[0].message.parsed == Weather(**OSLO)
    sent = server.requests[0].body["response_format"]
    assert sent["type"] == "json_schema" and sent["json_schema"]["strict"] is True


def test_a_json_answer_is_the_content_as_json_text(server: WireServer, oai: openai.OpenAI) -> None:
    server.script("weather", [{"json": {"city": "Oslo", "celsius": -3}}])
    reply = ask_openai(oai, response_format=json_schema(CLOSED))
    assert json.loads(reply.choices[0].message.content) == {"city": "Oslo", "celsius": -3}
    assert reply.choices[0].finish_reason == "stop"


@pytest.mark.parametrize(
    ("response_format", "fragment"),
    [
        ({"type": "xml"}, "Supported values are: 'json_object', 'json_schema', and 'text'"),
        ({"type": "json_schema"}, "Missing required parameter: 'response_format.json_schema'"),
        (json_schema(CLOSED, name="a name"), "json_schema.name': string does not match pattern"),
        (
            json_schema({**CLOSED, "additionalProperties": True}),
            "In context=(), 'additionalProperties' is required to be supplied and to be false",
        ),
        (
            json_schema({**CLOSED, "required": ["city"]}),
            "'required' is required to be supplied and to be an array including every key in "
            "properties. Missing 'celsius'",
        ),
        (
            json_schema(
                {
                    **CLOSED,
                    "properties": {"at": {"type": "object", "properties": {"x": {}}}},
                    "required": ["at"],
                }
            ),
            "In context=('properties', 'at'), 'additionalProperties'",
        ),
        (json_schema({"type": "array"}), "schema must be a JSON Schema of 'type: \"object\"'"),
        ({"type": "json_object"}, "must contain the word 'json'"),
    ],
)
def test_response_formats_the_api_refuses_are_refused(
    server: WireServer, oai: openai.OpenAI, response_format: Any, fragment: str
) -> None:
    server.script("weather", [{"json": OSLO}])
    with pytest.raises(
        openai.BadRequestError, match=fragment.replace("(", r"\(").replace(")", r"\)")
    ):
        ask_openai(oai, response_format=response_format)


def test_a_schema_that_is_not_strict_need_not_be_closed(
    server: WireServer, oai: openai.OpenAI
) -> None:
    server.script("weather", [{"text": "not even JSON"}])
    loose = {"type": "object", "properties": {"city": {"type": "string"}}}
    reply = ask_openai(oai, response_format=json_schema(loose, strict=False))
    assert reply.choices[0].message.content == "not even JSON"  # no guarantee without strict


@pytest.mark.parametrize("scripted", [{"json": {"city": "Oslo"}}, {"text": "cold"}])
def test_a_script_cannot_break_what_strict_mode_guarantees(
    server: WireServer, oai: openai.OpenAI, scripted: dict[str, Any]
) -> None:
    server.script("weather", [scripted])
    with pytest.raises(openai.BadRequestError, match="does not match the strict schema 'W'"):
        ask_openai(oai, response_format=json_schema(CLOSED))


# --- Anthropic ------------------------------------------------------------------------------

TOOLS = [
    {"name": "lookup", "description": "look", "input_schema": {"type": "object"}},
    {"name": "final_answer", "description": "answer", "input_schema": CLOSED},
]


def test_a_forced_tool_is_the_one_call_of_the_reply(
    server: WireServer, ant: anthropic.Anthropic
) -> None:
    server.script("weather", [{"json": {"city": "Oslo", "celsius": -3}}])
    reply = ask_anthropic(ant, tools=TOOLS, tool_choice={"type": "tool", "name": "final_answer"})
    (block,) = reply.content
    assert (block.type, block.name, block.input) == (
        "tool_use",
        "final_answer",
        {"city": "Oslo", "celsius": -3},
    )
    assert reply.stop_reason == "tool_use"


def test_an_unforced_json_answer_names_its_tool(
    server: WireServer, ant: anthropic.Anthropic
) -> None:
    server.script(
        "weather",
        [
            {
                "text": "Here it is.",
                "json": {"city": "Oslo", "celsius": -3},
                "json_tool": "final_answer",
            }
        ],
    )
    reply = ask_anthropic(ant, tools=TOOLS)
    text, call = reply.content
    assert (text.text, call.name) == ("Here it is.", "final_answer")


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (
            {"tools": TOOLS, "tool_choice": {"type": "tool", "name": "nope"}},
            "Tool 'nope' not found",
        ),
        (
            {"tools": TOOLS, "tool_choice": {"type": "tool"}},
            "tool_choice.tool.name: Field required",
        ),
        ({"tools": TOOLS, "tool_choice": {"type": "some"}}, "Input tag 'some'"),
        ({"tool_choice": {"type": "any"}}, "only be specified while providing tools"),
        ({"tools": TOOLS, "tool_choice": "any"}, "tool_choice: Input should be a valid dictionary"),
    ],
)
def test_tool_choices_the_api_refuses_are_refused(
    server: WireServer, ant: anthropic.Anthropic, extra: dict[str, Any], fragment: str
) -> None:
    server.script("weather", [{"text": "unreachable"}])
    with pytest.raises(anthropic.BadRequestError, match=fragment):
        ask_anthropic(ant, **extra)


@pytest.mark.parametrize(
    ("choice", "scripted", "fragment"),
    [
        ({"type": "tool", "name": "final_answer"}, {"text": "cold"}, "forces 'final_answer'"),
        (
            {"type": "tool", "name": "final_answer"},
            {"tool_calls": [{"name": "lookup", "args": {}}]},
            "forces 'final_answer'",
        ),
        ({"type": "any"}, {"text": "cold"}, "tool_choice 'any', but the script calls no tool"),
    ],
)
def test_a_script_cannot_break_what_a_forced_tool_guarantees(
    server: WireServer,
    ant: anthropic.Anthropic,
    choice: dict[str, Any],
    scripted: dict[str, Any],
    fragment: str,
) -> None:
    server.script("weather", [scripted])
    with pytest.raises(anthropic.BadRequestError, match=fragment):
        ask_anthropic(ant, tools=TOOLS, tool_choice=choice)


def test_a_json_answer_to_anthropic_needs_a_tool_to_call(
    server: WireServer, ant: anthropic.Anthropic
) -> None:
    server.script("weather", [{"json": OSLO}])
    with pytest.raises(anthropic.BadRequestError, match="needs a forced tool_choice"):
        ask_anthropic(ant, tools=TOOLS)


# --- Streamed -------------------------------------------------------------------------------


def test_a_json_answer_streams_as_content_deltas_to_openai(
    server: WireServer, oai: openai.OpenAI
) -> None:
    """The SDK's own stream reader gets the JSON text in deltas, and the
    parsed answer; a refusal streams as ``refusal`` deltas, no content."""
    server.script("weather", [{"json": OSLO}])
    with oai.chat.completions.stream(
        model=MODEL,
        messages=ASK,
        response_format=Weather,  # type: ignore[arg-type]
    ) as stream:
        pieces = [e.delta for e in stream if e.type == "content.delta"]
        done = stream.get_final_completion()
    assert len(pieces) > 1 and "".join(pieces) == json.dumps(OSLO)
    assert done.choices[0].message.parsed == Weather(**OSLO)

    server.script("no", [{"refusal": "I can't help with that."}])
    asked = [{"role": "user", "content": "no"}]
    with oai.chat.completions.stream(
        model=MODEL,
        messages=asked,
        response_format=Weather,  # type: ignore[arg-type]
    ) as stream:
        refused = [e.delta for e in stream if e.type == "refusal.delta"]
        message = stream.get_final_completion().choices[0].message
    assert len(refused) > 1 and "".join(refused) == message.refusal == "I can't help with that."
    assert message.content is None and message.parsed is None


def test_a_json_answer_streams_as_the_forced_tools_input_json_deltas_to_anthropic(
    server: WireServer, ant: anthropic.Anthropic
) -> None:
    server.script("weather", [{"json": OSLO}])
    forced = {"type": "tool", "name": "answer"}
    tool = {"name": "answer", "input_schema": CLOSED}
    with ant.messages.stream(
        model=MODEL,
        max_tokens=64,
        messages=ASK,  # type: ignore[arg-type]
        tools=[tool],  # type: ignore[list-item]
        tool_choice=forced,  # type: ignore[arg-type]
    ) as stream:
        kinds = [e.delta.type for e in stream if e.type == "content_block_delta"]
        message = stream.get_final_message()
    assert len(kinds) > 1 and set(kinds) == {"input_json_delta"}
    (block,) = message.content
    assert block.type == "tool_use" and block.name == "answer" and block.input == OSLO
