"""An MCP server of our own for the tests (the SDK's MCPServer, once FastMCP):
every call of a tool that acts is written to the ledger file named by
``MCP_LEDGER`` (tests.ledger's format, under the idempotency key the call
carried in its ``_meta``), so calls are counted from outside the workers and
the server. Run over stdio (``python -m tests.mcp_server``) or streamable
HTTP (``python -m tests.mcp_server --http PORT``).

``MCP_HOLD``: a file; while it exists, a first call of a ``held_*`` tool
waits (after its ``start`` line) so a test can kill a process mid-call. A
call under a key the ledger has seen before does not wait. The tools named
in ``{MCP_LEDGER}.drop`` are not offered by a server started while it exists.
While ``{MCP_LEDGER}.unlisted`` exists, ``tools/list`` answers with an error.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations
from pydantic import BaseModel

from tests.ledger import append

app = MCPServer("ledger")
KEY = "harness/idempotency_key"


class Weather(BaseModel):
    city: str
    celsius: float


def _key(ctx: Context) -> str:
    meta = ctx.request_context.meta or {}
    return str(meta.get(KEY) or "no-key")


def _acted(tool: str, key: str, hold: bool = False) -> None:
    ledger = os.environ["MCP_LEDGER"]
    seen = Path(ledger).exists() and f" {key} " in Path(ledger).read_text()
    append(ledger, "start", key)
    held = Path(os.environ.get("MCP_HOLD", "/nonexistent"))
    while hold and not seen and held.exists():
        time.sleep(0.02)
    append(ledger, "end", key)


@app.tool(annotations=ToolAnnotations(read_only_hint=True))
def weather(city: str) -> Weather:
    """The weather in a city, now."""
    return Weather(city=city, celsius=21.5)


@app.tool(annotations=ToolAnnotations(idempotent_hint=True))
def note(text: str, ctx: Context) -> str:
    """Write a note down (the same key twice: one note)."""
    _acted("note", _key(ctx))
    return f"noted: {text}"


@app.tool()
def send(to: str, ctx: Context) -> str:
    """Send a message (not idempotent: MCP's default)."""
    _acted("send", _key(ctx))
    return f"sent to {to}"


@app.tool(annotations=ToolAnnotations(idempotent_hint=True))
def held_note(text: str, ctx: Context) -> str:
    """As note, but a first call waits while MCP_HOLD exists."""
    _acted("held_note", _key(ctx), hold=True)
    return f"noted: {text}"


@app.tool()
def held_send(to: str, ctx: Context) -> str:
    """As send, but a first call waits while MCP_HOLD exists."""
    _acted("held_send", _key(ctx), hold=True)
    return f"sent to {to}"


@app.tool()
def broken() -> str:
    """Always fails."""
    raise ToolError("the printer is on fire")


@app.tool(annotations=ToolAnnotations(read_only_hint=True))
def authorization(ctx: Context) -> str:
    """The Authorization header the call came with (over HTTP)."""
    return str((ctx.headers or {}).get("authorization"))


@app.tool(annotations=ToolAnnotations(read_only_hint=True))
def pid() -> str:
    """This server's process id."""
    return str(os.getpid())


def _hide_dropped() -> None:
    """The tools named in the file ``{MCP_LEDGER}.drop`` (one a line) are not
    offered by a server started while it exists: a server that dropped them."""
    dropped = Path(os.environ.get("MCP_LEDGER", "/nonexistent") + ".drop")
    if dropped.exists():
        for name in dropped.read_text().split():
            app.remove_tool(name)


def _failing_listing() -> None:
    """While the file ``{MCP_LEDGER}.unlisted`` exists, a listing of the tools
    is answered with an error (the server lives on, and takes calls)."""
    unlisted = Path(os.environ.get("MCP_LEDGER", "/nonexistent") + ".unlisted")
    listed = app.list_tools

    async def list_tools() -> list[Any]:
        if unlisted.exists():
            raise ToolError("listing is broken today")
        return await listed()

    app.list_tools = list_tools  # type: ignore[method-assign]


if __name__ == "__main__":
    _hide_dropped()
    _failing_listing()
    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        app.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        app.run()
