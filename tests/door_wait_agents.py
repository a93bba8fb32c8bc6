"""Agents that wait on the world, for the doors' tests (HARNESS_IMPORTS=
tests.agents,tests.door_wait_agents): a call answered by its callback URL or a
completion, one answered by a signal, a durable sleep, and a parent whose
child waits on an operator's approval (tests.agents' ``approver``)."""

from __future__ import annotations

import harness


@harness.tool(effect="idempotent")
def ship(parcel: str, ctx: harness.ToolContext) -> harness.Deferred:
    """Ask a courier to ship; it calls back on the URL (or an operator completes it)."""
    ctx.callback_url()  # needs HARNESS_CALLBACK_SECRET: the doors' tests set one
    return harness.Deferred(timeout=3600)


@harness.tool(effect="idempotent")
def await_payment() -> harness.Deferred:
    """Wait for the signal ``paid``, for a minute at most."""
    return harness.Deferred(timeout=60, signal="paid")


harness.register_agent(
    harness.Agent(
        name="d-shipper",
        model=harness.ScriptedModel(
            [{"tool_calls": [{"name": "ship", "args": {"parcel": "p1"}}]}, {"final": "shipped"}]
        ),
        tools=[ship],
    )
)
harness.register_agent(
    harness.Agent(
        name="d-payer",
        model=harness.ScriptedModel(
            [{"tool_calls": [{"name": "await_payment", "args": {}}]}, {"final": "paid"}]
        ),
        tools=[await_payment],
    )
)
harness.register_agent(
    harness.Agent(
        name="d-sleeper",
        model=harness.ScriptedModel(
            [{"tool_calls": [{"name": "sleep", "args": {"seconds": 600}}]}, {"final": "rested"}]
        ),
        tools=[harness.sleep_tool(max_seconds=3600)],
    )
)
harness.register_agent(
    harness.Agent(
        name="d-planner",
        model=harness.ScriptedModel(
            [
                {"tool_calls": [{"name": "approver", "args": {"task": "charge three"}}]},
                {"final": "planned"},
            ]
        ),
        tools=[harness.agent_tool("approver")],
    )
)
