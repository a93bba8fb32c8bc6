"""A local stand-in for the OpenAI Chat Completions and Anthropic Messages HTTP APIs.

`WireServer` listens on 127.0.0.1 and answers

- ``POST /v1/chat/completions`` in the OpenAI wire format, and
- ``POST /v1/messages`` in the Anthropic wire format,

closely enough that the official SDKs (``openai.OpenAI(base_url=server.openai_base_url)``,
``anthropic.Anthropic(base_url=server.anthropic_base_url)``) parse its responses and errors as
they parse the real services'. It is also a conformance check for client code: requests that
the real APIs reject (a tool call without its result, consecutive Anthropic user turns, a
missing API key, ...) are rejected here with a 400/401 in the provider's error format.

Which response a request gets is scripted per conversation:

- the *goal* is the text of the first ``user`` message (a string, or the text parts / text
  blocks of a list joined with ``"\\n"``);
- the *turn* is the number of ``assistant`` messages in the request;
- ``server.script(goal, turns)`` registers the turns; request turn ``t`` is answered from
  ``turns[t]`` (or from the ``default`` script given to the constructor, for goals never
  registered). A turn past the end of the script, or an unknown goal without a default, is
  answered 400 saying so.

A turn is a provider-neutral dict::

    {
        "text": "assistant text",                                  # optional
        "tool_calls": [{"name": "search", "args": {"q": "x"}},     # optional
                       {"name": "broken", "raw_arguments": "{oops"}],
        "stop": "length",                                          # optional, sent verbatim
        "usage": {"input_tokens": 12, "output_tokens": 3,          # optional; None: the
                  "cached_tokens": 4, "cache_creation_tokens": 2},  # response has no usage
        "faults": [{"status": 429, "retry_after": 1.5}, {"delay": 2.0}, {"drop": True},
                   {"status": 429, "code": "insufficient_quota"}, {"trickle": 0.2},
                   {"pace": 0.5}],
    }

``"json": {...}`` is a structured answer: OpenAI's message content (as JSON text),
Anthropic's call of the tool its ``tool_choice`` forces (or of the tool ``"json_tool"``
names). Structured output is checked as the real services check it: ``response_format``
(``json_schema`` with a valid name, and with ``strict`` a schema in the strict subset:
every object closed, every property required; ``json_object`` only when the messages say
"json"), and Anthropic's ``tool_choice`` (a forced tool must be one the request offers);
and what they guarantee holds, so a script cannot contradict it: a strict answer matches
its schema, a forced tool is the one call of the reply, with no text. ``"refusal": "..."``
is OpenAI's refusal of a structured answer: the message's ``refusal`` instead of its
content (streamed as ``refusal`` deltas).

Tool call ids are deterministic: OpenAI ``call_<turn>_<i>``, Anthropic ``toolu_<turn>_<i>``.
A reply never takes more output tokens than the request allows (``max_tokens``, or OpenAI's
``max_completion_tokens``): a longer scripted one reports that many and stops for its length
(``length``, Anthropic's ``max_tokens``), as a real one would.

``faults[n]`` applies to the n-th request (0-based) received for (goal, turn), counting every
request recorded for that pair (faulted, rejected or answered); later requests are answered
normally. A fault is an error response (``status``, optional ``retry_after`` seconds,
``retry_after_ms``, ``message``, and ``code``: the error's code, and its type too, as OpenAI's
``insufficient_quota`` 429 has both), a ``delay`` in seconds before answering normally (or before
the error, if ``status`` is also given), ``drop`` (close the connection without a response), or
``trickle``: the normal response with its headers at once and its body one byte every
``trickle`` seconds (each read of the client's is short, the whole response is not).

A request with ``"stream": true`` gets the same reply as Server-Sent Events, in HTTP chunks, as
each API streams it: OpenAI's ``chat.completion.chunk`` deltas (the text, then each tool call's
id and name and its arguments), a chunk with the finish reason, with ``stream_options:
{"include_usage": true}`` a last chunk with the usage, and ``data: [DONE]``; Anthropic's
``message_start``, ``content_block_start``/``_delta``/``_stop`` per block (``text_delta``,
``input_json_delta``), ``message_delta`` (the stop reason, the output tokens) and
``message_stop``. Text and arguments go in deltas of `DELTA_CHARS` characters. Two faults
apply to a stream only: ``{"cut": N}`` sends its first N events and closes the connection
without ending the HTTP body (a stream that dies midway); ``{"cut": N, "error": "KIND"}`` sends
them, then the provider's error event of that type (``overloaded_error``, ``server_error``),
and ends the stream. ``{"pace": SECONDS}`` pauses that long between a stream's events (each
still its own flushed HTTP chunk), so a test can watch a streamed answer arrive piece by piece
and act in the middle of it (kill the process reading it, say); it combines with ``cut``. A
client that hangs up meanwhile fails a write that follows (not billed), and ``stop()`` cuts a pause
short. Errors and ``drop`` come before a stream starts, as for any request.

Requests are validated before faults apply, so an invalid request gets its 400 even when a
fault was scheduled for that slot (the slot is used up either way). Authentication: OpenAI
needs ``Authorization: Bearer <key>``; Anthropic takes ``x-api-key`` or a bearer token (the
anthropic 2.x SDK sends its ``api_key`` as ``Authorization: Bearer``), and ``anthropic-version``.

``billed(goal, turn)`` counts 200 responses the client got: one is counted as its bytes go
out and withdrawn if writing fails (a trickled one whose client hangs up midway too, a stream
cut or ended by an error event); a
delayed response whose client hung up meanwhile is never written nor counted.
``wait_idle()`` waits for such a delayed handler to finish.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import re
import select
import socket
import socketserver
import threading
import time
import traceback
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = ["ANTHROPIC", "OPENAI", "Recorded", "WireError", "WireServer"]

OPENAI = "openai"
ANTHROPIC = "anthropic"
OPENAI_PATH = "/v1/chat/completions"
ANTHROPIC_PATH = "/v1/messages"
_API_BY_PATH = {OPENAI_PATH: OPENAI, ANTHROPIC_PATH: ANTHROPIC}

_OPENAI_ROLES = ("system", "developer", "user", "assistant", "tool")
# Both providers restrict custom tool names to this pattern.
_TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")

_REASONS = {529: "Site Overloaded"}

_OPENAI_ERROR_KIND: dict[int, tuple[str, str | None, str]] = {
    # status: (error.type, error.code, default message)
    400: ("invalid_request_error", None, "Invalid request."),
    401: ("invalid_request_error", "invalid_api_key", "Incorrect API key provided."),
    403: ("invalid_request_error", "unsupported_country_region_territory", "Forbidden."),
    404: ("invalid_request_error", "model_not_found", "The model does not exist."),
    429: ("requests", "rate_limit_exceeded", "Rate limit reached for requests."),
    500: (
        "server_error",
        None,
        "The server had an error while processing your request. Sorry about that!",
    ),
    503: ("server_error", None, "The server is overloaded or not ready yet."),
    529: ("server_error", None, "The server is overloaded or not ready yet."),
}

_ANTHROPIC_ERROR_KIND: dict[int, tuple[str, str]] = {
    # status: (error.type, default message)
    400: ("invalid_request_error", "Invalid request."),
    401: ("authentication_error", "invalid x-api-key"),
    403: ("permission_error", "Your API key does not have permission to use this resource."),
    404: ("not_found_error", "Not found."),
    413: ("request_too_large", "Request exceeds the maximum allowed number of bytes."),
    429: ("rate_limit_error", "Number of requests has exceeded your rate limit."),
    500: ("api_error", "Internal server error"),
    503: ("api_error", "Service unavailable"),
    504: ("timeout_error", "Request timeout"),
    529: ("overloaded_error", "Overloaded"),
}


class WireError(Exception):
    """A request the real API rejects: answered in the provider's error format."""

    def __init__(self, status: int, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param


@dataclass(frozen=True)
class Recorded:
    """One request as the server received it.

    ``api`` is ``"openai"`` or ``"anthropic"`` (``"unknown"`` for any other path). ``status`` is
    the HTTP status the server answered (or meant to answer: a delayed 200 whose client gave
    up is still 200, see `WireServer.billed`); 0 for a dropped connection.
    """

    path: str
    api: str
    body: dict[str, Any]
    headers: dict[str, str]
    at: float
    goal: str | None
    turn: int | None
    status: int


@dataclass(frozen=True)
class _Plan:
    """What to send back for one request, decided under the server lock."""

    status: int
    payload: dict[str, Any] | None  # None: drop the connection
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    key: tuple[str | None, int] | None = None
    trickle: float = 0.0  # seconds between the body's bytes; 0: written at once
    stream: tuple[bytes, ...] | None = None  # Server-Sent Events, instead of the payload
    cut: bool = False  # the stream stops after its events, its connection closed
    errored: bool = False  # the stream ends with an error event: not billed
    pace: float = 0.0  # seconds between a stream's events; 0: written at once


# ---------------------------------------------------------------------------------------------
# Request parsing
# ---------------------------------------------------------------------------------------------


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _text_of(content: object) -> str | None:
    """The text of a message's content: a string, or its text parts joined with newlines."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [
            part["text"]
            for part in content
            if isinstance(part, dict)
            and part.get("type") == "text"
            and isinstance(part.get("text"), str)
        ]
        return "\n".join(texts)
    return None


def _locate(body: Mapping[str, Any]) -> tuple[str | None, int | None]:
    """(goal, turn) of a request body, best effort (also for bodies that fail validation)."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return None, None
    goal: str | None = None
    for message in messages:
        if isinstance(message, dict) and message.get("role") == "user":
            goal = _text_of(message.get("content"))
            break
    turn = sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant")
    return goal, turn


# ---------------------------------------------------------------------------------------------
# OpenAI validation
# ---------------------------------------------------------------------------------------------


def _check_openai_auth(headers: Mapping[str, str]) -> None:
    auth = headers.get("authorization", "")
    scheme, _, key = auth.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise WireError(
            401,
            "You didn't provide an API key. You need to provide your API key in an "
            "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
        )


def _check_openai_content(message: Mapping[str, Any], where: str, *, required: bool) -> None:
    content = message.get("content")
    if content is None:
        if required:
            raise WireError(
                400,
                f"Invalid value for '{where}.content': expected a string, got null.",
                param=f"{where}.content",
            )
        return
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise WireError(
            400,
            f"Invalid type for '{where}.content': expected one of a string or array of "
            f"objects, but got {_json_type(content)} instead.",
            param=f"{where}.content",
        )
    for j, part in enumerate(content):
        at = f"{where}.content[{j}]"
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise WireError(400, f"Missing required parameter: '{at}.type'.", param=f"{at}.type")
        if part["type"] == "text" and not isinstance(part.get("text"), str):
            raise WireError(400, f"Missing required parameter: '{at}.text'.", param=f"{at}.text")


def _check_openai_tool_calls(calls: object, where: str) -> dict[str, bool]:
    """The ids of an assistant message's tool calls, each not yet answered."""
    at = f"{where}.tool_calls"
    if not isinstance(calls, list):
        raise WireError(
            400,
            f"Invalid type for '{at}': expected an array, but got {_json_type(calls)} instead.",
            param=at,
        )
    if not calls:
        raise WireError(
            400,
            f"Invalid '{at}': empty array. Expected an array with minimum "
            "length 1, but got an empty array instead.",
            param=at,
        )
    pending: dict[str, bool] = {}
    for k, call in enumerate(calls):
        here = f"{at}[{k}]"
        if not isinstance(call, dict):
            raise WireError(400, f"Invalid type for '{here}': expected an object.", param=here)
        if not isinstance(call.get("id"), str) or not call["id"]:
            raise WireError(400, f"Missing required parameter: '{here}.id'.", param=f"{here}.id")
        if call.get("type") != "function":
            raise WireError(
                400,
                f"Invalid value: '{call.get('type')}'. Supported values are: 'function'.",
                param=f"{here}.type",
            )
        function = call.get("function")
        if not isinstance(function, dict):
            raise WireError(
                400, f"Missing required parameter: '{here}.function'.", param=f"{here}.function"
            )
        if not isinstance(function.get("name"), str):
            raise WireError(
                400,
                f"Missing required parameter: '{here}.function.name'.",
                param=f"{here}.function.name",
            )
        arguments = function.get("arguments")
        if not isinstance(arguments, str):
            raise WireError(
                400,
                f"Invalid type for '{here}.function.arguments': expected a string, but got "
                f"{_json_type(arguments)} instead.",
                param=f"{here}.function.arguments",
            )
        pending[call["id"]] = False
    return pending


def _check_openai_tools(tools: object) -> None:
    if not isinstance(tools, list):
        raise WireError(
            400,
            f"Invalid type for 'tools': expected an array, but got {_json_type(tools)} instead.",
            param="tools",
        )
    seen: set[str] = set()
    for k, tool in enumerate(tools):
        at = f"tools[{k}]"
        if not isinstance(tool, dict):
            raise WireError(400, f"Invalid type for '{at}': expected an object.", param=at)
        if tool.get("type") != "function":
            raise WireError(
                400,
                f"Invalid value: '{tool.get('type')}'. Supported values are: 'function'.",
                param=f"{at}.type",
            )
        function = tool.get("function")
        if not isinstance(function, dict):
            raise WireError(
                400, f"Missing required parameter: '{at}.function'.", param=f"{at}.function"
            )
        name = function.get("name")
        if not isinstance(name, str) or not _TOOL_NAME.fullmatch(name):
            raise WireError(
                400,
                f"Invalid '{at}.function.name': string does not match pattern. Expected a "
                "string that matches the pattern '^[a-zA-Z0-9_-]+$' (at most 64 characters).",
                param=f"{at}.function.name",
            )
        if name in seen:
            raise WireError(
                400, f"Invalid 'tools': duplicate function name '{name}'.", param="tools"
            )
        seen.add(name)
        description = function.get("description")
        if description is not None and not isinstance(description, str):
            raise WireError(
                400,
                f"Invalid type for '{at}.function.description': expected a string.",
                param=f"{at}.function.description",
            )
        parameters = function.get("parameters")
        if not isinstance(parameters, dict) or parameters.get("type") != "object":
            raise WireError(
                400,
                f"Invalid schema for function '{name}': schema must be a JSON Schema of "
                "'type: \"object\"'.",
                param=f"{at}.function.parameters",
            )


def _check_openai_stream(body: Mapping[str, Any]) -> None:
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise WireError(
            400,
            f"Invalid type for 'stream': expected a boolean, but got {_json_type(stream)} instead.",
            param="stream",
        )
    options = body.get("stream_options")
    if options is None:
        return
    if not stream:
        raise WireError(
            400,
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
            param="stream_options",
        )
    if not isinstance(options, dict):
        raise WireError(
            400, "Invalid type for 'stream_options': expected an object.", param="stream_options"
        )
    if "include_usage" in options and not isinstance(options["include_usage"], bool):
        raise WireError(
            400,
            "Invalid type for 'stream_options.include_usage': expected a boolean.",
            param="stream_options.include_usage",
        )


def _validate_openai(body: Mapping[str, Any]) -> None:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise WireError(400, "you must provide a model parameter", param="model")
    messages = body.get("messages")
    if messages is None:
        raise WireError(400, "Missing required parameter: 'messages'.", param="messages")
    if not isinstance(messages, list) or not messages:
        raise WireError(
            400,
            "Invalid 'messages': empty array. Expected an array with minimum length 1, but got "
            "an empty array instead.",
            param="messages",
        )
    _check_openai_stream(body)
    if "tools" in body:
        _check_openai_tools(body["tools"])
    if body.get("response_format") is not None:
        _check_response_format(body["response_format"], body["messages"])

    pending: dict[str, bool] | None = None  # tool call id -> answered, of the last assistant

    def unanswered() -> None:
        missing = [tid for tid, done in (pending or {}).items() if not done]
        if missing:
            raise WireError(
                400,
                "An assistant message with 'tool_calls' must be followed by tool messages "
                "responding to each 'tool_call_id'. The following tool_call_ids did not have "
                f"response messages: {', '.join(missing)}",
                param="messages",
            )

    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise WireError(
                400,
                f"Invalid type for '{where}': expected an object, but got "
                f"{_json_type(message)} instead.",
                param=where,
            )
        role = message.get("role")
        if role not in _OPENAI_ROLES:
            raise WireError(
                400,
                f"Invalid value: '{role}'. Supported values are: 'system', 'assistant', 'user', "
                "'tool', and 'developer'.",
                param=f"{where}.role",
            )
        if role == "tool":
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str):
                raise WireError(
                    400,
                    f"Missing required parameter: '{where}.tool_call_id'.",
                    param=f"{where}.tool_call_id",
                )
            if pending is None or call_id not in pending:
                raise WireError(
                    400,
                    "Invalid parameter: messages with role 'tool' must be a response to a "
                    "preceeding message with 'tool_calls'.",
                    param=f"{where}.role",
                )
            if pending[call_id]:
                raise WireError(
                    400,
                    f"Invalid parameter: tool_call_id '{call_id}' is answered by more than one "
                    "message with role 'tool'.",
                    param=f"{where}.tool_call_id",
                )
            pending[call_id] = True
            _check_openai_content(message, where, required=True)
            continue
        unanswered()
        pending = None
        if role == "assistant":
            if message.get("tool_calls") is not None:
                pending = _check_openai_tool_calls(message["tool_calls"], where)
            _check_openai_content(message, where, required=pending is None)
        else:
            _check_openai_content(message, where, required=True)
    unanswered()


