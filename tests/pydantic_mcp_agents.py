"""Pydantic AI agents with an MCP server of their own (Pydantic AI's
MCPToolset over stdio: tests.mcp_server, writing the ledger under the key
each call carries in its ``_meta``), for the worker tests that kill a call
mid-way; imported by workers through HARNESS_IMPORTS. Apart from
tests/pydantic_agents.py: fastmcp costs a worker 1.5 s to import."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from fastmcp.client.transports import StdioTransport
from pydantic_ai import Agent
from pydantic_ai.mcp import MCPToolset
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

import harness

REPO = Path(__file__).resolve().parents[1]


def _calls(tool: str) -> FunctionModel:
    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if not any(isinstance(m, ModelResponse) for m in messages):
            return ModelResponse(parts=[ToolCallPart(tool, {"text": "once", "to": "ops"}, "h1")])
        return ModelResponse(parts=[TextPart("done")])

    return FunctionModel(model)


def _server() -> MCPToolset[None]:
    """tests.mcp_server over stdio, through Pydantic AI's own MCPToolset: it
    writes the ledger under the key each call carries in its ``_meta``."""
    ledger = os.environ.get("HARNESS_TEST_LEDGER", os.devnull)
    env = {"PYTHONPATH": str(REPO), "MCP_LEDGER": ledger, "MCP_HOLD": ledger + ".hold"}
    transport = StdioTransport(sys.executable, ["-m", "tests.mcp_server"], env=env)
    return MCPToolset(transport, id="ledger", init_timeout=60)  # a busy machine starts it slowly


harness.register_pydantic_ai(Agent(_calls("held_note"), name="pai-mcp-note", toolsets=[_server()]))
harness.register_pydantic_ai(Agent(_calls("held_send"), name="pai-mcp-send", toolsets=[_server()]))
