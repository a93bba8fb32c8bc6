"""Pydantic AI agents for the worker tests, imported by workers via
HARNESS_IMPORTS=tests.agents,tests.pydantic_agents.

Tool effects go to the ledger (``HARNESS_TEST_LEDGER``) under their step's
idempotency key, like tests.agents'; each model call is noted in
``<ledger>.models`` as ``<goal>/<turn>``, to count what was bought.
"""

from __future__ import annotations

import os
import time
from typing import Any

from pydantic import BaseModel
from pydantic_ai import Agent, ModelRetry, RunContext
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

import harness
from harness.pydantic_agents import step_context
from tests.ledger import append

#: How long each tool call takes: room to SIGKILL its worker mid-call.
TOOL_SECONDS = float(os.environ.get("HARNESS_TEST_TOOL_SECONDS", "0.3"))


def _ledger() -> str:
    return os.environ["HARNESS_TEST_LEDGER"]


def _effect(tool: str, value: Any) -> Any:
    ctx = step_context()
    if ctx is None:  # a plain run of the agent, outside the harness
        return value
    key = ctx.idempotency_key
    append(_ledger(), "start", key)
    time.sleep(TOOL_SECONDS)
    append(_ledger(), "end", key)
    return value


class Forecast(BaseModel):
    city: str
    high: int
    summary: str


def goal_of(messages: list[ModelMessage]) -> str:
    first = messages[0]
    assert isinstance(first, ModelRequest)
    return next(str(p.content) for p in first.parts if isinstance(p, UserPromptPart))


def weather_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """City, then forecast, then an answer the validator refuses, then a good one."""
    turn = sum(isinstance(m, ModelResponse) for m in messages)
    append(_ledger() + ".models", "model", f"{goal_of(messages).replace(' ', '_')}/{turn}")
    if turn == 0:
        return ModelResponse(parts=[ToolCallPart("find_city", {"name": "oslo"}, "c1")])
    if turn == 1:
        return ModelResponse(parts=[ToolCallPart("forecast", {"city": "Oslo"}, "c2")])
    summary = "short" if turn == 2 else "cold and clear all day"
    args = {"city": "Oslo", "high": -3, "summary": summary}
    return ModelResponse(parts=[ToolCallPart(info.output_tools[0].name, args, "c3")])


def weather_agent(name: str) -> Agent[None, Forecast]:
    agent = Agent(FunctionModel(weather_model), output_type=Forecast, name=name)

    @agent.tool_plain
    def find_city(name: str) -> str:
        """The city's proper name."""
        return str(_effect("find_city", name.title()))

    @agent.tool
    def forecast(ctx: RunContext[None], city: str) -> dict[str, Any]:
        """Tomorrow's forecast."""
        return dict(_effect("forecast", {"city": city, "high": -3}))

    @agent.output_validator
    def long_enough(out: Forecast) -> Forecast:
        if len(out.summary) < 10:
            raise ModelRetry("the summary must be a sentence")
        return out

    return agent


def mailer_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    turn = sum(isinstance(m, ModelResponse) for m in messages)
    if turn == 0:
        return ModelResponse(parts=[ToolCallPart("send", {"to": "a@example.com"}, "m1")])
    return ModelResponse(parts=[TextPart("sent")])


mailer = Agent(FunctionModel(mailer_model), name="pai-mailer")


@mailer.tool_plain
def send(to: str) -> str:
    """Send the mail (not idempotent: at most once)."""
    return str(_effect("send", f"sent to {to}"))


def checker_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    append(_ledger() + ".models", "model", f"{goal_of(messages).replace(' ', '_')}/0")
    return ModelResponse(parts=[TextPart("checked")])


checker = Agent(FunctionModel(checker_model), name="pai-checker")


@checker.output_validator
def slow_check(ctx: RunContext[None], out: str) -> str:
    """Slow agent code after the response (an EXPLAIN of a generated query):
    room to SIGKILL its worker there."""
    key = f"validate:{str(ctx.prompt).replace(' ', '_')}"
    append(_ledger(), "start", key)
    time.sleep(TOOL_SECONDS)
    append(_ledger(), "end", key)
    return out


harness.register_pydantic_ai(weather_agent("pai-weather"))
harness.register_pydantic_ai(checker)
harness.register_pydantic_ai(mailer, effects={"send": "at_most_once"})
