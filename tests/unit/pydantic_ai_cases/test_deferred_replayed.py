"""A replay of a run whose deferred call was answered."""

from __future__ import annotations

import pytest
from pydantic_ai import Agent, CallDeferred
from pydantic_ai.models.function import FunctionModel

import harness
from harness import api
from harness.records import RunStatus, StepStatus
from tests.unit.pydantic_ai_cases.common import CALLS, drive, turns


def _agent(name: str) -> Agent[None, str]:
    agent = Agent(FunctionModel(turns([[("wire", {"amount": 3})]])), name=name)

    @agent.tool_plain
    def wire(amount: int) -> str:
        CALLS.append(("wire", amount))
        raise CallDeferred(metadata={"timeout": 600})

    return agent


def _run(name: str, **answer: object) -> str:
    harness.register_pydantic_ai(_agent(name))
    run_id = api.start_run(name, "go")
    drive(run_id)
    assert api.get_steps(run_id)[1].status is StepStatus.DEFERRED
    api.complete_step(run_id, 1, **answer)
    drive(run_id)
    assert api.get_run(run_id).status is RunStatus.COMPLETED, api.get_run(run_id).error
    return run_id


@pytest.mark.parametrize(
    ("name", "answer"),
    [
        ("defer-err", {"error": "nobody answered"}),
        ("defer-kind", {"result": {"kind": "wire", "id": 7}}),  # not Pydantic AI's own record
    ],
    ids=["an error", "an object that has a kind"],
)
def test_replay_of_a_deferred_call_answered_with(name: str, answer: dict[str, object]) -> None:
    run_id = _run(name, **answer)
    replay = api.replay_run(run_id, name)
    drive(replay)
    got = api.get_run(replay)
    assert got.status is RunStatus.COMPLETED, got.error
    assert got.result == api.get_run(run_id).result


def test_fork_after_an_answered_deferred_call() -> None:
    run_id = _run("defer-fork", error="nobody answered")
    fork = api.fork_run(run_id, 2)
    drive(fork)
    got = api.get_run(fork)
    assert got.status is RunStatus.COMPLETED, got.error
    assert got.result == api.get_run(run_id).result
    assert CALLS == [("wire", 3)]
