"""The shop's agent, imported by the workers with ``HARNESS_IMPORTS=shop.agents``.

A scripted model, so the example runs without a key: it checks the stock of
an item, then answers.
"""

from __future__ import annotations

import harness


@harness.tool(effect="read_only")
def check_stock(sku: str) -> dict[str, object]:
    """How many of ``sku`` are on the shelf (no side effect)."""
    return {"sku": sku, "in_stock": 12}


harness.register_agent(
    harness.Agent(
        name="shop-assistant",
        model=harness.ScriptedModel(
            [
                {"tool_calls": [{"name": "check_stock", "args": {"sku": "mug"}}]},
                {"final": "12 mugs in stock."},
            ]
        ),
        tools=[check_stock],
        max_steps=6,
    )
)
