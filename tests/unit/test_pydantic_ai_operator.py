"""An operator's and a user's words to a Pydantic AI run: a message is
refused (its run has its one prompt), edited arguments of an approval are
refused, and an in-doubt call resolved as succeeded carries the run on."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

import harness
from harness import api
from harness.engine import conversation, operations, recovery
from harness.engine.creation import create_run
from harness.engine.operations import Decision, resolve
from harness.engine.runner import run_step
from harness.engine.taskresult import TaskResult
from harness.errors import BadInput, DecisionConflict
from harness.records import RunStatus, StepStatus
from harness.store.memory import MemoryStore
from tests.rig import Rig

PAID: list[int] = []
PROMPTS: list[str] = []


@pytest.fixture
def embedded(monkeypatch: pytest.MonkeyPatch, sqlite_url: str, tmp_path: Path) -> Iterator[None]:
    monkeypatch.setenv("HARNESS_DATABASE_URL", sqlite_url)
    monkeypatch.setenv("HARNESS_HOME", str(tmp_path / ".harness"))
    api.reset_runtime()
    yield
    api.reset_runtime()


@pytest.fixture(autouse=True)
def _clear() -> None:
    PAID.clear()
    PROMPTS.clear()


def drive(run_id: str, limit: int = 30) -> list[TaskResult]:
    outcomes = []
    for _ in range(limit):
        outcome = run_step(api.runtime(), run_id)
        outcomes.append(outcome)
        if outcome is not TaskResult.ADVANCED:
            break
    return outcomes


def _pay_then_tell(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    PROMPTS.extend(
        str(p.content) for m in messages for p in m.parts if isinstance(p, UserPromptPart)
    )
    if not any(isinstance(m, ModelResponse) for m in messages):
        return ModelResponse(parts=[ToolCallPart("pay", {"amount": 10}, "p1")])
    told = [str(p.content) for p in messages[-1].parts if isinstance(p, ToolReturnPart)]
    return ModelResponse(parts=[TextPart("told: " + "|".join(told))])


def _payer(name: str, *, approval: bool = False) -> Agent[None, str]:
    agent = Agent(FunctionModel(_pay_then_tell), name=name)

    @agent.tool_plain(requires_approval=approval)
    def pay(amount: int) -> str:
        PAID.append(amount)
        if len(PAID) == 1 and name.startswith("doubt"):
            raise Crash  # the worker dies mid-call
        return "paid"

    return agent


class Crash(BaseException):
    """The worker dies here (SIGKILL)."""


@pytest.mark.usefixtures("embedded")
def test_a_message_to_a_moving_or_completed_run_is_refused_and_the_run_goes_on() -> None:
    harness.register_pydantic_ai(_payer("messaged"))
    run_id = api.start_run("messaged", "refund")
    run_step(api.runtime(), run_id)  # the model asks for pay
    with pytest.raises(DecisionConflict, match="takes no messages"):
        harness.send_message(run_id, "actually, do not pay")
    assert drive(run_id)[-1] is TaskResult.COMPLETED
    with pytest.raises(DecisionConflict, match="takes no messages"):
        harness.send_message(run_id, "and another thing")
    assert api.get_run(run_id).result == "told: paid"
    assert [s.kind.value for s in api.get_steps(run_id)] == ["model", "tool", "model"]
    assert "actually, do not pay" not in PROMPTS


@pytest.mark.parametrize("sender", ["with-the-agent", "without-it"])
@pytest.mark.usefixtures("embedded")
def test_a_message_during_the_final_turn_does_not_fail_the_run(
    sender: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    said: list[str] = []

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        with monkeypatch.context() as elsewhere:  # the user writes during the final answer
            if sender == "without-it":
                elsewhere.setattr(conversation, "_takes_messages", lambda run: True)
            try:
                said.append(harness.send_message(RUN[0], "and one more thing").outcome)
            except DecisionConflict as err:
                said.append(str(err))
        return ModelResponse(parts=[TextPart("final answer")])

    harness.register_pydantic_ai(Agent(FunctionModel(answer), name=f"final-turn-{sender}"))
    RUN[:] = [api.start_run(f"final-turn-{sender}", "question")]
    assert drive(RUN[0])[-1] is TaskResult.COMPLETED
    assert api.get_run(RUN[0]).result == "final answer"
    assert len(said) == 1
    assert ("takes no messages" in said[0]) == (sender == "with-the-agent")


RUN: list[str] = []


@pytest.mark.usefixtures("embedded")
def test_a_message_kept_by_a_sender_without_the_agent_is_left_untaken(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    harness.register_pydantic_ai(_payer("kept-elsewhere"))
    run_id = api.start_run("kept-elsewhere", "refund")
    run_step(api.runtime(), run_id)  # the model asks for pay
    with monkeypatch.context() as elsewhere:  # a sender that has not the agent's code
        elsewhere.setattr(conversation, "_takes_messages", lambda run: True)
        assert harness.send_message(run_id, "actually, do not pay").outcome == "kept"
    assert drive(run_id)[-1] is TaskResult.COMPLETED
    assert api.get_run(run_id).result == "told: paid"
    assert [s.kind.value for s in api.get_steps(run_id)] == ["model", "tool", "model"]


@pytest.mark.usefixtures("embedded")
def test_approve_with_edited_arguments_is_refused_and_the_call_waits() -> None:
    harness.register_pydantic_ai(_payer("edited", approval=True))
    run_id = api.start_run("edited", "refund")
    assert drive(run_id)[-1] is TaskResult.WAITING
    with pytest.raises(BadInput, match="edited ones are refused"):
        harness.approve(run_id, args={"amount": 1}, by="alice")
    assert api.get_steps(run_id)[1].status is StepStatus.AWAITING_APPROVAL
    harness.approve(run_id, by="alice")
    assert drive(run_id)[-1] is TaskResult.COMPLETED
    assert PAID == [10]


@pytest.mark.usefixtures("embedded")
def test_edited_arguments_approved_where_the_agent_is_unknown_are_not_called(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A CLI without HARNESS_IMPORTS cannot refuse the edit: the worker does,
    rather than call the tool with the model's arguments the operator changed."""
    harness.register_pydantic_ai(_payer("edited-elsewhere", approval=True))
    run_id = api.start_run("edited-elsewhere", "refund")
    assert drive(run_id)[-1] is TaskResult.WAITING
    with monkeypatch.context() as elsewhere:  # an operator's process without the agent
        elsewhere.setattr(operations, "_check_args", lambda *args: None)
        harness.approve(run_id, args={"amount": 1}, by="alice")
    drive(run_id)
    call = api.get_steps(run_id)[1]
    assert call.status is StepStatus.FAILED and "edited arguments" in (call.error or "")
    assert PAID == []


