"""An MCP server built by a dynamic toolset: its calls carry no idempotency key."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from fastmcp.client.transports import StdioTransport
from pydantic_ai import Agent, RunContext
from pydantic_ai.mcp import MCPToolset
from pydantic_ai.models.function import FunctionModel
from pydantic_ai.toolsets import DynamicToolset

import harness
from harness import api
from harness.records import RunStatus
from tests.ledger import Ledger
from tests.unit.pydantic_ai_cases.common import drive, turns

REPO = Path("/work/main")


def test_an_mcp_server_inside_a_dynamic_toolset_gets_the_steps_key(tmp_path: Path) -> None:
    ledger = tmp_path / "mcp.ledger"
    env = {**os.environ, "PYTHONPATH": str(REPO), "MCP_LEDGER": str(ledger)}

    def server(ctx: RunContext[None]) -> Any:
        return MCPToolset(
            StdioTransport(sys.executable, ["-m", "tests.mcp_server"], env=env, cwd=str(REPO)),
            id="inner",
        )

    agent = Agent(
        FunctionModel(turns([[("send", {"to": "ops"})]])),
        name="dyn-mcp",
        toolsets=[DynamicToolset(server, id="dyn", per_run_step=False)],
    )
    harness.register_pydantic_ai(agent)
    run_id = api.start_run("dyn-mcp", "go")
    drive(run_id)
    run = api.get_run(run_id)
    assert run.status is RunStatus.COMPLETED, run.error
    keys = [e.key for e in Ledger.read(ledger).executions]
    steps = api.get_steps(run_id)
    assert keys == [steps[1].idempotency_key]
