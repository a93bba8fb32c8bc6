"""Waiting on the world without a worker: a signal, and a durable sleep.

``payments``: the tool sends a payment link and returns
``harness.Deferred(signal="paid")``; whatever learns of the payment (a
webhook handler, a script, an operator) sends the signal, and the step
takes it as its result. ``follow-up``: the model asks to wait a day with
``harness.sleep_tool``; the wake-up is a time in the database, so the
sleep holds no worker and survives a restart. From the repository root::

    export HARNESS_IMPORTS=examples.waiting
    celery -A tasks worker & celery -A tasks beat &
    harness start payments "collect payment for order 1234" --json
    harness signal RUN paid --data '{"amount_cents": 4200}' --id pay_8841
    harness start follow-up "check on the ticket tomorrow" --json
"""

from __future__ import annotations

import harness


@harness.tool(effect="idempotent")
def request_payment(order_id: str, amount_cents: int, ctx: harness.ToolContext) -> harness.Deferred:
    """Send the customer a payment link; the answer is the signal ``paid``
    (its data: what was paid), or an error after three days."""
    # A real one creates the payment with ctx.idempotency_key as its key.
    return harness.Deferred(timeout=3 * 24 * 3600, signal="paid")


harness.register_agent(
    harness.Agent(
        name="payments",
        model=harness.ScriptedModel(
            [
                {
                    "tool_calls": [
                        {
                            "name": "request_payment",
                            "args": {"order_id": "1234", "amount_cents": 4200},
                        }
                    ]
                },
                {"final": "Order 1234 is paid."},
            ]
        ),
        tools=[request_payment],
    )
)

harness.register_agent(
    harness.Agent(
        name="follow-up",
        model=harness.ScriptedModel(
            [
                {"tool_calls": [{"name": "sleep", "args": {"seconds": 86400}}]},
                {"final": "A day later: the ticket is closed."},
            ]
        ),
        tools=[harness.sleep_tool(max_seconds=7 * 24 * 3600)],
    )
)
