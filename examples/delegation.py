"""Two agents: a planner that delegates to a researcher.

``harness.agent_tool("researcher")`` is a tool whose call starts a run of
the researcher (its goal: the model's ``task`` argument) under the id
``{planner_run}:{step}``, and waits, holding no worker, until that run
ends: its final answer is the tool's result. Two calls in one turn are two
children running in parallel. From the repository root::

    export HARNESS_IMPORTS=examples.delegation
    celery -A tasks worker & celery -A tasks beat &
    harness start planner "plan a weekend in Lisbon" --json
    harness show RUN --json                     # children: [{"run_id": "RUN:1", ...}, ...]
"""

from __future__ import annotations

import harness

harness.register_agent(
    harness.Agent(
        name="researcher",
        model=harness.ScriptedModel([{"final": "Tram 28, Belem, and a pastel de nata."}]),
        tools=[],
        max_steps=10,
    )
)

harness.register_agent(
    harness.Agent(
        name="planner",
        model=harness.ScriptedModel(
            [
                {
                    "tool_calls": [
                        {"name": "researcher", "args": {"task": "what to see in Lisbon"}},
                        {"name": "researcher", "args": {"task": "where to eat in Lisbon"}},
                    ]
                },
                {"final": "Saturday: tram 28 and Belem. Sunday: pastries."},
            ]
        ),
        tools=[
            harness.agent_tool(
                "researcher", description="Research one question and answer it in a paragraph."
            )
        ],
        max_tokens=200_000,  # the children's usage counts against it
    )
)