@pytest.mark.parametrize("decision", ["succeeded", "retry"])
def test_an_in_doubt_call_resolved_carries_the_run_on(
    memory_store: MemoryStore, decision: str
) -> None:
    agent = _payer(f"doubt-{decision}")
    harness.register_pydantic_ai(agent, effects={"pay": "at_most_once"})
    rig = Rig(memory_store)
    run_id = create_run(rig.runtime(), agent.name or "", "refund")
    rig.drive(limit=1)
    with pytest.raises(Crash):
        rig.drive(limit=1)
    rig.clock.advance(rig.lease_ttl + 1)
    recovery.sweep(rig.runtime("sweeper"))
    assert rig.drive(worker="w2") == [TaskResult.WAITING]
    assert rig.store.steps(run_id)[1].status is StepStatus.IN_DOUBT
    given = "paid by hand" if decision == "succeeded" else None
    resolve(rig.runtime("operator"), run_id, Decision(decision), given, force=True)
    assert rig.drive(worker="w2")[-1] is TaskResult.COMPLETED
    run = rig.load(run_id)
    assert run.status is RunStatus.COMPLETED
    if decision == "succeeded":  # the operator's result is the tool's return
        assert run.result == "told: paid by hand" and PAID == [10]
    else:
        assert run.result == "told: paid" and PAID == [10, 10]