def _check_response_format(response_format: object, messages: list[Any]) -> None:
    """``response_format`` as the API checks it: ``text``, ``json_object`` (the
    messages must say "json"), or ``json_schema`` with a name and, when
    ``strict``, a schema in the strict subset (:func:`_check_strict_schema`)."""
    at = "response_format"
    if not isinstance(response_format, dict):
        raise WireError(
            400,
            f"Invalid type for '{at}': expected an object, but got "
            f"{_json_type(response_format)} instead.",
            param=at,
        )
    kind = response_format.get("type")
    if kind not in ("text", "json_object", "json_schema"):
        raise WireError(
            400,
            f"Invalid value: '{kind}'. Supported values are: 'json_object', 'json_schema', "
            "and 'text'.",
            param=f"{at}.type",
        )
    if kind == "json_object":
        said = json.dumps(messages).lower()
        if "json" not in said:
            raise WireError(
                400,
                "'messages' must contain the word 'json' in some form, to use "
                "'response_format' of type 'json_object'.",
                param="messages",
            )
    if kind != "json_schema":
        return
    spec = response_format.get("json_schema")
    if not isinstance(spec, dict):
        raise WireError(
            400, f"Missing required parameter: '{at}.json_schema'.", param=f"{at}.json_schema"
        )
    name = spec.get("name")
    if not isinstance(name, str) or not _TOOL_NAME.fullmatch(name):
        raise WireError(
            400,
            f"Invalid '{at}.json_schema.name': string does not match pattern. Expected a string "
            "that matches the pattern '^[a-zA-Z0-9_-]+$' (at most 64 characters).",
            param=f"{at}.json_schema.name",
        )
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise WireError(
            400,
            f"Invalid type for '{at}.json_schema.strict': expected a boolean.",
            param=f"{at}.json_schema.strict",
        )
    schema = spec.get("schema")
    if schema is not None and not isinstance(schema, dict):
        raise WireError(
            400,
            f"Invalid type for '{at}.json_schema.schema': expected an object.",
            param=f"{at}.json_schema.schema",
        )
    if strict:
        _check_strict_schema(name, schema or {})


