"""tests/wire.py through the official SDKs: real HTTP round trips on 127.0.0.1."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import openai
import pytest

from tests.wire import Recorded, WireServer

MODEL = "test-model"


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


def ask_openai(client: openai.OpenAI, messages: list[dict[str, Any]], **kw: Any) -> Any:
    return client.chat.completions.create(model=MODEL, messages=messages, **kw)  # type: ignore[arg-type]


def ask_anthropic(client: anthropic.Anthropic, messages: list[dict[str, Any]], **kw: Any) -> Any:
    return client.messages.create(model=MODEL, max_tokens=64, messages=messages, **kw)  # type: ignore[arg-type]


OPENAI_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"the {name} tool",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        },
    }
    for name in ("search", "fetch")
]
ANTHROPIC_TOOLS = [
    {
        "name": name,
        "description": f"the {name} tool",
        "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}},
    }
    for name in ("search", "fetch")
]
TOOL_TURN: dict[str, Any] = {
    "text": "Looking both up.",
    "tool_calls": [
        {"name": "search", "args": {"q": "celery"}},
        {"name": "fetch", "args": {"q": "redis"}},
    ],
}


# --- plain answers ----------------------------------------------------------------------------


def test_openai_final_answer(server: WireServer, oai: openai.OpenAI) -> None:
    server.script(
        "hi",
        [{"text": "hello", "usage": {"input_tokens": 7, "output_tokens": 2, "cached_tokens": 3}}],
    )
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
    ]
    reply = ask_openai(oai, messages)

    choice = reply.choices[0]
    assert reply.object == "chat.completion" and reply.id.startswith("chatcmpl-")
    assert reply.model == MODEL
    assert choice.message.content == "hello" and choice.message.tool_calls is None
    assert choice.finish_reason == "stop"
    assert reply.usage.prompt_tokens == 7 and reply.usage.completion_tokens == 2
    assert reply.usage.total_tokens == 9
    assert reply.usage.prompt_tokens_details.cached_tokens == 3
    [seen] = server.requests
    assert (seen.api, seen.path, seen.goal, seen.turn, seen.status) == (
        "openai",
        "/v1/chat/completions",
        "hi",
        0,
        200,
    )
    assert seen.headers["authorization"] == "Bearer test"
    assert seen.body["messages"] == messages


def test_anthropic_final_answer(server: WireServer, ant: anthropic.Anthropic) -> None:
    server.script(
        "hi",
        [
            {
                "text": "hello",
                "usage": {
                    "input_tokens": 7,
                    "output_tokens": 2,
                    "cached_tokens": 3,
                    "cache_creation_tokens": 4,
                },
            }
        ],
    )
    reply = ask_anthropic(ant, [{"role": "user", "content": "hi"}], system="be brief")

    assert reply.type == "message" and reply.role == "assistant" and reply.id.startswith("msg_")
    assert reply.model == MODEL
    assert [block.type for block in reply.content] == ["text"]
    assert reply.content[0].text == "hello"
    assert reply.stop_reason == "end_turn" and reply.stop_sequence is None
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (7, 2)
    assert reply.usage.cache_read_input_tokens == 3
    assert reply.usage.cache_creation_input_tokens == 4
    [seen] = server.requests
    assert (seen.api, seen.path, seen.goal, seen.turn) == ("anthropic", "/v1/messages", "hi", 0)
    # anthropic 2.x sends the key as a bearer token, not x-api-key.
    assert seen.headers["authorization"] == "Bearer test"
    assert seen.headers["anthropic-version"]


def test_default_usage_and_stop_override(server: WireServer, oai: openai.OpenAI) -> None:
    server.script("long", [{"text": "cut", "stop": "length"}])
    reply = ask_openai(oai, [{"role": "user", "content": "long"}])
    assert reply.choices[0].finish_reason == "length"
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (10, 5)
    assert reply.usage.prompt_tokens_details is None


# --- tool calls -------------------------------------------------------------------------------


def test_openai_parallel_tool_calls(server: WireServer, oai: openai.OpenAI) -> None:
    server.script("look", [TOOL_TURN])
    reply = ask_openai(oai, [{"role": "user", "content": "look"}], tools=OPENAI_TOOLS)

    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Looking both up."
    calls = choice.message.tool_calls
    assert [call.id for call in calls] == ["call_0_0", "call_0_1"]
    assert [call.type for call in calls] == ["function", "function"]
    assert [call.function.name for call in calls] == ["search", "fetch"]
    assert [json.loads(call.function.arguments) for call in calls] == [
        {"q": "celery"},
        {"q": "redis"},
    ]


def test_anthropic_parallel_tool_calls(server: WireServer, ant: anthropic.Anthropic) -> None:
    server.script("look", [TOOL_TURN])
    reply = ask_anthropic(ant, [{"role": "user", "content": "look"}], tools=ANTHROPIC_TOOLS)

    assert reply.stop_reason == "tool_use"
    assert [block.type for block in reply.content] == ["text", "tool_use", "tool_use"]
    uses = reply.content[1:]
    assert [use.id for use in uses] == ["toolu_0_0", "toolu_0_1"]
    assert [use.name for use in uses] == ["search", "fetch"]
    assert [use.input for use in uses] == [{"q": "celery"}, {"q": "redis"}]


def test_openai_two_turn_conversation(server: WireServer, oai: openai.OpenAI) -> None:
    server.script("look", [TOOL_TURN, {"text": "celery uses redis"}])
    messages: list[dict[str, Any]] = [{"role": "user", "content": "look"}]
    first = ask_openai(oai, messages, tools=OPENAI_TOOLS).choices[0].message

    messages.append(
        {
            "role": "assistant",
            "content": first.content,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.function.name, "arguments": call.function.arguments},
                }
                for call in first.tool_calls
            ],
        }
    )
    for call in first.tool_calls:
        messages.append({"role": "tool", "tool_call_id": call.id, "content": f"{call.id} ok"})
    final = ask_openai(oai, messages, tools=OPENAI_TOOLS)

    assert final.choices[0].message.content == "celery uses redis"
    assert final.choices[0].finish_reason == "stop"
    assert final.usage.prompt_tokens == 20  # default: 10 * (turn + 1)
    assert [(r.goal, r.turn, r.status) for r in server.requests] == [
        ("look", 0, 200),
        ("look", 1, 200),
    ]


def test_anthropic_two_turn_conversation(server: WireServer, ant: anthropic.Anthropic) -> None:
    server.script("look", [TOOL_TURN, {"text": "celery uses redis"}])
    messages: list[dict[str, Any]] = [{"role": "user", "content": "look"}]
    first = ask_anthropic(ant, messages, tools=ANTHROPIC_TOOLS)

    # The SDK's own response blocks are accepted back as request content.
    messages.append({"role": "assistant", "content": first.content})
    messages.append(
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_0_0", "content": "found"},
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_0_1",
                    "content": [{"type": "text", "text": "boom"}],
                    "is_error": True,
                },
            ],
        }
    )
    final = ask_anthropic(ant, messages, tools=ANTHROPIC_TOOLS)

    assert final.content[0].text == "celery uses redis"
    assert final.stop_reason == "end_turn"
    assert [(r.goal, r.turn, r.status) for r in server.requests] == [
        ("look", 0, 200),
        ("look", 1, 200),
    ]
    sent = server.requests[1].body["messages"][1]["content"]
    assert [block["type"] for block in sent] == ["text", "tool_use", "tool_use"]


def test_openai_malformed_arguments_arrive_verbatim(server: WireServer, oai: openai.OpenAI) -> None:
    server.script("bad", [{"tool_calls": [{"name": "search", "raw_arguments": '{"q": "x",'}]}])
    reply = ask_openai(oai, [{"role": "user", "content": "bad"}])
    assert reply.choices[0].message.tool_calls[0].function.arguments == '{"q": "x",'


def test_anthropic_raw_arguments(server: WireServer, ant: anthropic.Anthropic) -> None:
    raws = ['{"q": "x"}', '{"q": "x",', "[1, 2]"]
    server.script("bad", [{"tool_calls": [{"name": "search", "raw_arguments": r} for r in raws]}])
    reply = ask_anthropic(ant, [{"role": "user", "content": "bad"}])
    # A JSON object arrives parsed; anything else arrives as the raw string, which anthropic
    # 2.10 keeps as is in `ToolUseBlock.input` (no response validation).
    assert [block.input for block in reply.content] == [{"q": "x"}, '{"q": "x",', "[1, 2]"]


# --- scripted errors --------------------------------------------------------------------------

OPENAI_ERRORS: list[tuple[int, type[openai.APIStatusError]]] = [
    (429, openai.RateLimitError),
    (500, openai.InternalServerError),
    (503, openai.InternalServerError),
    (529, openai.InternalServerError),
    (400, openai.BadRequestError),
    (401, openai.AuthenticationError),
    (404, openai.NotFoundError),
]
ANTHROPIC_ERRORS: list[tuple[int, type[anthropic.APIStatusError], str]] = [
    (429, anthropic.RateLimitError, "rate_limit_error"),
    (500, anthropic.InternalServerError, "api_error"),
    (503, anthropic.ServiceUnavailableError, "api_error"),
    (529, anthropic.OverloadedError, "overloaded_error"),
    (400, anthropic.BadRequestError, "invalid_request_error"),
    (401, anthropic.AuthenticationError, "authentication_error"),
    (404, anthropic.NotFoundError, "not_found_error"),
]


@pytest.mark.parametrize(("status", "cls"), OPENAI_ERRORS)
def test_openai_error_statuses(
    server: WireServer, oai: openai.OpenAI, status: int, cls: type[openai.APIStatusError]
) -> None:
    server.script("err", [{"text": "ok", "faults": [{"status": status, "retry_after": 1.5}]}])
    with pytest.raises(cls) as caught:
        ask_openai(oai, [{"role": "user", "content": "err"}])
    err = caught.value
    assert err.status_code == status
    assert err.response.headers["retry-after"] == "1.5"
    assert err.request_id is not None and err.request_id.startswith("req_")
    assert isinstance(err.body, dict) and set(err.body) == {"message", "type", "param", "code"}
    # The next request for the same (goal, turn) is past the faults: answered normally.
    assert ask_openai(oai, [{"role": "user", "content": "err"}]).choices[0].message.content == "ok"


@pytest.mark.parametrize(("status", "cls", "kind"), ANTHROPIC_ERRORS)
def test_anthropic_error_statuses(
    server: WireServer,
    ant: anthropic.Anthropic,
    status: int,
    cls: type[anthropic.APIStatusError],
    kind: str,
) -> None:
    server.script("err", [{"text": "ok", "faults": [{"status": status, "retry_after": 2}]}])
    with pytest.raises(cls) as caught:
        ask_anthropic(ant, [{"role": "user", "content": "err"}])
    err = caught.value
    assert err.status_code == status
    assert err.response.headers["retry-after"] == "2"
    assert err.type == kind
    assert err.request_id is not None and err.request_id.startswith("req_")
    assert ask_anthropic(ant, [{"role": "user", "content": "err"}]).content[0].text == "ok"


def test_retry_after_ms_and_messages(
    server: WireServer, oai: openai.OpenAI, ant: anthropic.Anthropic
) -> None:
    server.script(
        "slow down",
        [{"faults": [{"status": 429, "retry_after_ms": 250, "message": "easy"}] * 2}],
    )
    with pytest.raises(openai.RateLimitError) as oai_err:
        ask_openai(oai, [{"role": "user", "content": "slow down"}])
    assert oai_err.value.response.headers["retry-after-ms"] == "250"
    assert "retry-after" not in oai_err.value.response.headers
    assert oai_err.value.code == "rate_limit_exceeded" and oai_err.value.message.endswith("easy")
    with pytest.raises(anthropic.RateLimitError) as ant_err:
        ask_anthropic(ant, [{"role": "user", "content": "slow down"}])
    assert ant_err.value.response.headers["retry-after-ms"] == "250"
    assert ant_err.value.api_message == "easy"


def test_context_length_error(server: WireServer, oai: openai.OpenAI) -> None:
    message = "This model's maximum context length is 8192 tokens."
    server.script("huge", [{"faults": [{"status": 400, "message": message}]}])
    with pytest.raises(openai.BadRequestError) as caught:
        ask_openai(oai, [{"role": "user", "content": "huge"}])
    assert caught.value.code == "context_length_exceeded"
    assert "maximum context length" in caught.value.message


# --- timeouts and dropped connections ---------------------------------------------------------


def test_openai_timeout_is_not_billed(server: WireServer, oai: openai.OpenAI) -> None:
    server.script("wait", [{"text": "late", "faults": [{"delay": 2}]}])
    with pytest.raises(openai.APITimeoutError):
        ask_openai(oai, [{"role": "user", "content": "wait"}], timeout=0.5)
    assert server.wait_idle(5.0)  # the server finished its delay and saw the client gone
    assert (server.calls("wait", 0), server.billed("wait", 0)) == (1, 0)
    assert server.requests[0].status == 200


def test_anthropic_timeout(server: WireServer, ant: anthropic.Anthropic) -> None:
    server.script("wait", [{"text": "late", "faults": [{"delay": 2}]}])
    with pytest.raises(anthropic.APITimeoutError):
        ask_anthropic(ant, [{"role": "user", "content": "wait"}], timeout=0.5)
    # The next request (slot 1) is answered at once, while the first handler still sleeps.
    assert ask_anthropic(ant, [{"role": "user", "content": "wait"}]).content[0].text == "late"
    assert server.billed("wait", 0) == 1


def test_delay_within_timeout_is_billed(server: WireServer, oai: openai.OpenAI) -> None:
    server.script("wait", [{"text": "late", "faults": [{"delay": 0.2}]}])
    reply = ask_openai(oai, [{"role": "user", "content": "wait"}], timeout=5)
    assert reply.choices[0].message.content == "late"
    assert server.billed("wait", 0) == 1


def test_drop(server: WireServer, oai: openai.OpenAI, ant: anthropic.Anthropic) -> None:
    server.script("flaky", [{"text": "back", "faults": [{"drop": True}, {"drop": True}]}])
    with pytest.raises(openai.APIConnectionError) as oai_err:
        ask_openai(oai, [{"role": "user", "content": "flaky"}])
    assert not isinstance(oai_err.value, openai.APITimeoutError)
    with pytest.raises(anthropic.APIConnectionError) as ant_err:
        ask_anthropic(ant, [{"role": "user", "content": "flaky"}])
    assert not isinstance(ant_err.value, anthropic.APITimeoutError)
    assert ask_openai(oai, [{"role": "user", "content": "flaky"}]).choices[0].message.content
    assert [r.status for r in server.requests] == [0, 0, 200]
    assert (server.calls("flaky", 0), server.billed("flaky", 0)) == (3, 1)


def test_a_trickled_response_outlasts_the_sdks_timeout(
    server: WireServer, oai: openai.OpenAI
) -> None:
    """The SDK's (httpx's) timeout bounds each read, not the response: a body
    that comes a byte at a time is waited for however long it takes."""
    server.script("drip", [{"text": "ok", "faults": [{"trickle": 0.01}]}])
    started = time.monotonic()
    reply = ask_openai(oai, [{"role": "user", "content": "drip"}], timeout=0.5)
    assert reply.choices[0].message.content == "ok"
    assert time.monotonic() - started > 0.5  # the whole response took longer than the timeout
    assert server.billed("drip", 0) == 1


def test_a_trickle_cut_short_by_the_client_is_not_billed(server: WireServer) -> None:
    server.script("drip", [{"text": "ok", "faults": [{"trickle": 0.05}]}])
    body = {"model": MODEL, "messages": [{"role": "user", "content": "drip"}]}
    with socket.create_connection(("127.0.0.1", int(server.url.rsplit(":", 1)[1]))) as conn:
        data = json.dumps(body).encode()
        conn.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(data), data)
        )
        assert conn.recv(1024).startswith(b"HTTP/1.1 200")  # the headers, then a byte or so
    assert server.wait_idle(10.0)
    assert (server.calls("drip", 0), server.billed("drip", 0)) == (1, 0)


def test_a_reply_stops_at_the_requests_output_limit(
    server: WireServer, oai: openai.OpenAI, ant: anthropic.Anthropic
) -> None:
    server.script("long", [{"text": "a long story", "usage": {"output_tokens": 30000}}])
    reply = ask_openai(oai, [{"role": "user", "content": "long"}], max_completion_tokens=100)
    assert (reply.usage.completion_tokens, reply.choices[0].finish_reason) == (100, "length")
    reply = ask_openai(oai, [{"role": "user", "content": "long"}])
    assert (reply.usage.completion_tokens, reply.choices[0].finish_reason) == (30000, "stop")
    answer = ask_anthropic(ant, [{"role": "user", "content": "long"}])  # max_tokens=64
    assert (answer.usage.output_tokens, answer.stop_reason) == (64, "max_tokens")


def test_usage_left_out(server: WireServer, oai: openai.OpenAI, ant: anthropic.Anthropic) -> None:
    server.script("uncounted", [{"text": "ok", "usage": None}])
    assert ask_openai(oai, [{"role": "user", "content": "uncounted"}]).usage is None
    reply = ask_anthropic(ant, [{"role": "user", "content": "uncounted"}])
    assert reply.content[0].text == "ok" and getattr(reply, "usage", None) is None


def test_openai_insufficient_quota_is_a_429_with_its_code(
    server: WireServer, oai: openai.OpenAI
) -> None:
    server.script("broke", [{"faults": [{"status": 429, "code": "insufficient_quota"}]}])
    with pytest.raises(openai.RateLimitError) as caught:
        ask_openai(oai, [{"role": "user", "content": "broke"}])
    assert (caught.value.code, caught.value.type) == ("insufficient_quota", "insufficient_quota")
    assert "You exceeded your current quota" in caught.value.message


# --- validation -------------------------------------------------------------------------------


def test_openai_rejects_missing_tool_result(server: WireServer, oai: openai.OpenAI) -> None:
    server.script("look", [TOOL_TURN, {"text": "done"}])
    first = ask_openai(oai, [{"role": "user", "content": "look"}]).choices[0].message
    assistant = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": c.id, "type": "function", "function": c.function.model_dump()}
            for c in first.tool_calls
        ],
    }
    answer_first = {"role": "tool", "tool_call_id": "call_0_0", "content": "ok"}
    with pytest.raises(openai.BadRequestError, match="call_0_1"):
        ask_openai(oai, [{"role": "user", "content": "look"}, assistant, answer_first])
    # ... also when a user message follows before the missing answer.
    with pytest.raises(openai.BadRequestError, match="did not have response messages"):
        ask_openai(
            oai,
            [
                {"role": "user", "content": "look"},
                assistant,
                answer_first,
                {"role": "user", "content": "and?"},
            ],
        )
    # A tool message answering no call of the preceding assistant message.
    with pytest.raises(openai.BadRequestError, match="must be a response to a preceeding"):
        ask_openai(
            oai,
            [
                {"role": "user", "content": "look"},
                assistant,
                answer_first,
                {"role": "tool", "tool_call_id": "call_9_9", "content": "?"},
            ],
        )
    assert [r.status for r in server.requests] == [200, 400, 400, 400]


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"arguments": {"q": "x"}}, "expected a string"),
        ({"role": "robot"}, "Invalid value: 'robot'"),
        ({"tools": [OPENAI_TOOLS[0], OPENAI_TOOLS[0]]}, "duplicate function name"),
        (
            {"tools": [{"type": "function", "function": {"name": "a.b", "parameters": {}}}]},
            "does not match pattern",
        ),
    ],
)
def test_openai_rejects_malformed_requests(
    server: WireServer, oai: openai.OpenAI, change: dict[str, Any], fragment: str
) -> None:
    server.script("x", [{"text": "unreachable"}, {"text": "unreachable"}])
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    if "arguments" in change:
        call["function"] = {"name": "f", "arguments": change["arguments"]}
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": change.get("role", "tool"), "tool_call_id": "c1", "content": "r"},
    ]
    extra = {"tools": change["tools"]} if "tools" in change else {}
    with pytest.raises(openai.BadRequestError, match=fragment):
        ask_openai(oai, messages, **extra)


def test_anthropic_rejects_missing_tool_result(
    server: WireServer, ant: anthropic.Anthropic
) -> None:
    server.script("look", [TOOL_TURN, {"text": "done"}])
    first = ask_anthropic(ant, [{"role": "user", "content": "look"}])
    result = {"type": "tool_result", "tool_use_id": "toolu_0_0", "content": "ok"}
    history: list[dict[str, Any]] = [
        {"role": "user", "content": "look"},
        {"role": "assistant", "content": first.content},
    ]
    with pytest.raises(anthropic.BadRequestError, match="toolu_0_1"):
        ask_anthropic(ant, [*history, {"role": "user", "content": [result]}])
    with pytest.raises(anthropic.BadRequestError, match="without `tool_result` blocks"):
        ask_anthropic(ant, [*history, {"role": "user", "content": "what did you find?"}])
    stray = {"type": "tool_result", "tool_use_id": "toolu_9_9", "content": "?"}
    with pytest.raises(anthropic.BadRequestError, match="unexpected `tool_use_id`"):
        ask_anthropic(
            ant,
            [*history, {"role": "user", "content": [result, stray]}],
        )


@pytest.mark.parametrize(
    ("messages", "extra", "fragment"),
    [
        (
            [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
            {},
            'multiple "user" roles in a row',
        ),
        (
            [{"role": "system", "content": "s"}, {"role": "user", "content": "a"}],
            {},
            "top-level `system` parameter",
        ),
        ([{"role": "assistant", "content": "a"}], {}, "first message must use the"),
        ([{"role": "user", "content": ""}], {}, "non-empty content"),
        (
            [{"role": "user", "content": "a"}],
            {"tools": [ANTHROPIC_TOOLS[0], ANTHROPIC_TOOLS[0]]},
            "Tool names must be unique",
        ),
        (
            [{"role": "user", "content": "a"}],
            {"tools": [{"name": "t", "input_schema": {"type": "array"}}]},
            "input_schema.type",
        ),
        ([{"role": "user", "content": "a"}], {"system": [{"type": "image"}]}, "system.0.type"),
    ],
)
def test_anthropic_rejects_malformed_requests(
    server: WireServer,
    ant: anthropic.Anthropic,
    messages: list[dict[str, Any]],
    extra: dict[str, Any],
    fragment: str,
) -> None:
    server.script("a", [{"text": "unreachable"}])
    with pytest.raises(anthropic.BadRequestError, match=fragment) as caught:
        ask_anthropic(ant, messages, **extra)
    assert caught.value.type == "invalid_request_error"


def test_missing_api_key_is_401(
    server: WireServer, oai: openai.OpenAI, ant: anthropic.Anthropic
) -> None:
    server.script("hi", [{"text": "hello"}])
    with pytest.raises(openai.AuthenticationError):
        ask_openai(
            oai, [{"role": "user", "content": "hi"}], extra_headers={"Authorization": openai.omit}
        )
    with pytest.raises(anthropic.AuthenticationError, match="x-api-key"):
        ask_anthropic(
            ant,
            [{"role": "user", "content": "hi"}],
            extra_headers={"Authorization": anthropic.omit},
        )
    # The x-api-key header (anthropic 1.x, curl) is accepted as well.
    reply = ask_anthropic(
        ant,
        [{"role": "user", "content": "hi"}],
        extra_headers={"Authorization": anthropic.omit, "x-api-key": "test"},
    )
    assert reply.content[0].text == "hello"


def test_unscripted_goal_and_turn_past_the_script(
    server: WireServer, oai: openai.OpenAI, ant: anthropic.Anthropic
) -> None:
    server.script("one", [{"text": "only"}])
    with pytest.raises(openai.BadRequestError, match="no script for goal 'nobody'"):
        ask_openai(oai, [{"role": "user", "content": "nobody"}])
    with pytest.raises(anthropic.BadRequestError, match="has 1 turn"):
        ask_anthropic(
            ant,
            [
                {"role": "user", "content": "one"},
                {"role": "assistant", "content": "only"},
                {"role": "user", "content": "more"},
            ],
        )


def test_default_script() -> None:
    with (
        WireServer(default=[{"text": "default answer"}]) as server,
        openai.OpenAI(base_url=server.openai_base_url, api_key="k", max_retries=0) as client,
    ):
        server.script("special", [{"text": "special answer"}])
        answers = [
            ask_openai(client, [{"role": "user", "content": goal}]).choices[0].message.content
            for goal in ("anything", "special")
        ]
        assert answers == ["default answer", "special answer"]


# --- counters ---------------------------------------------------------------------------------


def test_calls_and_billed(server: WireServer, oai: openai.OpenAI) -> None:
    server.script("count", [{"text": "ok", "faults": [{"status": 429}, {"status": 500}]}])
    for cls in (openai.RateLimitError, openai.InternalServerError):
        with pytest.raises(cls):
            ask_openai(oai, [{"role": "user", "content": "count"}])
    for _ in range(2):
        ask_openai(oai, [{"role": "user", "content": "count"}])
    assert (server.calls("count", 0), server.billed("count", 0)) == (4, 2)
    assert (server.calls("count", 1), server.billed("count", 1)) == (0, 0)
    assert [r.status for r in server.requests] == [429, 500, 200, 200]

    server.reset()
    assert server.requests == []
    assert (server.calls("count", 0), server.billed("count", 0)) == (0, 0)
    with pytest.raises(openai.BadRequestError, match="no script"):
        ask_openai(oai, [{"role": "user", "content": "count"}])


def test_concurrent_requests(server: WireServer, oai: openai.OpenAI) -> None:
    server.script("many", [{"text": "ok", "faults": [{"status": 429}] * 5}])

    def ask(_: int) -> int:
        try:
            ask_openai(oai, [{"role": "user", "content": "many"}])
        except openai.RateLimitError:
            return 429
        return 200

    with ThreadPoolExecutor(max_workers=8) as pool:
        statuses = sorted(pool.map(ask, range(40)))
    assert statuses == [200] * 35 + [429] * 5
    assert (server.calls("many", 0), server.billed("many", 0)) == (40, 35)
    assert len(server.requests) == 40


def test_max_per_window(server: WireServer, oai: openai.OpenAI) -> None:
    server.script("burst", [{"text": "ok"}])
    for _ in range(3):
        ask_openai(oai, [{"role": "user", "content": "burst"}])
    assert 1 <= server.max_per_window(0.001) <= 3
    assert server.max_per_window(3600.0) in (1, 2, 3)  # 3 unless an hour boundary fell between
    assert server.max_per_window(3600.0, model="other-model") == 0

    # The windows are calendar windows [k*w, (k+1)*w), not sliding ones.
    server.reset()
    arrivals = [(10.0, "a"), (10.5, "a"), (10.99, "b"), (11.0, "a"), (11.2, "a"), (11.9, "a")]
    for at, model in arrivals:
        server.requests.append(
            Recorded("/v1/messages", "anthropic", {"model": model}, {}, at, "g", 0, 200)
        )
    assert server.max_per_window(1.0) == 3
    assert server.max_per_window(1.0, model="a") == 3
    assert server.max_per_window(1.0, model="b") == 1
    assert server.max_per_window(0.5) == 2  # [10.5, 11.0) holds 10.5 and 10.99
    assert server.max_per_window(2.0) == 6


def test_python_m_tests_wire_serves_a_script_on_a_port() -> None:
    """`python -m tests.wire --script examples/weather_wire.json` (README, "Real
    models"): the weather run of the README, with no key and no network."""
    repo = Path(__file__).resolve().parents[2]
    argv = ["-m", "tests.wire", "--port", "0", "--script", "examples/weather_wire.json"]
    with subprocess.Popen(
        [sys.executable, *argv], cwd=repo, stdout=subprocess.PIPE, text=True
    ) as proc:
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            url = re.search(r"OPENAI_BASE_URL=(\S+)", line)
            assert url, line
            goal = "What should I wear in Oslo and in Lisbon today?"
            with openai.OpenAI(base_url=url.group(1), api_key="any", max_retries=0) as client:
                with pytest.raises(openai.RateLimitError) as limited:
                    ask_openai(client, [{"role": "user", "content": goal}])
                assert limited.value.response.headers["retry-after"] == "2"
                turn = ask_openai(client, [{"role": "user", "content": goal}])
            calls = turn.choices[0].message.tool_calls
            assert [json.loads(c.function.arguments)["city"] for c in calls] == ["Oslo", "Lisbon"]
            assert (turn.usage.prompt_tokens, turn.usage.completion_tokens) == (212, 41)
        finally:
            proc.terminate()


# --- streams ----------------------------------------------------------------------------------

STREAMED_TURN: dict[str, Any] = {
    **TOOL_TURN,
    "usage": {"input_tokens": 70, "output_tokens": 9, "cached_tokens": 30},
}


def stream_openai(client: openai.OpenAI, goal: str, **kw: Any) -> list[Any]:
    """The chunks of a streamed request, as the SDK parses them."""
    with client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": goal}],
        stream=True,
        **kw,
    ) as chunks:
        return list(chunks)


