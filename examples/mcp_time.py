"""An agent whose tools come from an MCP server: the reference time server
(``mcp-server-time`` on PyPI, written by the Model Context Protocol's
authors), started by each worker process over stdio. Its two tools are
offered as the server lists them, with its own descriptions and schemas, and
``read_only`` from their annotations. The model is scripted, so it runs with
no key; put a real one in its place (``model="openai:gpt-4.1-mini"``) and it
decides the calls itself. From the repository root::

    pip install -e '.[mcp]' mcp-server-time      # in the clone
    export HARNESS_IMPORTS=examples.mcp_time
    celery -A tasks worker & celery -A tasks beat &
    harness start clock "When is 09:00 in Tokyo in Oslo?" --json
"""

from __future__ import annotations

import sys

import harness

#: ``command`` and ``args`` as MCP's stdio parameters; ``prefix`` would name
#: the tools ``{prefix}_{name}``, ``effects`` would override the annotations.
TIME = harness.MCPServer("time", command=sys.executable, args=["-m", "mcp_server_time"])

harness.register_agent(
    harness.Agent(
        "clock",
        model=harness.ScriptedModel(
            [
                {"tool_calls": [{"name": "get_current_time", "args": {"timezone": "Asia/Tokyo"}}]},
                {
                    "tool_calls": [
                        {
                            "name": "convert_time",
                            "args": {
                                "source_timezone": "Asia/Tokyo",
                                "time": "09:00",
                                "target_timezone": "Europe/Oslo",
                            },
                        }
                    ]
                },
                {"final": "09:00 in Tokyo is 01:00 in Oslo."},
            ]
        ),
        tools=[TIME],
    )
)