def _check_strict_schema(name: str, schema: dict[str, Any]) -> None:
    """Structured Outputs' strict subset: the root an object, and every object
    closed (``additionalProperties: false``) with every property required."""
    if schema.get("type") != "object":
        raise WireError(
            400,
            f"Invalid schema for response_format '{name}': schema must be a JSON Schema of "
            f"'type: \"object\"', got 'type: \"{schema.get('type')}\"'.",
            param="response_format",
        )

    def walk(node: object, context: tuple[str, ...]) -> None:
        if not isinstance(node, dict):
            return
        where = f"In context=({', '.join(repr(c) for c in context)})"
        if node.get("type") == "object" or "properties" in node:
            if node.get("additionalProperties") is not False:
                raise WireError(
                    400,
                    f"Invalid schema for response_format '{name}': {where}, "
                    "'additionalProperties' is required to be supplied and to be false.",
                    param="response_format",
                )
            required = node.get("required") or []
            missing = [key for key in node.get("properties") or {} if key not in required]
            if missing:
                raise WireError(
                    400,
                    f"Invalid schema for response_format '{name}': {where}, 'required' is "
                    "required to be supplied and to be an array including every key in "
                    f"properties. Missing '{missing[0]}'.",
                    param="response_format",
                )
        for key in ("properties", "$defs", "definitions"):
            for sub_name, sub in (node.get(key) or {}).items():
                walk(sub, (*context, key, sub_name))
        for key in ("anyOf", "allOf", "oneOf", "prefixItems"):
            for i, sub in enumerate(node.get(key) or ()):
                walk(sub, (*context, key, str(i)))
        if isinstance(node.get("items"), dict):
            walk(node["items"], (*context, "items"))

    walk(schema, ())


def _conforms(value: object, schema: object, root: dict[str, Any]) -> bool:
    """Does ``value`` match ``schema`` (the strict subset: types, properties,
    items, enum, const, anyOf and local ``$ref``)?"""
    if not isinstance(schema, dict):
        return True
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        target: Any = root
        for part in ref[2:].split("/"):
            target = target.get(part, {}) if isinstance(target, dict) else {}
        if not _conforms(value, target, root):
            return False
    if "enum" in schema and value not in schema["enum"]:
        return False
    if "const" in schema and value != schema["const"]:
        return False
    if "anyOf" in schema and not any(_conforms(value, s, root) for s in schema["anyOf"]):
        return False
    kinds = schema.get("type")
    if kinds is not None:
        wanted = kinds if isinstance(kinds, list) else [kinds]
        if not any(_is_json_type(value, k) for k in wanted):
            return False
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        if any(key not in value for key in schema.get("required") or ()):
            return False
        if schema.get("additionalProperties") is False and any(k not in properties for k in value):
            return False
        return all(_conforms(v, properties.get(k), root) for k, v in value.items())
    if isinstance(value, list) and "items" in schema:
        return all(_conforms(v, schema["items"], root) for v in value)
    return True


