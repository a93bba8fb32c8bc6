"""A Pydantic AI agent as a harness agent: its model requests and tool calls as steps.

:class:`AgentModel` is the harness model of such an agent: a model step
re-runs the agent (harness.pydantic_agents.journal) and carries out its next
model request; the turn it returns keeps the response whole (``native``),
and lists the function tool calls the agent makes next as tool steps, or is
the run's final output, or asks for another model step (the agent retries:
an output validator said ``ModelRetry``). Each tool step is a
:class:`AgentToolSpec`: it re-runs the agent and carries out that one call.
A model response is recorded before the step's checkpoint like any other
(never bought twice); a tool call goes through the harness's executor
(idempotency key, effect, in doubt, approval) like any other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, TypeAdapter
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.exceptions import ModelHTTPError
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
from pydantic_ai.usage import UsageLimits
from pydantic_core import to_jsonable_python

from harness.errors import ModelError, RetryableModelError, ToolError
from harness.models import ModelRequest, ModelTurn, ToolCall, Usage
from harness.pydantic_agents import live
from harness.pydantic_agents.journal import MODEL, CallKey, Replay, Target, current
from harness.records import JSON, Step, StepKind, StepStatus
from harness.tools import ToolContext, ToolEffect, ToolSpec

#: HTTP statuses worth asking the provider again for.
_RETRYABLE = frozenset({408, 409, 425, 429, 500, 502, 503, 504, 529})
#: A tool step whose call the agent did not make (it refused the arguments,
#: or ended first): its result, never read back.
NOT_CALLED = "not_called"


def step_context() -> ToolContext | None:
    """The harness step a Pydantic AI tool is called in (its ``idempotency_key``
    is the same on every attempt: pass it downstream to dedupe on it); None
    when the agent runs outside the harness (a plain ``run_sync``)."""
    replay = current()
    step = None if replay is None else replay.step
    return step if isinstance(step, ToolContext) else None


@dataclass(frozen=True)
class Journal:
    """A run's steps as a re-run reads them: the model responses in order,
    the tool results by call, and the call each tool step stands for."""

    responses: list[Any]
    results: dict[CallKey, Any]
    calls: dict[int, CallKey]
    prompt: str | None = None

    @classmethod
    def of(cls, steps: Sequence[Step], before: int) -> Journal:
        responses: list[Any] = []
        results: dict[CallKey, Any] = {}
        calls: dict[int, CallKey] = {}
        prompt = None
        for step in sorted(steps, key=lambda s: s.index):
            if step.index >= before:
                break
            result = step.result if isinstance(step.result, dict) else {}
            native = result.get("native")
            if step.kind is StepKind.MODEL and isinstance(native, dict):
                responses.append(native.get("response"))
                prompt = native.get("prompt", prompt)
                calls.update(_calls_of(step.index, len(responses) - 1, result))
            elif step.kind is StepKind.TOOL and step.index in calls:
                recorded = _tool_result(step, result)
                if recorded is not None:
                    results[calls[step.index]] = recorded
        return cls(responses, results, calls, prompt)

    def replay(self, target: Target) -> Replay:
        return Replay(list(self.responses), dict(self.results), target)


def _calls_of(index: int, turn: int, result: dict[str, Any]) -> dict[int, CallKey]:
    """The tool steps after model step ``index``, each with the call it stands for."""
    calls: dict[int, CallKey] = {}
    seen: dict[str, int] = {}
    for i, call in enumerate(result.get("tool_calls") or ()):
        call_id = str(call.get("id"))
        calls[index + 1 + i] = (turn, call_id, seen.get(call_id, 0))
        seen[call_id] = seen.get(call_id, 0) + 1
    return calls


def _tool_result(step: Step, result: dict[str, Any]) -> Any:
    """A tool step's outcome as Pydantic AI's recorded call result; None if it has none."""
    if step.status is StepStatus.DONE and "kind" in result:
        return result
    if step.approval is not None and step.approval.rejected:
        reason = step.approval.reason or "no reason given"
        return {"kind": "tool_failed", "message": f"rejected by {step.approval.by}: {reason}"}
    return None


@dataclass(frozen=True)
class Binding:
    """One registered Pydantic AI agent: what every step of its runs re-runs."""

    agent: PydanticAgent[Any, Any]
    name: str
    deps: Any
    tool_names: frozenset[str]
    usage_limits: UsageLimits | None = None


class AgentModel:
    """The harness model of a Pydantic AI agent (see the module docstring)."""

    records_responses = True

    def __init__(self, binding: Binding) -> None:
        self.binding = binding
        model = binding.agent.model
        self.name = str(getattr(model, "model_name", "") or "")

    async def next_turn(self, request: ModelRequest) -> ModelTurn:
        binding = self.binding
        try:
            journal = Journal.of(request.history(), request.step_index)
            fresh = journal.replay(MODEL)
            replay = await live.advance(binding, request.run_id, request.goal, fresh)
        except Exception as err:  # the agent's own run failed between steps
            raise ModelError(f"the Pydantic AI agent failed: {type(err).__name__}: {err}") from err
        if replay.error is not None:
            raise _model_error(replay.error)
        if not replay.did:
            raise ModelError(
                f"the re-run of agent {binding.name!r} made no new model request at step "
                f"{request.step_index}: its code took another path than when it was recorded"
            )
        native: dict[str, JSON] = {"prompt": request.goal, "response": replay.done}
        response = _response(replay.done)
        usage = Usage(response.usage.input_tokens, response.usage.output_tokens)
        if replay.finished:
            return ModelTurn(final=output_json(replay.output), usage=usage, native=native)
        calls: tuple[ToolCall, ...] = ()
        if replay.stopped_at == "tool":
            calls = tuple(
                ToolCall(part.tool_name, _args(part), part.tool_call_id)
                for part in response.parts
                if isinstance(part, ToolCallPart) and part.tool_name in binding.tool_names
            )
        text = "".join(p.content for p in response.parts if isinstance(p, TextPart)) or None
        return ModelTurn(tool_calls=calls, text=text, usage=usage, native=native)


_RESPONSE = TypeAdapter(ModelResponse)


def _response(native: Any) -> ModelResponse:
    return _RESPONSE.validate_python(native)


def _args(part: ToolCallPart) -> dict[str, JSON]:
    """The call's arguments as shown on its step (the agent reads them from the response)."""
    try:
        args = part.args_as_dict()
    except ValueError:
        return {}
    return to_jsonable_python(args)  # type: ignore[no-any-return]


