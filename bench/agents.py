"""Agents for the benchmarks (HARNESS_IMPORTS=bench.agents)."""

from __future__ import annotations

import os
import time

import harness


@harness.tool(effect="idempotent")
def slow_call(seconds: float, ctx: harness.ToolContext) -> str:
    """Log the call's start (key, pid, time) to BENCH_LEDGER, then wait."""
    line = f"{ctx.idempotency_key} {os.getpid()} {time.time():.6f}\n".encode()
    fd = os.open(os.environ["BENCH_LEDGER"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
    time.sleep(seconds)
    return "ok"


harness.register_agent(
    harness.Agent(
        name="bench-slow-tool",
        model=harness.ScriptedModel(
            [
                {"tool_calls": [{"name": "slow_call", "args": {"seconds": 3.0}}]},
                {"final": "done"},
            ]
        ),
        tools=[slow_call],
    )
)
