"""Approval-gated calls beside plain calls in one model turn."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic_ai import Agent, ApprovalRequired, RunContext
from pydantic_ai.models.function import FunctionModel

import harness
from harness import api
from harness.records import RunStatus, StepStatus
from tests.unit.pydantic_ai_cases.common import CALLS, drive, turns


def _static(name: str) -> Agent[None, str]:
    agent = Agent(
        FunctionModel(turns([[("pay", {"amount": 5}), ("shout", {"word": "hi"})]])), name=name
    )

    @agent.tool_plain(requires_approval=True)
    def pay(amount: int) -> str:
        CALLS.append(("pay", amount))
        return "paid"

    @agent.tool_plain
    def shout(word: str) -> str:
        CALLS.append(("shout", word))
        return word.upper()

    return agent


def _self_asking(name: str) -> Agent[None, str]:
    agent = Agent(
        FunctionModel(turns([[("pay", {"amount": 5}), ("shout", {"word": "hi"})]])), name=name
    )

    @agent.tool
    def pay(ctx: RunContext[None], amount: int) -> str:
        if not ctx.tool_call_approved:
            raise ApprovalRequired
        CALLS.append(("pay", amount))
        return "paid"

    @agent.tool_plain
    def shout(word: str) -> str:
        CALLS.append(("shout", word))
        return word.upper()

    return agent


@pytest.mark.parametrize("make", [_static, _self_asking], ids=["static", "raises"])
def test_an_approved_call_beside_a_plain_call(kept: str, make: Any) -> None:
    name = f"{make.__name__}-{kept}"
    harness.register_pydantic_ai(make(name), requires_approval=["pay"])
    run_id = api.start_run(name, "go")
    drive(run_id)
    assert api.get_steps(run_id)[1].status is StepStatus.AWAITING_APPROVAL
    harness.approve(run_id, by="alice")
    drive(run_id)
    run = api.get_run(run_id)
    assert CALLS == [("pay", 5), ("shout", "hi")]
    assert run.status is RunStatus.COMPLETED, run.error
