"""An MCP server whose listing fails for a moment in the middle of a run."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from fastmcp.client.transports import StdioTransport
from pydantic_ai import Agent
from pydantic_ai.mcp import MCPToolset
from pydantic_ai.models.function import FunctionModel

import harness
from harness import api
from harness.pydantic_agents import live
from harness.records import RunStatus
from tests.unit.pydantic_ai_cases.common import CALLS, drive, turns

REPO = Path("/work/main")


def test_a_moment_of_mcp_outage_is_waited_out(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(live, "KEPT", 0)  # each step re-runs (another worker took the last one)
    ledger = tmp_path / "mcp.ledger"
    env = {**os.environ, "PYTHONPATH": str(REPO), "MCP_LEDGER": str(ledger)}
    server = MCPToolset(
        StdioTransport(sys.executable, ["-m", "tests.mcp_server"], env=env, cwd=str(REPO)),
        id="ledger",
    )
    agent = Agent(
        FunctionModel(turns([[("shout", {"word": "hi"})]])), name="outage", toolsets=[server]
    )

    @agent.tool_plain
    def shout(word: str) -> str:
        CALLS.append(("shout", word))
        return word.upper()

    harness.register_pydantic_ai(agent)
    run_id = api.start_run("outage", "go")
    drive(run_id, limit=2)  # the first model step (tools listed, recorded), the call
    Path(str(ledger) + ".unlisted").touch()  # the server's tools/list fails for now
    drive(run_id, limit=1)
    run = api.get_run(run_id)
    assert run.status is not RunStatus.FAILED, run.error  # a server outage should be waited out
