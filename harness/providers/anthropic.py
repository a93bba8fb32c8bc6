"""Anthropic's Messages API, through the official ``anthropic`` SDK.
Configured by the SDK's variables, ``ANTHROPIC_API_KEY`` and ``ANTHROPIC_BASE_URL``.

A structured answer (``Agent(output_type=...)``) is asked for with a tool,
:data:`~harness.output.FINAL_TOOL`, whose input schema is the answer's,
offered beside the agent's tools; ``tool_choice`` forces it when the agent
has no tools of its own. A call of it is the final answer
(harness.providers.base.answered_by_tool); one that did not validate is
answered with a ``tool_result`` error saying why."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from harness.errors import ConfigError
from harness.models import ModelTurn, ToolCall, Usage, token_count
from harness.output import FINAL_TOOL, FINAL_TOOL_DESCRIPTION, OutputSchema, correction
from harness.providers import sse
from harness.providers.base import Deltas, ProviderModel, tool_call, tool_schema
from harness.providers.deadline import http_client
from harness.providers.transcript import Exchange, Rejected
from harness.tools import ToolSpec

#: Usage counts Anthropic reports beside input and output: kept as sent, and
#: counted in ``input_tokens`` (:func:`_usage`).
CACHE_FIELDS = ("cache_read_input_tokens", "cache_creation_input_tokens")


class AnthropicModel(ProviderModel):
    """``AnthropicModel("claude-sonnet-4-5", system="You are ...", max_tokens=1024)``:
    every other keyword goes into each request as it is."""

    provider = "anthropic"
    extra = "anthropic"
    #: Its SDK sends its arguments as they are: nothing to save by moving them.
    verbatim = ()

    def __init__(
        self,
        model: str,
        *,
        system: str | None = None,
        max_tokens: int = 1024,
        timeout: float | None = None,
        **params: Any,
    ) -> None:
        if "thinking" in params:
            raise ConfigError(
                "AnthropicModel: extended thinking is not supported yet (its blocks would "
                "have to be sent back with every tool result)"
            )
        super().__init__(model, system=system, timeout=timeout, max_tokens=max_tokens, **params)

    @classmethod
    def _import_sdk(cls) -> Any:
        try:
            import anthropic
        except ImportError as err:
            raise cls._missing_extra(err) from None
        return anthropic

    def _base_error(self) -> type[Exception]:
        return self.sdk.AnthropicError  # type: ignore[no-any-return]

    def _make_client(self) -> Any:
        bounded = http_client(self.sdk)
        if bounded is None:
            return self.sdk.Anthropic(max_retries=0)
        return self.sdk.Anthropic(max_retries=0, http_client=bounded)

    def payload(
        self,
        goal: str,
        history: Sequence[Exchange],
        tools: Sequence[ToolSpec],
        output: OutputSchema | None = None,
    ) -> dict[str, Any]:
        messages: list[dict[str, Any]] = [{"role": "user", "content": goal}]
        for exchange in history:
            if exchange.rejected is not None:
                messages.extend(_rejected(exchange.rejected, exchange.text))
                continue
            if exchange.user:
                messages.append({"role": "user", "content": exchange.text})
                continue
            if not exchange.calls:  # a final answer the conversation went on after
                text = exchange.text if exchange.text and exchange.text.strip() else "(no text)"
                messages.append({"role": "assistant", "content": [{"type": "text", "text": text}]})
                continue
            blocks: list[dict[str, Any]] = []
            if exchange.text and exchange.text.strip():  # the API rejects blank text blocks
                blocks.append({"type": "text", "text": exchange.text})
            blocks.extend(
                {"type": "tool_use", "id": call.id, "name": call.name, "input": call.args}
                for call in exchange.calls
            )
            messages.append({"role": "assistant", "content": blocks})
            # One user message answers every tool_use of the turn.
            messages.append(
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": answer.call_id,
                            "content": answer.content,
                            **({"is_error": True} if answer.is_error else {}),
                        }
                        for answer in exchange.answers
                    ],
                }
            )
        payload: dict[str, Any] = {**self.params, "model": self.model, "messages": messages}
        if self.system is not None:
            payload["system"] = self.system
        offered = [
            {
                "name": spec.name,
                "description": spec.description or spec.name,
                "input_schema": tool_schema(spec),
            }
            for spec in tools
        ]
        if output is not None:
            offered.append(final_tool(output))
            if not tools:  # nothing else to do but answer
                payload["tool_choice"] = {"type": "tool", "name": FINAL_TOOL}
        if offered:
            payload["tools"] = offered
        return payload

    def endpoint(self, client: Any) -> Callable[..., Any]:
        return client.messages.create  # type: ignore[no-any-return]

    def events(self, response: Any) -> Iterator[dict[str, Any]]:
        for name, data in sse.raw_events(sse.body(response), self.name):
            # Every event of the API is named; as the SDK, an unnamed one is skipped.
            if name is None or name == "ping":
                continue
            if name == "error":
                raise self._stream_error(data.decode(errors="replace"), response)
            if data:
                yield sse.loads(data, self.name)

    def _stream_error(self, data: str, response: Any) -> Exception:
        """The error a stream reports (``event: error``), as the SDK raises it: a
        status error with the response's status (200) and the event's JSON."""
        body: Any = data
        try:
            body = json.loads(data)
            message = f"{body}"
        except (ValueError, RecursionError):
            message = data or f"Error code: {response.status_code}"
        failure = self.sdk.APIStatusError(message, response=response.http_response, body=body)
        return failure  # type: ignore[no-any-return]

    def assemble(self, events: Iterable[Any], deltas: Deltas) -> ModelTurn:
        blocks: dict[int, _Block] = {}
        counts: dict[str, Any] | None = None
        stop, ended = None, False
        for each in events:
            event = sse.plain(each)
            kind = event.get("type")
            if kind == "content_block_delta":
                block = blocks.get(event.get("index", -1))
                if block is not None:
                    block.add(event.get("delta") or {}, deltas)
            elif kind == "content_block_start":
                blocks[event.get("index", -1)] = _Block(event.get("content_block") or {}, deltas)
            elif kind == "message_start":
                counts = _counts(counts, (event.get("message") or {}).get("usage"))
            elif kind == "message_delta":
                stop = (event.get("delta") or {}).get("stop_reason")
                counts = _counts(counts, event.get("usage"))
            elif kind == "message_stop":
                ended = True
        if not ended:
            raise self.unfinished()
        ordered = [blocks[i] for i in sorted(blocks)]
        text = "".join("".join(b.parts) for b in ordered if b.kind == "text")
        calls = tuple(b.call() for b in ordered if b.kind == "tool_use")
        usage = _usage(counts)
        if calls:
            return ModelTurn(tool_calls=calls, text=text or None, usage=usage, stop_reason=stop)
        return ModelTurn(final=text, usage=usage, stop_reason=stop)


def final_tool(output: OutputSchema) -> dict[str, Any]:
    """The tool whose call is the structured final answer."""
    description = FINAL_TOOL_DESCRIPTION
    if output.description:
        description += f" The answer: {output.description}"
    return {"name": FINAL_TOOL, "description": description, "input_schema": output.schema}


def _rejected(rejected: Rejected, text: str | None) -> list[dict[str, Any]]:
    """The answer as the model gave it (the final-answer tool's call, or
    text), then why it was refused (that call's error result, or text)."""
    blocks: list[dict[str, Any]] = []
    if text and text.strip():
        blocks.append({"type": "text", "text": text})
    if isinstance(rejected.answer, dict):
        blocks.append(
            {
                "type": "tool_use",
                "id": rejected.call_id,
                "name": FINAL_TOOL,
                "input": rejected.answer,
            }
        )
        said = {
            "type": "tool_result",
            "tool_use_id": rejected.call_id,
            "content": correction(rejected.error),
            "is_error": True,
        }
    else:
        answer = rejected.answer if rejected.answer.strip() else "(no answer)"
        blocks.append({"type": "text", "text": answer})
        told = f"{correction(rejected.error)} Give it by calling the {FINAL_TOOL} tool."
        said = {"type": "text", "text": told}
    return [{"role": "assistant", "content": blocks}, {"role": "user", "content": [said]}]


class _Block:
    """One content block as its deltas come: a text block's text, a tool_use
    block's id, name and input JSON (other blocks are kept out of the turn)."""

    def __init__(self, start: Mapping[str, Any], deltas: Deltas) -> None:
        self.kind: str = start.get("type") or ""
        self.parts: list[str] = []
        self.id: str | None = start.get("id")
        self.name: str = start.get("name") or ""
        self.input: Any = start.get("input")
        text = start.get("text")
        if self.kind == "text" and text:
            self.parts.append(text)
            deltas(text)

    def add(self, delta: Mapping[str, Any], deltas: Deltas) -> None:
        kind = delta.get("type")
        if kind == "text_delta" and self.kind == "text":
            text = delta.get("text") or ""
            self.parts.append(text)
            deltas(text)
        elif kind == "input_json_delta" and self.kind == "tool_use":
            self.parts.append(delta.get("partial_json") or "")

    def call(self) -> ToolCall:
        raw = "".join(self.parts)
        if not raw.strip() and isinstance(self.input, dict):  # no input streamed: as it began
            return ToolCall(self.name, self.input, self.id)
        return tool_call(self.name, raw, self.id)


#: The counts of a streamed message's usage: its input ones at its start, the
#: output ones (and, from newer servers, the input ones again) at its end.
_COUNTS = ("input_tokens", "output_tokens", *CACHE_FIELDS)


def _counts(
    counts: dict[str, Any] | None, reported: Mapping[str, Any] | None
) -> dict[str, Any] | None:
    """``counts`` with what ``reported`` says over them (the later count wins, as
    in the SDK's own accumulator); None while no event has reported usage."""
    if reported is None:
        return counts
    more = {n: v for n in _COUNTS if (v := reported.get(n)) is not None}
    return {**(counts or {}), **more}


def _usage(reported: Mapping[str, Any] | None) -> Usage | None:
    """The turn's usage under the harness's one rule: ``input_tokens`` is every
    input token, cached or not, as OpenAI counts them. Anthropic reports its
    cache reads and writes beside ``input_tokens``, so they are added in (and
    kept on their own, under its names, for the price). None when the
    response has no usage (a compatible server's)."""
    if reported is None:
        return None
    details = {
        name: token_count(name, value)
        for name in CACHE_FIELDS
        if (value := reported.get(name)) is not None
    }
    uncached = token_count("input_tokens", reported.get("input_tokens") or 0)
    output = token_count("output_tokens", reported.get("output_tokens") or 0)
    return Usage(uncached + sum(details.values()), output, details)
