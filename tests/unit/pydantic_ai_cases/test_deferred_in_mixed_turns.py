"""Two calls in one model turn where one is deferred (CallDeferred / external tool)."""

from __future__ import annotations

from pydantic_ai import Agent, CallDeferred
from pydantic_ai.models.function import FunctionModel
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets import ExternalToolset

import harness
from harness import api
from harness.records import RunStatus, StepStatus
from tests.unit.pydantic_ai_cases.common import CALLS, drive, turns


def _two_deferred(name: str, second: str) -> Agent[None, str]:
    agent = Agent(
        FunctionModel(turns([[("wire", {"amount": 3}), (second, {"word": "hi"})]])), name=name
    )

    @agent.tool_plain
    def wire(amount: int) -> str:
        CALLS.append(("wire", amount))
        raise CallDeferred(metadata={"timeout": 600})

    @agent.tool_plain
    def shout(word: str) -> str:
        CALLS.append(("shout", word))
        return word.upper()

    @agent.tool_plain
    def wire2(word: str) -> str:
        CALLS.append(("wire2", word))
        raise CallDeferred(metadata={"timeout": 600})

    return agent


def test_a_deferred_call_then_a_plain_call_in_one_turn(kept: str) -> None:
    name = f"defer-then-plain-{kept}"
    harness.register_pydantic_ai(_two_deferred(name, "shout"))
    run_id = api.start_run(name, "go")
    drive(run_id)
    steps = api.get_steps(run_id)
    assert steps[1].status is StepStatus.DEFERRED
    # the plain call must be made once, in its own step
    api.complete_step(run_id, 1, result={"ref": "W"})
    drive(run_id)
    run = api.get_run(run_id)
    assert run.status is RunStatus.COMPLETED, run.error
    assert CALLS == [("wire", 3), ("shout", "hi")]


def test_two_deferred_calls_in_one_turn(kept: str) -> None:
    name = f"two-deferred-{kept}"
    harness.register_pydantic_ai(_two_deferred(name, "wire2"))
    run_id = api.start_run(name, "go")
    drive(run_id)
    steps = api.get_steps(run_id)
    assert [s.status for s in steps[1:3]] == [StepStatus.DEFERRED, StepStatus.DEFERRED], CALLS


def _external_then_plain(name: str) -> Agent[None, str]:
    external = ExternalToolset[None](
        [
            ToolDefinition(
                name="ask_human", parameters_json_schema={"type": "object"}, kind="external"
            )
        ],
        id="humans",
    )
    agent = Agent(
        FunctionModel(turns([[("ask_human", {}), ("shout", {"word": "hi"})]])),
        name=name,
        toolsets=[external],
    )

    @agent.tool_plain
    def shout(word: str) -> str:
        CALLS.append(("shout", word))
        return word.upper()

    return agent


def test_an_external_call_then_a_plain_call_in_one_turn(kept: str) -> None:
    name = f"ext-then-plain-{kept}"
    harness.register_pydantic_ai(_external_then_plain(name))
    run_id = api.start_run(name, "go")
    drive(run_id)
    steps = api.get_steps(run_id)
    assert steps[1].status is StepStatus.DEFERRED, steps[1]
    api.complete_step(run_id, 1, result="yes")
    drive(run_id)
    run = api.get_run(run_id)
    assert run.status is RunStatus.COMPLETED, run.error
    assert CALLS == [("shout", "hi")]
