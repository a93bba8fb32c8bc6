"""OpenAI's Chat Completions API, through the official ``openai`` SDK: OpenAI
itself and every server that speaks it (vLLM, Ollama, a LiteLLM proxy).
Configured by the SDK's variables, ``OPENAI_API_KEY`` and ``OPENAI_BASE_URL``.

A structured answer (``Agent(output_type=...)``) is asked for with
``response_format`` of type ``json_schema``: it shapes the text answer, and
the agent's tools stay offered. An answer that did not validate is sent
back as the assistant's message, followed by a user message saying why."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from harness.errors import ModelError
from harness.models import ModelTurn, ToolCall, Usage, token_count
from harness.output import OutputSchema, as_text, correction
from harness.providers import sse
from harness.providers.base import Deltas, ProviderModel, tool_call, tool_schema
from harness.providers.deadline import http_client
from harness.providers.transcript import Exchange, Rejected, arguments_json
from harness.tools import ToolSpec


class OpenAIModel(ProviderModel):
    """``OpenAIModel("gpt-4.1-mini", system="You are ...", temperature=0)``:
    every other keyword goes into each request as it is."""

    provider = "openai"
    extra = "openai"
    #: Chat Completions' current name for it (reasoning models refuse ``max_tokens``);
    #: a server that knows only ``max_tokens`` gets it from ``max_tokens=`` on the model.
    output_limit = "max_completion_tokens"

    @classmethod
    def _import_sdk(cls) -> Any:
        try:
            import openai
        except ImportError as err:
            raise cls._missing_extra(err) from None
        return openai

    def _base_error(self) -> type[Exception]:
        return self.sdk.OpenAIError  # type: ignore[no-any-return]

    def _make_client(self) -> Any:
        bounded = http_client(self.sdk)
        if bounded is None:
            return self.sdk.OpenAI(max_retries=0)
        return self.sdk.OpenAI(max_retries=0, http_client=bounded)

    def payload(
        self,
        goal: str,
        history: Sequence[Exchange],
        tools: Sequence[ToolSpec],
        output: OutputSchema | None = None,
    ) -> dict[str, Any]:
        messages: list[dict[str, Any]] = []
        if self.system is not None:
            messages.append({"role": "system", "content": self.system})
        messages.append({"role": "user", "content": goal})
        for exchange in history:
            if exchange.rejected is not None:
                messages.extend(_rejected(exchange.rejected))
                continue
            if exchange.user:
                messages.append({"role": "user", "content": exchange.text})
                continue
            if not exchange.calls:  # a final answer the conversation went on after
                messages.append({"role": "assistant", "content": exchange.text})
                continue
            messages.append(
                {
                    "role": "assistant",
                    "content": exchange.text,
                    "tool_calls": [
                        {
                            "id": call.id,
                            "type": "function",
                            "function": {"name": call.name, "arguments": arguments_json(call)},
                        }
                        for call in exchange.calls
                    ],
                }
            )
            # One tool message per call, in the order of the calls.
            messages.extend(
                {"role": "tool", "tool_call_id": answer.call_id, "content": answer.content}
                for answer in exchange.answers
            )
        payload: dict[str, Any] = {**self.params, "model": self.model, "messages": messages}
        if tools:
            payload["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": spec.name,
                        "description": spec.description or spec.name,
                        "parameters": tool_schema(spec),
                    },
                }
                for spec in tools
            ]
        if output is not None:
            payload["response_format"] = response_format(output)
        return payload

    def endpoint(self, client: Any) -> Callable[..., Any]:
        return client.chat.completions.create  # type: ignore[no-any-return]

    def streaming(self, known: Mapping[str, Any]) -> dict[str, Any]:
        # Without ``include_usage`` a stream reports no usage at all.
        options = {**(known.get("stream_options") or {}), "include_usage": True}
        return {"stream": True, "stream_options": options}

    def events(self, response: Any) -> Iterator[dict[str, Any]]:
        stream = sse.raw_events(sse.body(response), self.name)
        for _, data in stream:
            if data.startswith(b"[DONE]"):
                sse.drain(stream)
                return
            chunk = sse.loads(data, self.name)
            if chunk.get("error"):
                raise self._stream_error(chunk["error"], response)
            yield chunk

    def _stream_error(self, error: Any, response: Any) -> Exception:
        """The error a stream reports (``{"error": ...}`` for data), as the SDK raises it."""
        message = error.get("message") if isinstance(error, Mapping) else None
        if not message or not isinstance(message, str):
            message = "An error occurred during streaming"
        failure = self.sdk.APIError(message=message, request=response.http_request, body=error)
        return failure  # type: ignore[no-any-return]

    def assemble(self, events: Iterable[Any], deltas: Deltas) -> ModelTurn:
        texts: list[str] = []
        refusals: list[str] = []
        calls: dict[int, _PartialCall] = {}
        chose, finish, reported = False, None, None
        for event in events:
            chunk = sse.plain(event)
            if chunk.get("usage") is not None:  # the last chunk's, with include_usage
                reported = chunk["usage"]
            for choice in chunk.get("choices") or ():
                if choice.get("index") != 0:
                    continue
                chose = True
                delta = choice.get("delta") or {}
                content = delta.get("content")
                if content:
                    texts.append(content)
                    deltas(content)
                refusal = delta.get("refusal")
                if refusal:
                    refusals.append(refusal)
                for part in delta.get("tool_calls") or ():
                    calls.setdefault(part.get("index"), _PartialCall()).add(part)
                if choice.get("finish_reason") is not None:
                    finish = choice["finish_reason"]
        if finish is None:  # ended before its end, even before a first choice: retried
            raise self.unfinished()
        if not chose:
            raise ModelError(f"{self.name}: the response has no choices")
        text = "".join(texts) if texts else None
        made = tuple(c.call() for _, c in sorted(calls.items()) if c.kind in (None, "function"))
        usage = _usage(reported)
        if made:
            return ModelTurn(tool_calls=made, text=text, usage=usage, stop_reason=finish)
        # A refusal of a structured answer comes instead of the content: it is the
        # answer, which then does not validate, and the model is told so.
        final = text or "".join(refusals)
        return ModelTurn(final=final, usage=usage, stop_reason=finish)


def response_format(output: OutputSchema) -> dict[str, Any]:
    """``response_format`` asking for ``output``'s JSON schema."""
    schema: dict[str, Any] = {"name": output.name, "schema": output.schema, "strict": output.strict}
    if output.description:
        schema["description"] = output.description
    return {"type": "json_schema", "json_schema": schema}