def _is_json_type(value: object, kind: object) -> bool:
    return {
        "object": isinstance(value, dict),
        "array": isinstance(value, list),
        "string": isinstance(value, str),
        "integer": isinstance(value, int) and not isinstance(value, bool),
        "number": isinstance(value, int | float) and not isinstance(value, bool),
        "boolean": isinstance(value, bool),
        "null": value is None,
    }.get(str(kind), False)


# ---------------------------------------------------------------------------------------------
# Anthropic validation
# ---------------------------------------------------------------------------------------------


def _check_tool_choice(choice: object, tools: object) -> None:
    """``tool_choice``: ``auto``, ``any``, ``none`` or ``tool`` with the name of
    a tool the request offers; never without tools (but ``none``)."""
    if not isinstance(choice, dict):
        raise WireError(400, "tool_choice: Input should be a valid dictionary")
    kind = choice.get("type")
    if kind not in ("auto", "any", "tool", "none"):
        raise WireError(
            400,
            f"tool_choice: Input tag '{kind}' found using 'type' does not match any of the "
            "expected tags: 'auto', 'any', 'tool', 'none'",
        )
    if "disable_parallel_tool_use" in choice and not isinstance(
        choice["disable_parallel_tool_use"], bool
    ):
        raise WireError(
            400, f"tool_choice.{kind}.disable_parallel_tool_use: Input should be a valid boolean"
        )
    if kind == "none":
        return
    if not tools:
        raise WireError(400, "tool_choice may only be specified while providing tools.")
    if kind == "tool":
        name = choice.get("name")
        if not isinstance(name, str) or not name:
            raise WireError(400, "tool_choice.tool.name: Field required")
        names = (
            [t.get("name") for t in tools if isinstance(t, dict)] if isinstance(tools, list) else []
        )
        if name not in names:
            raise WireError(400, f"tool_choice: Tool '{name}' not found in tools")


# ---------------------------------------------------------------------------------------------
# Structured answers in a script
# ---------------------------------------------------------------------------------------------


def _structured(turn_spec: Mapping[str, Any], api: str, body: Mapping[str, Any]) -> Any:
    """The turn as the provider answers it under the request's structured
    output. ``"json": {...}`` in a script is the structured answer: OpenAI's
    message content (its JSON text), Anthropic's call of the tool that
    ``tool_choice`` forces (or of the tool ``"json_tool"`` names). What the
    real service guarantees is checked, so a script cannot say otherwise: a
    strict ``json_schema`` answer matches its schema; a forced tool is the
    one tool called, with no text; ``any`` calls some tool."""
    spec = dict(turn_spec)
    choice = body.get("tool_choice") if api == ANTHROPIC else None
    forced = (
        choice.get("name") if isinstance(choice, dict) and choice.get("type") == "tool" else None
    )
    if "json" in spec:
        value = spec.pop("json")
        if api == OPENAI:
            spec["text"] = json.dumps(value)
        else:
            tool = spec.pop("json_tool", None) or forced
            if tool is None:
                raise WireError(
                    400,
                    "WireServer: a 'json' answer to Anthropic needs a forced tool_choice or a "
                    "'json_tool' in the script",
                )
            call = {"name": tool, "args": value}
            spec["tool_calls"] = [*(spec.get("tool_calls") or []), call]
    if api == OPENAI:
        _check_strict_answer(spec, body)
    elif isinstance(choice, dict):
        _check_forced(spec, choice)
    return spec


def _check_strict_answer(spec: Mapping[str, Any], body: Mapping[str, Any]) -> None:
    response_format = body.get("response_format")
    if not isinstance(response_format, dict) or response_format.get("type") != "json_schema":
        return
    schema_spec = response_format["json_schema"]
    if not schema_spec.get("strict") or spec.get("tool_calls") or spec.get("refusal"):
        return  # the guarantee: the schema's answer, or a refusal instead
    schema = schema_spec.get("schema") or {}
    try:
        value = json.loads(spec.get("text") or "")
    except ValueError:
        value = _NOT_JSON
    if value is _NOT_JSON or not _conforms(value, schema, schema):
        raise WireError(
            400,
            f"WireServer: the script's answer {spec.get('text')!r} does not match the strict "
            f"schema {schema_spec.get('name')!r}, which the real API guarantees",
        )


_NOT_JSON = object()


def _check_forced(spec: Mapping[str, Any], choice: Mapping[str, Any]) -> None:
    calls = spec.get("tool_calls") or []
    kind = choice.get("type")
    if kind == "tool":
        names = [call["name"] for call in calls]
        if names != [choice["name"]] or spec.get("text"):
            raise WireError(
                400,
                f"WireServer: tool_choice forces {choice['name']!r}, but the script answers "
                f"with text {spec.get('text')!r} and calls {names}",
            )
    elif kind == "any" and not calls:
        raise WireError(400, "WireServer: tool_choice 'any', but the script calls no tool")
    elif kind == "none" and calls:
        raise WireError(400, "WireServer: tool_choice 'none', but the script calls tools")


def _check_anthropic_headers(headers: Mapping[str, str]) -> None:
    # anthropic 2.x sends `api_key` as `Authorization: Bearer <key>` (1.x sent `x-api-key`);
    # the API takes either, so either will do here.
    scheme, _, token = headers.get("authorization", "").partition(" ")
    bearer = scheme.lower() == "bearer" and bool(token.strip())
    if not headers.get("x-api-key", "").strip() and not bearer:
        raise WireError(401, "x-api-key header is required")
    if not headers.get("anthropic-version", "").strip():
        raise WireError(400, "anthropic-version: header is required")


def _check_text_blocks(value: object, where: str, *, allow: tuple[str, ...] = ("text",)) -> None:
    """A list of content blocks of the allowed types; text blocks non-empty."""
    if not isinstance(value, list):
        raise WireError(400, f"{where}: Input should be a valid list")
    for j, block in enumerate(value):
        at = f"{where}.{j}"
        if not isinstance(block, dict) or block.get("type") not in allow:
            kinds = ", ".join(repr(a) for a in allow)
            raise WireError(400, f"{at}.type: Input should be {kinds}")
        if block["type"] == "text":
            if not isinstance(block.get("text"), str):
                raise WireError(400, f"{at}.text: Field required")
            if not block["text"]:
                raise WireError(400, f"{at}: text content blocks must be non-empty")


def _anthropic_blocks(message: Mapping[str, Any], i: int) -> list[dict[str, Any]]:
    """A message's content as a list of checked blocks (a string becomes one text block)."""
    content = message.get("content")
    where = f"messages.{i}.content"
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    if not isinstance(content, list):
        raise WireError(400, f"{where}: Input should be a valid list or string")
    blocks: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        at = f"{where}.{j}"
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise WireError(400, f"{at}.type: Field required")
        kind = block["type"]
        if kind == "text":
            if not isinstance(block.get("text"), str):
                raise WireError(400, f"{at}.text: Field required")
            if not block["text"]:
                raise WireError(400, "messages: text content blocks must be non-empty")
        elif kind == "tool_use":
            for name in ("id", "name"):
                if not isinstance(block.get(name), str) or not block[name]:
                    raise WireError(400, f"{at}.tool_use.{name}: Field required")
            if not isinstance(block.get("input"), dict):
                raise WireError(400, f"{at}.tool_use.input: Input should be a valid dictionary")
        elif kind == "tool_result":
            if not isinstance(block.get("tool_use_id"), str) or not block["tool_use_id"]:
                raise WireError(400, f"{at}.tool_result.tool_use_id: Field required")
            result = block.get("content")
            if result is not None and not isinstance(result, str):
                _check_text_blocks(
                    result, f"{at}.tool_result.content", allow=("text", "image", "document")
                )
            if "is_error" in block and not isinstance(block["is_error"], bool):
                raise WireError(400, f"{at}.tool_result.is_error: Input should be a valid boolean")
        blocks.append(block)
    return blocks


