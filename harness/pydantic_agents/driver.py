"""A Pydantic AI agent as a harness agent: its model requests and tool calls as steps.

:class:`AgentModel` is the harness model of such an agent: a model step
re-runs the agent (harness.pydantic_agents.journal) and carries out its next
model request; the turn it returns keeps the response whole (``native``),
and lists the function tool calls the agent makes next as tool steps, or is
the run's final output, or asks for another model step (the agent retries:
an output validator said ``ModelRetry``). Each tool step is a
:class:`AgentToolSpec`: it re-runs the agent and carries out that one call.
A model response is recorded the moment the call returns, before the
agent's own code (output validators, output functions, argument checks) runs
on it (harness.engine.responses): never bought twice, and billed even if
that code fails the run. A tool call goes through the harness's executor
(idempotency key, effect, in doubt, approval) like any other; its step ends
when the tool returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, TypeAdapter
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.exceptions import (
    ModelConnectionError,
    ModelHTTPError,
    ModelRateLimitError,
    ModelRequestTimeout,
    ModelServerError,
    ModelUnavailableError,
)
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
from pydantic_ai.usage import UsageLimits
from pydantic_core import to_jsonable_python

from harness.errors import (
    BadInput,
    ModelError,
    RetryableModelError,
    StoreError,
    ToolError,
    ToolUnavailable,
    interruptions,
)
from harness.models import ModelRequest, ModelTurn, ResponseRecorder, ToolCall, Usage
from harness.pydantic_agents import live
from harness.pydantic_agents.journal import MODEL, CallKey, Replay, Target, current, is_deferred
from harness.pydantic_agents.toolsets import unreachable
from harness.records import JSON, Step, StepKind, StepStatus
from harness.tools import ToolContext, ToolEffect, ToolSpec
from harness.waiting import Deferred

#: HTTP statuses worth asking the provider again for.
_RETRYABLE = frozenset({408, 409, 425, 429, 500, 502, 503, 504, 529})
#: Pydantic AI's transient provider failures (a timeout, a dropped
#: connection, a rate limit, an overload, a 5xx): retried by the harness.
_TRANSIENT = (
    ModelConnectionError,
    ModelRateLimitError,
    ModelRequestTimeout,
    ModelServerError,
    ModelUnavailableError,
)
#: The kinds of Pydantic AI's own recorded call results (what a tool step
#: records); any other result is a tool's return an operator gave.
PAYLOAD_KINDS = frozenset(
    {
        "tool_return",
        "tool_content_result",
        "tool_failed",
        "model_retry",
        "validation_error",
        "approval_required",
        "call_deferred",
        "run_cancelled",
    }
)
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
                if "response" not in native:  # the run ended with no request (see next_turn)
                    continue
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
    """A tool step's outcome as Pydantic AI's recorded call result; None if it has none.
    A result an operator gave (``harness resolve --succeeded``) is the tool's return,
    and so is the answer to a deferred call (its error: the call's failure)."""
    if step.wait is not None:  # answered: DONE with the answer, or FAILED with the error
        if step.status is StepStatus.DONE:
            return {"kind": "tool_return", "result": step.result}
        if step.status is StepStatus.FAILED:
            return {"kind": "tool_failed", "message": step.error or "the call failed"}
        return None
    if step.status is StepStatus.DONE:
        if result.get("kind") in PAYLOAD_KINDS:
            return result
        if NOT_CALLED not in result:
            return {"kind": "tool_return", "result": step.result}
    if step.approval is not None and step.approval.rejected:
        reason = step.approval.reason or "no reason given"
        return {"kind": "tool_failed", "message": f"rejected by {step.approval.by}: {reason}"}
    if step.status is StepStatus.FAILED and step.error:
        # A failure the run went on after (a replay served a deferred call's
        # error answer): the call's failure, which the model saw.
        return {"kind": "tool_failed", "message": step.error}
    return None


@dataclass(frozen=True)
class Binding:
    """One registered Pydantic AI agent: what every step of its runs re-runs.
    ``one_loop``: its runs are driven on one event loop per process (it has
    toolsets besides function tools, whose MCP clients belong to one loop)."""

    agent: PydanticAgent[Any, Any]
    name: str
    deps: Any
    usage_limits: UsageLimits | None = None
    one_loop: bool = False


async def _advance(
    binding: Binding, key: str, prompt: str, fresh: Replay, step: Any = None
) -> Replay:
    """:func:`live.advance` on this thread's loop, or on the process's MCP
    loop for an agent whose MCP toolsets must stay on one loop: Pydantic AI
    shares one client per toolset, and two threads' loops using it at once
    hang (the threads pool)."""
    if not binding.one_loop:
        return await live.advance(binding, key, prompt, fresh, step)
    from harness.toolsets import sessions

    return await sessions.on_loop(live.advance(binding, key, prompt, fresh, step))


class AgentModel:
    """The harness model of a Pydantic AI agent (see the module docstring)."""

    records_responses = True
    #: Its responses are recorded by the step's recorder as they arrive.
    records_early = True
    #: ``harness send`` is refused: the agent's run has its one prompt.
    takes_messages = False

    def __init__(self, binding: Binding) -> None:
        self.binding = binding
        model = binding.agent.model
        self.name = str(getattr(model, "model_name", "") or "")

    async def next_turn(self, request: ModelRequest) -> ModelTurn:
        binding = self.binding
        try:
            journal = Journal.of(request.history(), request.step_index)
            fresh = journal.replay(MODEL)
            if request.recorder is not None:
                fresh.keeper = _Keeper(request.recorder, request.goal)
            replay = await _advance(binding, request.run_id, request.goal, fresh)
        except _not_the_agents_fault():
            raise
        except Exception as err:  # the agent's own run failed between steps
            said = f"the Pydantic AI agent failed: {type(err).__name__}: {err}"
            if unreachable(err):  # its MCP server, listing its tools: retried
                raise RetryableModelError(said) from err
            raise ModelError(said) from err
        if replay.error is not None:
            raise _model_error(replay.error)
        if not replay.did and replay.finished and request.step_index - 1 in journal.calls:
            # The run ended after its tool calls with no new request (a tool
            # beside the output tool, end_strategy="graceful"): that is its end.
            final = output_json(replay.output)
            return ModelTurn(final=final, native={"prompt": request.goal, "ended": True})
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
                if isinstance(part, ToolCallPart) and part.tool_name in replay.offered
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


def _not_the_agents_fault() -> tuple[type[BaseException], ...]:
    """Raised as they are (the engine retries the step): the store failed
    reading the history, or the process stops the step."""
    return (StoreError, *interruptions())


def _model_error(err: Exception) -> ModelError:
    if isinstance(err, _not_the_agents_fault()):
        raise err
    transient = isinstance(err, _TRANSIENT) or (
        isinstance(err, ModelHTTPError) and err.status_code in _RETRYABLE
    )
    if transient:
        retry_after = getattr(err, "retry_after", None)
        hint = float(retry_after) if isinstance(retry_after, int | float) else None
        return RetryableModelError(f"{type(err).__name__}: {err}", retry_after=hint)
    return ModelError(f"the model request failed: {type(err).__name__}: {err}")


class _Keeper:
    """The step's :class:`ResponseRecorder` as a :class:`~journal.Keeper`:
    records a response as the step's result would hold it (``native``)."""

    def __init__(self, recorder: ResponseRecorder, prompt: str) -> None:
        self.recorder, self.prompt = recorder, prompt

    def recorded(self) -> tuple[bool, Any]:
        found, stored = self.recorder.recorded()
        return found, _native_response(stored)

    def keep(self, response: Any) -> Any:
        got = _response(response).usage
        native: dict[str, JSON] = {"prompt": self.prompt, "response": response}
        usage = Usage(got.input_tokens, got.output_tokens)
        return _native_response(self.recorder.keep({"native": native}, usage))

    def release(self) -> None:
        self.recorder.release()


def _native_response(stored: JSON) -> Any:
    native = stored.get("native") if isinstance(stored, dict) else None
    return native.get("response") if isinstance(native, dict) else None


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
    of an approval are refused (:meth:`validate_edit`)."""

    def __init__(
        self, binding: Binding, name: str, effect: ToolEffect, description: str, approval: bool
    ) -> None:
        async def call(ctx: ToolContext) -> JSON | Deferred:
            return await _call_tool(binding, ctx)

        super().__init__(call, name, effect, description, None, approval)

    def validate(self, args: dict[str, JSON]) -> dict[str, Any]:
        return {}

    def validate_edit(self, args: dict[str, JSON]) -> None:
        raise BadInput(
            "args",
            f"tool {self.name!r} is a Pydantic AI agent's: it takes the arguments its "
            "model gave, so edited ones are refused (approve or reject the call as it is)",
        )


async def _call_tool(binding: Binding, ctx: ToolContext) -> JSON | Deferred:
    try:
        history = ctx.history()
    except StoreError as err:
        # Before the agent runs: nothing was called, so the step is tried
        # again after a back-off, never left in doubt (an at_most_once tool).
        raise ToolUnavailable(f"the run's steps could not be read: {err}", sent=False) from err
    step = next((s for s in history if s.index == ctx.step_index), None)
    if step is not None and step.approval is not None and step.approval.proposed_args:
        # Approved with edited arguments by a process without the agent (which
        # refuses them): the agent would call with its model's own. Not called.
        raise ToolError(
            "the call was approved with edited arguments, which a Pydantic AI agent's "
            "tool cannot take (it calls with its model's own): not called"
        )
    journal = Journal.of(history, ctx.step_index)
    target = journal.calls.get(ctx.step_index)
    if target is None or journal.prompt is None:
        raise ToolError(f"step {ctx.step_index} is not a call the agent's model asked for")
    fresh = journal.replay(target)
    fresh.approved = step is not None and step.approval is not None and not step.approval.rejected
    try:
        replay = await _advance(binding, ctx.run_id, journal.prompt, fresh, ctx)
    except Exception as err:
        if unreachable(err):  # before the call (its server, listing its tools): not sent
            raise ToolUnavailable(f"{type(err).__name__}: {err}", sent=False) from err
        raise
    if replay.error is not None:
        if unreachable(replay.error):  # during the call: it may have reached the server
            raise ToolUnavailable(str(replay.error), sent=True) from replay.error
        raise replay.error
    if not replay.did:
        return {NOT_CALLED: "the agent did not make this call (see the next model turn)"}
    if is_deferred(replay.done):
        return _deferral(replay.done)
    return replay.done


def _deferral(done: dict[str, Any]) -> Deferred:
    """A call the agent deferred (``CallDeferred``, an external tool) as the
    harness's wait: its ``metadata`` may name a ``timeout`` in seconds and a
    ``signal`` that answers it; any answer (``harness complete``, a
    callback, the signal) is then what the call returned."""
    metadata = done.get("metadata")
    metadata = metadata if isinstance(metadata, dict) else {}
    try:
        return Deferred(timeout=metadata.get("timeout"), signal=metadata.get("signal"))
    except BadInput as err:
        raise ToolError(
            f"the call was deferred with metadata the harness cannot wait on: {err}"
        ) from None
