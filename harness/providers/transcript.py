"""The conversation so far, rebuilt from the stored steps.

A model step turns the run's steps, as the store holds them, into
exchanges, each a model turn and the answers to its tool calls, or a final
answer that did not validate against the agent's output type and the error
the model is told of. So a run resumed on another worker after a SIGKILL
sends the provider the same conversation. A worker that carried the turn
before keeps the steps that can no longer change and the exchanges made of
them (harness.engine.transcripts, through :func:`exchanges`'s ``memo``).
Each provider formats the exchanges its own way (harness.providers.openai,
.anthropic).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from harness.models import ModelTurn, ToolCall
from harness.records import JSON, Step, StepKind, StepStatus


@dataclass(frozen=True)
class ToolAnswer:
    """What a tool call came to, for the model: its result as JSON text, or an
    error it can react to."""

    call_id: str
    name: str
    content: str
    is_error: bool


@dataclass(frozen=True)
class Rejected:
    """A final answer that did not validate (``Agent(output_type=...)``):
    what the model answered (text, or the final-answer tool's input, called
    under ``call_id``) and the validation error it is told of."""

    answer: str | dict[str, JSON]
    error: str
    call_id: str


@dataclass(frozen=True)
class Exchange:
    """One model turn that asked for tools, and the answer to each call; or
    one that answered finally, in a conversation that went on after it (no
    calls; a structured answer as its JSON text); or one whose final answer
    was rejected (``rejected``; no calls); or, with ``user``, the user's next
    message (``text``)."""

    text: str | None
    calls: tuple[ToolCall, ...]  # every call with an id
    answers: tuple[ToolAnswer, ...]
    rejected: Rejected | None = None
    user: bool = False


def call_id(call: ToolCall, step_index: int, position: int) -> str:
    """The provider's id for the call; one made up, stable, for a turn that had none."""
    return call.id or f"call_{step_index}_{position}"


def exchanges(
    steps: Sequence[Step],
    before: int,
    memo: dict[int, Exchange | None] | None = None,
    settled: int = 0,
) -> list[Exchange]:
    """The exchanges of the steps before index ``before`` (the model step now
    asking). Tool step ``m + 1 + i`` answers call ``i`` of model step ``m``.

    ``memo``: the exchange (or None: none) each step began, kept for the steps
    whose exchange is made of steps below ``settled`` only, which no longer
    change (harness.engine.transcripts): such a step's exchange is made once
    and then taken from ``memo``."""
    by_index = {s.index: s for s in steps if s.index < before}
    found = []
    for index in sorted(by_index):
        if memo is not None and index in memo:
            exchange = memo[index]
        else:
            exchange, last = _exchange(by_index[index], by_index)
            if memo is not None and last < settled:
                memo[index] = exchange
        if exchange is not None:
            found.append(exchange)
    return found


def _exchange(step: Step, by_index: dict[int, Step]) -> tuple[Exchange | None, int]:
    """The exchange ``step`` begins (None: none), and the index of the last
    step it is made of."""
    if step.kind is StepKind.USER:
        return Exchange(str(step.args.get("text", "")), (), (), user=True), step.index
    if step.kind is not StepKind.MODEL or not isinstance(step.result, dict):
        return None, step.index
    turn = ModelTurn.from_result(step.result)
    invalid = step.result.get("invalid")
    if turn.final is not None and isinstance(invalid, str):
        rejected = Rejected(turn.final, invalid, f"call_{step.index}_final")
        return Exchange(turn.text, (), (), rejected), step.index
    if not turn.tool_calls:
        if turn.final is not None:  # an answer the conversation went on after
            # A structured answer (an object, maybe the final-answer tool's
            # input) goes back as the assistant's text: its JSON, so no
            # tool call is left without a result.
            final = turn.final if isinstance(turn.final, str) else _json(turn.final)
            return Exchange(final, (), ()), step.index
        return None, step.index
    calls, answers = [], []
    for i, call in enumerate(turn.tool_calls):
        identified = ToolCall(
            call.name, call.args, call_id(call, step.index, i), call.raw_arguments
        )
        calls.append(identified)
        answers.append(_answer(identified, by_index.get(step.index + 1 + i)))
    return Exchange(turn.text, tuple(calls), tuple(answers)), step.index + len(calls)


def _answer(call: ToolCall, step: Step | None) -> ToolAnswer:
    assert call.id is not None
    if step is not None and step.status is StepStatus.DONE:
        return ToolAnswer(call.id, call.name, _json(step.result), is_error=False)
    if step is not None and step.status is StepStatus.FAILED:
        return ToolAnswer(call.id, call.name, _json({"error": step.error}), is_error=True)
    status = "missing" if step is None else step.status.value
    return ToolAnswer(call.id, call.name, _json({"error": f"no result ({status})"}), True)


def _json(value: JSON) -> str:
    return json.dumps(value, ensure_ascii=False)


def arguments_json(call: ToolCall) -> str:
    """The call's arguments as the model sent them: verbatim if they were not
    a JSON object, so the model sees its own mistake."""
    return call.raw_arguments if call.raw_arguments is not None else _json(call.args)