def _check_anthropic_tools(tools: object) -> None:
    if not isinstance(tools, list):
        raise WireError(400, "tools: Input should be a valid list")
    seen: set[str] = set()
    for k, tool in enumerate(tools):
        at = f"tools.{k}"
        if not isinstance(tool, dict):
            raise WireError(400, f"{at}: Input should be a valid dictionary")
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise WireError(400, f"{at}.name: Field required")
        if name in seen:
            raise WireError(400, "tools: Tool names must be unique.")
        seen.add(name)
        if tool.get("type") not in (None, "custom"):
            continue  # a server tool (web search, code execution, ...): no schema of ours
        if not _TOOL_NAME.fullmatch(name):
            raise WireError(
                400, f"{at}.custom.name: String should match pattern '^[a-zA-Z0-9_-]{{1,64}}$'"
            )
        if "description" in tool and not isinstance(tool["description"], str):
            raise WireError(400, f"{at}.custom.description: Input should be a valid string")
        schema = tool.get("input_schema")
        if not isinstance(schema, dict):
            raise WireError(400, f"{at}.custom.input_schema: Field required")
        if schema.get("type") != "object":
            raise WireError(400, f"{at}.custom.input_schema.type: Input should be 'object'")


def _validate_anthropic(body: Mapping[str, Any]) -> None:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise WireError(400, "model: Field required")
    max_tokens = body.get("max_tokens")
    if max_tokens is None:
        raise WireError(400, "max_tokens: Field required")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise WireError(400, "max_tokens: Input should be a positive integer")
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise WireError(400, "messages: Field required")
    if not messages:
        raise WireError(400, "messages: at least one message is required")
    if "stream" in body and not isinstance(body["stream"], bool):
        raise WireError(400, "stream: Input should be a valid boolean")
    system = body.get("system")
    if system is not None and not isinstance(system, str):
        _check_text_blocks(system, "system")
    if "tools" in body:
        _check_anthropic_tools(body["tools"])
    if body.get("tool_choice") is not None:
        _check_tool_choice(body["tool_choice"], body.get("tools"))

    previous_role: str | None = None
    pending: list[str] = []  # tool_use ids of the previous (assistant) message
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise WireError(400, f"messages.{i}: Input should be a valid dictionary")
        role = message.get("role")
        if role == "system":
            raise WireError(
                400,
                f'messages.{i}.role: Unexpected role "system". The Messages API accepts a '
                'top-level `system` parameter, not "system" as an input message role.',
            )
        if role not in ("user", "assistant"):
            raise WireError(400, f"messages.{i}.role: Input should be 'user' or 'assistant'")
        if i == 0 and role != "user":
            raise WireError(400, 'messages: first message must use the "user" role')
        if role == previous_role:
            raise WireError(
                400,
                'messages: roles must alternate between "user" and "assistant", but found '
                f'multiple "{role}" roles in a row',
            )
        blocks = _anthropic_blocks(message, i)
        if not blocks and not (role == "assistant" and i == len(messages) - 1):
            raise WireError(
                400,
                f"messages.{i}: all messages must have non-empty content except for the "
                "optional final assistant message",
            )
        kinds = [b["type"] for b in blocks]
        if role == "assistant" and "tool_result" in kinds:
            j = kinds.index("tool_result")
            raise WireError(
                400, f"messages.{i}.content.{j}: tool_result blocks are only allowed in user turns"
            )
        if role == "user" and "tool_use" in kinds:
            j = kinds.index("tool_use")
            raise WireError(
                400,
                f"messages.{i}.content.{j}: tool_use blocks are only allowed in assistant turns",
            )
        if role == "user":
            answered: set[str] = set()
            for j, block in enumerate(blocks):
                if block["type"] != "tool_result":
                    continue
                tool_use_id = block["tool_use_id"]
                if tool_use_id not in pending:
                    raise WireError(
                        400,
                        f"messages.{i}.content.{j}: unexpected `tool_use_id` found in "
                        f"`tool_result` blocks: {tool_use_id}. Each `tool_result` block must "
                        "have a corresponding `tool_use` block in the previous message.",
                    )
                if tool_use_id in answered:
                    raise WireError(
                        400,
                        f"messages.{i}.content.{j}: each tool_use must have a single result. "
                        f"Found multiple `tool_result` blocks with id: {tool_use_id}",
                    )
                answered.add(tool_use_id)
            missing = [tid for tid in pending if tid not in answered]
            if missing:
                raise WireError(
                    400,
                    f"messages.{i}: `tool_use` ids were found without `tool_result` blocks "
                    f"immediately after: {', '.join(missing)}. Each `tool_use` block must have "
                    "a corresponding `tool_result` block in the next message.",
                )
            pending = []
        else:
            pending = [b["id"] for b in blocks if b["type"] == "tool_use"]
        previous_role = role


# ---------------------------------------------------------------------------------------------
# Responses
# ---------------------------------------------------------------------------------------------


#: Errors whose code says more than their status, as the real services word them.
_CODED_MESSAGES = {
    "insufficient_quota": "You exceeded your current quota, please check your plan and billing "
    "details. For more information on this error, read the docs: "
    "https://platform.openai.com/docs/guides/error-codes/api-errors.",
}


def _openai_error(
    status: int, message: str | None, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    kind, default_code, default = _OPENAI_ERROR_KIND.get(
        status, ("server_error" if status >= 500 else "invalid_request_error", None, "Error.")
    )
    if code is not None:  # OpenAI's quota error has it as its type and its code
        kind, default_code, default = code, code, _CODED_MESSAGES.get(code, default)
    text = message or default
    if status == 400 and "context length" in text.lower():
        default_code = "context_length_exceeded"
    return {"error": {"message": text, "type": kind, "param": param, "code": default_code}}


def _anthropic_error(
    status: int, message: str | None, request_id: str, code: str | None = None
) -> dict[str, Any]:
    kind, default = _ANTHROPIC_ERROR_KIND.get(
        status, ("api_error" if status >= 500 else "invalid_request_error", "Error.")
    )
    if code is not None:
        kind, default = code, _CODED_MESSAGES.get(code, default)
    return {
        "type": "error",
        "error": {"type": kind, "message": message or default},
        "request_id": request_id,
    }


def _cut(turn_spec: Mapping[str, Any], turn: int, api: str, body: Mapping[str, Any]) -> Any:
    """The turn as a reply within the request's output limit: a scripted reply
    longer than it stops there, for its length, as the real services' do."""
    if api == OPENAI:
        limit = body.get("max_completion_tokens") or body.get("max_tokens")
    else:
        limit = body.get("max_tokens")
    numbers = _usage_numbers(turn_spec, turn)
    if not isinstance(limit, int) or numbers["output_tokens"] <= limit:
        return turn_spec
    cut = {**turn_spec, "stop": turn_spec.get("stop", "length" if api == OPENAI else "max_tokens")}
    if turn_spec.get("usage", {}) is not None:
        cut["usage"] = {**numbers, "output_tokens": limit}
    return cut


def _usage_numbers(turn_spec: Mapping[str, Any], turn: int) -> dict[str, int]:
    usage = dict(turn_spec.get("usage") or {})
    usage.setdefault("input_tokens", 10 * (turn + 1))
    usage.setdefault("output_tokens", 5)
    return usage


def _openai_completion(
    turn_spec: Mapping[str, Any], turn: int, model: str, completion_id: str
) -> dict[str, Any]:
    calls: list[dict[str, Any]] = []
    for i, call in enumerate(turn_spec.get("tool_calls") or []):
        arguments = call["raw_arguments"] if "raw_arguments" in call else json.dumps(call["args"])
        calls.append(
            {
                "id": f"call_{turn}_{i}",
                "type": "function",
                "function": {"name": call["name"], "arguments": arguments},
            }
        )
    refusal = turn_spec.get("refusal")
    message: dict[str, Any] = {
        "role": "assistant",
        "content": None if refusal else turn_spec.get("text"),
        "refusal": refusal or None,
    }
    if calls:
        message["tool_calls"] = calls
    numbers = _usage_numbers(turn_spec, turn)
    usage: dict[str, Any] = {
        "prompt_tokens": numbers["input_tokens"],
        "completion_tokens": numbers["output_tokens"],
        "total_tokens": numbers["input_tokens"] + numbers["output_tokens"],
    }
    if "cached_tokens" in numbers:
        usage["prompt_tokens_details"] = {"cached_tokens": numbers["cached_tokens"]}
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": turn_spec.get("stop", "tool_calls" if calls else "stop"),
                "logprobs": None,
            }
        ],
        **_reported(turn_spec, usage),
    }


