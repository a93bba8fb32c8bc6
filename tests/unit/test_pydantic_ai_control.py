"""A Pydantic AI agent under the operator's controls, on the embedded store:
approval (the agent's own ``requires_approval`` and the harness's), a rejection
the model is told, ``steps_per_task``, and ``harness show --json``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from pydantic import BaseModel
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    RetryPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

import harness
from harness import api
from harness.cli import main
from harness.engine.runner import run_step
from harness.engine.taskresult import TaskResult
from harness.records import RunStatus, StepStatus

PAID: list[int] = []


@pytest.fixture(autouse=True)
def _embedded(monkeypatch: pytest.MonkeyPatch, sqlite_url: str, tmp_path: Path) -> Iterator[None]:
    monkeypatch.setenv("HARNESS_DATABASE_URL", sqlite_url)
    monkeypatch.setenv("HARNESS_HOME", str(tmp_path / ".harness"))
    api.reset_runtime()
    PAID.clear()
    yield
    api.reset_runtime()


def drive(run_id: str, limit: int = 30) -> list[TaskResult]:
    """Step the run as workers would, until it stops moving."""
    outcomes = []
    for _ in range(limit):
        outcome = run_step(api.runtime(), run_id)
        outcomes.append(outcome)
        if outcome is not TaskResult.ADVANCED:
            break
    return outcomes


def _refund_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Pays twice, then says what it was told about the payments."""
    turn = sum(isinstance(m, ModelResponse) for m in messages)
    if turn == 0:
        return ModelResponse(
            parts=[
                ToolCallPart("pay", {"amount": 10}, "p1"),
                ToolCallPart("pay", {"amount": 20}, "p2"),
            ]
        )
    told = [
        str(part.content) if isinstance(part, ToolReturnPart) else part.model_response()
        for part in messages[-1].parts
        if isinstance(part, ToolReturnPart | RetryPromptPart)
    ]
    return ModelResponse(parts=[TextPart(" | ".join(told))])


def refund_agent(name: str, *, own_approval: bool) -> Agent[None, str]:
    agent = Agent(FunctionModel(_refund_model), name=name)

    @agent.tool_plain(requires_approval=own_approval)
    def pay(amount: int) -> str:
        """Pay a refund."""
        PAID.append(amount)
        return f"paid {amount}"

    return agent


@pytest.mark.parametrize("own", [True, False], ids=["agents-own", "harness-option"])
def test_approval_holds_each_call_and_a_rejection_is_told_to_the_model(own: bool) -> None:
    agent = refund_agent(f"refunds-{own}", own_approval=own)
    harness.register_pydantic_ai(agent, requires_approval=() if own else ["pay"])
    run_id = api.start_run(agent.name or "", "refund both")
    assert drive(run_id)[-1] is TaskResult.WAITING
    steps = api.get_steps(run_id)
    assert [s.status for s in steps[1:3]] == [StepStatus.AWAITING_APPROVAL, StepStatus.PENDING]
    assert steps[1].args == {"amount": 10}
    harness.approve(run_id, by="alice")
    assert drive(run_id)[-1] is TaskResult.WAITING  # the second call, now
    harness.reject(run_id, "too much", by="bob")
    assert drive(run_id)[-1] is TaskResult.COMPLETED
    assert PAID == [10]
    run = api.get_run(run_id)
    assert run.result is not None and run.result.startswith("paid 10 | ")
    assert "rejected by bob: too much" in run.result


class Total(BaseModel):
    total: int


def _sum_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    turn = sum(isinstance(m, ModelResponse) for m in messages)
    if turn < 4:
        return ModelResponse(parts=[ToolCallPart("add", {"n": turn}, f"a{turn}")])
    return ModelResponse(parts=[ToolCallPart(info.output_tools[0].name, {"total": 6}, "out")])


@pytest.mark.parametrize("per_task", [1, 4])
def test_steps_per_task_takes_several_steps_in_one_task(per_task: int) -> None:
    agent: Agent[None, Total] = Agent(FunctionModel(_sum_model), output_type=Total, name="sums")

    @agent.tool_plain
    def add(n: int) -> int:
        return n

    harness.register_pydantic_ai(agent, name=f"sums-{per_task}", steps_per_task=per_task)
    run_id = api.start_run(f"sums-{per_task}", "add up")
    tasks = drive(run_id)
    assert tasks[-1] is TaskResult.COMPLETED
    assert len(api.get_steps(run_id)) == 9  # five model requests, four calls
    assert len(tasks) == (9 if per_task == 1 else 3)


def test_show_json_lists_one_step_per_request_and_call_and_the_result_object() -> None:
    agent: Agent[None, Total] = Agent(FunctionModel(_sum_model), output_type=Total, name="shown")

    @agent.tool_plain
    def add(n: int) -> int:
        return n

    harness.register_pydantic_ai(agent, effects={"add": "read_only"})
    run_id = api.start_run("shown", "add up")
    drive(run_id)
    result = CliRunner().invoke(main, ["show", run_id, "--json"])
    shown: dict[str, Any] = json.loads(result.output)
    assert shown["status"] == RunStatus.COMPLETED.value
    assert shown["result"] == {"total": 6}
    assert [(s["kind"], s.get("tool")) for s in shown["steps"]] == [
        *([("model", None), ("tool", "add")] * 4),
        ("model", None),
    ]
    assert shown["usage"]["input_tokens"] > 0


def test_a_fork_carries_on_from_the_recording_and_a_replay_serves_it() -> None:
    agent: Agent[None, Total] = Agent(FunctionModel(_sum_model), output_type=Total, name="forked")
    made: list[int] = []

    @agent.tool_plain
    def add(n: int) -> int:
        made.append(n)
        return n

    harness.register_pydantic_ai(agent)
    run_id = api.start_run("forked", "add up")
    drive(run_id)
    assert made == [0, 1, 2, 3]
    # From model step 4: the first two calls are copied, never made again.
    fork = api.fork_run(run_id, 4)
    assert drive(fork)[-1] is TaskResult.COMPLETED
    assert made == [0, 1, 2, 3, 2, 3]
    assert api.get_run(fork).result == api.get_run(run_id).result
    replay = api.replay_run(run_id, "forked")
    assert drive(replay)[-1] is TaskResult.COMPLETED
    assert made == [0, 1, 2, 3, 2, 3]  # every call served from the recording
    assert api.get_run(replay).result == api.get_run(run_id).result
