"""A conversation: an assistant that asks back, then answers the user's
next message (`harness send`). Its model is scripted, so it runs offline;
with a provider (`model="openai:gpt-4.1-mini"`) the same agent holds a real
conversation, each turn sent the whole of it.

    HARNESS_IMPORTS=examples.chat celery -A tasks worker
    harness start trip-planner "Plan me a weekend away" --wait
    harness send RUN "Somewhere cold, by the sea"
"""

import harness

harness.register_agent(
    harness.Agent(
        name="trip-planner",
        model=harness.ScriptedModel(
            [
                {"final": "Gladly. Somewhere warm, or somewhere cold?"},
                {"final": "Then Tromsø: fjords, the northern lights, fish soup by the harbour."},
            ]
        ),
        tools=[],
    )
)