def _reported(turn_spec: Mapping[str, Any], usage: dict[str, Any]) -> dict[str, Any]:
    """The response's ``usage`` field: left out when the script says ``"usage": None``
    (as some compatible servers do)."""
    if "usage" in turn_spec and turn_spec["usage"] is None:
        return {}
    return {"usage": usage}


def _anthropic_message(
    turn_spec: Mapping[str, Any], turn: int, model: str, message_id: str
) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if turn_spec.get("text"):  # the API never sends an empty text block
        content.append({"type": "text", "text": turn_spec["text"]})
    calls = turn_spec.get("tool_calls") or []
    for i, call in enumerate(calls):
        tool_input: object
        if "raw_arguments" in call:
            # A real tool_use `input` is always an object. For a malformed-arguments script we
            # send the parsed object when the raw text is a JSON object, else the raw string
            # itself: anthropic 2.10 builds responses without validation (`construct`), so
            # `ToolUseBlock.input` then holds that str, typed `Dict[str, object]` or not.
            try:
                parsed = json.loads(call["raw_arguments"])
            except ValueError:
                parsed = None
            tool_input = parsed if isinstance(parsed, dict) else call["raw_arguments"]
        else:
            tool_input = call["args"]
        content.append(
            {
                "type": "tool_use",
                "id": f"toolu_{turn}_{i}",
                "name": call["name"],
                "input": tool_input,
            }
        )
    numbers = _usage_numbers(turn_spec, turn)
    usage: dict[str, Any] = {
        "input_tokens": numbers["input_tokens"],
        "output_tokens": numbers["output_tokens"],
    }
    if "cached_tokens" in numbers:
        usage["cache_read_input_tokens"] = numbers["cached_tokens"]
    if "cache_creation_tokens" in numbers:
        usage["cache_creation_input_tokens"] = numbers["cache_creation_tokens"]
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": turn_spec.get("stop", "tool_use" if calls else "end_turn"),
        "stop_sequence": None,
        **_reported(turn_spec, usage),
    }


# ---------------------------------------------------------------------------------------------
# Streams
# ---------------------------------------------------------------------------------------------

#: Characters per streamed delta, of text and of a tool call's arguments alike.
DELTA_CHARS = 4


def _pieces(text: str) -> list[str]:
    return [text[i : i + DELTA_CHARS] for i in range(0, len(text), DELTA_CHARS)]


def _sse(data: Mapping[str, Any] | str, event: str | None = None) -> bytes:
    """One Server-Sent Event: ``event:`` (Anthropic names every event) and ``data:``."""
    text = data if isinstance(data, str) else json.dumps(data)
    head = f"event: {event}\n" if event is not None else ""
    return f"{head}data: {text}\n\n".encode()


def _openai_stream(completion: Mapping[str, Any], include_usage: bool) -> list[bytes]:
    """The completion as OpenAI streams it: a role chunk, the text in deltas, each
    tool call opened with its id and name and its arguments in deltas, a chunk
    with the finish reason, the usage chunk (``stream_options.include_usage``;
    every chunk before it then says ``"usage": null``), and ``[DONE]``."""
    base = {
        "id": completion["id"],
        "object": "chat.completion.chunk",
        "created": completion["created"],
        "model": completion["model"],
        "system_fingerprint": None,
    }
    no_usage: dict[str, Any] = {"usage": None} if include_usage else {}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return _sse({**base, "choices": [choice], **no_usage})

    choice = completion["choices"][0]
    message = choice["message"]
    text = message["content"]
    opening = {"role": "assistant", "content": None if text is None else "", "refusal": None}
    events = [chunk(opening)]
    events.extend(chunk({"content": piece}) for piece in _pieces(text or ""))
    events.extend(chunk({"refusal": piece}) for piece in _pieces(message.get("refusal") or ""))
    for i, call in enumerate(message.get("tool_calls") or ()):
        opened = {**call, "index": i, "function": {**call["function"], "arguments": ""}}
        events.append(chunk({"tool_calls": [opened]}))
        events.extend(
            chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]})
            for piece in _pieces(call["function"]["arguments"])
        )
    events.append(chunk({}, choice["finish_reason"]))
    if include_usage and "usage" in completion:
        events.append(_sse({**base, "choices": [], "usage": completion["usage"]}))
    events.append(_sse("[DONE]"))
    return events


def _anthropic_stream(message: Mapping[str, Any]) -> list[bytes]:
    """The message as Anthropic streams it: ``message_start`` (its input usage,
    one output token so far), a ``ping``, each block's start, deltas
    (``text_delta``, ``input_json_delta``) and stop, ``message_delta`` (the stop
    reason, the output tokens) and ``message_stop``."""
    usage = message.get("usage")
    start: dict[str, Any] = {
        **message,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
    }
    if usage is not None:
        start["usage"] = {**usage, "output_tokens": min(1, usage["output_tokens"])}
    events = [
        _sse({"type": "message_start", "message": start}, "message_start"),
        _sse({"type": "ping"}, "ping"),
    ]
    for index, block in enumerate(message["content"]):
        if block["type"] == "text":
            opened: dict[str, Any] = {"type": "text", "text": ""}
            kind, field, whole = "text_delta", "text", block["text"]
        else:
            opened = {**block, "input": {}}
            raw = block["input"]
            kind, field, whole = (
                "input_json_delta",
                "partial_json",
                (raw if isinstance(raw, str) else json.dumps(raw)),
            )
        events.append(
            _sse(
                {"type": "content_block_start", "index": index, "content_block": opened},
                "content_block_start",
            )
        )
        events.extend(
            _sse(
                {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": kind, field: piece},
                },
                "content_block_delta",
            )
            for piece in _pieces(whole)
        )
        events.append(_sse({"type": "content_block_stop", "index": index}, "content_block_stop"))
    delta: dict[str, Any] = {
        "type": "message_delta",
        "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
    }
    if usage is not None:
        delta["usage"] = {"output_tokens": usage["output_tokens"]}
    events.append(_sse(delta, "message_delta"))
    events.append(_sse({"type": "message_stop"}, "message_stop"))
    return events


