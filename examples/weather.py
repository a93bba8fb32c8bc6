"""An agent on a real model: what to wear, from the weather in each city.

Needs a provider: OpenAI (or any server that speaks its API) or Anthropic,
configured by the SDK's own variables. Pick the model with WEATHER_MODEL. From
the repository root (``examples`` is not installed with the package)::

    pip install -e '.[openai]'                        # in the clone, or [anthropic]
    export OPENAI_API_KEY=sk-...                      # or OPENAI_BASE_URL=http://localhost:11434/v1
    export WEATHER_MODEL=openai:gpt-4.1-mini          # or anthropic:claude-sonnet-4-5
    export HARNESS_IMPORTS=examples.weather
    celery -A tasks worker & celery -A tasks beat &
    harness start weather "What should I wear in Oslo and in Lisbon today?" --json

``examples/offline.py`` is the same agent on a scripted model, with no key;
``python -m tests.wire --script examples/weather_wire.json`` serves this one a
scripted conversation over the OpenAI wire format (README, "Real models").
"""

from __future__ import annotations

import os

import harness
from examples.weather_tools import current_weather
from harness.providers import model_from_name

MODEL = os.environ.get("WEATHER_MODEL", "openai:gpt-4.1-mini")
SYSTEM = "Answer in two sentences. Look the weather up; never guess it."

harness.register_agent(
    harness.Agent(
        name="weather",
        model=model_from_name(MODEL, system=SYSTEM),
        tools=[current_weather],
        max_steps=12,
    )
)

# The same agent on a budget: it pauses before the model call that would take
# it past 2,000 tokens, for an operator to `harness resume RUN --max-tokens N`.
harness.register_agent(
    harness.Agent(
        name="weather-frugal",
        model=model_from_name(MODEL, system=SYSTEM, max_tokens=300),
        tools=[current_weather],
        max_tokens=2000,
        on_budget="pause",
    )
)
