"""A call the run's record says waits for an operator, claimed on a message's
hint: the receiving worker reads the tool from its registry (Late), not the record."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.models.function import FunctionModel
from pydantic_ai.toolsets import FunctionToolset

import harness
from harness import api
from harness.engine import runner
from harness.engine.runner import run_step
from harness.engine.taskresult import TaskResult
from harness.records import StepStatus
from tests.unit.pydantic_ai_cases.common import CALLS, turns


def test_a_claim_on_a_hint_keeps_a_recorded_approval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tools = FunctionToolset[None](id="ops")

    @tools.tool_plain
    def look(word: str) -> str:
        CALLS.append(("look", word))
        return word

    @tools.tool_plain(requires_approval=True)  # Pydantic AI's own word: every call waits
    def pay(amount: int) -> str:
        CALLS.append(("pay", amount))
        return "paid"

    model = FunctionModel(turns([[("x_look", {"word": "a"}), ("x_pay", {"amount": 5})]]))
    agent = Agent(model, name="hinted", toolsets=[tools.prefixed("x")])
    harness.register_pydantic_ai(agent, effects={"x_look": "idempotent", "x_pay": "idempotent"})
    sent: list[Any] = []
    monkeypatch.setattr(
        runner,
        "dispatch",
        lambda rt, run_id, cursor, delay=0.0, hint=None: sent.append((cursor, hint)),
    )
    run_id = api.start_run("hinted", "go")
    assert run_step(api.runtime(), run_id) is TaskResult.ADVANCED  # the model step: tools recorded
    cursor, hint = sent[-1]
    # the call of x_look, claimed on its hint; its checkpoint sends step 2's hint
    assert run_step(api.runtime(), run_id, cursor, hint) is TaskResult.ADVANCED
    cursor, hint = sent[-1]
    assert run_step(api.runtime(), run_id, cursor, hint) is TaskResult.WAITING
    steps = api.get_steps(run_id)
    assert steps[2].status is StepStatus.AWAITING_APPROVAL, steps[2]
