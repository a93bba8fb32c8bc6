"""Agents and tools for the tests, imported by workers via HARNESS_IMPORTS=tests.agents.

Side effects go to an external ledger file (``HARNESS_TEST_LEDGER``): one
line when a call starts and one when its effect is done, so a test can count
effects and check that no two executions of a step overlapped.
"""

from __future__ import annotations

import os
import time
from typing import Any

import harness
from tests.ledger import append


def _ledger() -> str:
    return os.environ["HARNESS_TEST_LEDGER"]


@harness.tool(effect="idempotent")
def effect(n: int, ctx: harness.ToolContext, seconds: float = 0.0) -> dict[str, Any]:
    """Record a start, wait, then record the effect."""
    append(_ledger(), "start", ctx.idempotency_key)
    time.sleep(seconds)
    append(_ledger(), "end", ctx.idempotency_key)
    return {"n": n, "key": ctx.idempotency_key}


@harness.tool(effect="at_most_once")
def send_email(to: str, ctx: harness.ToolContext, seconds: float = 0.0) -> str:
    append(_ledger(), "start", ctx.idempotency_key)
    time.sleep(seconds)
    append(_ledger(), "end", ctx.idempotency_key)
    return f"sent to {to}"


def chain_turns(count: int, seconds: float) -> list[dict[str, Any]]:
    """A model that asks for ``count`` effects one after another, then answers."""
    turns: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "effect", "args": {"n": i, "seconds": seconds}}]}
        for i in range(count)
    ]
    return [*turns, {"final": f"{count} effects done"}]


for name, count, seconds in (
    ("chain", 3, 0.0),
    ("slow-chain", 3, 2.0),
    ("long-chain", 8, 0.05),
    ("stall", 1, 20.0),  # one long tool call: keeps a worker slot busy
    ("queued", 1, 0.25),  # one short call: a backlog of them outlasts the lease TTL
):
    harness.register_agent(
        harness.Agent(
            name=name,
            model=harness.ScriptedModel(chain_turns(count, seconds)),
            tools=[effect],
            max_steps=100,
        )
    )

harness.register_agent(
    harness.Agent(
        name="mailer",
        model=harness.ScriptedModel(
            [
                {
                    "tool_calls": [
                        {"name": "send_email", "args": {"to": "a@example.com", "seconds": 2.0}}
                    ]
                },
                {"final": "mailed"},
            ]
        ),
        tools=[send_email],
    )
)

harness.register_agent(
    harness.Agent(
        name="chaos",
        model=harness.ScriptedModel(chain_turns(6, 0.5)),
        tools=[effect],
        max_steps=100,
        max_attempts=20,  # random kills may hit one step several times
    )
)


@harness.tool(effect="read_only")
def lookup(ctx: harness.ToolContext, seconds: float = 0.0) -> str:
    """A read that takes its time: safe to run twice, so it goes straight through."""
    append(_ledger(), "start", ctx.idempotency_key)
    time.sleep(seconds)
    append(_ledger(), "end", ctx.idempotency_key)
    return "looked up"


harness.register_agent(
    harness.Agent(
        name="slow-read",
        model=harness.ScriptedModel(
            [{"tool_calls": [{"name": "lookup", "args": {"seconds": 5.0}}]}, {"final": "read"}]
        ),
        tools=[lookup],
    )
)


@harness.tool(effect="idempotent", requires_approval=True)
def charge(amount: int, ctx: harness.ToolContext) -> dict[str, Any]:
    """Charge a card: an operator approves each call first."""
    append(_ledger(), "start", ctx.idempotency_key)
    append(_ledger(), "end", ctx.idempotency_key)
    return {"charged": amount, "key": ctx.idempotency_key}


harness.register_agent(
    harness.Agent(
        name="approver",
        model=harness.ScriptedModel(
            [
                {
                    "tool_calls": [
                        {"name": "charge", "args": {"amount": 10}},
                        {"name": "charge", "args": {"amount": 20}},
                        {"name": "charge", "args": {"amount": 30}},
                    ]
                },
                {"final": "charged"},
            ]
        ),
        tools=[charge],
    )
)


# A support desk for the replay tests: the goal "order N" decides every call,
# so each recorded run is different and a second version of the agent can
# follow some recordings and leave others.
@harness.tool(effect="read_only")
def find(order: int, ctx: harness.ToolContext) -> dict[str, Any]:
    append(_ledger(), "start", ctx.idempotency_key)
    append(_ledger(), "end", ctx.idempotency_key)
    return {"order": order, "status": "delivered", "key": ctx.idempotency_key}


class DeskModel:
    """Version 1 looks the order up, refunds it (``effect``, idempotent) and
    mails the customer (``send_email``, at_most_once), then answers.

    Version 2 differs by the order number N: N % 4 == 0 answers in other
    words; N % 4 == 1 refunds another amount (an idempotent call off the
    recording); N % 4 == 2 looks up another order (a read_only call off the
    recording); N % 4 == 3 does exactly what version 1 did. It also says more:
    10 more input tokens a turn."""

    records_responses = False

    def __init__(self, version: int) -> None:
        self.version = version
        self.name = f"desk-{version}"

    def next_turn(self, request: harness.ModelRequest) -> harness.ModelTurn:
        n = int(request.goal.rsplit(" ", 1)[-1])
        v2 = self.version == 2
        usage = harness.Usage(100 + 10 * v2, 20)
        if request.turn == 0:
            order = n + 1 if v2 and n % 4 == 2 else n
            return harness.ModelTurn(
                tool_calls=(harness.ToolCall("find", {"order": order}),),
                text=f"Let me look up order {order}.",
                usage=usage,
            )
        if request.turn == 1:
            amount = n + 1000 if v2 and n % 4 == 1 else n
            return harness.ModelTurn(
                tool_calls=(
                    harness.ToolCall("effect", {"n": amount}),
                    harness.ToolCall("send_email", {"to": f"customer{n}@example.com"}),
                ),
                text=f"Order {n} was delivered. Refunding {amount}.",
                usage=usage,
            )
        final = f"Order {n}: refunded." if v2 and n % 4 == 0 else f"order {n} refunded"
        return harness.ModelTurn(final=final, usage=usage)


for version in (1, 2):
    harness.register_agent(
        harness.Agent(
            name="desk" if version == 1 else "desk-v2",
            model=DeskModel(version),
            tools=[find, effect, send_email],
        )
    )
