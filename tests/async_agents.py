"""``async def`` tools and an ``async def`` model for the worker tests, imported
by workers via HARNESS_IMPORTS=tests.agents,tests.async_agents.

Effects go to the ledger (``HARNESS_TEST_LEDGER``) like tests.agents'; each
call also notes, in ``<ledger>.notes``, the process, thread and event loop it
ran on, and a cancelled call notes that its ``finally`` ran.
"""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any

import harness
from harness.models import ModelRequest, ModelTurn
from tests.ledger import append


def _ledger() -> str:
    return os.environ["HARNESS_TEST_LEDGER"]


def note(kind: str, key: str) -> None:
    """``<kind> <key>:<thread>:<loop id> <pid> <time>`` in the notes file."""
    where = f"{threading.get_ident()}:{id(asyncio.get_running_loop())}"
    append(_ledger() + ".notes", kind, f"{key}:{where}")


@harness.tool(effect="idempotent")
async def async_effect(n: int, ctx: harness.ToolContext, seconds: float = 0.0) -> dict[str, Any]:
    """Record a start, await, then record the effect."""
    append(_ledger(), "start", ctx.idempotency_key)
    note("tool", ctx.idempotency_key)
    await asyncio.sleep(seconds)
    append(_ledger(), "end", ctx.idempotency_key)
    return {"n": n}


@harness.tool(effect="at_most_once")
async def async_send(to: str, ctx: harness.ToolContext, seconds: float = 0.0) -> str:
    append(_ledger(), "start", ctx.idempotency_key)
    await asyncio.sleep(seconds)
    append(_ledger(), "end", ctx.idempotency_key)
    return f"sent to {to}"


@harness.tool(effect="idempotent")
async def async_stall(ctx: harness.ToolContext) -> str:
    """The first attempt outlasts the step's time limit; the next one is quick."""
    append(_ledger(), "start", ctx.idempotency_key)
    try:
        if ctx.attempt == 1:
            await asyncio.sleep(120)
        append(_ledger(), "end", ctx.idempotency_key)
        return f"done on attempt {ctx.attempt}"
    finally:
        note("finally", ctx.idempotency_key)


class AsyncScriptedModel:
    """ScriptedModel's turns, from an ``async def next_turn``; its responses are
    recorded like a provider's (``records_responses`` left at its default)."""

    def __init__(self, turns: list[dict[str, Any]]) -> None:
        self.script = harness.ScriptedModel(turns)

    async def next_turn(self, request: ModelRequest) -> ModelTurn:
        note("model", f"{request.run_id}:{request.step_index}")
        await asyncio.sleep(0.01)
        return self.script.next_turn(request)


def _one_call(tool: str, args: dict[str, Any], final: str) -> AsyncScriptedModel:
    return AsyncScriptedModel([{"tool_calls": [{"name": tool, "args": args}]}, {"final": final}])


harness.register_agent(
    harness.Agent(
        name="async-chain",
        model=AsyncScriptedModel(
            [
                *({"tool_calls": [{"name": "async_effect", "args": {"n": i}}]} for i in range(3)),
                {"final": "3 async effects done"},
            ]
        ),
        tools=[async_effect],
    )
)
harness.register_agent(
    harness.Agent(
        name="async-slow",
        model=_one_call("async_effect", {"n": 1, "seconds": 3.0}, "effect done"),
        tools=[async_effect],
    )
)
harness.register_agent(
    harness.Agent(
        name="async-mailer",
        model=_one_call("async_send", {"to": "a@example.com", "seconds": 3.0}, "mailed"),
        tools=[async_send],
    )
)
harness.register_agent(
    harness.Agent(
        name="async-stall",
        model=_one_call("async_stall", {}, "stalled once"),
        tools=[async_stall],
    )
)
