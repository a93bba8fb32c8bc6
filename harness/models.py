"""Models: what decides the next turn of an agent.

A model step asks the model for one turn: either a final answer or a list of
tool calls. :class:`ScriptedModel` is deterministic (demos, tests); provider
models implement the same :class:`Model` protocol.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from harness.errors import ModelError
from harness.records import JSON, Step


@dataclass(frozen=True)
class ToolCall:
    name: str
    args: dict[str, JSON] = field(default_factory=dict)


@dataclass(frozen=True)
class ModelTurn:
    """A final answer, or tool calls to make before the next turn."""

    final: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> ModelTurn:
        """``{"final": "text"}`` or ``{"tool_calls": [{"name": ..., "args": {...}}]}``."""
        if not isinstance(raw, Mapping):
            raise ModelError(f"a turn must be a mapping, not {type(raw).__name__}")
        if "final" in raw:
            if not isinstance(raw["final"], str):
                raise ModelError(f"'final' must be text, not {raw['final']!r}")
            if raw.get("tool_calls"):
                raise ModelError("a turn has either 'final' or 'tool_calls', not both")
            return cls(final=raw["final"])
        calls = raw.get("tool_calls")
        if not isinstance(calls, Sequence) or isinstance(calls, str) or not calls:
            raise ModelError(f"a turn needs 'final' or a non-empty 'tool_calls' list: {raw!r}")
        parsed = []
        for call in calls:
            if not isinstance(call, Mapping) or not isinstance(call.get("name"), str):
                raise ModelError(f"a tool call needs a 'name': {call!r}")
            args = call.get("args", {})
            if not isinstance(args, Mapping):
                raise ModelError(f"tool call args must be a mapping: {call!r}")
            parsed.append(ToolCall(call["name"], dict(args)))
        return cls(tool_calls=tuple(parsed))


@dataclass(frozen=True)
class ModelRequest:
    """What a model gets for one turn. ``history()`` reads the steps so far
    from the store; call it only if the model needs the conversation."""

    run_id: str
    goal: str
    turn: int
    step_index: int
    history: Callable[[], list[Step]]


class Model(Protocol):
    def next_turn(self, request: ModelRequest) -> ModelTurn:
        """Decide the next turn. Must not have side effects: it may be re-run."""


class ScriptedModel:
    """Turn *i* answers model step *i*: deterministic, for demos and tests."""

    def __init__(self, turns: Sequence[Mapping[str, Any]]) -> None:
        self.turns = tuple(ModelTurn.parse(t) for t in turns)

    def next_turn(self, request: ModelRequest) -> ModelTurn:
        if request.turn >= len(self.turns):
            raise ModelError(
                f"ScriptedModel has {len(self.turns)} turns; turn {request.turn} was asked for"
            )
        return self.turns[request.turn]
