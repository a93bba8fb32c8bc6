"""The demo agent, ``support-bot``: look up an order, refund it, answer.

Import it with ``HARNESS_IMPORTS=harness.examples``. The refund has a real
side effect: a line appended to ``$HARNESS_HOME/ledger.txt`` (a stand-in for
a payment provider), after a deliberate pause that leaves time to kill the
worker mid-call. Every invocation is also logged to ``attempts.txt``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import harness
from harness import compose

REFUND_SECONDS = 2.5


def _home() -> Path:
    home = compose.settings().home
    home.mkdir(parents=True, exist_ok=True)
    return home


def _append(name: str, line: str) -> None:
    with open(_home() / name, "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


@harness.tool(effect="read_only")
def lookup_order(order_id: str) -> dict[str, object]:
    """Fetch an order (no side effect)."""
    return {"order_id": order_id, "amount_cents": 4200, "status": "delivered"}


@harness.tool(effect="idempotent")
def issue_refund(order_id: str, amount_cents: int, ctx: harness.ToolContext) -> dict[str, object]:
    """Refund an order. The idempotency key goes to the provider with the request."""
    _append("attempts.txt", f"{ctx.idempotency_key} attempt={ctx.attempt} pid={os.getpid()}")
    time.sleep(REFUND_SECONDS)  # the provider is slow: a window to crash in
    entry = {"key": ctx.idempotency_key, "order_id": order_id, "amount_cents": amount_cents}
    _append("ledger.txt", json.dumps(entry))
    return {"refunded": amount_cents, "order_id": order_id}


support_bot = harness.register_agent(
    harness.Agent(
        name="support-bot",
        model=harness.ScriptedModel(
            [
                {"tool_calls": [{"name": "lookup_order", "args": {"order_id": "1234"}}]},
                {
                    "tool_calls": [
                        {"name": "issue_refund", "args": {"order_id": "1234", "amount_cents": 4200}}
                    ]
                },
                {"final": "Refunded 42.00 for order 1234."},
            ]
        ),
        tools=[lookup_order, issue_refund],
        max_steps=10,
    )
)