def _stream_error(api: str, kind: str, message: str | None) -> bytes:
    """An error event in a stream that has begun (an overload, a server error), as
    the provider sends it: the stream then ends."""
    text = message or f"{kind} (during the stream)"
    if api == ANTHROPIC:
        return _sse({"type": "error", "error": {"type": kind, "message": text}}, "error")
    return _sse({"error": {"message": text, "type": kind, "param": None, "code": None}})


# ---------------------------------------------------------------------------------------------
# HTTP plumbing
# ---------------------------------------------------------------------------------------------


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, wire: WireServer, address: tuple[str, int]) -> None:
        self.wire = wire
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind would resolve the host name (socket.getfqdn): not needed here.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)


class _Stopped(Exception):
    """The server stops, or a fault cuts the stream: the response is cut short."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the real services (and the SDKs' pools) use
    server: _HTTPServer

    def setup(self) -> None:
        super().setup()
        # Headers and body go out in two writes: without this, Nagle's algorithm meets the
        # client's delayed ACK and every response takes ~40 ms.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.wire._track(self.connection, opened=True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.wire._track(self.connection, opened=False)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: tests read `WireServer.requests` instead

    def do_GET(self) -> None:
        self._serve(b"")

    def do_POST(self) -> None:
        try:
            length = int(self.headers.get("content-length") or 0)
        except ValueError:
            self.send_error(411, "A valid Content-Length is required")
            return
        self._serve(self.rfile.read(length) if length > 0 else b"")

    def _serve(self, raw: bytes) -> None:
        at = time.time()
        wire = self.server.wire
        wire._busy(+1)
        try:
            headers = {name.lower(): value for name, value in self.headers.items()}
            plan = wire._decide(self.command, self.path, headers, raw, at)
            self._execute(plan)
        finally:
            wire._busy(-1)

    def _execute(self, plan: _Plan) -> None:
        wire = self.server.wire
        if plan.delay > 0 and (wire._stopping.wait(plan.delay) or not self._peer_open()):
            self.close_connection = True  # stopping, or the client gave up waiting
            return
        if plan.payload is None:  # drop: close without writing a byte
            self.close_connection = True
            return
        # Billed before the first byte goes out, so that a client holding the response always
        # sees it counted; taken back if the write fails, or the stream is cut or ends in error.
        billed = plan.key if plan.status == 200 else None
        if billed is not None:
            wire._bill(billed, +1)
        try:
            self.send_response(plan.status, _REASONS.get(plan.status))
            if plan.stream is None:
                data = json.dumps(plan.payload).encode()
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
            else:
                self.send_header("Transfer-Encoding", "chunked")
            for name, value in plan.headers.items():
                self.send_header(name, value)
            self.end_headers()
            if plan.stream is None:
                self._write(data, plan.trickle)
                return
            for i, event in enumerate(plan.stream):  # one HTTP chunk per event, each flushed
                if i and plan.pace > 0 and wire._stopping.wait(plan.pace):
                    raise _Stopped
                self._write(b"%x\r\n%s\r\n" % (len(event), event), plan.trickle)
            if plan.cut:  # no last chunk: the client sees its stream broken off
                raise _Stopped
            self._write(b"0\r\n\r\n", plan.trickle)
            if plan.errored and billed is not None:
                wire._bill(billed, -1)
        except (BrokenPipeError, ConnectionResetError, _Stopped):
            self.close_connection = True
            if billed is not None:
                wire._bill(billed, -1)

    def _write(self, data: bytes, trickle: float) -> None:
        if trickle > 0:
            self._trickle(data, trickle)
        else:
            self.wfile.write(data)
        self.wfile.flush()

    def _trickle(self, data: bytes, interval: float) -> None:
        """The body one byte at a time, ``interval`` seconds apart."""
        self.wfile.flush()
        for i in range(len(data)):
            if self.server.wire._stopping.wait(interval):
                raise _Stopped
            self.wfile.write(data[i : i + 1])
            self.wfile.flush()

    def _peer_open(self) -> bool:
        """False when the client closed the connection (it gave up waiting)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            if not readable:
                return True
            peeked: bytes = self.connection.recv(1, socket.MSG_PEEK)
            return peeked != b""
        except OSError:
            return False


# ---------------------------------------------------------------------------------------------
# The server
# ---------------------------------------------------------------------------------------------


