"""Provider conformance with the tools of MCP servers: OpenAI and Anthropic,
through their real SDKs on the local wire-format server (tests.wire), offered
the tools of two real MCP servers over stdio, the reference time server from
PyPI (``mcp-server-time``) and tests.mcp_server, and calling them.

Each tool reaches the provider under its own name with the JSON schema and
description its server listed, in the provider's own tool format; the calls
the model asks for are answered in the provider's tool-result format (the
wire server checks it as strictly as the services do); the ledger, written
by the MCP server itself, holds the call under the step's idempotency key.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import harness
from harness.agents import register_agent
from harness.engine.creation import create_run
from harness.records import RunStatus, StepKind, StepStatus
from harness.store.memory import MemoryStore
from harness.toolsets import sessions
from harness.toolsets.mcp import MCPServer
from tests.ledger import Ledger
from tests.rig import Rig
from tests.unit.test_providers import PROVIDERS, model_for
from tests.wire import WireServer

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _closed_sessions() -> Iterator[None]:
    yield
    sessions.close_all()


def servers(ledger: Path) -> list[MCPServer]:
    env = {"PYTHONPATH": str(REPO), "MCP_LEDGER": str(ledger), "MCP_HOLD": f"{ledger}.hold"}
    ours = MCPServer("desk", command=sys.executable, args=["-m", "tests.mcp_server"], env=env)
    time_server = MCPServer(
        "time", command=sys.executable, args=["-m", "mcp_server_time"], prefix="clock"
    )
    return [ours, time_server]


def offered(provider: str, body: dict[str, Any]) -> dict[str, tuple[str, Any]]:
    """The tools of a request: name to (description, JSON schema)."""
    if provider == "openai":
        return {
            t["function"]["name"]: (t["function"]["description"], t["function"]["parameters"])
            for t in body["tools"]
        }
    return {t["name"]: (t["description"], t["input_schema"]) for t in body["tools"]}


@pytest.mark.parametrize("provider", PROVIDERS)
def test_mcp_tools_are_offered_called_and_answered_through_the_sdks(
    provider: str, wire: WireServer, memory_store: MemoryStore, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger.txt"
    tools = servers(ledger)
    register_agent(harness.Agent(name="mcp-bot", model=model_for(provider), tools=tools))
    goal = "the time, the weather and a note"
    wire.script(
        goal,
        [
            {
                "text": "Looking.",
                "tool_calls": [
                    {"name": "clock_get_current_time", "args": {"timezone": "Europe/Oslo"}},
                    {"name": "weather", "args": {"city": "Oslo"}},
                    {"name": "note", "args": {"text": "asked"}},
                ],
            },
            {"text": "It is now in Oslo, 21.5C, noted."},
        ],
    )
    rig = Rig(memory_store)
    run_id = create_run(rig.runtime(), "mcp-bot", goal)
    rig.drive()

    run = rig.load(run_id)
    assert run.status is RunStatus.COMPLETED, run.error
    assert run.result == "It is now in Oslo, 21.5C, noted."
    # Offered as the servers listed them.
    listed = {t.name: t for server in tools for t in server.list_offered()}
    sent = offered(provider, wire.requests[0].body)
    assert {"clock_get_current_time", "clock_convert_time", "weather", "note"} <= set(sent)
    for name in ("clock_get_current_time", "weather", "note"):
        assert sent[name] == (listed[name].description, listed[name].schema), name
    # Called once each, the results kept as the servers answered.
    steps = rig.store.steps(run_id)
    calls = [s for s in steps if s.kind is StepKind.TOOL]
    assert [(s.tool, s.status) for s in calls] == [
        ("clock_get_current_time", StepStatus.DONE),
        ("weather", StepStatus.DONE),
        ("note", StepStatus.DONE),
    ]
    assert calls[0].result["timezone"] == "Europe/Oslo"
    assert calls[1].result == {"city": "Oslo", "celsius": 21.5}
    assert calls[2].result == {"result": "noted: asked"}  # FastMCP structures a str
    assert Ledger.read(ledger).effects(calls[2].idempotency_key) == 1
    # Each billed once: two model turns, two requests.
    assert [wire.billed(goal, turn) for turn in (0, 1)] == [1, 1]
