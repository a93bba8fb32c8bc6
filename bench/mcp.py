"""``python -m bench.mcp``: what a call of an MCP tool costs (issue 25).

The same tool, a weather lookup that returns a small object, three ways in
this process: a function tool (the baseline), the tool of an MCP server over
stdio (tests.mcp_server, one process started once), and over streamable
HTTP (the same server, run as a separate process). Each is called CALLS
times through ``ToolSpec.invoke`` (what a tool step does between its
checkpoints); the median and the ratio to the baseline are printed. Then a
run of STEPS tool steps (and STEPS + 1 model turns) carried by the real
engine on SQLite (tests.rig's runtime: no broker), with the function tool
and with the stdio server's, per step.

A measurement, not a test: it prints the figures and ratios.

    python -m bench.mcp [--calls 500] [--steps 50]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import create_engine

import harness
from harness.engine.creation import create_run
from harness.records import RunStatus
from harness.store.migrate import upgrade
from harness.store.sql import SQLStore
from harness.tools import ToolContext, ToolSpec
from harness.toolsets import sessions
from tests.rig import Rig

REPO = Path(__file__).resolve().parents[1]


@harness.tool(effect="read_only")
def weather(city: str) -> dict[str, object]:
    """The weather in a city, now."""
    return {"city": city, "celsius": 21.5}


def _median_ms(call: Callable[[], object], times: int) -> float:
    took = []
    for _ in range(times):
        began = time.perf_counter()
        call()
        took.append(time.perf_counter() - began)
    return statistics.median(took) * 1000


def _spec(server: harness.MCPServer) -> ToolSpec:
    (found,) = [t for t in server.bind(server.list_offered()) if t.name == "weather"]
    return found


def _calls(spec: ToolSpec, times: int) -> float:
    ctx = ToolContext("bench", 1, 1)
    args = spec.validate({"city": "Oslo"})
    spec.invoke(args, ctx)  # started, connected
    return _median_ms(lambda: spec.invoke(args, ctx), times)


def _run_ms_per_step(tool: ToolSpec | harness.MCPServer, steps: int, name: str) -> float:
    turns: list[dict[str, object]] = [
        {"tool_calls": [{"name": "weather", "args": {"city": f"c{i}"}}]} for i in range(steps)
    ]
    harness.register_agent(
        harness.Agent(
            name,
            harness.ScriptedModel([*turns, {"final": "done"}]),
            tools=[tool],
            max_steps=4 * steps,
        )
    )
    with tempfile.TemporaryDirectory() as home:
        url = f"sqlite:///{home}/bench.db"
        upgrade(create_engine(url))
        store = SQLStore.from_url(url)
        rig = Rig(store)
        began = time.perf_counter()
        run_id = create_run(rig.runtime(), name, "go")
        rig.drive(limit=10 * steps)
        took = time.perf_counter() - began
        assert rig.load(run_id).status is RunStatus.COMPLETED
        store.close()
    return took / steps * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--steps", type=int, default=50)
    options = parser.parse_args()
    ledger = tempfile.NamedTemporaryFile(delete=False).name  # noqa: SIM115
    env = {"PYTHONPATH": str(REPO), "MCP_LEDGER": ledger}
    stdio = harness.MCPServer("s", command=sys.executable, args=["-m", "tests.mcp_server"], env=env)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    http_proc = subprocess.Popen(
        [sys.executable, "-m", "tests.mcp_server", "--http", str(port)],
        env=os.environ | env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        http = harness.MCPServer("h", url=f"http://127.0.0.1:{port}/mcp")
        for _ in range(100):
            try:
                http.list_offered()
                break
            except harness.HarnessError:
                time.sleep(0.1)
        base = _calls(weather, options.calls)
        print(f"calls ({options.calls}, median)   ms/call   ratio")
        print(f"function tool               {base:8.3f}   1.0x")
        for label, server in (("MCP over stdio", stdio), ("MCP over streamable HTTP", http)):
            ms = _calls(_spec(server), options.calls)
            print(f"{label:<27} {ms:8.3f}   {ms / base:.0f}x")
        plain = _run_ms_per_step(weather, options.steps, "bench-plain")
        mcp = _run_ms_per_step(stdio, options.steps, "bench-mcp")
        print(
            f"\na run of {options.steps} tool steps (engine in process, SQLite)   ms/step   ratio"
        )
        print(f"function tool                                         {plain:8.2f}   1.00x")
        print(
            f"MCP over stdio                                        {mcp:8.2f}   {mcp / plain:.2f}x"
        )
    finally:
        sessions.close_all()
        http_proc.kill()
        http_proc.wait()
        os.unlink(ledger)


if __name__ == "__main__":
    main()
