from __future__ import annotations

from typing import Any

from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    RetryPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo

from harness import api
from harness.engine.runner import run_step
from harness.engine.taskresult import TaskResult

CALLS: list[tuple[str, Any]] = []


def drive(run_id: str, limit: int = 40) -> list[TaskResult]:
    outcomes = []
    for _ in range(limit):
        outcomes.append(run_step(api.runtime(), run_id))
        if outcomes[-1] is not TaskResult.ADVANCED:
            break
    return outcomes


def returns(messages: list[ModelMessage]) -> list[str]:
    last = messages[-1]
    return [str(p.content) for p in last.parts if isinstance(p, ToolReturnPart | RetryPromptPart)]


def turns(script: list[list[tuple[str, dict[str, Any]]]]) -> Any:
    """A model that makes each turn's calls (several per turn), then answers with all returns."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        turn = sum(isinstance(m, ModelResponse) for m in messages)
        seen = [r for m in messages[1:] for r in returns([m])]
        if turn < len(script):
            return ModelResponse(
                parts=[ToolCallPart(n, a, f"c{turn}_{i}") for i, (n, a) in enumerate(script[turn])]
            )
        return ModelResponse(parts=[TextPart(" | ".join(seen))])

    return model
