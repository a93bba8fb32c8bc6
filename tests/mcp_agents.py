"""Agents whose tools come from MCP servers, for the tests with real workers
(tests/integration/test_mcp_workers.py). Workers import it through
HARNESS_IMPORTS (:data:`IMPORTS`).

Their server is tests.mcp_server over stdio, one per worker process, writing
the external ledger (``HARNESS_TEST_LEDGER``) under each call's idempotency
key; while the file ``{ledger}.hold`` exists its ``held_*`` tools wait, so a
test can SIGKILL a worker or the server mid-call. The desk also has the
reference time server from PyPI (``mcp-server-time``), under a prefix.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import harness

#: HARNESS_IMPORTS for a cluster that carries these agents (and tests/agents.py's).
IMPORTS = "tests.agents,tests.mcp_agents"
REPO = Path(__file__).resolve().parents[1]


def ledger_server() -> harness.MCPServer:
    ledger = os.environ.get("HARNESS_TEST_LEDGER", os.devnull)
    env = {"PYTHONPATH": str(REPO), "MCP_LEDGER": ledger, "MCP_HOLD": ledger + ".hold"}
    return harness.MCPServer(
        "ledger", command=sys.executable, args=["-m", "tests.mcp_server"], env=env
    )


def _calls(*calls: tuple[str, dict[str, object]]) -> list[dict[str, object]]:
    return [
        {"tool_calls": [{"name": name, "args": args} for name, args in calls]},
        {"final": "done"},
    ]


TIME = harness.MCPServer(
    "time", command=sys.executable, args=["-m", "mcp_server_time"], prefix="clock"
)

harness.register_agent(
    harness.Agent(
        "mcp-desk",
        harness.ScriptedModel(
            _calls(
                ("clock_get_current_time", {"timezone": "UTC"}),
                ("weather", {"city": "Oslo"}),
                ("note", {"text": "hello"}),
            )
        ),
        tools=[ledger_server(), TIME],
    )
)
harness.register_agent(
    harness.Agent(
        "mcp-held-note",
        harness.ScriptedModel(_calls(("held_note", {"text": "once"}))),
        tools=[ledger_server()],
        tool_retries=3,
    )
)
harness.register_agent(
    harness.Agent(
        "mcp-held-send",
        harness.ScriptedModel(_calls(("held_send", {"to": "bob"}))),
        tools=[ledger_server()],
    )
)
#: For the chaos suite (tests/chaos/driver.py): the reference time server and
#: our server's read-only weather, neither of which writes the ledger (a stdio
#: server outlives the worker that started it by a moment, so its own ledger
#: lines would not say which executor was killed): the run must complete with
#: every call done whatever is killed.
harness.register_agent(
    harness.Agent(
        "mcp-chaos",
        harness.ScriptedModel(
            _calls(
                ("clock_get_current_time", {"timezone": "Europe/Oslo"}),
                ("weather", {"city": "Oslo"}),
            )
        ),
        tools=[ledger_server(), TIME],
    )
)