class WireServer:
    """A scripted fake of both providers' HTTP APIs. See the module docstring."""

    def __init__(
        self,
        default: list[dict[str, Any]] | None = None,
        address: tuple[str, int] = ("127.0.0.1", 0),
    ) -> None:
        self._default = default
        self._address = address  # port 0: any free port
        self._scripts: dict[str, list[dict[str, Any]]] = {}
        self._calls: Counter[tuple[str | None, int]] = Counter()
        self._billed: Counter[tuple[str | None, int]] = Counter()
        self.requests: list[Recorded] = []
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._stopping = threading.Event()
        self._idle = threading.Condition(self._lock)
        self._in_flight = 0
        self._connections: set[socket.socket] = set()
        self._handlers: set[threading.Thread] = set()
        self._http: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> WireServer:
        if self._http is not None:
            raise RuntimeError("WireServer already started")
        self._stopping.clear()
        self._http = _HTTPServer(self, self._address)
        self._thread = threading.Thread(
            target=self._http.serve_forever,
            kwargs={"poll_interval": 0.01},
            name=f"wire-server:{self._http.server_address[1]}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        http, thread = self._http, self._thread
        if http is None or thread is None:
            return
        self._stopping.set()  # cuts scripted delays short
        http.shutdown()
        thread.join()
        with self._lock:
            connections = list(self._connections)
            handlers = list(self._handlers)
        for connection in connections:  # wake handlers waiting on idle keep-alive connections
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        deadline = time.monotonic() + 5.0
        for handler in handlers:
            handler.join(max(0.0, deadline - time.monotonic()))
        http.server_close()
        self._http = None
        self._thread = None

    def __enter__(self) -> WireServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def url(self) -> str:
        if self._http is None:
            raise RuntimeError("WireServer not started")
        host, port = self._http.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def openai_base_url(self) -> str:
        return self.url + "/v1"

    @property
    def anthropic_base_url(self) -> str:
        return self.url

    # -- scripting and inspection ---------------------------------------------------------------

    def script(self, goal: str, turns: list[dict[str, Any]]) -> None:
        """Answer conversations whose first user message is `goal` with `turns[turn]`."""
        with self._lock:
            self._scripts[goal] = list(turns)

    def calls(self, goal: str, turn: int) -> int:
        """Requests received for (goal, turn): faulted, rejected and answered alike."""
        with self._lock:
            return self._calls[(goal, turn)]

    def billed(self, goal: str, turn: int) -> int:
        """200 responses written in full for (goal, turn); not those whose client gave up."""
        with self._lock:
            return self._billed[(goal, turn)]

    def max_per_window(self, window: float, model: str | None = None) -> int:
        """Most requests (of `model`, or all) arriving within one window [k*w, (k+1)*w)."""
        with self._lock:
            buckets = Counter(
                int(r.at // window)
                for r in self.requests
                if model is None or r.body.get("model") == model
            )
        return max(buckets.values(), default=0)

    def wait_idle(self, timeout: float = 5.0) -> bool:
        """Wait until no request is being handled (e.g. a delayed one whose client gave up)."""
        with self._idle:
            return self._idle.wait_for(lambda: self._in_flight == 0, timeout)

    def reset(self) -> None:
        """Forget scripts, counters and recorded requests (the default script stays)."""
        with self._lock:
            self._scripts.clear()
            self._calls.clear()
            self._billed.clear()
            self.requests.clear()

    # -- called by handler threads --------------------------------------------------------------

    def _track(self, connection: socket.socket, *, opened: bool) -> None:
        with self._lock:
            if opened:
                self._connections.add(connection)
                self._handlers.add(threading.current_thread())
            else:
                self._connections.discard(connection)
                self._handlers.discard(threading.current_thread())

    def _busy(self, delta: int) -> None:
        with self._idle:
            self._in_flight += delta
            if self._in_flight == 0:
                self._idle.notify_all()

    def _bill(self, key: tuple[str | None, int], delta: int) -> None:
        with self._lock:
            self._billed[key] += delta

    def _decide(
        self, method: str, target: str, headers: dict[str, str], raw: bytes, at: float
    ) -> _Plan:
        path = target.split("?", 1)[0]
        api = _API_BY_PATH.get(path)
        body: dict[str, Any] = {}
        parse_error: str | None = None
        try:
            decoded = json.loads(raw) if raw else None
        except ValueError as exc:
            decoded, parse_error = None, f"The request body is not valid JSON: {exc}"
        if isinstance(decoded, dict):
            body = decoded
        elif parse_error is None:
            parse_error = "The request body must be a JSON object."
        goal, turn = _locate(body)
        key = (goal, turn) if turn is not None else None
        with self._lock:
            slot = 0
            if key is not None:
                slot = self._calls[key]
                self._calls[key] += 1
            try:
                plan = self._plan(api, method, path, headers, body, parse_error, key, slot)
            except Exception as exc:  # a bug in this file: make it loud, not a fake fault
                traceback.print_exc()
                plan = self._error(api, 500, f"WireServer internal error: {exc!r}")
            self.requests.append(
                Recorded(
                    path=path,
                    api=api or "unknown",
                    body=body,
                    headers=headers,
                    at=at,
                    goal=goal,
                    turn=turn,
                    status=plan.status if plan.payload is not None else 0,
                )
            )
        return plan

    def _request_id(self) -> str:
        return f"req_wire{next(self._ids):08d}"

    def _error(
        self,
        api: str | None,
        status: int,
        message: str | None,
        *,
        param: str | None = None,
        headers: dict[str, str] | None = None,
        delay: float = 0.0,
        code: str | None = None,
    ) -> _Plan:
        request_id = self._request_id()
        extra = dict(headers or {})
        if api == ANTHROPIC:
            extra["request-id"] = request_id
            payload = _anthropic_error(status, message, request_id, code)
        else:
            extra["x-request-id"] = request_id
            payload = _openai_error(status, message, param, code)
        return _Plan(status=status, payload=payload, headers=extra, delay=delay)

    def _plan(
        self,
        api: str | None,
        method: str,
        path: str,
        headers: dict[str, str],
        body: dict[str, Any],
        parse_error: str | None,
        key: tuple[str | None, int] | None,
        slot: int,
    ) -> _Plan:
        if api is None:
            return self._error(None, 404, f"Invalid URL ({method} {path})")
        if method != "POST":
            return self._error(api, 405, f"Method {method} not allowed on {path}")
        try:
            if api == OPENAI:
                _check_openai_auth(headers)
            else:
                _check_anthropic_headers(headers)
            if parse_error is not None:
                raise WireError(400, parse_error)
            if api == OPENAI:
                _validate_openai(body)
            else:
                _validate_anthropic(body)
            assert key is not None  # valid bodies have messages
            goal, turn = key
            turns = self._scripts.get(goal) if goal is not None else None
            if turns is None:
                turns = self._default
            if turns is None:
                raise WireError(400, f"WireServer: no script for goal {goal!r} and no default")
            if turn >= len(turns):
                raise WireError(
                    400,
                    f"WireServer: the script for goal {goal!r} has {len(turns)} turn(s); "
                    f"this request is turn {turn} ({turn} assistant message(s))",
                )
            spec = _structured(turns[turn], api, body)
        except WireError as exc:
            return self._error(api, exc.status, exc.message, param=exc.param)

        faults = spec.get("faults") or []
        fault: dict[str, Any] = faults[slot] if slot < len(faults) else {}
        delay = float(fault.get("delay", 0.0))
        if fault.get("drop"):
            return _Plan(status=0, payload=None, delay=delay, key=key)
        if "status" in fault:
            extra: dict[str, str] = {}
            if fault.get("retry_after") is not None:
                extra["retry-after"] = f"{fault['retry_after']:g}"
            if fault.get("retry_after_ms") is not None:
                extra["retry-after-ms"] = f"{fault['retry_after_ms']:g}"
            return self._error(
                api,
                int(fault["status"]),
                fault.get("message"),
                headers=extra,
                delay=delay,
                code=fault.get("code"),
            )

        spec = _cut(spec, turn, api, body)
        request_id = self._request_id()
        model = str(body["model"])
        serial = next(self._ids)
        if api == OPENAI:
            payload = _openai_completion(spec, turn, model, f"chatcmpl-wire{serial:08d}")
            extra = {"x-request-id": request_id}
        else:
            payload = _anthropic_message(spec, turn, model, f"msg_wire{serial:08d}")
            extra = {"request-id": request_id}
        trickle = float(fault.get("trickle", 0.0))
        if not body.get("stream"):
            return _Plan(200, payload, extra, delay=delay, key=key, trickle=trickle)
        if api == OPENAI:
            options = body.get("stream_options") or {}
            events = _openai_stream(payload, options.get("include_usage") is True)
        else:
            events = _anthropic_stream(payload)
        cut = fault.get("cut")
        if cut is not None:
            events = events[: int(cut)]
            if fault.get("error") is not None:
                events.append(_stream_error(api, str(fault["error"]), fault.get("message")))
        return _Plan(
            200,
            payload,
            {**extra, "Content-Type": "text/event-stream", "Cache-Control": "no-cache"},
            delay=delay,
            key=key,
            trickle=trickle,
            stream=tuple(events),
            cut=cut is not None and fault.get("error") is None,
            errored=cut is not None and fault.get("error") is not None,
            pace=float(fault.get("pace", 0.0)),
        )


def main(argv: list[str] | None = None) -> None:
    """``python -m tests.wire``: serve both wire formats on a port until
    interrupted, with scripted conversations from a JSON file (an object
    ``{goal: [turn, ...]}``, or a list of turns for every goal), so that a
    real model's agent can be tried with no key and no network. Run it from
    the repository root (``tests`` is not installed with the package)."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.wire",
        description="A local OpenAI and Anthropic wire-format server (tests/wire.py).",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8099, help="port (0: any free one)")
    parser.add_argument(
        "--script", type=Path, metavar="FILE", help="JSON: {goal: [turns]}, or [turns] for any goal"
    )
    args = parser.parse_args(argv)
    script: Any = [] if args.script is None else json.loads(args.script.read_text())
    server = WireServer(
        default=script if isinstance(script, list) and script else None,
        address=(args.host, args.port),
    )
    for goal, turns in script.items() if isinstance(script, dict) else ():
        server.script(goal, turns)
    with server:
        print(
            f"serving on {server.url}: OPENAI_BASE_URL={server.openai_base_url} "
            f"ANTHROPIC_BASE_URL={server.anthropic_base_url} (any API key)",
            flush=True,
        )
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()


if __name__ == "__main__":
    main()
