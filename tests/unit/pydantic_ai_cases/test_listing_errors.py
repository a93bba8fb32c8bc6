"""The agent's own code fails deterministically while its tools are listed."""

from __future__ import annotations

from pydantic_ai import Agent, RunContext
from pydantic_ai.models.function import FunctionModel
from pydantic_ai.toolsets import DynamicToolset, FunctionToolset

import harness
from harness import api
from harness.engine.runner import run_step
from harness.engine.taskresult import TaskResult
from tests.unit.pydantic_ai_cases.common import turns


def test_a_bug_in_the_agents_listing_code_fails_the_run() -> None:
    def broken(ctx: RunContext[None]) -> FunctionToolset[None]:
        raise KeyError("tenant")  # the agent's own bug: every worker, every time

    agent = Agent(
        FunctionModel(turns([])), name="broken-listing", toolsets=[DynamicToolset(broken, id="b")]
    )
    harness.register_pydantic_ai(agent)
    run_id = api.start_run("broken-listing", "go")
    assert run_step(api.runtime(), run_id) is TaskResult.FAILED
    run = api.get_run(run_id)
    assert run.status.value == "failed", (run.status, run.blocked)
