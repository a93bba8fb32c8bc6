"""A structured answer: what to wear, as a JSON object that validates.

``Agent(output_type=Outfit)`` asks the model for its final answer with the
provider's structured output (OpenAI ``response_format`` with ``Outfit``'s
JSON schema; Anthropic a ``final_answer`` tool of that schema). The answer is
validated against ``Outfit``; one that does not validate goes back to the
model with the error, at most ``output_retries`` times. The run's ``result``
is then the object. From the repository root (``examples`` is not installed
with the package)::

    export OPENAI_API_KEY=sk-...                      # or OPENAI_BASE_URL=...
    export WEATHER_MODEL=openai:gpt-4.1-mini          # or anthropic:claude-sonnet-4-5
    export HARNESS_IMPORTS=examples.outfit
    celery -A tasks worker & celery -A tasks beat &
    harness start outfit "What should I wear in Oslo today?" --json

``python -m tests.wire --script examples/outfit_wire.json`` serves it a
scripted conversation, with an answer that does not validate (README,
"Structured answers").
"""

from __future__ import annotations

import os

from pydantic import BaseModel, field_validator

import harness
from examples.weather_tools import current_weather
from harness.providers import model_from_name


class Outfit(BaseModel):
    """What to wear in one city today."""

    city: str
    celsius: float
    wear: list[str]

    @field_validator("wear")
    @classmethod
    def something(cls, wear: list[str]) -> list[str]:
        if not wear:
            raise ValueError("name at least one thing to wear")
        return wear


harness.register_agent(
    harness.Agent(
        name="outfit",
        model=model_from_name(
            os.environ.get("WEATHER_MODEL", "openai:gpt-4.1-mini"),
            system="Look the weather up; never guess it.",
        ),
        tools=[current_weather],
        output_type=Outfit,
        output_retries=2,
    )
)
