"""Human in the loop: a refund needs an operator's approval before each call.

Offline (a scripted model), from the repository root (``examples`` is not
installed with the package; ``.venv/bin`` on the PATH)::

    export HARNESS_IMPORTS=examples.approvals
    celery -A tasks worker & celery -A tasks beat &
    harness start refunds "refund orders 1234 and 5678" --json
    harness show RUN                          # step 1 awaiting_approval, with its arguments
    harness approve RUN --step 2 --args '{"order_id": "5678", "amount_cents": 1000}'
    harness approve RUN                       # the call the run waits on
"""

from __future__ import annotations

import harness


@harness.tool(effect="idempotent", requires_approval=True)
def refund(order_id: str, amount_cents: int, ctx: harness.ToolContext) -> dict[str, object]:
    """Refund an order (a real one passes ctx.idempotency_key to the payment provider)."""
    return {"order_id": order_id, "refunded_cents": amount_cents, "key": ctx.idempotency_key}


harness.register_agent(
    harness.Agent(
        name="refunds",
        model=harness.ScriptedModel(
            [
                {
                    "tool_calls": [
                        {"name": "refund", "args": {"order_id": "1234", "amount_cents": 4200}},
                        {"name": "refund", "args": {"order_id": "5678", "amount_cents": 9900}},
                    ]
                },
                {"final": "Both refunds are through."},
            ]
        ),
        tools=[refund],
    )
)
