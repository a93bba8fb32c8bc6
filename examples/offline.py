"""The weather agent of ``examples/weather.py`` on a scripted model: no key,
no network, the same tool and the same durable steps. From the repository
root (``examples`` is not installed with the package)::

    export HARNESS_IMPORTS=examples.offline
    celery -A tasks worker & celery -A tasks beat &
    harness start weather-offline "What should I wear in Oslo and in Lisbon today?" --json
"""

from __future__ import annotations

import harness
from examples.weather_tools import current_weather

harness.register_agent(
    harness.Agent(
        name="weather-offline",
        model=harness.ScriptedModel(
            [
                {
                    "tool_calls": [
                        {"name": "current_weather", "args": {"city": "Oslo"}},
                        {"name": "current_weather", "args": {"city": "Lisbon"}},
                    ]
                },
                {"final": "Oslo: a winter coat and boots (-3 C, snow). Lisbon: a light jacket."},
            ]
        ),
        tools=[current_weather],
        max_steps=12,
    )
)