def _model_error(err: Exception) -> ModelError:
    if isinstance(err, ModelHTTPError) and err.status_code in _RETRYABLE:
        return RetryableModelError(f"{err}")
    return ModelError(f"the model request failed: {type(err).__name__}: {err}")


def output_json(output: Any) -> str | dict[str, JSON]:
    """The run's result: text as it is, a pydantic model or a mapping as its
    JSON object, anything else as ``{"output": value}``."""
    if isinstance(output, str):
        return output
    if isinstance(output, BaseModel):
        return output.model_dump(mode="json")
    value = to_jsonable_python(output)
    return value if isinstance(value, dict) else {"output": value}


class AgentToolSpec(ToolSpec):
    """A function tool of a Pydantic AI agent as a harness tool: a call of it
    re-runs the agent and carries out that one call. The agent validates
    the arguments itself (from the recorded response), so edited arguments
    of an approval are not used."""

    def __init__(
        self, binding: Binding, name: str, effect: ToolEffect, description: str, approval: bool
    ) -> None:
        async def call(ctx: ToolContext) -> JSON:
            return await _call_tool(binding, ctx)

        super().__init__(call, name, effect, description, None, approval)

    def validate(self, args: dict[str, JSON]) -> dict[str, Any]:
        return {}


async def _call_tool(binding: Binding, ctx: ToolContext) -> JSON:
    journal = Journal.of(ctx.history(), ctx.step_index)
    target = journal.calls.get(ctx.step_index)
    if target is None or journal.prompt is None:
        raise ToolError(f"step {ctx.step_index} is not a call the agent's model asked for")
    fresh = journal.replay(target)
    replay = await live.advance(binding, ctx.run_id, journal.prompt, fresh, ctx)
    if replay.error is not None:
        raise replay.error
    if not replay.did:
        return {NOT_CALLED: "the agent did not make this call (see the next model turn)"}
    return replay.done
