"""OpenAI's Chat Completions API, through the official ``openai`` SDK: OpenAI
itself and every server that speaks it (vLLM, Ollama, a LiteLLM proxy).
Configured by the SDK's variables, ``OPENAI_API_KEY`` and ``OPENAI_BASE_URL``.

A structured answer (``Agent(output_type=...)``) is asked for with
``response_format`` of type ``json_schema``: it shapes the text answer, and
the agent's tools stay offered. An answer that did not validate is sent
back as the assistant's message, followed by a user message saying why."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from harness.errors import ModelError
from harness.models import ModelTurn, ToolCall, Usage, token_count
from harness.output import OutputSchema, as_text, correction
from harness.providers.base import ProviderModel, tool_schema
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

    def parse(self, response: Any) -> ModelTurn:
        if not response.choices:
            raise ModelError(f"{self.name}: the response has no choices")
        choice = response.choices[0]
        message = choice.message
        calls = tuple(_call(c) for c in message.tool_calls or () if c.type == "function")
        usage = None
        if response.usage is not None:
            details = {}
            cached = getattr(response.usage.prompt_tokens_details, "cached_tokens", None)
            if cached is not None:
                details["cached_tokens"] = token_count("cached_tokens", cached)
            usage = Usage(
                token_count("input_tokens", response.usage.prompt_tokens),
                token_count("output_tokens", response.usage.completion_tokens),
                details,
            )
        if calls:
            return ModelTurn(
                tool_calls=calls,
                text=message.content,
                usage=usage,
                stop_reason=choice.finish_reason,
            )
        # A refusal of a structured answer comes instead of the content: it is the
        # answer, which then does not validate, and the model is told so.
        final = message.content or getattr(message, "refusal", None) or ""
        return ModelTurn(final=final, usage=usage, stop_reason=choice.finish_reason)


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


def _call(call: Any) -> ToolCall:
    raw = call.function.arguments or "{}"
    try:
        args = json.loads(raw)
    except (ValueError, RecursionError):  # not JSON, too deep, a 5,000-digit number
        args = None
    if not isinstance(args, dict):
        return ToolCall(call.function.name, {}, call.id, raw_arguments=raw)
    return ToolCall(call.function.name, args, call.id)
