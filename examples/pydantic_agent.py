"""A team's existing Pydantic AI agent, moved onto Celery in three lines.

Everything above the marked lines is a plain ``pydantic_ai.Agent``: its
tools, its output type, its output validator. The model is a deterministic
``FunctionModel`` so that the example runs offline; set ``PYDANTIC_AI_MODEL``
(``openai:gpt-4.1-mini``, ``anthropic:claude-sonnet-4-5``, ...) to use a real
one. From the repository root (``examples`` is not installed with the package)::

    export HARNESS_IMPORTS=examples.pydantic_agent
    celery -A tasks worker & celery -A tasks beat &
    harness start trip-planner "A weekend in Oslo for two" --json
"""

from __future__ import annotations

import os

from pydantic import BaseModel
from pydantic_ai import Agent, ModelRetry
from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart
from pydantic_ai.models import Model
from pydantic_ai.models.function import AgentInfo, FunctionModel

import harness
from examples.weather_tools import CONDITIONS
from harness.pydantic_agents import step_context


class Plan(BaseModel):
    """What to pack and where dinner is booked."""

    city: str
    pack: list[str]
    dinner: str


def _scripted(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """A model that looks the weather up, books a table, then answers (once
    without packing anything, which the validator sends back)."""
    turn = sum(isinstance(m, ModelResponse) for m in messages)
    if turn == 0:
        return ModelResponse(parts=[ToolCallPart("current_weather", {"city": "Oslo"}, "w1")])
    if turn == 1:
        return ModelResponse(
            parts=[ToolCallPart("book_table", {"city": "Oslo", "people": 2}, "b1")]
        )
    pack = [] if turn == 2 else ["wool coat", "boots"]
    plan = {"city": "Oslo", "pack": pack, "dinner": "table for 2 at 19:00, ref OSL-2"}
    return ModelResponse(parts=[ToolCallPart(info.output_tools[0].name, plan, "p1")])


def _model() -> Model | str:
    return os.environ.get("PYDANTIC_AI_MODEL") or FunctionModel(_scripted)


trip_planner = Agent(
    _model(),
    output_type=Plan,
    name="trip-planner",
    instructions="Plan a short trip: check the weather, book dinner, say what to pack.",
)


@trip_planner.tool_plain
def current_weather(city: str) -> dict[str, object]:
    """The current temperature in Celsius and the sky in a city."""
    found = CONDITIONS.get(city.strip().lower())
    if found is None:
        raise ModelRetry(f"no weather station in {city!r}; try one of {sorted(CONDITIONS)}")
    return {"city": city, **found}


@trip_planner.tool_plain
def book_table(city: str, people: int) -> str:
    """Book a table for dinner (a real booking: not to be made twice)."""
    ctx = step_context()  # the harness step: its key is the booking's idempotency key
    key = ctx.idempotency_key if ctx is not None else "local"
    return f"table for {people} at 19:00 in {city}, ref {key[-6:]}"


@trip_planner.output_validator
def packs_something(plan: Plan) -> Plan:
    if not plan.pack:
        raise ModelRetry("say what to pack")
    return plan


# -- the three lines that move it onto Celery ----------------------------------
harness.register_pydantic_ai(
    trip_planner, effects={"current_weather": "read_only", "book_table": "at_most_once"}
)