def stream_anthropic(client: anthropic.Anthropic, goal: str, **kw: Any) -> list[Any]:
    with client.messages.create(
        model=MODEL,
        max_tokens=64,
        messages=[{"role": "user", "content": goal}],
        stream=True,
        **kw,
    ) as events:
        return list(events)


def test_an_openai_stream_is_the_unstreamed_reply_in_deltas(
    server: WireServer, oai: openai.OpenAI
) -> None:
    """The SDK's own accumulator (``chat.completions.stream``) makes of the
    stream the completion the unstreamed request gets."""
    server.script("look", [STREAMED_TURN])
    messages: list[dict[str, Any]] = [{"role": "user", "content": "look"}]
    plain = ask_openai(oai, messages, tools=OPENAI_TOOLS)
    with oai.chat.completions.stream(
        model=MODEL,
        messages=messages,  # type: ignore[arg-type]
        tools=OPENAI_TOOLS,  # type: ignore[arg-type]
        stream_options={"include_usage": True},
    ) as stream:
        streamed = stream.get_final_completion()
    assert streamed.usage == plain.usage
    assert streamed.usage is not None and streamed.usage.prompt_tokens_details is not None
    assert streamed.usage.prompt_tokens_details.cached_tokens == 30
    assert streamed.choices[0].finish_reason == plain.choices[0].finish_reason == "tool_calls"
    got, want = streamed.choices[0].message, plain.choices[0].message
    assert got.content == want.content == "Looking both up."
    assert [(c.id, c.function.name, c.function.arguments) for c in got.tool_calls or ()] == [
        (c.id, c.function.name, c.function.arguments) for c in want.tool_calls or ()
    ]
    assert server.requests[1].body["stream"] is True
    assert server.billed("look", 0) == 2