def _rejected(rejected: Rejected) -> list[dict[str, Any]]:
    """The answer as the model gave it, then why it was refused."""
    answer = rejected.answer if isinstance(rejected.answer, str) else as_text(rejected.answer)
    return [
        {"role": "assistant", "content": answer or "(no answer)"},
        {"role": "user", "content": correction(rejected.error)},
    ]


def _usage(reported: Mapping[str, Any] | None) -> Usage | None:
    if reported is None:
        return None
    details = {}
    cached = (reported.get("prompt_tokens_details") or {}).get("cached_tokens")
    if cached is not None:
        details["cached_tokens"] = token_count("cached_tokens", cached)
    return Usage(
        token_count("input_tokens", reported.get("prompt_tokens")),
        token_count("output_tokens", reported.get("completion_tokens")),
        details,
    )


class _PartialCall:
    """One tool call as its deltas come: its id and type once, its name and
    arguments in pieces (joined, as the SDK's own accumulator joins them)."""

    def __init__(self) -> None:
        self.id: str | None = None
        self.kind: str | None = None
        self.name: list[str] = []
        self.arguments: list[str] = []

    def add(self, part: Mapping[str, Any]) -> None:
        self.id = part.get("id") or self.id
        self.kind = part.get("type") or self.kind
        function = part.get("function")
        if function is not None:
            if function.get("name"):
                self.name.append(function["name"])
            if function.get("arguments"):
                self.arguments.append(function["arguments"])

    def call(self) -> ToolCall:
        return tool_call("".join(self.name), "".join(self.arguments), self.id)