def test_an_openai_stream_splits_text_and_arguments_into_chunks(
    server: WireServer, oai: openai.OpenAI
) -> None:
    server.script("look", [STREAMED_TURN])
    chunks = stream_openai(oai, "look", stream_options={"include_usage": True})
    assert {c.object for c in chunks} == {"chat.completion.chunk"}
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert deltas[0].role == "assistant"
    texts = [d.content for d in deltas if d.content]
    assert len(texts) > 1 and "".join(texts) == "Looking both up."
    pieces: dict[int, list[str]] = {}
    for delta in deltas:
        for part in delta.tool_calls or ():
            if part.id is not None:
                assert part.function is not None and part.function.name
            pieces.setdefault(part.index, []).append(part.function.arguments or "")  # type: ignore[union-attr]
    assert all(len([p for p in parts if p]) > 1 for parts in pieces.values())
    assert [json.loads("".join(parts)) for parts in pieces.values()] == [
        {"q": "celery"},
        {"q": "redis"},
    ]
    # Every chunk but the last says "usage": null; the last has no choices, only usage.
    assert [c.usage for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens == 70
    assert [c.choices[0].finish_reason for c in chunks[:-1]][-1] == "tool_calls"
    # Without include_usage, no usage at all.
    plain = stream_openai(oai, "look")
    assert all(c.usage is None for c in plain) and all(c.choices for c in plain)


def test_an_anthropic_stream_is_the_event_sequence_of_the_unstreamed_message(
    server: WireServer, ant: anthropic.Anthropic
) -> None:
    server.script(
        "look", [{**STREAMED_TURN, "usage": {**STREAMED_TURN["usage"], "cache_creation_tokens": 5}}]
    )
    plain = ask_anthropic(ant, [{"role": "user", "content": "look"}], tools=ANTHROPIC_TOOLS)
    events = stream_anthropic(ant, "look", tools=ANTHROPIC_TOOLS)
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 3
    text = [e.delta.text for e in events if e.type == "content_block_delta" and e.index == 0]
    assert len(text) > 1 and "".join(text) == "Looking both up."
    for index in (1, 2):
        parts = [
            e.delta.partial_json
            for e in events
            if e.type == "content_block_delta" and e.index == index
        ]
        assert len(parts) > 1 and json.loads("".join(parts)) == plain.content[index].input  # type: ignore[union-attr]
    with ant.messages.stream(
        model=MODEL,
        max_tokens=64,
        messages=[{"role": "user", "content": "look"}],
        tools=ANTHROPIC_TOOLS,  # type: ignore[arg-type]
    ) as stream:
        streamed = stream.get_final_message()
    assert streamed.model_dump(exclude={"id"}) == plain.model_dump(exclude={"id"})
    assert streamed.usage.cache_read_input_tokens == 30
    assert streamed.usage.cache_creation_input_tokens == 5
    assert streamed.usage.output_tokens == 9


def test_a_stream_without_usage(
    server: WireServer, oai: openai.OpenAI, ant: anthropic.Anthropic
) -> None:
    server.script("uncounted", [{"text": "ok", "usage": None}])
    chunks = stream_openai(oai, "uncounted", stream_options={"include_usage": True})
    assert all(c.choices and c.usage is None for c in chunks)
    events = stream_anthropic(ant, "uncounted")
    assert getattr(events[0].message, "usage", None) is None
    assert getattr(events[-2], "usage", None) is None


def test_a_cut_stream_breaks_off_in_the_sdk_and_is_not_billed(
    server: WireServer, oai: openai.OpenAI, ant: anthropic.Anthropic
) -> None:
    server.script("cut", [{"text": "a long answer", "faults": [{"cut": 3}, {"cut": 3}]}])
    with pytest.raises(openai.APIConnectionError):
        stream_openai(oai, "cut")
    # anthropic 2.10 leaves a stream's transport errors unwrapped.
    with pytest.raises(httpx2.RemoteProtocolError):
        stream_anthropic(ant, "cut")
    assert server.wait_idle(5.0)
    assert (server.calls("cut", 0), server.billed("cut", 0)) == (2, 0)
    assert len(stream_openai(oai, "cut")) > 3  # the next one is whole
    assert server.billed("cut", 0) == 1


def test_a_paced_stream_comes_an_event_at_a_time(server: WireServer, oai: openai.OpenAI) -> None:
    """A minute between events: the first is read at once, and stopping the
    server cuts the pause short; the stream never ended, so it is not billed."""
    server.script("paced", [{"text": "a long answer", "faults": [{"pace": 60}]}])
    with oai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "paced"}], stream=True
    ) as chunks:
        first = next(iter(chunks))
        assert first.choices[0].delta.role == "assistant"
        assert server.billed("paced", 0) == 1  # its bytes are going out
    server.stop()
    assert server.billed("paced", 0) == 0


def test_a_paced_stream_read_to_its_end_is_the_whole_reply(
    server: WireServer, ant: anthropic.Anthropic
) -> None:
    server.script("paced", [{"text": "a long answer", "faults": [{"pace": 0.01}]}])
    events = stream_anthropic(ant, "paced")
    text = [e.delta.text for e in events if e.type == "content_block_delta"]
    assert len(text) > 1 and "".join(text) == "a long answer"
    assert server.billed("paced", 0) == 1


def test_an_error_event_ends_a_stream_under_way(
    server: WireServer, oai: openai.OpenAI, ant: anthropic.Anthropic
) -> None:
    server.script(
        "overload",
        [
            {
                "text": "a long answer",
                "faults": [
                    {"cut": 2, "error": "server_error"},
                    {"cut": 4, "error": "overloaded_error"},
                ],
            }
        ],
    )
    with pytest.raises(openai.APIError) as oai_err:
        stream_openai(oai, "overload")
    assert not isinstance(oai_err.value, openai.APIStatusError)
    assert isinstance(oai_err.value.body, dict) and oai_err.value.body["type"] == "server_error"
    with pytest.raises(anthropic.APIStatusError) as ant_err:
        stream_anthropic(ant, "overload")
    assert ant_err.value.status_code == 200  # the stream had begun
    assert ant_err.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]
    assert server.wait_idle(5.0)  # the client may stop reading at the error, before its end
    assert server.billed("overload", 0) == 0


def test_a_stream_fails_before_it_starts_as_any_request(
    server: WireServer, oai: openai.OpenAI, ant: anthropic.Anthropic
) -> None:
    server.script("busy", [{"text": "ok", "faults": [{"status": 429, "retry_after": 2}] * 2}])
    with pytest.raises(openai.RateLimitError) as oai_err:
        stream_openai(oai, "busy")
    assert oai_err.value.response.headers["retry-after"] == "2"
    with pytest.raises(anthropic.RateLimitError):
        stream_anthropic(ant, "busy")
    with pytest.raises(openai.BadRequestError, match="only allowed when 'stream' is enabled"):
        ask_openai(
            oai, [{"role": "user", "content": "busy"}], stream_options={"include_usage": True}
        )
